//! The requests the fake model received, as tests read them back.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde_json::{Value, json};

use super::origin::Origin;
use super::request::{Api, conversation, offered_tools, prompt_text};

/// One request as the server received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// 1-based arrival number.
    pub seq: u64,
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Header names in lower case; repeated headers are joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The JSON body; `Value::Null` when empty, `{"_raw": text}` when not JSON.
    pub body: Value,
    pub api: Api,
    pub origin: Origin,
    /// A one-line description of what the server answered.
    pub reply: String,
    /// When the request's head arrived (wall clock): what the shim's `lastRequestAt` is measured against.
    pub at: SystemTime,
    /// The input tokens the server reported for it (Responses API: the body at about 4 bytes a token).
    pub input_tokens: u64,
}

impl RecordedRequest {
    /// The `model` field of the body, if any.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// Names of the tools offered to the model (`namespace.name` for Responses API namespaces).
    pub fn tool_names(&self) -> Vec<String> {
        offered_tools(&self.body).into_iter().map(|t| t.qualified()).collect()
    }

    /// The latest user text, the one markers are read from.
    pub fn user_text(&self) -> String {
        prompt_text(&conversation(self.api, &self.body)).unwrap_or_default()
    }
}

impl RecordedRequest {
    /// Writes the request as `<seq>.json` into `dir` (`Options::dump_dir`).
    pub(super) fn dump(&self, dir: &Path) {
        let dump = json!({
            "seq": self.seq, "method": self.method, "path": self.path, "headers": self.headers,
            "origin": format!("{:?}", self.origin), "reply": self.reply, "body": self.body,
        });
        let text = serde_json::to_string_pretty(&dump).unwrap_or_default();
        let _ = std::fs::write(dir.join(format!("{:04}.json", self.seq)), text);
    }
}

/// A one-line summary of a request, for logs.
pub fn summary_line(r: &RecordedRequest) -> String {
    let model = r.model().unwrap_or("-");
    let text: String = r.user_text().chars().take(80).collect();
    format!(
        "fake-model #{} {} {} model={} origin={:?} tools={} user={:?} -> {}",
        r.seq,
        r.method,
        r.path,
        model,
        r.origin,
        r.tool_names().len(),
        text,
        r.reply
    )
}
