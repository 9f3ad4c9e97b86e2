//! Which of codex-acp's sessions are root sessions: the ones Coda made or opened (`session/new`, `session/fork`
//! answer with their id; `session/load`, `session/resume` name it). A subagent's session (an AIR child thread,
//! `X` or `X:generation:N`) is never one of them: Coda's usage facts and compaction are about roots only.

use std::collections::HashSet;

use serde_json::Value;

use crate::frame::{Frame, Kind};
use crate::layer::Cx;

#[derive(Default, Debug)]
pub struct Roots(HashSet<String>);

impl Roots {
    /// Learns a root from an answer on its way to Coda (any other frame is no news); reads only answers to
    /// the four methods that open a session.
    pub fn learn(&mut self, frame: &Frame, cx: &Cx) {
        if !matches!(frame.kind(), Kind::Response { .. }) {
            return;
        }
        let Some(request) = cx.answer_to(frame) else { return };
        let named = request.session().map(str::to_owned);
        let method = request.method.as_str();
        if !matches!(method, "session/new" | "session/fork" | "session/load" | "session/resume") {
            return;
        }
        let Some(result) = frame.value().get("result") else { return };
        let id = match method {
            "session/new" | "session/fork" => result.get("sessionId").and_then(Value::as_str).map(str::to_owned),
            _ => named,
        };
        if let Some(id) = id.filter(|id| !id.is_empty()) {
            self.0.insert(id);
        }
    }

    pub fn contains(&self, session: &str) -> bool {
        self.0.contains(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use crate::layer::{Cx, Layer};
    use serde_json::json;
    use std::convert::Infallible;

    /// Learns roots from what passes.
    #[derive(Default)]
    struct Learner(Roots);
    impl Layer for Learner {
        type Timer = Infallible;
        type Event = Infallible;
        type Reply = Infallible;
        fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
            self.0.learn(&frame, cx);
            cx.to_client(frame);
        }
    }

    #[test]
    fn roots_are_the_sessions_coda_made_or_opened_and_nothing_else() {
        let mut h = Harness::of(Learner::default());
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s-new"}}));
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":"s-old"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{}}));
        // A failed load opens nothing; nor does an answer to another method that names a session.
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":"s-gone"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"no"}}));
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"s-p"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":4,"result":{"sessionId":"s-p2"}}));
        // Hostile: a sessionId that is no string, an answer to nothing.
        h.from_client(json!({"jsonrpc":"2.0","id":5,"method":"session/new","params":{}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":5,"result":{"sessionId":1e300}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":99,"result":{"sessionId":"stray"}}));
        let roots = &h.layer::<Learner>(0).0;
        assert!(roots.contains("s-new") && roots.contains("s-old"));
        for not in ["s-gone", "s-p", "s-p2", "stray", ""] {
            assert!(!roots.contains(not), "{not}");
        }
    }
}
