//! An agent that titles sessions with the start of the first prompt, cut short (Qwen Code: the first 200 code
//! points of the first text block, then `...`): with the instruction injected in front of that prompt, the title
//! and the session list's `_meta.preview` are the instruction's opening, without its closing marker, so the
//! engine's instruction layer (which removes whole blocks) cannot find it. This layer blanks such a text: in
//! `session/list` results, `session_info_update` titles and any other agent frame that carries one, never in
//! the model's own streamed words. The user's own words are not in it to keep (they come after the block).

use std::convert::Infallible;

use serde_json::Value;

use crate::coda::instruction::{CLOSE, OPEN, TOKEN};
use crate::frame::Frame;
use crate::layer::{Cx, Layer};

/// Blanks cut-short instruction echoes (see the module docs).
pub struct TruncatedTitles;

/// Whether `s` is the start of an injected block that lost its end.
fn is_cut_echo(s: &str) -> bool {
    s.trim_start().starts_with(OPEN) && !s.contains(CLOSE)
}

/// Blanks every cut-short echo in `v`; true when one was found.
fn blank(v: &mut Value) -> bool {
    match v {
        Value::String(s) if is_cut_echo(s) => {
            s.clear();
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |acc, i| blank(i) | acc),
        Value::Object(map) => map.values_mut().fold(false, |acc, i| blank(i) | acc),
        _ => false,
    }
}

impl Layer for TruncatedTitles {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if frame.is_streamed_chunk() || !frame.has(&TOKEN) {
            return cx.to_client(frame);
        }
        let mut value = frame.to_value();
        if blank(&mut value) {
            tracing::debug!("blanked a title cut from the injected instruction");
            return cx.to_client(frame.rewritten(value));
        }
        cx.to_client(frame)
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        frame.is_streamed_chunk() || !frame.has(&TOKEN)
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::instruction::wrap;
    use crate::layer::testing::Harness;
    use serde_json::json;

    #[test]
    fn a_title_cut_from_the_instruction_is_blanked_a_whole_block_and_other_text_are_left() {
        let cut: String =
            wrap("# Coda client\n\nYour replies are shown in Coda… 回复").chars().take(200).collect::<String>();
        let cut = format!("{}...", &cut[..cut.len().min(60)]);
        assert!(is_cut_echo(&cut));
        let mut h = Harness::of(TruncatedTitles);
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessions":[
            {"sessionId":"a","title":cut,"_meta":{"preview":cut,"startTime":"x"}},
            {"sessionId":"b","title":"mine","_meta":{"preview":"mine"}}]}}));
        let out = h.to_client();
        assert_eq!(out[0]["result"]["sessions"][0]["title"], "");
        assert_eq!(out[0]["result"]["sessions"][0]["_meta"], json!({"preview":"","startTime":"x"}));
        assert_eq!(out[0]["result"]["sessions"][1]["title"], "mine");
        // A whole block is the instruction layer's to strip; the model's words are never touched.
        let whole = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{
            "sessionUpdate":"session_info_update","title":wrap("x")}}});
        h.from_agent(whole.clone());
        assert_eq!(h.to_client(), vec![whole]);
        let said = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{
            "sessionUpdate":"agent_message_chunk","content":{"type":"text","text":cut}}}});
        h.from_agent(said.clone());
        assert_eq!(h.to_client(), vec![said]);
    }
}
