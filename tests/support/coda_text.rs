//! What Coda really sends, for the live tests and the recorders.
//!
//! Its session instruction (a real-size one, shared with every suite through `fixtures/coda-instruction.md`), a
//! one-line instruction for the scenario that keeps the short form, and a multi-line first prompt. `leak` finds any
//! part of either instruction in what a client received.

use serde_json::Value;

/// Coda's session instruction as Coda sends it: several paragraphs of Markdown, a list, code spans,
/// Chinese text and an emoji, over 2 KB.
pub const INSTRUCTION: &str = include_str!("../../fixtures/coda-instruction.md");
/// The short form, kept for one scenario.
pub const ONE_LINE: &str = "Coda live check: answer briefly. Marker INSTR-7f3a.";
/// In both instructions: counts how often the model received one.
pub const MARK: &str = "INSTR-7f3a";
/// A first user prompt as Coda sends one: several lines. Append markers for the fake model after it.
pub const FIRST_PROMPT: &str = "Could you look at the failing build?\n\nIt broke after yesterday's merge:\n- the \
                                iPhone target stops at link time\n- 测试都通过了\n\nStart with the log.";

/// `systemPrompt` as Coda sends it on `session/new`, `session/load` and `session/resume`.
pub fn system_prompt(text: &str) -> Value {
    serde_json::json!({"mode": "append", "content": [{"type": "text", "text": text}]})
}

/// Runs of five words of an instruction (white space folded, as agents reflow it), and its marker.
fn probes(instruction: &str) -> Vec<String> {
    let words: Vec<&str> = instruction.split_whitespace().collect();
    let mut probes: Vec<String> = words.windows(5).map(|w| w.join(" ")).collect();
    probes.push("coda-session-instruction".to_owned());
    probes.push(MARK.to_owned());
    probes
}

/// The first part of either instruction found in any string of `frame`, with white space folded.
pub fn leak(frame: &Value) -> Option<String> {
    let mut strings = Vec::new();
    collect(frame, &mut strings);
    let all: Vec<String> = [INSTRUCTION, ONE_LINE].iter().flat_map(|i| probes(i)).collect();
    strings.iter().find_map(|s| {
        let folded = s.split_whitespace().collect::<Vec<_>>().join(" ");
        all.iter().find(|p| folded.contains(p.as_str())).map(|p| format!("{p:?} in {s:?}"))
    })
}

fn collect<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| collect(i, out)),
        Value::Object(map) => map.iter().for_each(|(k, i)| {
            out.push(k);
            collect(i, out)
        }),
        _ => {}
    }
}
