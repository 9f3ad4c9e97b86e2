//! The agent's requests to the in-process client: questions for the person, and refusals of the rest.
//!
//! Permission requests and links to open are asked y/n on a terminal and refused otherwise; everything Coda
//! does not offer is refused as Coda would.
//!
//! No I/O of its own beyond the stdin reader thread: each step returns the answers to send, and rows go to the
//! transcript's [`Renderer`].

use std::collections::VecDeque;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::cli::render::{Renderer, Tone};

/// A question put to the person at the terminal.
struct Question {
    id: Value,
    kind: QuestionKind,
}

enum QuestionKind {
    Permission { options: Vec<Value> },
    Url,
}

/// The agent's requests, queued while one question is on the terminal.
#[derive(Default)]
pub(crate) struct Questions {
    /// Whether a person can answer (stdin is a terminal); else every question is refused.
    pub stdin_tty: bool,
    /// `--json`: the frames go to stdout, so questions go to stderr.
    pub json: bool,
    queue: VecDeque<Question>,
    asking: Option<Question>,
    answers: Option<mpsc::UnboundedReceiver<String>>,
}

/// A JSON-RPC answer to the agent's request `id`.
fn result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

impl Questions {
    /// Whether a question is on the terminal, waiting for [`Questions::next_line`].
    pub fn asking(&self) -> bool {
        self.asking.is_some()
    }

    /// The next line the person typed; `None` once stdin is closed.
    pub async fn next_line(&mut self) -> Option<String> {
        match &mut self.answers {
            Some(rx) => rx.recv().await,
            None => None,
        }
    }

    /// A request from the agent; returns the answers to send now.
    pub fn request(&mut self, r: &mut Renderer<std::io::Stdout>, method: &str, id: Value, params: Value) -> Vec<Value> {
        match method {
            "session/request_permission" => {
                let title = params.pointer("/toolCall/title").and_then(Value::as_str).unwrap_or("a tool call");
                let options: Vec<Value> = params.get("options").and_then(Value::as_array).cloned().unwrap_or_default();
                let names: Vec<String> = options
                    .iter()
                    .map(|o| {
                        let name = o.get("name").and_then(Value::as_str).unwrap_or("?");
                        let kind = o.get("kind").and_then(Value::as_str).unwrap_or("?");
                        format!("{name} ({kind})")
                    })
                    .collect();
                r.row(Tone::Yellow, &format!("permission: {title}; options: {}", names.join(", ")));
                self.ask(r, Question { id, kind: QuestionKind::Permission { options } })
            }
            "elicitation/create" => {
                let message = params.get("message").and_then(Value::as_str).unwrap_or("");
                match params.get("mode").and_then(Value::as_str) {
                    Some("url") => {
                        let url = params.get("url").and_then(Value::as_str).unwrap_or("?");
                        r.row(Tone::Yellow, &format!("question (link): {message} {url}"));
                        self.ask(r, Question { id, kind: QuestionKind::Url })
                    }
                    _ => {
                        r.row(Tone::Yellow, &format!("question (form): {message}"));
                        r.row(Tone::Yellow, "  -> cancel: prompt mode does not fill in forms");
                        vec![result(id, json!({"action": "cancel"}))]
                    }
                }
            }
            "_coda/remote/code" => {
                r.row(Tone::Dim, "the agent asked for a remote binding code: not available in prompt mode");
                vec![error(id, -32603, "prompt mode has no remote entry")]
            }
            other => {
                r.row(Tone::Dim, &format!("the agent called {other}: not offered by Coda (method not found)"));
                vec![error(id, -32601, &format!("Method not found: {other}"))]
            }
        }
    }

    /// Queues a question for the person, or refuses it when no person can answer.
    fn ask(&mut self, r: &mut Renderer<std::io::Stdout>, q: Question) -> Vec<Value> {
        if !self.stdin_tty {
            return vec![cancelled(r, q, "refused: stdin is not a terminal")];
        }
        self.queue.push_back(q);
        self.next_question(r);
        Vec::new()
    }

    /// Puts the next queued question to the person.
    fn next_question(&mut self, r: &mut Renderer<std::io::Stdout>) {
        if self.asking.is_some() {
            return;
        }
        let Some(q) = self.queue.pop_front() else { return };
        if self.answers.is_none() {
            self.answers = Some(spawn_stdin_lines());
        }
        let text = match q.kind {
            QuestionKind::Permission { .. } => "  allow? [y/N] ",
            QuestionKind::Url => "  opened it and done? [y/N] ",
        };
        if self.json {
            eprint!("{text}");
        } else {
            r.ask(text);
        }
        self.asking = Some(q);
    }

