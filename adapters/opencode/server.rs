//! OpenCode's own HTTP server as a side channel (`opencode acp` always starts one, see `mod.rs`).
//!
//! OpenCode's ACP bridge forwards only events of sessions it knows, and a `task` call names its child
//! session over ACP only when it completes. The server's event stream (`GET /global/event`, SSE) says more,
//! as it happens (checked live on 1.18.33):
//! - `message.part.updated` of the `task` tool part carries `state.metadata.sessionId` (the child) as soon
//!   as the child session exists, before the child's first model request;
//! - `session.status` says when a session goes `busy` and `idle` (the end of any run, OpenCode's own
//!   follow-up turns included);
//! - `permission.asked` / `permission.replied` name every permission request, a child's included;
//! - `message.updated` of an assistant message, first sent when its step starts, names the user message it
//!   answers (`parentID`) and the agent and model of the step (for steering).
//!
//! The reader reduces these to [`ServerEvent`]s and hands them to the layers (the set-up in `mod.rs` routes
//! each to the layer that acts on it); [`Server::reply_permission`] answers a permission request through
//! `POST /permission/{id}/reply` for the permission bridge, [`Server::post_message`] and
//! [`Server::delete_message`] add and remove a steering message (`steering.rs`, through `calls.rs`). For replays the
//! events come from a file instead (one [`ServerEvent`] per line, see [`tail`]).

use crate::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the layer learns from OpenCode's server, reduced to what it acts on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ServerEvent {
    /// The `task` call `call` of `session` runs in the child session `child`.
    #[serde(rename = "task.child")]
    TaskChild { session: String, call: String, child: String },
    /// A session's run state: `busy` (also `retry`) or idle.
    #[serde(rename = "session.status")]
    Status { session: String, busy: bool },
    /// A permission request OpenCode is waiting on.
    #[serde(rename = "permission.asked")]
    Asked {
        id: String,
        session: String,
        permission: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call: Option<String>,
        #[serde(default)]
        metadata: Value,
        #[serde(default)]
        directory: String,
    },
    /// A permission request was answered (by anyone).
    #[serde(rename = "permission.replied")]
    Replied { session: String, id: String },
    /// OpenCode retries a failed model request of `session` (`session.status` `retry`): seen at `at_ms` (Unix
    /// ms), its next attempt `wait_ms` later (from `next`), with the upstream's message.
    #[serde(rename = "session.retry")]
    Retry {
        session: String,
        attempt: u64,
        message: String,
        at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// The shim's own call on the server for steering (`steering.rs`) came back: `message` is the user
    /// message it added to `session` (`POST /session/{id}/message`, `noReply`) or removed again (`DELETE`);
    /// `error` says why the call failed.
    #[serde(rename = "steer.call")]
    SteerCall {
        session: String,
        call: SteerCallKind,
        #[serde(default)]
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A run of `session` failed (`session.error`): OpenCode's error name, the upstream's message, HTTP status
    /// and the error code of its answer body.
    #[serde(rename = "session.error")]
    Failed {
        session: String,
        name: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// An assistant message of `session` (one per model request, `message.updated`), said when it is created
    /// and once more when completed: created at `created_ms` (Unix ms, OpenCode's clock, just before the
    /// request); the user message `parent` it answers and the agent and model it runs with (for steering);
    /// once completed, the request's context (`tokens`: input + cache read + cache write) and `output` tokens
    /// (for usage facts and compaction). `summary`: a compaction's summary.
    #[serde(rename = "message.step")]
    Step(Box<crate::adapters::opencode::usage::Step>),
    /// OpenCode compacted `session` (`session.compacted`), asked for or automatically.
    #[serde(rename = "session.compacted")]
    Compacted { session: String },
    /// The shim asked OpenCode's server to compact `session` (written to the record so that a replay
    /// hands on what followed only once the replayed shim has asked too; never read from the server).
    #[serde(rename = "summarize.asked")]
    SummarizeAsked { session: String },
    /// What OpenCode's server answered the shim's compaction of `session` (`compact::Summarized`).
    #[serde(rename = "summarize.result")]
    Summarized { session: String, result: crate::adapters::opencode::compact::Summarized },
}

/// Which of the steering layer's calls a [`ServerEvent::SteerCall`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SteerCallKind {
    Post,
    Delete,
}

/// What the reader hands the layer.
#[derive(Clone, Debug)]
pub enum FromServer {
    Event(ServerEvent),
    /// The event stream was lost: what it said about running sessions may be stale (never in a replay).
    Lost,
    /// A replay's events file was read up to this length, and every event in it before that sent (only with a
    /// took log, `CODA_OPENCODE_TOOK`): sent after those events, so the layers have handled them all by the
    /// time the one it goes to handles it.
    Read(u64),
}

/// Where OpenCode's server listens, and how to authenticate.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    pub host: String,
    pub port: u16,
    /// `Basic …` when `OPENCODE_SERVER_PASSWORD` is set (the child inherits the shim's environment).
    pub auth: Option<String>,
}

