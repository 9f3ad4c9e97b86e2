//! OpenCode's own HTTP server, as coda-opencode uses it (`adapters/opencode/server.rs`, `summarize.rs`, `calls.rs`),
//! answered from the CLI model: `GET /session/status`, `POST /session/{id}/summarize` (compaction), `POST
//! /session/{id}/message` and `DELETE …/message/{m}` (steering), `POST /permission/{id}/reply`. The event stream
//! (`GET /global/event`) is held open and says nothing: the shim's reader thread would hand events in at a real
//! time, not a virtual one, so a run would not be a function of its seed (docs/simulation.md, "Left out").
//!
//! The layers run these calls as jobs, which a [`coda_shim::relay::testing::Pair`] runs on the relay's own thread:
//! the relay waits for each answer, so it comes at one virtual instant, and a run stays deterministic.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::cli::Model;

pub struct Server {
    pub port: u16,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// What the server was asked, for the transcript.
pub type Log = Arc<Mutex<Vec<String>>>;

impl Server {
    pub fn start(model: Arc<Mutex<Model>>, log: Log) -> std::io::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stop2, streams2) = (stop.clone(), streams.clone());
        let accept = std::thread::Builder::new().name("sim-opencode-server".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                if let Ok(c) = conn.try_clone() {
                    streams2.lock().expect("lock").push(c);
                }
                let (model, log, stop) = (model.clone(), log.clone(), stop2.clone());
                let _ = std::thread::Builder::new().name("sim-opencode-conn".into()).spawn(move || {
                    let _ = serve(conn, &model, &log, &stop);
                });
            }
        })?;
        Ok(Server { port, stop, streams, accept: Some(accept) })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in self.streams.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wakes the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, model: &Mutex<Model>, log: &Mutex<Vec<String>>, stop: &AtomicBool) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut head = String::new();
        if reader.read_line(&mut head)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length.min(1 << 20)];
        reader.read_exact(&mut body)?;
        let mut words = head.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let path = target.split('?').next().unwrap_or("");
        if method == "GET" && path == "/global/event" {
            out.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n")?;
            out.flush()?;
            // Nothing is said; a comment now and then keeps the reader's 60 s read timeout away.
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                if out.write_all(b": quiet\n\n").and_then(|()| out.flush()).is_err() {
                    return Ok(());
                }
            }
            return Ok(());
        }
        let (status, answer) = route(method, path, model);
        let now = model.lock().expect("lock").now;
        log.lock().expect("lock").push(format!("{now} HTTP {method} {path} -> {status} {answer}"));
        let reply = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        out.write_all(reply.as_bytes())?;
        out.flush()?;
    }
}

fn route(method: &str, path: &str, model: &Mutex<Model>) -> (u16, String) {
    let mut m = model.lock().expect("lock");
    if m.dead {
        return (503, "{}".into());
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let decode = |s: &str| s.replace("%5F", "_").replace("%2D", "-");
    match (method, parts.as_slice()) {
        ("GET", ["session", "status"]) => {
            let busy: serde_json::Map<String, serde_json::Value> =
                m.running_sessions().into_iter().map(|s| (s, json!({"type": "busy"}))).collect();
            (200, serde_json::Value::Object(busy).to_string())
        }
        ("POST", ["session", id, "summarize"]) => {
            let session = decode(id);
            if m.summarize(&session) { (200, "true".into()) } else { (500, r#"{"name":"UnknownError"}"#.into()) }
        }
        ("POST", ["session", id, "message"]) => {
            let session = decode(id);
            let now = m.now;
            m.steering(&session, "", None, now);
            (200, json!({"info": {"id": format!("msg_steer{now}")}, "parts": []}).to_string())
        }
        ("DELETE", ["session", _, "message", _]) => (200, "true".into()),
        ("POST", ["permission", _, "reply"]) => (200, "true".into()),
        _ => (404, "{}".into()),
    }
}