    /// The person's answer to the question on the terminal (`None`: stdin closed); returns the answers to send.
    pub fn answered(&mut self, r: &mut Renderer<std::io::Stdout>, line: Option<String>) -> Vec<Value> {
        let Some(q) = self.asking.take() else { return Vec::new() };
        let yes = line.as_deref().is_some_and(|l| matches!(l.trim().to_ascii_lowercase().as_str(), "y" | "yes"));
        if line.is_none() {
            let answer = cancelled(r, q, "refused: stdin closed");
            self.next_question(r);
            return vec![answer];
        }
        let answer = match q.kind {
            QuestionKind::Permission { options } => {
                let pick = |kinds: &[&str]| {
                    kinds.iter().find_map(|k| options.iter().find(|o| o.get("kind").and_then(Value::as_str) == Some(k)))
                };
                let chosen =
                    if yes { pick(&["allow_once", "allow_always"]) } else { pick(&["reject_once", "reject_always"]) };
                match chosen.and_then(|o| Some((o.get("optionId")?.clone(), o.get("name").cloned()))) {
                    Some((option, name)) => {
                        let name = name.as_ref().and_then(Value::as_str).unwrap_or("?").to_owned();
                        let tone = if yes { Tone::Green } else { Tone::Yellow };
                        r.row(tone, &format!("  -> {}: {name}", if yes { "allowed" } else { "rejected" }));
                        result(q.id, json!({"outcome": {"outcome": "selected", "optionId": option}}))
                    }
                    None => cancelled(r, Question { id: q.id, kind: QuestionKind::Url }, "no matching option"),
                }
            }
            QuestionKind::Url => {
                let action = if yes { "accept" } else { "decline" };
                r.row(Tone::Plain, &format!("  -> {action}"));
                result(q.id, json!({"action": action}))
            }
        };
        self.next_question(r);
        vec![answer]
    }

    /// Refuses every question asked or queued (ACP, prompt turn, cancellation: the client answers pending
    /// permission requests with cancelled); returns the answers to send.
    pub fn cancel_all(&mut self, r: &mut Renderer<std::io::Stdout>, why: &str) -> Vec<Value> {
        let pending: Vec<Question> = self.asking.take().into_iter().chain(self.queue.drain(..)).collect();
        pending.into_iter().map(|q| cancelled(r, q, why)).collect()
    }
}

/// Refuses a question: the ACP `cancelled` outcome for a permission, `cancel` for a link.
fn cancelled(r: &mut Renderer<std::io::Stdout>, q: Question, why: &str) -> Value {
    r.row(Tone::Yellow, &format!("  -> {why} (outcome cancelled)"));
    let answer = match q.kind {
        QuestionKind::Permission { .. } => json!({"outcome": {"outcome": "cancelled"}}),
        QuestionKind::Url => json!({"action": "cancel"}),
    };
    result(q.id, answer)
}

/// Lines typed on stdin, read on a thread of their own (a blocking read cannot be cancelled).
fn spawn_stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line.clone()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot read answers from stdin: {e}");
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> Renderer<std::io::Stdout> {
        Renderer::new(std::io::stdout(), false, false)
    }

    #[test]
    fn without_a_terminal_every_question_is_refused_and_other_requests_get_coda_s_answers() {
        let (mut q, mut r) = (Questions::default(), quiet());
        let permission = json!({"toolCall": {"title": "rm -rf /"}, "options": [
            {"optionId": "ok", "name": "Allow", "kind": "allow_once"}]});
        let answers = q.request(&mut r, "session/request_permission", json!(7), permission);
        assert_eq!(answers, vec![json!({"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "cancelled"}}})]);
        let link = json!({"mode": "url", "message": "sign in", "url": "https://example.com"});
        let answers = q.request(&mut r, "elicitation/create", json!("e"), link);
        assert_eq!(answers, vec![json!({"jsonrpc": "2.0", "id": "e", "result": {"action": "cancel"}})]);
        let form = q.request(&mut r, "elicitation/create", json!(8), json!({"mode": "form", "message": "name?"}));
        assert_eq!(form[0]["result"], json!({"action": "cancel"}));
        let other = q.request(&mut r, "fs/read_text_file", json!(9), json!({}));
        assert_eq!(other[0]["error"]["code"], json!(-32601));
        assert!(!q.asking());
    }

    #[test]
    fn cancelling_refuses_what_is_queued() {
        let (mut q, mut r) = (Questions::default(), quiet());
        q.queue.push_back(Question { id: json!(1), kind: QuestionKind::Permission { options: Vec::new() } });
        q.queue.push_back(Question { id: json!(2), kind: QuestionKind::Url });
        let answers = q.cancel_all(&mut r, "cancelled by Ctrl-C");
        assert_eq!(answers[0]["result"], json!({"outcome": {"outcome": "cancelled"}}));
        assert_eq!(answers[1]["result"], json!({"action": "cancel"}));
        assert!(q.cancel_all(&mut r, "again").is_empty());
    }
}
