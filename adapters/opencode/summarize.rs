//! The HTTP side of a compaction (`compact.rs`): what the layer's jobs run, never the layer.
//!
//! Live, each [`Ask`] is a job of the compaction layer's ([`crate::layer::Cx::work`], on the engine's workers)
//! that asks OpenCode's server `GET /session/status` (a busy session is not compacted: OpenCode would stop its
//! turn) and then `POST /session/{id}/summarize`; the answer is the job's result.
//!
//! In a replay no server runs: the answer comes from the recording's events file, like every server event.
//! The layer logged its ask there ([`ServerEvent::SummarizeAsked`]), and the file reader waits at that line
//! until the replayed layer's job has asked too ([`ReplayGate`]), so that what OpenCode did after the ask
//! reaches the layers after the ask, as it did live.
//!
//! [`ServerEvent::SummarizeAsked`]: crate::adapters::opencode::server::ServerEvent::SummarizeAsked

use crate::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::adapters::opencode::compact::{Ask, Asker, Summarized};
use crate::adapters::opencode::server::Server;
use crate::coda::compact::DEADLINE;

/// Asks OpenCode's server (blocking, on the job's thread) and gives its answer.
pub fn live(server: Server) -> Asker {
    Arc::new(move |ask: Ask| {
        let result = summarize(&server, &ask);
        if let Summarized::Failed { why } = &result {
            tracing::warn!("OpenCode did not compact session {}: {why}", ask.session);
        }
        Some(result)
    })
}

fn summarize(server: &Server, ask: &Ask) -> Summarized {
    match busy(server, ask) {
        Ok(true) => return Summarized::Busy,
        Ok(false) => {}
        Err(why) => return Summarized::Failed { why: format!("GET /session/status: {why}") },
    }
    let path = format!("/session/{}/summarize", utf8_percent_encode(&ask.session, NON_ALPHANUMERIC));
    // The summary is a model request: it may take minutes; the layer gives up at DEADLINE.
    let mut req = server.agent(DEADLINE, None).post(&server.url(&path)).query("directory", &ask.directory);
    if let Some(auth) = &server.auth {
        req = req.header("Authorization", auth);
    }
    let body = serde_json::json!({ "providerID": ask.provider, "modelID": ask.model }).to_string();
    match req.content_type("application/json").send(&body) {
        Err(e) => Summarized::Failed { why: e.to_string() },
        Ok(mut answer) => {
            let status = answer.status().as_u16();
            let text = answer.body_mut().with_config().limit(4096).read_to_string().unwrap_or_default();
            match (status, text.trim()) {
                (200, "true") => Summarized::Done,
                (200, _) => Summarized::Failed { why: "OpenCode's server did not answer true".into() },
                (status, _) => Summarized::Failed { why: format!("HTTP {status}") },
            }
        }
    }
}

/// Whether OpenCode's server says the session runs (`{"ses_…": {"type": "busy"}}`; idle ones are left out).
fn busy(server: &Server, ask: &Ask) -> Result<bool, String> {
    let mut req = server
        .agent(Duration::from_secs(10), None)
        .get(&server.url("/session/status"))
        .query("directory", &ask.directory);
    if let Some(auth) = &server.auth {
        req = req.header("Authorization", auth);
    }
    let mut answer = req.call().map_err(|e| e.to_string())?;
    if answer.status() != 200 {
        return Err(format!("HTTP {}", answer.status().as_u16()));
    }
    let text = answer.body_mut().with_config().limit(1 << 20).read_to_string().map_err(|e| e.to_string())?;
    let status: Value = crate::json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    Ok(is_busy(&status, &ask.session))
}

fn is_busy(status: &Value, session: &str) -> bool {
    status.get(session).and_then(|s| s.get("type")).and_then(Value::as_str).is_some_and(|t| t != "idle")
}

/// A replay's stand-in for the server: counts the layer's asks, which the events file reader waits for.
#[derive(Clone, Default)]
pub struct ReplayGate {
    asks: Arc<(Mutex<HashMap<String, u32>>, Condvar)>,
}

/// How long the file reader waits at an ask the replayed layer does not make (a replay that went another way).
const REPLAY_WAIT: Duration = Duration::from_secs(30);