impl Server {
    /// The server named by an `opencode acp` command line (`--port N`, `--hostname H`), if it names a port.
    /// Set-up only (`mod.rs`): it reads the environment (`OPENCODE_SERVER_PASSWORD`, `OPENCODE_SERVER_USERNAME`).
    pub fn from_args(args: &[String]) -> Option<Server> {
        let value = |name: &str| {
            let mut found = None;
            for (i, a) in args.iter().enumerate() {
                if a == name {
                    found = args.get(i + 1).cloned();
                } else if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                    found = Some(v.to_owned());
                }
            }
            found
        };
        let port: u16 = value("--port")?.parse().ok().filter(|p| *p != 0)?;
        let host = match value("--hostname").as_deref() {
            None | Some("0.0.0.0") | Some("") => "127.0.0.1".to_owned(),
            Some(h) => h.to_owned(),
        };
        let auth = std::env::var("OPENCODE_SERVER_PASSWORD").ok().filter(|p| !p.is_empty()).map(|password| {
            let user = std::env::var("OPENCODE_SERVER_USERNAME").ok().filter(|u| !u.is_empty());
            let pair = format!("{}:{password}", user.as_deref().unwrap_or("opencode"));
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Some(Server { host, port, auth })
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host, self.port)
    }

    /// A client for this server: never through a proxy (it is local), HTTP errors as statuses, and
    /// `timeout` to connect and for the response's head.
    pub(super) fn agent(&self, timeout: Duration, per_read: Option<Duration>) -> ureq::Agent {
        ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(per_read)
            .build()
            .into()
    }

    /// Answers permission request `id` (`once`, `always` or `reject`); the error says why it failed.
    pub fn reply_permission(&self, directory: &str, id: &str, reply: &str) -> Result<(), String> {
        let url = self.url(&format!("/permission/{}/reply", utf8_percent_encode(id, NON_ALPHANUMERIC)));
        let mut req = self.agent(Duration::from_secs(10), None).post(&url).query("directory", directory);
        if let Some(auth) = &self.auth {
            req = req.header("Authorization", auth);
        }
        let body = serde_json::json!({ "reply": reply }).to_string();
        let answer = req.content_type("application/json").send(&body).map_err(|e| e.to_string())?;
        match answer.status().as_u16() {
            200..300 => Ok(()),
            status => Err(format!("HTTP {status}")),
        }
    }
}

impl Server {
    fn authorized<B>(&self, mut req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        if let Some(auth) = &self.auth {
            req = req.header("Authorization", auth);
        }
        req
    }

    /// The messages of `session` (`GET /session/{id}/message`), as OpenCode keeps them (at most 32 MiB read).
    pub fn messages(&self, directory: &str, session: &str) -> Result<Value, String> {
        let url = self.url(&format!("/session/{}/message", utf8_percent_encode(session, NON_ALPHANUMERIC)));
        let req = self.authorized(self.agent(Duration::from_secs(10), None).get(&url).query("directory", directory));
        let mut answer = req.call().map_err(|e| e.to_string())?;
        if !(200..300).contains(&answer.status().as_u16()) {
            return Err(format!("HTTP {}", answer.status().as_u16()));
        }
        let text = answer.body_mut().with_config().limit(32 << 20).read_to_string().map_err(|e| e.to_string())?;
        crate::json::from_str(&text).map_err(|e| format!("an answer that is no JSON ({e})"))
    }

