//! What Coda receives from coda-kimi, as one readable line per frame that matters for activity.
//!
//! The notation of `expected.txt` in a Kimi fixture: the shim's `_coda/wait` reports and the `session/update`s it made
//! from Kimi's files, and the answers of prompts, in the order Coda receives them. `S` is the main session.

use serde_json::Value;

/// `wait <sessionId> <waitId> <state> [kind=…] [childSessionId=…]`, `update <sessionId> <kind> <text|id>`
/// (only updates the shim made), `answer <id> <stopReason|error>`; `None` for other frames.
pub fn show(v: &Value, shim_made: bool, main: &str) -> Option<String> {
    let p = &v["params"];
    let sid = |x: &str| if x == main { "S".to_owned() } else { x.to_owned() };
    let s = |k: &str| p[k].as_str().unwrap_or("").to_owned();
    match v["method"].as_str() {
        Some("_coda/wait") => {
            let mut line = format!("wait {} {} {}", sid(&s("sessionId")), s("waitId"), s("state"));
            for k in ["kind", "childSessionId"] {
                if let Some(x) = p[k].as_str() {
                    line += &format!(" {k}={x}");
                }
            }
            Some(line)
        }
        Some("session/update") if shim_made => {
            let u = &p["update"];
            let what = u["content"]["text"].as_str().or(u["toolCallId"].as_str()).unwrap_or("");
            let what: String = what.chars().take(60).collect::<String>().replace('\n', " ");
            Some(format!("update {} {} {what}", sid(&s("sessionId")), u["sessionUpdate"].as_str().unwrap_or("")))
        }
        None if v.get("id").is_some() && v["result"]["stopReason"].is_string() => {
            Some(format!("answer {} {}", v["id"], v["result"]["stopReason"].as_str().unwrap_or("")))
        }
        _ => None,
    }
}

/// The summary of a trace's `shim->client` frames (raw `--trace-file` or fixture records).
pub fn summary(trace: &str) -> Vec<String> {
    let records: Vec<Value> = trace.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let main = records
        .iter()
        .find_map(|r| r["frame"]["result"]["sessionId"].as_str().map(str::to_owned))
        .or_else(|| {
            records
                .iter()
                .find_map(|r| {
                    (r["frame"]["method"] == "session/load")
                        .then(|| r["frame"]["params"]["sessionId"].as_str())
                        .flatten()
                })
                .map(str::to_owned)
        })
        .unwrap_or_default();
    records
        .iter()
        .filter(|r| r["dir"] == "shim->client")
        .filter_map(|r| show(&r["frame"], r["shim"] == true, &main))
        .collect()
}

/// The Kimi recordings that carry a file log (`fixtures/kimi/*/files.jsonl`), sorted.
pub fn recordings() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kimi");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .map(|rd| rd.flatten().map(|d| d.path()).filter(|p| p.join("files.jsonl").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    assert!(dirs.len() >= 12, "the Kimi recordings under {} are missing", root.display());
    dirs
}

/// `expected.txt` without what the activity layer does not produce: the prompt answers, Kimi's session
/// title (the title layer's, checked by tests/fixture_instruction.rs and the binary replay) and the usage
/// updates (the usage layer's, replayed by tests/kimi_replay.rs on their own).
pub fn activity_expected(expected: &str) -> String {
    expected
        .lines()
        .filter(|l| !l.starts_with("answer ") && !l.contains(" session_info_update") && !l.contains(" usage_update"))
        .map(|l| format!("{l}\n"))
        .collect()
}
