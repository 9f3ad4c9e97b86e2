//! OpenCode's own HTTP server as a side channel (`opencode acp` always starts one, see `main.rs`).
//!
//! OpenCode's ACP bridge forwards only events of sessions it knows, and a `task` call names its child
//! session over ACP only when it completes. The server's event stream (`GET /global/event`, SSE) says more,
//! as it happens (checked live on 1.18.33):
//! - `message.part.updated` of the `task` tool part carries `state.metadata.sessionId` (the child) as soon
//!   as the child session exists, before the child's first model request;
//! - `session.status` says when a session goes `busy` and `idle` (the end of any run, OpenCode's own
//!   follow-up turns included);
//! - `permission.asked` / `permission.replied` name every permission request, a child's included.
//!
//! The reader reduces these to [`ServerEvent`]s and hands them to the activity layer; it also answers a
//! permission request through `POST /permission/{id}/reply` when the layer asks it to. For replays the
//! events come from a file instead (one [`ServerEvent`] per line, see [`tail`]).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

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
}

/// What the reader hands the layer.
#[derive(Debug)]
pub enum FromServer {
    Event(ServerEvent),
    /// The event stream was lost: what it said about running sessions may be stale (never in a replay).
    Lost,
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
            format!("Basic {}", base64(format!("{}:{password}", user.as_deref().unwrap_or("opencode")).as_bytes()))
        });
        Some(Server { host, port, auth })
    }

    fn head(&self, method: &str, path: &str) -> String {
        let mut h = format!("{method} {path} HTTP/1.1\r\nHost: {}:{}\r\n", self.host, self.port);
        if let Some(auth) = &self.auth {
            h.push_str(&format!("Authorization: {auth}\r\n"));
        }
        h
    }

    /// Answers permission request `id` (`once`, `always` or `reject`); the error says why it failed.
    pub fn reply_permission(&self, directory: &str, id: &str, reply: &str) -> Result<(), String> {
        let body = serde_json::json!({ "reply": reply }).to_string();
        let path = format!("/permission/{}/reply?directory={}", percent(id), percent(directory));
        let mut req = self.head("POST", &path);
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        let mut stream = self.connect(Duration::from_secs(10))?;
        stream.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut r = BufReader::new(stream);
        let (status, _) = read_head(&mut r)?;
        if (200..300).contains(&status) { Ok(()) } else { Err(format!("HTTP {status}")) }
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream, String> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        Ok(stream)
    }
}

/// Reads OpenCode's event stream until the process ends, reconnecting when it drops; `send` gets each
/// reduced event (false: the relay stopped, so the reader stops too).
pub fn follow(server: Server, send: impl Fn(FromServer) -> bool + Send + 'static) {
    let spawned = std::thread::Builder::new().name("opencode-events".into()).spawn(move || {
        let mut reducer = Reducer::default();
        let mut connected_once = false;
        loop {
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
    // one that sends no head within seconds and try again.
    let mut stream = server.connect(Duration::from_secs(3))?;
    let mut req = server.head("GET", "/global/event");
    req.push_str("Accept: text/event-stream\r\n\r\n");
    stream.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(stream);
    let (status, chunked) = read_head(&mut r)?;
    if status != 200 {
        return Err(format!("GET /global/event: HTTP {status}"));
    }
    // OpenCode sends a heartbeat every ten seconds: a minute of silence is a dead connection.
    r.get_ref().set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    reducer.connected = true;
    tracing::debug!("reading OpenCode's events at {}:{}", server.host, server.port);
    let body: Box<dyn Read> = if chunked { Box::new(Chunked { inner: r, left: 0, done: false }) } else { Box::new(r) };
    let mut lines = BufReader::new(body);
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
            let event = serde_json::from_str::<Value>(&data).ok().and_then(|v| reducer.reduce(&v));
            data.clear();
            if let Some(e) = event
                && !send(FromServer::Event(e))
            {
                return Ok(Stop::Relay);
            }
        }
    }
}

/// Status line and headers; returns the status and whether the body is chunked.
fn read_head(r: &mut impl BufRead) -> Result<(u16, bool), String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("no HTTP status line")?;
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("the headers did not end".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, chunked));
        }
        if let Some((k, v)) = l.split_once(':')
            && k.trim().eq_ignore_ascii_case("transfer-encoding")
            && v.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
}

/// An HTTP/1.1 chunked body as a plain byte stream.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        while self.left == 0 {
            if self.done {
                return Ok(0);
            }
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                return Ok(0);
            }
            let size = line.trim().split(';').next().unwrap_or("");
            if size.is_empty() {
                continue; // the CRLF after a chunk's data
            }
            self.left = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
            if self.left == 0 {
                self.done = true;
            }
        }
        let n = {
            let want = buf.len().min(self.left);
            self.inner.read(&mut buf[..want])?
        };
        if n == 0 {
            return Ok(0);
        }
        self.left -= n;
        Ok(n)
    }
}

/// Turns OpenCode's bus events into [`ServerEvent`]s, dropping repeats (a running `task` part is updated
/// many times; `busy` is announced again at every step).
#[derive(Default)]
pub struct Reducer {
    children: HashSet<(String, String)>,
    status: HashMap<String, bool>,
    connected: bool,
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
            "permission.replied" => {
                Some(ServerEvent::Replied { session: s(props, "sessionID")?, id: s(props, "requestID")? })
            }
            _ => None,
        }
    }
}

/// Replays: reads [`ServerEvent`]s appended to `path` (one JSON object a line), as the replay player writes
/// them where the live run read them from OpenCode's server.
pub fn tail(path: PathBuf, send: impl Fn(FromServer) -> bool + Send + 'static) {
    let spawned = std::thread::Builder::new().name("opencode-events-file".into()).spawn(move || {
        let mut offset = 0u64;
        let mut partial = String::new();
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
                match serde_json::from_str::<ServerEvent>(&line) {
                    Ok(e) => {
                        if !send(FromServer::Event(e)) {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!("{}: not an OpenCode server event ({e}): {}", path.display(), line.trim()),
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the OpenCode event file reader: {e}");
    }
}

fn percent(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn base64_and_percent_encoding() {
        assert_eq!(base64(b"opencode:pw"), "b3BlbmNvZGU6cHc=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(percent("/w d/ü"), "/w%20d/%C3%BC");
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
    fn a_chunked_body_reads_as_its_bytes() {
        let wire = b"5\r\ndata:\r\n5;x=1\r\n {}\n\n\r\n0\r\n\r\n";
        let mut body = String::new();
        Chunked { inner: &wire[..], left: 0, done: false }.read_to_string(&mut body).expect("read");
        assert_eq!(body, "data: {}\n\n");
    }

    #[test]
    fn events_round_trip_through_the_replay_file_format() {
        let e = ServerEvent::Status { session: "s".into(), busy: false };
        let line = serde_json::to_string(&e).expect("json");
        assert_eq!(line, r#"{"type":"session.status","session":"s","busy":false}"#);
        assert_eq!(serde_json::from_str::<ServerEvent>(&line).expect("back"), e);
    }
}