    /// Adds a user message to `session` without starting a run of its own (`POST /session/{id}/message` with
    /// `noReply: true` in `body`): a busy session's running loop takes it at its next step. The message's id.
    pub fn post_message(&self, directory: &str, session: &str, body: &Value) -> Result<String, String> {
        let url = self.url(&format!("/session/{}/message", utf8_percent_encode(session, NON_ALPHANUMERIC)));
        let req = self.authorized(self.agent(Duration::from_secs(10), None).post(&url).query("directory", directory));
        let mut answer =
            req.content_type("application/json").send(body.to_string().as_str()).map_err(|e| e.to_string())?;
        if !(200..300).contains(&answer.status().as_u16()) {
            return Err(format!("HTTP {}", answer.status().as_u16()));
        }
        let text = answer.body_mut().with_config().limit(1 << 20).read_to_string().map_err(|e| e.to_string())?;
        let v: Value = crate::json::from_str(&text).map_err(|e| format!("an answer that is no JSON ({e})"))?;
        let id = v.pointer("/info/id").and_then(Value::as_str).filter(|id| !id.is_empty());
        id.map(str::to_owned).ok_or_else(|| "an answer without `info.id`".to_owned())
    }

    /// Removes message `message` of `session` again (`DELETE /session/{id}/message/{messageId}`; OpenCode
    /// refuses while the session is busy).
    pub fn delete_message(&self, directory: &str, session: &str, message: &str) -> Result<(), String> {
        let path = format!(
            "/session/{}/message/{}",
            utf8_percent_encode(session, NON_ALPHANUMERIC),
            utf8_percent_encode(message, NON_ALPHANUMERIC)
        );
        let url = self.url(&path);
        let req = self.authorized(self.agent(Duration::from_secs(10), None).delete(&url).query("directory", directory));
        let answer = req.call().map_err(|e| e.to_string())?;
        match answer.status().as_u16() {
            200..300 => Ok(()),
            status => Err(format!("HTTP {status}")),
        }
    }
}

/// Reads OpenCode's event stream until the process ends, reconnecting when it drops; `send` gets each
/// reduced event (false: the relay stopped, so the reader stops too). Before each try it asks `runs` whether
/// the relay still runs: a reader that never connected has sent nothing that would have told it.
pub fn follow(
    server: Server,
    send: impl Fn(FromServer) -> bool + Send + 'static,
    runs: impl Fn() -> bool + Send + 'static,
) {
    let spawned = std::thread::Builder::new().name("opencode-events".into()).spawn(move || {
        let mut reducer = Reducer::default();
        let mut connected_once = false;
        while runs() {
            match stream_events(&server, &mut reducer, &send) {
                Ok(Stop::Relay) => return,
                Ok(Stop::Ended) => tracing::debug!("OpenCode's event stream ended"),
                Err(e) => tracing::trace!("OpenCode's event stream: {e}"),
            }
            if reducer.connected {
                connected_once = true;
                reducer.connected = false;
                reducer.status.clear();
                if !send(FromServer::Lost) {
                    return;
                }
            }
            // OpenCode opens its server a few seconds after it starts; then a dropped stream is rare.
            std::thread::sleep(if connected_once { Duration::from_secs(1) } else { Duration::from_millis(100) });
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the OpenCode event reader: {e}");
    }
}

enum Stop {
    /// The relay is gone.
    Relay,
    /// The server closed the stream.
    Ended,
}

fn stream_events(server: &Server, reducer: &mut Reducer, send: &impl Fn(FromServer) -> bool) -> Result<Stop, String> {
    // A connection OpenCode accepted while still starting may never be answered (seen live): give up on
    // one that sends no head within seconds and try again. OpenCode sends a heartbeat every ten seconds:
    // a minute of silence is a dead connection.
    let agent = server.agent(Duration::from_secs(3), Some(Duration::from_secs(60)));
    let mut req = agent.get(&server.url("/global/event")).header("Accept", "text/event-stream");
    if let Some(auth) = &server.auth {
        req = req.header("Authorization", auth);
    }
    let answer = req.call().map_err(|e| e.to_string())?;
    if answer.status() != 200 {
        return Err(format!("GET /global/event: HTTP {}", answer.status().as_u16()));
    }
    reducer.connected = true;
    tracing::debug!("reading OpenCode's events at {}:{}", server.host, server.port);
    let mut lines = BufReader::new(answer.into_body().into_reader());
    let mut data = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Ok(Stop::Ended);
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if let Some(d) = l.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        } else if l.is_empty() && !data.is_empty() {
            let event = crate::json::from_str::<Value>(&data).ok().and_then(|v| reducer.reduce(&v));
            data.clear();
            if let Some(e) = event
                && !send(FromServer::Event(e))
            {
                return Ok(Stop::Relay);
            }
        }
    }
}