impl ReplayGate {
    /// The layer's asker: each ask is counted, nothing else happens (the answer is the file's).
    pub fn asker(&self) -> Asker {
        let gate = self.clone();
        Arc::new(move |ask: Ask| {
            let (asks, asked) = &*gate.asks;
            *asks.lock().unwrap_or_else(|p| p.into_inner()).entry(ask.session).or_default() += 1;
            asked.notify_all();
            None
        })
    }

    /// Waits until the layer has asked to compact `session` (once per recorded ask); false after
    /// `REPLAY_WAIT` without it.
    pub fn wait(&self, session: &str) -> bool {
        let (asks, asked) = &*self.asks;
        let guard = asks.lock().unwrap_or_else(|p| p.into_inner());
        let (mut guard, _) = asked
            .wait_timeout_while(guard, REPLAY_WAIT, |a| a.get(session).is_none_or(|n| *n == 0))
            .unwrap_or_else(|p| p.into_inner());
        match guard.get_mut(session) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => {
                tracing::warn!("the replay's compaction of session {session} was never asked for; going on");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask() -> Ask {
        Ask { session: "ses_1".into(), directory: "/w".into(), provider: "fake".into(), model: "m".into() }
    }

    #[test]
    fn only_a_session_the_status_names_as_running_is_busy() {
        assert!(!is_busy(&json!({}), "ses_1"));
        assert!(is_busy(&json!({"ses_1":{"type":"busy"}}), "ses_1"));
        assert!(is_busy(&json!({"ses_1":{"type":"retry","attempt":2}}), "ses_1"));
        assert!(!is_busy(&json!({"ses_2":{"type":"busy"}}), "ses_1"));
        assert!(!is_busy(&json!({"ses_1":{"type":"idle"}}), "ses_1"));
        assert!(!is_busy(&json!([1e300]), "ses_1"));
    }

    /// A one-connection HTTP server: answers each request in turn with the given answers, hands back heads.
    fn serve(answers: Vec<&'static str>) -> (Server, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let served = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for answer in answers {
                let (mut conn, _) = listener.accept().expect("accept");
                let mut r = BufReader::new(conn.try_clone().expect("clone"));
                let mut head = String::new();
                while r.read_line(&mut head).expect("read") > 2 && !head.ends_with("\r\n\r\n") {}
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                r.read_exact(&mut body).expect("body");
                heads.push(head + &String::from_utf8_lossy(&body));
                conn.write_all(answer.as_bytes()).expect("answer");
            }
            heads
        });
        (Server { host: "127.0.0.1".into(), port, auth: None }, served)
    }

    #[test]
    fn it_asks_the_status_then_summarizes_with_the_sessions_model() {
        let (server, served) = serve(vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\ntrue",
        ]);
        assert_eq!(summarize(&server, &ask()), Summarized::Done);
        let heads = served.join().expect("server");
        assert!(heads[0].starts_with("GET /session/status?directory=%2Fw HTTP/1.1"), "{}", heads[0]);
        assert!(heads[1].starts_with("POST /session/ses%5F1/summarize?directory=%2Fw HTTP/1.1"), "{}", heads[1]);
        assert!(heads[1].ends_with(r#"{"modelID":"m","providerID":"fake"}"#), "{}", heads[1]);
    }

    #[test]
    fn a_busy_session_a_refusal_and_a_dead_server_are_said() {
        let (server, _s) = serve(vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 25\r\nconnection: close\r\n\r\n{\"ses_1\":{\"type\":\"busy\"}}",
        ]);
        assert_eq!(summarize(&server, &ask()), Summarized::Busy);
        let (server, _s) = serve(vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\nconnection: close\r\n\r\nfalse",
        ]);
        assert_eq!(summarize(&server, &ask()), Summarized::Failed { why: "HTTP 400".into() });
        let (server, _s) = serve(vec!["HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\n{\"x"]);
        assert!(matches!(summarize(&server, &ask()), Summarized::Failed { why } if why.contains("not JSON")));
        let port = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
        let dead = Server { host: "127.0.0.1".into(), port, auth: None };
        assert!(matches!(summarize(&dead, &ask()), Summarized::Failed { .. }));
    }

    #[test]
    fn the_replay_gate_lets_the_reader_on_once_per_ask() {
        let gate = ReplayGate::default();
        let asker = gate.asker();
        let waiting = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.wait("ses_1"))
        };
        assert_eq!(asker(ask()), None, "the answer is the file's");
        assert!(waiting.join().expect("reader"), "let on by the ask");
        asker(ask());
        assert!(gate.wait("ses_1"));
    }
}