/// Turns OpenCode's bus events into [`ServerEvent`]s, dropping repeats (a running `task` part is updated
/// many times; `busy` is announced again at every step).
#[derive(Default)]
pub struct Reducer {
    children: HashSet<(String, String)>,
    status: HashMap<String, bool>,
    connected: bool,
    steps: crate::adapters::opencode::usage::StepReducer,
}

impl Reducer {
    /// One event of `/global/event` (`{directory, payload}`) or of a directory's `/event` (the payload).
    pub fn reduce(&mut self, v: &Value) -> Option<ServerEvent> {
        let payload = v.get("payload").unwrap_or(v);
        let props = payload.get("properties")?;
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        match payload.get("type")?.as_str()? {
            "message.part.updated" => {
                let part = props.get("part")?;
                if part.get("type")?.as_str()? != "tool" || part.get("tool")?.as_str()? != "task" {
                    return None;
                }
                let child = part.pointer("/state/metadata/sessionId").and_then(Value::as_str)?.to_owned();
                let (session, call) = (s(part, "sessionID")?, s(part, "callID")?);
                self.children.insert((call.clone(), child.clone())).then_some(ServerEvent::TaskChild {
                    session,
                    call,
                    child,
                })
            }
            "session.status" if props.pointer("/status/type").and_then(Value::as_str) == Some("retry") => {
                let session = s(props, "sessionID")?;
                self.status.insert(session.clone(), true);
                let status = props.get("status")?;
                let at_ms = jiff::Timestamp::now().as_millisecond().max(0) as u64;
                let next = status.get("next").and_then(Value::as_f64).filter(|n| n.is_finite() && *n >= 0.0);
                Some(ServerEvent::Retry {
                    session,
                    attempt: status.get("attempt").and_then(Value::as_u64).unwrap_or(0),
                    message: s(status, "message").unwrap_or_default(),
                    at_ms,
                    wait_ms: next.map(|n| (n.min(u64::MAX as f64) as u64).saturating_sub(at_ms)),
                })
            }
            "session.error" => {
                let u = crate::adapters::opencode::failure::upstream_of(props.get("error")?);
                Some(ServerEvent::Failed {
                    session: s(props, "sessionID")?,
                    name: u.name,
                    message: u.message,
                    status: u.status,
                    code: u.code,
                })
            }
            "session.status" => {
                let session = s(props, "sessionID")?;
                let busy = props.pointer("/status/type").and_then(Value::as_str)? != "idle";
                (self.status.insert(session.clone(), busy) != Some(busy))
                    .then_some(ServerEvent::Status { session, busy })
            }
            "permission.asked" => Some(ServerEvent::Asked {
                id: s(props, "id")?,
                session: s(props, "sessionID")?,
                permission: s(props, "permission").unwrap_or_default(),
                call: props.get("tool").and_then(|t| s(t, "callID")),
                metadata: props.get("metadata").cloned().unwrap_or(Value::Null),
                directory: s(v, "directory").unwrap_or_default(),
            }),
            "message.updated" => self.steps.reduce(props),
            "session.compacted" => Some(ServerEvent::Compacted { session: s(props, "sessionID")? }),
            "permission.replied" => {
                Some(ServerEvent::Replied { session: s(props, "sessionID")?, id: s(props, "requestID")? })
            }
            _ => None,
        }
    }
}

/// Replays: reads [`ServerEvent`]s appended to `path` (one JSON object a line), as the replay player writes
/// them where the live run read them from OpenCode's server. With `took`, after the events of each read a
/// [`FromServer::Read`] with the length of the whole lines read so far.
pub fn tail(path: PathBuf, took: bool, send: impl Fn(FromServer) -> bool + Send + 'static) {
    let spawned = std::thread::Builder::new().name("opencode-events-file".into()).spawn(move || {
        let mut offset = 0u64;
        let mut partial = String::new();
        let mut told = 0u64;
        loop {
            if let Ok(mut f) = std::fs::File::open(&path) {
                use std::io::Seek;
                if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
                    let mut buf = String::new();
                    if let Ok(n) = f.read_to_string(&mut buf) {
                        offset += n as u64;
                        partial.push_str(&buf);
                    }
                }
            }
            while let Some(end) = partial.find('\n') {
                let line: String = partial.drain(..=end).collect();
                if line.trim().is_empty() {
                    continue;
                }
                match crate::json::from_str::<ServerEvent>(&line) {
                    Ok(e) => {
                        if !send(FromServer::Event(e)) {
                            return;
                        }
                    }
                    Err(e) => {
                        // serde's message may quote the line ("unknown variant `…`"): at debug with it.
                        let why = match &e {
                            crate::json::Error::Json(j) => {
                                format!("{:?} error at column {}", j.classify(), j.column())
                            }
                            deep => deep.to_string(),
                        };
                        tracing::warn!(
                            "{}: a line of {} bytes is not an OpenCode server event ({why})",
                            path.display(),
                            line.len(),
                        );
                        tracing::debug!("the line ({e}): {}", line.trim());
                    }
                }
            }
            let whole = offset - partial.len() as u64;
            if took && whole > told {
                told = whole;
                if !send(FromServer::Read(whole)) {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the OpenCode event file reader: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_replays_reader_says_how_far_it_read_after_the_events_of_those_lines() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("events.jsonl");
        let mut f = std::fs::File::create(&path).expect("create");
        let busy = r#"{"type":"session.status","session":"s","busy":true}"#;
        let idle = r#"{"type":"session.status","session":"s","busy":false}"#;
        // A whole line and half of the next: the reader says only the whole one read.
        write!(f, "{busy}\n{}", &idle[..10]).expect("write");
        let (tx, rx) = std::sync::mpsc::channel();
        tail(path, true, move |e| tx.send(e).is_ok());
        let next = || rx.recv_timeout(Duration::from_secs(10)).expect("the reader sends on");
        assert!(matches!(next(), FromServer::Event(ServerEvent::Status { busy: true, .. })));
        assert!(matches!(next(), FromServer::Read(n) if n == busy.len() as u64 + 1));
        writeln!(f, "{}", &idle[10..]).expect("write");
        assert!(matches!(next(), FromServer::Event(ServerEvent::Status { busy: false, .. })));
        assert!(matches!(next(), FromServer::Read(n) if n == (busy.len() + idle.len()) as u64 + 2));
        // Nothing more while nothing is written: no second report of the same length.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    }

    #[test]
    fn the_port_and_host_come_from_the_command_line() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let s = Server::from_args(&args(&["acp", "--hostname", "127.0.0.1", "--port", "4711"])).expect("a server");
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 4711));
        assert_eq!(Server::from_args(&args(&["acp", "--port=99"])).map(|s| s.port), Some(99));
        assert_eq!(Server::from_args(&args(&["acp", "--port", "0.0.0.0"])), None, "not a port");
        assert_eq!(Server::from_args(&args(&["acp", "--port", "0"])), None, "0: OpenCode picks, the shim cannot know");
        assert_eq!(Server::from_args(&args(&["acp"])), None);
        let any = Server::from_args(&args(&["acp", "--hostname", "0.0.0.0", "--port", "5"])).expect("a server");
        assert_eq!(any.host, "127.0.0.1", "listening everywhere includes loopback");
    }

    /// A one-connection HTTP server on loopback: hands back the request it got, answers with `answer`.
    fn serve_once(answer: impl Into<String>) -> (Server, std::thread::JoinHandle<String>) {
        let answer = answer.into();
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let served = std::thread::spawn(move || {
            use std::io::Write;
            let (mut conn, _) = listener.accept().expect("accept");
            let mut head = String::new();
            let mut r = BufReader::new(conn.try_clone().expect("clone"));
            while r.read_line(&mut head).expect("read") > 2 && !head.ends_with("\r\n\r\n") {}
            conn.write_all(answer.as_bytes()).expect("answer");
            head
        });
        (Server { host: "127.0.0.1".into(), port, auth: Some("Basic b3BlbmNvZGU6cHc=".into()) }, served)
    }

    #[test]
    fn the_event_stream_is_read_over_http_with_chunks_and_auth() {
        let status = r#"{"directory":"/w","payload":{"type":"session.status","properties":{"sessionID":"ses_p","status":{"type":"busy"}}}}"#;
        let sse = format!("data: {status}\n\n");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
            10,
            &sse[..10],
            sse.len() - 10,
            &sse[10..]
        );
        let (server, served) = serve_once(answer);
        let got = std::sync::Mutex::new(Vec::new());
        let stop = stream_events(&server, &mut Reducer::default(), &|e| {
            got.lock().expect("lock").push(format!("{e:?}"));
            true
        });
        assert!(matches!(stop, Ok(Stop::Ended)));
        assert_eq!(*got.lock().expect("lock"), [r#"Event(Status { session: "ses_p", busy: true })"#]);
        let head = served.join().expect("server");
        assert!(head.starts_with("GET /global/event HTTP/1.1"), "{head}");
        assert!(head.to_ascii_lowercase().contains("authorization: basic b3blbmnvzgu6chc="), "{head}");
    }

    #[test]
    fn a_permission_answer_goes_to_the_encoded_path() {
        let (server, served) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ntrue");
        server.reply_permission("/w d/ü", "per 1", "once").expect("answered");
        let head = served.join().expect("server");
        assert!(head.starts_with("POST /permission/per%201/reply?directory=%2Fw%20d%2F%C3%BC HTTP/1.1"), "{head}");
        let (server, _served) = serve_once("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(server.reply_permission("/w", "per_2", "once"), Err("HTTP 404".into()));
    }

    #[test]
    fn a_steering_message_is_posted_and_deleted_on_encoded_paths() {
        let body = r#"{"info":{"id":"msg_1","role":"user"},"parts":[]}"#;
        let (server, served) = serve_once(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ));
        let sent = json!({"noReply": true, "parts": [{"type": "text", "text": "x"}]});
        assert_eq!(server.post_message("/w d", "ses 1", &sent), Ok("msg_1".into()));
        let head = served.join().expect("server");
        assert!(head.starts_with("POST /session/ses%201/message?directory=%2Fw%20d HTTP/1.1"), "{head}");
        assert!(head.to_ascii_lowercase().contains("authorization: basic"), "{head}");
        // An answer that does not name the message, or is no JSON, or an HTTP error: no message.
        for answer in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n1e400",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nnope{",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
        ] {
            let (server, _served) = serve_once(answer);
            assert!(server.post_message("/w", "ses_1", &sent).is_err(), "{answer}");
        }
        let (server, served) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ntrue");
        server.delete_message("/w", "ses_1", "msg/1").expect("deleted");
        let head = served.join().expect("server");
        assert!(head.starts_with("DELETE /session/ses%5F1/message/msg%2F1?directory=%2Fw HTTP/1.1"), "{head}");
        let (server, _served) = serve_once("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(server.delete_message("/w", "ses_1", "msg_1"), Err("HTTP 400".into()));
    }

    #[test]
    fn an_assistant_message_is_a_step_with_what_steering_needs() {
        let mut r = Reducer::default();
        let updated = |role: &str, id: &str| {
            json!({"directory":"/w","payload":{"type":"message.updated","properties":{"sessionID":"ses_p","info":{
                "id":id,"sessionID":"ses_p","role":role,"parentID":"msg_u","agent":"build","mode":"build",
                "providerID":"fake","modelID":"fake-model","time":{"created":1}}}}})
        };
        let step = ServerEvent::Step(Box::new(crate::adapters::opencode::usage::Step {
            session: "ses_p".into(),
            message: "msg_a".into(),
            created_ms: 1,
            completed_ms: None,
            tokens: None,
            output: None,
            summary: false,
            provider: Some("fake".into()),
            model: Some("fake-model".into()),
            parent: Some("msg_u".into()),
            agent: Some("build".into()),
            variant: None,
        }));
        assert_eq!(r.reduce(&updated("assistant", "msg_a")), Some(step));
        assert_eq!(r.reduce(&updated("assistant", "msg_a")), None, "updated again as it runs: said once");
        assert_eq!(r.reduce(&updated("user", "msg_u2")), None);
        let mode_only = json!({"payload":{"type":"message.updated","properties":{"info":{"id":"msg_b",
            "sessionID":"ses_p","role":"assistant","mode":"plan","variant":"high","time":{"created":2}}}}});
        let Some(ServerEvent::Step(s)) = r.reduce(&mode_only) else { panic!("a step") };
        assert_eq!((s.parent, s.agent.as_deref(), s.variant.as_deref()), (None, Some("plan"), Some("high")));
        let no_time = json!({"payload":{"type":"message.updated","properties":{"info":{"id":"msg_c",
            "sessionID":"ses_p","role":"assistant","parentID":"msg_u"}}}});
        assert_eq!(r.reduce(&no_time), None);
    }

    /// Shapes as OpenCode 1.18.33 sent them on `/global/event` (trimmed).
    #[test]
    fn bus_events_reduce_to_what_the_layer_needs_once() {
        let mut r = Reducer::default();
        let part = |meta: Value| {
            json!({"directory":"/w","payload":{"type":"message.part.updated","properties":{"sessionID":"ses_p",
                "part":{"type":"tool","tool":"task","callID":"call_26","sessionID":"ses_p",
                "state":{"status":"running","title":"worker_1 task","metadata":meta}}}}})
        };
        assert_eq!(r.reduce(&part(json!({}))), None, "no child yet");
        let named = part(json!({"parentSessionId":"ses_p","sessionId":"ses_c"}));
        let child = ServerEvent::TaskChild { session: "ses_p".into(), call: "call_26".into(), child: "ses_c".into() };
        assert_eq!(r.reduce(&named), Some(child));
        assert_eq!(r.reduce(&named), None, "said once");
        let status = |t: &str| json!({"directory":"/w","payload":{"type":"session.status","properties":{"sessionID":"ses_p","status":{"type":t}}}});
        assert_eq!(r.reduce(&status("busy")), Some(ServerEvent::Status { session: "ses_p".into(), busy: true }));
        assert_eq!(r.reduce(&status("busy")), None);
        assert_eq!(r.reduce(&status("idle")), Some(ServerEvent::Status { session: "ses_p".into(), busy: false }));
        let asked = json!({"directory":"/w","payload":{"type":"permission.asked","properties":{"id":"per_1",
            "sessionID":"ses_c","permission":"bash","patterns":["echo hi"],"metadata":{"command":"echo hi"},
            "always":["echo *"],"tool":{"messageID":"msg_1","callID":"call_28"}}}});
        assert_eq!(
            r.reduce(&asked),
            Some(ServerEvent::Asked {
                id: "per_1".into(),
                session: "ses_c".into(),
                permission: "bash".into(),
                call: Some("call_28".into()),
                metadata: json!({"command":"echo hi"}),
                directory: "/w".into()
            })
        );
        let replied = json!({"payload":{"type":"permission.replied","properties":{"sessionID":"ses_c","requestID":"per_1","reply":"once"}}});
        assert_eq!(r.reduce(&replied), Some(ServerEvent::Replied { session: "ses_c".into(), id: "per_1".into() }));
        let other = json!({"payload":{"type":"message.part.delta","properties":{"sessionID":"ses_p","delta":"x"}}});
        assert_eq!(r.reduce(&other), None);
        assert_eq!(r.reduce(&json!("garbage")), None);
    }

    #[test]
    fn events_round_trip_through_the_replay_file_format() {
        let e = ServerEvent::Status { session: "s".into(), busy: false };
        let line = serde_json::to_string(&e).expect("json");
        assert_eq!(line, r#"{"type":"session.status","session":"s","busy":false}"#);
        assert_eq!(serde_json::from_str::<ServerEvent>(&line).expect("back"), e);
    }
}
