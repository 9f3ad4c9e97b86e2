//! A scripted fake model server for the live tests.
//!
//! Serves on 127.0.0.1 (OS-chosen port) the streaming APIs the wrapped CLIs call:
//! OpenAI chat completions with SSE (Kimi, Grok, OpenCode) and the OpenAI Responses API with SSE
//! (Codex). Any model name and any API key are accepted. Every request is recorded.
//!
//! What the "model" answers is chosen by markers in the latest user text of the request:
//!
//! | marker | answer |
//! | --- | --- |
//! | (none) | plain text |
//! | `[[text:T]]` | plain text `T` (also the closing text after a tool result) |
//! | `[[bg:CMD]]` | a background shell tool call running `CMD` |
//! | `[[sh:CMD]]` | a foreground shell tool call running `CMD` |
//! | `[[subagent:PROMPT]]`, `[[subagent:NAME\|PROMPT]]` | a subagent spawn (background where the CLI offers the choice) |
//! | `[[subagent-fg:PROMPT]]` | a foreground subagent spawn |
//! | `[[resume:ID\|PROMPT]]` | a follow-up to subagent `ID` (`last`: the latest id a tool result named) |
//! | `[[tool:NAME\|JSON]]` | a call of any tool the request offers, with these arguments; `$last_task` in JSON becomes the latest `task_id: X` a tool result named (Kimi's TaskStop, WaitFor) |
//! | `[[error:KIND]]` | an HTTP error: `429-usage`, `429-rate`, `500`, `502` (a proxy's HTML page), `503`, `529` (overloaded), `401`, or `reset` (the connection closed without an answer); `KIND~S` answers with `Retry-After: S` (seconds) instead of the quick retry; `KIND*N` fails only the first N attempts |
//! | `[[delay:MS]]` | wait `MS` milliseconds before answering (combine with any other marker) |
//!
//! Several tool markers in one prompt become parallel tool calls. Markers may nest, so a subagent's
//! prompt can carry its own markers: `[[subagent:[[bg:sleep 2]]]]`. When the request ends with a tool
//! result the model answers plain text, so every turn ends. Title and summary side requests get a
//! short title (as the forced tool call or JSON object when the request asks for one). A marker whose
//! tool the request does not offer is answered with a plain text saying so, never with a call of a
//! tool the CLI does not have. Retryable errors carry `retry-after-ms: 100` so CLIs that honour it
//! (OpenCode) give up quickly (unless `~S` asks for a real wait); Grok ignores it and retries 5xx fifteen times
//! with backoff.
//!
//! Kimi joins the prompts of failed turns into one user message; prompts seen before are dropped from
//! its start, so only the newest prompt's markers count.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// Text of a plain answer when no marker asks for anything else.
pub const DEFAULT_TEXT: &str = "Hello from the fake model.";
/// Text answered after a tool result when the prompt has no `[[text:…]]` marker.
pub const AFTER_TOOL_TEXT: &str = "The tool call is done.";
/// Text answered to title and summary side requests.
pub const SIDE_TEXT: &str = "Fake title";

/// Which API a request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Responses,
    Models,
    Other,
}

/// Who a model request came from, as far as the request itself tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The main agent of a session.
    Main,
    /// A subagent (a child thread, task or agent).
    Subagent,
    /// A side request: session title, turn summary and the like.
    Side,
    /// Not a model request (model list, unknown path).
    None,
}

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

/// Options for [`FakeModel::start_with`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Print one line per request to stderr.
    pub log_requests: bool,
    /// Also write each request as `<seq>.json` into this directory.
    pub dump_dir: Option<PathBuf>,
}

struct Shared {
    options: Options,
    requests: Mutex<Vec<RecordedRequest>>,
    seq: AtomicU64,
    /// Every prompt text seen, with how often it was answered with an error (`[[error:KIND*N]]`).
    prompts: Mutex<HashMap<String, u32>>,
}

/// The running server. Dropping it stops the server.
pub struct FakeModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeModel {
    /// Starts a quiet server on 127.0.0.1 with an OS-chosen port.
    pub fn start() -> FakeModel {
        Self::start_with(Options::default())
    }

    /// Starts a server with options. Runs on its own thread, so it works from sync and async tests.
    pub fn start_with(options: Options) -> FakeModel {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("local address");
        if let Some(dir) = &options.dump_dir {
            let _ = std::fs::create_dir_all(dir);
        }
        let shared = Arc::new(Shared {
            options,
            requests: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            prompts: Mutex::new(HashMap::new()),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("fake-model".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(serve(listener, serving, stopped));
            })
            .expect("spawn fake-model thread");
        FakeModel { addr, shared, stop: Some(stop), thread: Some(thread) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL every CLI config wants.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// All requests received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Model requests only (chat completions and Responses API), in arrival order.
    pub fn model_requests(&self) -> Vec<RecordedRequest> {
        self.requests().into_iter().filter(|r| matches!(r.api, Api::ChatCompletions | Api::Responses)).collect()
    }

    /// Polls until `done` holds for the recorded requests or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&[RecordedRequest]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.requests()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, shared: Arc<Shared>, mut stopped: tokio::sync::oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("fake-model: cannot listen: {err}");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    eprintln!("fake-model: accept failed: {err}");
                    continue;
                }
            },
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(Arc::clone(&shared), req));
            // Errors here are peers hanging up mid-request; nothing to do about them.
            let _ = http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut headers = BTreeMap::new();
    for (name, value) in req.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v: &mut String| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    let bytes = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let body = parse_body(&bytes);
    let api = classify_api(&method, &path);
    let origin = classify_origin(api, &body);
    let answer = match shared.prompts.lock() {
        Ok(mut prompts) => answer(api, origin, &method, &body, &mut prompts),
        Err(_) => answer(api, origin, &method, &body, &mut HashMap::new()),
    };
    let seq = shared.seq.fetch_add(1, Ordering::SeqCst) + 1;
    let record = RecordedRequest {
        seq,
        method: method.to_string(),
        path,
        headers,
        body,
        api,
        origin,
        reply: answer.summary.clone(),
    };
    if shared.options.log_requests {
        eprintln!("{}", summary_line(&record));
    }
    if let Some(dir) = &shared.options.dump_dir {
        let dump = json!({
            "seq": record.seq, "method": record.method, "path": record.path, "headers": record.headers,
            "origin": format!("{:?}", record.origin), "reply": record.reply, "body": record.body,
        });
        let text = serde_json::to_string_pretty(&dump).unwrap_or_default();
        let _ = std::fs::write(dir.join(format!("{seq:04}.json")), text);
    }
    if let Ok(mut requests) = shared.requests.lock() {
        requests.push(record);
    }
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    if answer.reset {
        // A service error makes hyper drop the connection without writing a response.
        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake model: reset"));
    }
    Ok(answer.response)
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

fn parse_body(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| json!({ "_raw": String::from_utf8_lossy(bytes) }))
}

fn classify_api(method: &Method, path: &str) -> Api {
    if *method == Method::POST && path.ends_with("/chat/completions") {
        Api::ChatCompletions
    } else if *method == Method::POST && path.ends_with("/responses") {
        Api::Responses
    } else if *method == Method::GET && (path.ends_with("/models") || path.contains("/models/")) {
        Api::Models
    } else {
        Api::Other
    }
}

// ---------------------------------------------------------------------------------------------
// The conversation, seen the same way for both APIs.

#[derive(Clone, Debug, PartialEq)]
enum Item {
    System(String),
    User(String),
    Assistant,
    ToolCall,
    /// The text the tool returned.
    ToolResult(String),
}

/// Flattens a chat-completions `messages` array or a Responses API `input` into items.
fn conversation(api: Api, body: &Value) -> Vec<Item> {
    let mut items = Vec::new();
    match api {
        Api::ChatCompletions => {
            for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
                let role = message.get("role").and_then(Value::as_str).unwrap_or("");
                let text = content_text(message.get("content"));
                match role {
                    "system" | "developer" => items.push(Item::System(text)),
                    "user" => items.push(Item::User(text)),
                    "assistant" => {
                        items.push(Item::Assistant);
                        if message.get("tool_calls").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
                            items.push(Item::ToolCall);
                        }
                    }
                    "tool" | "function" => items.push(Item::ToolResult(text)),
                    _ => {}
                }
            }
        }
        Api::Responses => {
            if let Some(instructions) = body.get("instructions").and_then(Value::as_str) {
                items.push(Item::System(instructions.to_string()));
            }
            let input = body.get("input");
            if let Some(text) = input.and_then(Value::as_str) {
                items.push(Item::User(text.to_string()));
            }
            for item in input.and_then(Value::as_array).into_iter().flatten() {
                let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "message" => match role {
                        "system" | "developer" => items.push(Item::System(content_text(item.get("content")))),
                        "user" => items.push(Item::User(content_text(item.get("content")))),
                        _ => items.push(Item::Assistant),
                    },
                    // A message from another agent (Codex multi-agent v2): the child's task.
                    "agent_message" => items.push(Item::User(content_text(item.get("content")))),
                    k if k.ends_with("_output") => {
                        let output = item.get("output");
                        let text = output.and_then(Value::as_str).map_or_else(|| content_text(output), str::to_string);
                        items.push(Item::ToolResult(text))
                    }
                    k if k.ends_with("_call") => items.push(Item::ToolCall),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    items
}

/// Text of a message content: a string, or an array of parts with `text` (or `encrypted_content`).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| {
                p.get("text").or_else(|| p.get("encrypted_content")).and_then(Value::as_str).or_else(|| p.as_str())
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Kimi joins the prompts of turns that got no answer (failed, cancelled) into one user message,
/// separated by blank lines; drop the ones seen before so old markers do not fire again.
fn latest_prompt(text: &str, prompts: &mut HashMap<String, u32>) -> String {
    let mut rest = text;
    while let Some(seen) = prompts.keys().find(|p| {
        !p.is_empty() && rest.len() > p.len() && rest.starts_with(p.as_str()) && rest[p.len()..].starts_with("\n\n")
    }) {
        rest = rest[seen.len()..].trim_start_matches('\n');
    }
    let latest = rest.to_string();
    prompts.entry(latest.clone()).or_insert(0);
    latest
}

/// The user's prompt: the last user text after the last non-user item, skipping the context the
/// CLIs append after it (Kimi's date reminder, Codex's environment context).
fn prompt_text(items: &[Item]) -> Option<String> {
    trailing_user_texts(items).into_iter().rev().find(|t| {
        let t = t.trim_start();
        !t.starts_with("<system-reminder>") && !t.starts_with("<environment_context>")
    })
}

/// Texts of the user messages after the last non-user item.
fn trailing_user_texts(items: &[Item]) -> Vec<String> {
    let start = items.iter().rposition(|i| !matches!(i, Item::User(_) | Item::System(_))).map_or(0, |p| p + 1);
    items[start..]
        .iter()
        .filter_map(|i| match i {
            Item::User(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Tools offered by the request.

#[derive(Clone, Debug)]
struct Tool {
    namespace: Option<String>,
    name: String,
    parameters: Value,
}

impl Tool {
    fn qualified(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}.{}", self.name),
            None => self.name.clone(),
        }
    }

    fn has_param(&self, name: &str) -> bool {
        self.parameters.get("properties").and_then(|p| p.get(name)).is_some()
    }
}

/// Tools from chat-completions (`{type:function, function:{name, parameters}}`) or Responses API
/// (`{type:function, name, parameters}`, or a namespace holding `tools`) shapes.
fn offered_tools(body: &Value) -> Vec<Tool> {
    fn collect(tools: &Value, namespace: Option<&str>, out: &mut Vec<Tool>) {
        for tool in tools.as_array().into_iter().flatten() {
            let function = tool.get("function").unwrap_or(tool);
            if let Some(inner) = tool.get("tools") {
                let ns = tool.get("name").and_then(Value::as_str);
                collect(inner, ns.or(namespace), out);
                continue;
            }
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                out.push(Tool {
                    namespace: tool.get("namespace").and_then(Value::as_str).or(namespace).map(str::to_string),
                    name: name.to_string(),
                    parameters: function.get("parameters").cloned().unwrap_or(Value::Null),
                });
            }
        }
    }
    let mut out = Vec::new();
    if let Some(tools) = body.get("tools") {
        collect(tools, None, &mut out);
    }
    out
}

fn find_tool<'a>(tools: &'a [Tool], names: &[&str]) -> Option<&'a Tool> {
    names.iter().find_map(|n| tools.iter().find(|t| t.name == *n))
}

// ---------------------------------------------------------------------------------------------
// Markers.

#[derive(Clone, Debug, PartialEq)]
enum Marker {
    Text(String),
    Bg(String),
    Sh(String),
    Subagent { name: Option<String>, prompt: String, background: bool },
    Resume { target: String, prompt: String },
    Tool { name: String, arguments: String },
    Error { kind: String, times: Option<u32> },
    Delay(u64),
}

/// Finds the top-level `[[name:arg]]` markers in `text`; an argument may hold nested markers.
fn parse_markers(text: &str) -> Vec<Marker> {
    let mut markers = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        let inner_start = start + 2;
        let Some(len) = marker_len(&rest[inner_start..]) else {
            break;
        };
        let inner = &rest[inner_start..inner_start + len];
        if let Some(marker) = marker_from(inner) {
            markers.push(marker);
        }
        rest = &rest[inner_start + len + 2..];
    }
    markers
}

/// Length of a marker body up to its matching `]]`, counting nested `[[`.
fn marker_len(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match &bytes[i..i + 2] {
            b"[[" => {
                depth += 1;
                i += 2;
            }
            b"]]" if depth == 0 => return Some(i),
            b"]]" => {
                depth -= 1;
                i += 2;
            }
            _ => i += 1,
        }
    }
    None
}

fn marker_from(inner: &str) -> Option<Marker> {
    let (name, arg) = inner.split_once(':').unwrap_or((inner, ""));
    let arg = arg.trim().to_string();
    Some(match name.trim() {
        "text" => Marker::Text(arg),
        "bg" => Marker::Bg(arg),
        "sh" => Marker::Sh(arg),
        "subagent" | "subagent-fg" => {
            let (name_part, prompt) = split_top_level_bar(&arg);
            let name = name_part.filter(|n| is_agent_name(n)).map(str::to_string);
            let prompt = if name.is_some() { prompt.to_string() } else { arg.clone() };
            Marker::Subagent { name, prompt, background: name_is("subagent", inner) }
        }
        "resume" => {
            let (target, prompt) = split_top_level_bar(&arg);
            Marker::Resume { target: target.unwrap_or("").trim().to_string(), prompt: prompt.trim().to_string() }
        }
        "tool" => {
            let (name, arguments) = match split_top_level_bar(&arg) {
                (Some(name), arguments) => (name, arguments),
                (None, name) => (name, ""),
            };
            Marker::Tool { name: name.trim().to_string(), arguments: arguments.trim().to_string() }
        }
        "error" => match arg.split_once('*') {
            Some((kind, times)) => Marker::Error { kind: kind.trim().into(), times: times.trim().parse().ok() },
            None => Marker::Error { kind: arg, times: None },
        },
        "delay" => Marker::Delay(arg.parse().unwrap_or(0)),
        _ => return None,
    })
}

fn name_is(name: &str, inner: &str) -> bool {
    inner.split_once(':').map_or(inner, |(n, _)| n).trim() == name
}

fn is_agent_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 40 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Splits `a|b` at the first `|` outside nested markers; `(None, s)` when there is none.
fn split_top_level_bar(s: &str) -> (Option<&str>, &str) {
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"[[") {
            depth += 1;
            i += 2;
        } else if bytes[i..].starts_with(b"]]") {
            depth = depth.saturating_sub(1);
            i += 2;
        } else if bytes[i] == b'|' && depth == 0 {
            return (Some(&s[..i]), &s[i + 1..]);
        } else {
            i += 1;
        }
    }
    (None, s)
}

// ---------------------------------------------------------------------------------------------
// Who is asking.

/// Tells main, subagent and side requests apart from the request body alone.
fn classify_origin(api: Api, body: &Value) -> Origin {
    if !matches!(api, Api::ChatCompletions | Api::Responses) {
        return Origin::None;
    }
    let items = conversation(api, body);
    if is_side_request(body, &items) {
        return Origin::Side;
    }
    if is_subagent_request(api, body) {
        return Origin::Subagent;
    }
    Origin::Main
}

/// Phrases that open the CLIs' title and summary requests.
const SIDE_PHRASES: &[&str] = &[
    "generate a very short title",  // Codex
    "app-generated request",        // Codex
    "you are a title generator",    // OpenCode
    "generating the session title", // Grok
    "ultra-short dashboard line",   // Grok turn summary
];

fn is_side_request(body: &Value, items: &[Item]) -> bool {
    // Without tools the model can only write text: titles, summaries, compaction.
    if offered_tools(body).is_empty() || forced_tool(body).is_some() {
        return true;
    }
    let mut texts: Vec<&str> = items
        .iter()
        .filter_map(|i| match i {
            Item::System(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let users = trailing_user_texts(items);
    texts.extend(users.iter().map(String::as_str));
    texts.iter().any(|t| {
        let lower = t.to_lowercase();
        SIDE_PHRASES.iter().any(|p| lower.contains(p))
    })
}

/// The function a chat request forces with `tool_choice` (Grok's session title does).
fn forced_tool(body: &Value) -> Option<&str> {
    body.get("tool_choice")?.get("function")?.get("name")?.as_str()
}

/// A title or summary: the forced tool called with sample arguments, JSON when a schema is asked
/// for, else short text.
fn side_reply(body: &Value) -> Reply {
    if let Some(name) = forced_tool(body) {
        let tools = offered_tools(body);
        if let Some(tool) = tools.iter().find(|t| t.name == name) {
            let call = Call { namespace: None, name: tool.name.clone(), arguments: sample(&tool.parameters) };
            return Reply::Calls(vec![call]);
        }
    }
    let schema = body.pointer("/text/format/schema").or_else(|| body.pointer("/response_format/json_schema/schema"));
    match schema {
        Some(schema) => Reply::Text(sample(schema).to_string()),
        None => Reply::Text(SIDE_TEXT.into()),
    }
}

/// A value that satisfies a simple JSON schema; strings say [`SIDE_TEXT`].
fn sample(schema: &Value) -> Value {
    let kind = match schema.get("type") {
        Some(Value::Array(kinds)) => kinds.first().and_then(Value::as_str).unwrap_or("string"),
        Some(kind) => kind.as_str().unwrap_or("string"),
        None if schema.get("properties").is_some() => "object",
        None => "string",
    };
    match kind {
        "object" => {
            let mut out = serde_json::Map::new();
            for (key, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
                out.insert(key.clone(), sample(property));
            }
            Value::Object(out)
        }
        "array" => json!([]),
        "boolean" => json!(false),
        "integer" | "number" => json!(0),
        "null" => Value::Null,
        _ => json!(SIDE_TEXT),
    }
}

fn is_subagent_request(api: Api, body: &Value) -> bool {
    if api == Api::Responses {
        if let Some(agent) = turn_metadata(body, "agent_name") {
            return agent != "/root";
        }
        return body
            .get("input")
            .and_then(Value::as_array)
            .is_some_and(|input| input.iter().any(|i| i.get("type").and_then(Value::as_str) == Some("agent_message")));
    }
    // Chat CLIs give subagents a tool set without the spawn tool.
    let tools = offered_tools(body);
    let can_spawn = find_tool(&tools, SPAWN_TOOLS).is_some();
    let can_shell = find_tool(&tools, SHELL_TOOLS).is_some();
    can_shell && !can_spawn
}

/// A field of Codex's `client_metadata["x-codex-turn-metadata"]` (a JSON string).
fn turn_metadata(body: &Value, field: &str) -> Option<String> {
    let raw = body.get("client_metadata")?.get("x-codex-turn-metadata")?.as_str()?;
    let meta: Value = serde_json::from_str(raw).ok()?;
    meta.get(field).and_then(Value::as_str).map(str::to_string)
}

// ---------------------------------------------------------------------------------------------
// What to answer.

/// Shell tools, in order of preference: Codex, Kimi, Grok, OpenCode.
const SHELL_TOOLS: &[&str] = &["exec_command", "Bash", "run_terminal_command", "bash", "shell"];
/// Subagent tools: Codex (v2 and v1), Kimi, Grok, OpenCode.
const SPAWN_TOOLS: &[&str] = &["spawn_agent", "Agent", "spawn_subagent", "task"];
/// Follow-up tools: Codex v2, Codex v1; Kimi, Grok and OpenCode resume through their spawn tool.
const FOLLOWUP_TOOLS: &[&str] = &["followup_task", "send_input"];

#[derive(Clone, Debug, PartialEq)]
enum Reply {
    Text(String),
    Calls(Vec<Call>),
    /// `body` is JSON, or a `Value::String` sent as an HTML page; `retry_after` in seconds (`~S`).
    Error {
        status: u16,
        body: Value,
        retry_after: Option<u64>,
    },
    /// The connection is closed without an answer (`reset`).
    Reset,
}

#[derive(Clone, Debug, PartialEq)]
struct Call {
    namespace: Option<String>,
    name: String,
    arguments: Value,
}

struct Answer {
    response: Response<Full<Bytes>>,
    /// Close the connection instead of answering.
    reset: bool,
    summary: String,
    delay: Duration,
}

fn answer(api: Api, origin: Origin, method: &Method, body: &Value, prompts: &mut HashMap<String, u32>) -> Answer {
    let no_delay = Duration::ZERO;
    match api {
        Api::Models => {
            let models =
                json!({"object":"list","data":[{"id":"fake-model","object":"model","created":0,"owned_by":"fake"}]});
            return Answer {
                response: json_response(200, &models),
                reset: false,
                summary: "model list".into(),
                delay: no_delay,
            };
        }
        Api::Other => {
            if *method == Method::GET {
                return Answer {
                    response: json_response(200, &json!({"ok":true})),
                    reset: false,
                    summary: "ok".into(),
                    delay: no_delay,
                };
            }
            let body = json!({"error":{"message":"fake model: unknown path","type":"invalid_request_error"}});
            return Answer {
                response: json_response(404, &body),
                reset: false,
                summary: "404".into(),
                delay: no_delay,
            };
        }
        _ => {}
    }
    let (reply, delay) = decide(api, origin, body, prompts);
    let summary = describe(&reply);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = body.get("model").and_then(Value::as_str).unwrap_or("fake-model");
    let response = match (&reply, api) {
        (Reply::Error { status, body, retry_after }, _) => {
            let mut response = match body {
                Value::String(page) => html_response(*status, page),
                _ => json_response(*status, body),
            };
            let headers = response.headers_mut();
            match retry_after {
                Some(seconds) => {
                    headers.insert("retry-after", HeaderValue::from(*seconds));
                }
                // Retryable errors ask for a quick retry, so CLIs that retry (Grok, OpenCode) give up fast.
                None if *status == 429 || *status >= 500 => {
                    headers.insert("retry-after-ms", HeaderValue::from_static("100"));
                    headers.insert("retry-after", HeaderValue::from_static("0"));
                }
                None => {}
            }
            response
        }
        (Reply::Reset, _) => json_response(500, &Value::Null),
        (_, Api::Responses) => sse_response(responses_events(&reply)),
        (_, _) if stream => sse_response(chat_events(&reply, model)),
        (_, _) => json_response(200, &chat_completion(&reply, model)),
    };
    Answer { response, reset: reply == Reply::Reset, summary, delay }
}

/// Picks the reply for a model request. `prompts` holds every prompt seen so far, with the number
/// of errors answered to it.
fn decide(api: Api, origin: Origin, body: &Value, prompts: &mut HashMap<String, u32>) -> (Reply, Duration) {
    if origin == Origin::Side {
        return (side_reply(body), Duration::ZERO);
    }
    let items = conversation(api, body);
    let prompt = latest_prompt(&prompt_text(&items).unwrap_or_default(), prompts);
    let markers = parse_markers(&prompt);
    let delay = markers
        .iter()
        .find_map(|m| match m {
            Marker::Delay(ms) => Some(Duration::from_millis(*ms)),
            _ => None,
        })
        .unwrap_or(Duration::ZERO);
    let closing = markers.iter().find_map(|m| match m {
        Marker::Text(t) => Some(t.clone()),
        _ => None,
    });

    if matches!(items.last(), Some(Item::ToolResult(_))) {
        return (Reply::Text(closing.unwrap_or_else(|| AFTER_TOOL_TEXT.into())), delay);
    }
    if let Some((kind, times)) = markers.iter().find_map(|m| match m {
        Marker::Error { kind, times } => Some((kind.as_str(), *times)),
        _ => None,
    }) {
        // `*N` fails only the first N attempts, so a CLI's retry then succeeds.
        let count = prompts.entry(prompt.clone()).or_insert(0);
        if times.is_none_or(|n| *count < n) {
            *count += 1;
            return (error_reply(api, kind), delay);
        }
    }
    let tools = offered_tools(body);
    let mut calls = Vec::new();
    for marker in &markers {
        match call_for(marker, &tools, &items, calls.len()) {
            Ok(Some(call)) => calls.push(call),
            Ok(None) => {}
            Err(why) => return (Reply::Text(format!("fake model: {why}")), delay),
        }
    }
    if !calls.is_empty() {
        return (Reply::Calls(calls), delay);
    }
    (Reply::Text(closing.unwrap_or_else(|| DEFAULT_TEXT.into())), delay)
}

/// The tool call a marker asks for, shaped for the tools this CLI offers.
fn call_for(marker: &Marker, tools: &[Tool], items: &[Item], index: usize) -> Result<Option<Call>, String> {
    let call =
        |tool: &Tool, arguments: Value| Call { namespace: tool.namespace.clone(), name: tool.name.clone(), arguments };
    let missing = |what: &str| format!("no {what} tool offered (tools: {})", tool_list(tools));
    Ok(Some(match marker {
        Marker::Bg(cmd) | Marker::Sh(cmd) => {
            let background = matches!(marker, Marker::Bg(_));
            let tool = find_tool(tools, SHELL_TOOLS).ok_or_else(|| missing("shell"))?;
            call(tool, shell_arguments(tool, cmd, background))
        }
        Marker::Subagent { name, prompt, background } => {
            let tool = find_tool(tools, SPAWN_TOOLS).ok_or_else(|| missing("subagent"))?;
            let name = name.clone().unwrap_or_else(|| format!("worker_{}", index + 1));
            call(tool, spawn_arguments(tool, &name, prompt, *background))
        }
        Marker::Resume { target, prompt } => {
            let last = (target == "last").then(|| last_subagent_id(items)).flatten();
            let target = last.as_deref().unwrap_or(target);
            if let Some(tool) = find_tool(tools, FOLLOWUP_TOOLS) {
                call(tool, followup_arguments(tool, target, prompt))
            } else {
                let tool = find_tool(tools, SPAWN_TOOLS).ok_or_else(|| missing("follow-up"))?;
                call(tool, resume_arguments(tool, target, prompt))
            }
        }
        Marker::Tool { name, arguments } => {
            let tool = tools
                .iter()
                .find(|t| t.name == *name || t.qualified() == *name)
                .ok_or_else(|| missing(&format!("`{name}`")))?;
            let arguments = if arguments.is_empty() {
                json!({})
            } else {
                let arguments = match last_task_id(items) {
                    Some(task) if arguments.contains(LAST_TASK) => arguments.replace(LAST_TASK, &task),
                    _ => arguments.clone(),
                };
                serde_json::from_str(&arguments).map_err(|e| format!("bad JSON for `{name}`: {e}"))?
            };
            call(tool, arguments)
        }
        Marker::Text(_) | Marker::Error { .. } | Marker::Delay(_) => return Ok(None),
    }))
}

/// The id of the latest subagent named in a tool result, for `[[resume:last|…]]`:
/// Grok `subagent_id: X`, Kimi `agent_id: agent-N`, OpenCode `<task id="ses_…"`, Codex `{"task_name":"/root/x"}`.
fn last_subagent_id(items: &[Item]) -> Option<String> {
    items.iter().rev().find_map(|item| {
        let Item::ToolResult(text) = item else { return None };
        let task_name = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|output| output.get("task_name").and_then(Value::as_str).map(str::to_string));
        if task_name.is_some() {
            return task_name;
        }
        text.lines().find_map(|line| {
            let line = line.trim();
            let value = line
                .strip_prefix("subagent_id:")
                .or_else(|| line.strip_prefix("agent_id:"))
                .or_else(|| line.strip_prefix("<task id=\"").and_then(|rest| rest.split('"').next()));
            value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
        })
    })
}

/// Stands for the latest task id in `[[tool:NAME|JSON]]` arguments.
const LAST_TASK: &str = "$last_task";

/// The latest `task_id: X` line of a tool result (Kimi's background Bash and Agent results), for `$last_task`.
fn last_task_id(items: &[Item]) -> Option<String> {
    items.iter().rev().find_map(|item| {
        let Item::ToolResult(text) = item else { return None };
        text.lines().find_map(|line| {
            let value = line.trim().strip_prefix("task_id:")?.trim();
            (!value.is_empty()).then(|| value.to_string())
        })
    })
}

fn tool_list(tools: &[Tool]) -> String {
    let names: Vec<String> = tools.iter().map(Tool::qualified).collect();
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

/// Arguments for a shell command, by the parameter names the tool declares.
fn shell_arguments(tool: &Tool, cmd: &str, background: bool) -> Value {
    let mut args = serde_json::Map::new();
    let command_key = ["cmd", "command"].into_iter().find(|k| tool.has_param(k)).unwrap_or("command");
    args.insert(command_key.into(), json!(cmd));
    if tool.has_param("description") {
        args.insert("description".into(), json!(format!("run {cmd}")));
    }
    if background {
        // Codex backgrounds a command that is still running after `yield_time_ms`.
        if tool.has_param("yield_time_ms") {
            args.insert("yield_time_ms".into(), json!(500));
        }
        for key in ["run_in_background", "background", "is_background"] {
            if tool.has_param(key) {
                args.insert(key.into(), json!(true));
            }
        }
    }
    Value::Object(args)
}

/// Arguments for a subagent spawn, by the parameter names the tool declares.
fn spawn_arguments(tool: &Tool, name: &str, prompt: &str, background: bool) -> Value {
    let mut args = serde_json::Map::new();
    for (key, value) in [
        ("task_name", json!(name)),
        ("name", json!(name)),
        ("message", json!(prompt)),
        ("prompt", json!(prompt)),
        ("task", json!(prompt)),
        ("description", json!(format!("{name} task"))),
        ("subagent_type", json!(subagent_type(tool))),
        ("run_in_background", json!(background)),
        ("background", json!(background)),
        // Codex children inherit the parent's history unless told not to; the task alone keeps markers apart.
        ("fork_turns", json!("none")),
    ] {
        if tool.has_param(key) {
            args.insert(key.into(), value);
        }
    }
    Value::Object(args)
}

/// A subagent type the tool accepts: the first enum value, else a common built-in.
fn subagent_type(tool: &Tool) -> Value {
    let schema = tool.parameters.get("properties").and_then(|p| p.get("subagent_type"));
    if let Some(first) = schema.and_then(|s| s.get("enum")).and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    // Kimi's default profile is `coder`; OpenCode's general-purpose agent is `general`.
    let description = schema.and_then(|s| s.get("description")).and_then(Value::as_str).unwrap_or("");
    if description.contains("coder") || tool.name == "Agent" { json!("coder") } else { json!("general") }
}

fn followup_arguments(tool: &Tool, target: &str, prompt: &str) -> Value {
    let mut args = serde_json::Map::new();
    for (key, value) in
        [("target", json!(target)), ("id", json!(target)), ("message", json!(prompt)), ("prompt", json!(prompt))]
    {
        if tool.has_param(key) {
            args.insert(key.into(), value);
        }
    }
    Value::Object(args)
}

/// Resuming through the spawn tool (Kimi `resume`, Grok `resume_from`, OpenCode `task_id`).
fn resume_arguments(tool: &Tool, target: &str, prompt: &str) -> Value {
    let mut args = spawn_arguments(tool, "resumed", prompt, true);
    if let Some(map) = args.as_object_mut() {
        for key in ["resume", "resume_from", "task_id"] {
            if tool.has_param(key) {
                map.insert(key.into(), json!(target));
            }
        }
        // Kimi rejects a resume that also names the subagent type.
        if tool.has_param("resume") {
            map.remove("subagent_type");
        }
    }
    args
}

/// HTTP status and body for `[[error:KIND]]`, in the shape each API's clients classify.
fn error_reply(api: Api, kind: &str) -> Reply {
    let responses = api == Api::Responses;
    let (kind, retry_after) = match kind.split_once('~') {
        Some((kind, seconds)) => (kind.trim(), seconds.trim().parse().ok()),
        None => (kind, None),
    };
    let (status, error) = match kind {
        "reset" => return Reply::Reset,
        "502" => {
            let page = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n";
            return Reply::Error { status: 502, body: Value::String(page.into()), retry_after };
        }
        // Anthropic's overload answer, as gateways in front of Claude models pass it on.
        "529" => {
            let body = json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
            return Reply::Error { status: 529, body, retry_after };
        }
        "429-usage" if responses => (
            429,
            json!({"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus",
                "resets_in_seconds":3600,"resets_at":unix_now() + 3600}),
        ),
        "429-usage" => (
            429,
            json!({"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","code":"insufficient_quota"}),
        ),
        "429-rate" => (
            429,
            json!({"message":"Rate limit reached for requests. Please try again later.","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}),
        ),
        "500" => (
            500,
            json!({"message":"The server had an error while processing your request.","type":"server_error","code":"server_error"}),
        ),
        "503" => (
            503,
            json!({"message":"The server is overloaded, please try again later.","type":"server_is_overloaded","code":"server_is_overloaded"}),
        ),
        "401" => (
            401,
            json!({"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}),
        ),
        other => (500, json!({"message":format!("fake model: unknown error kind {other:?}"),"type":"server_error"})),
    };
    Reply::Error { status, body: json!({ "error": error }), retry_after }
}

fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Text(t) => format!("text {:?}", t.chars().take(60).collect::<String>()),
        Reply::Error { status, body, .. } => {
            let kind = body.pointer("/error/type").and_then(Value::as_str).unwrap_or("");
            format!("error {status} {kind}")
        }
        Reply::Reset => "connection reset".into(),
        Reply::Calls(calls) => {
            let parts: Vec<String> = calls
                .iter()
                .map(|c| {
                    let name = c.namespace.as_ref().map_or(c.name.clone(), |ns| format!("{ns}.{}", c.name));
                    format!("{name}({})", c.arguments)
                })
                .collect();
            format!("call {}", parts.join(", "))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Wire shapes.

static IDS: AtomicU64 = AtomicU64::new(0);

fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed) + 1
}

fn json_response(status: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn html_response(status: u16, page: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(page.to_owned())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
    response
}

fn sse_response(body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

const USAGE_IN: u64 = 10;
const USAGE_OUT: u64 = 5;

/// Chat-completions stream: role, content or tool-call deltas, finish reason, usage, `[DONE]`.
fn chat_events(reply: &Reply, model: &str) -> String {
    let id = format!("chatcmpl-{}", next_id());
    let chunk = |delta: Value, finish: Value| {
        json!({"id":id,"object":"chat.completion.chunk","created":0,"model":model,
               "choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
    };
    let mut events = vec![chunk(json!({"role":"assistant","content":""}), Value::Null)];
    let finish = match reply {
        Reply::Text(text) => {
            events.push(chunk(json!({"content":text}), Value::Null));
            "stop"
        }
        Reply::Calls(calls) => {
            for (index, call) in calls.iter().enumerate() {
                let call_id = format!("call_{}", next_id());
                events.push(chunk(
                    json!({"tool_calls":[{"index":index,"id":call_id,"type":"function","function":{"name":call.name,"arguments":""}}]}),
                    Value::Null,
                ));
                events.push(chunk(
                    json!({"tool_calls":[{"index":index,"function":{"arguments":call.arguments.to_string()}}]}),
                    Value::Null,
                ));
            }
            "tool_calls"
        }
        Reply::Error { .. } | Reply::Reset => "stop",
    };
    events.push(chunk(json!({}), json!(finish)));
    events.push(json!({"id":id,"object":"chat.completion.chunk","created":0,"model":model,"choices":[],
        "usage":{"prompt_tokens":USAGE_IN,"completion_tokens":USAGE_OUT,"total_tokens":USAGE_IN + USAGE_OUT}}));
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

/// A non-streaming chat completion, for clients that do not ask for a stream.
fn chat_completion(reply: &Reply, model: &str) -> Value {
    let (message, finish) = match reply {
        Reply::Calls(calls) => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id":format!("call_{}", next_id()),"type":"function","function":{"name":c.name,"arguments":c.arguments.to_string()}}))
                .collect();
            (json!({"role":"assistant","content":null,"tool_calls":tool_calls}), "tool_calls")
        }
        Reply::Text(text) => (json!({"role":"assistant","content":text}), "stop"),
        Reply::Error { .. } | Reply::Reset => (json!({"role":"assistant","content":""}), "stop"),
    };
    json!({"id":format!("chatcmpl-{}", next_id()),"object":"chat.completion","created":0,"model":model,
           "choices":[{"index":0,"message":message,"finish_reason":finish}],
           "usage":{"prompt_tokens":USAGE_IN,"completion_tokens":USAGE_OUT,"total_tokens":USAGE_IN + USAGE_OUT}})
}

/// Responses API stream: `response.created`, one `output_item.done` per item, `response.completed`.
fn responses_events(reply: &Reply) -> String {
    let response_id = format!("resp_{}", next_id());
    let mut events = vec![json!({"type":"response.created","response":{"id":response_id}})];
    match reply {
        Reply::Text(text) => {
            let item_id = format!("msg_{}", next_id());
            events.push(json!({"type":"response.output_item.added","output_index":0,
                "item":{"type":"message","role":"assistant","id":item_id,"content":[]}}));
            events.push(json!({"type":"response.output_text.delta","item_id":item_id,"output_index":0,"content_index":0,"delta":text}));
            events.push(json!({"type":"response.output_item.done","output_index":0,
                "item":{"type":"message","role":"assistant","id":item_id,"content":[{"type":"output_text","text":text}]}}));
        }
        Reply::Calls(calls) => {
            for (index, call) in calls.iter().enumerate() {
                let n = next_id();
                let mut item = json!({"type":"function_call","id":format!("fc_{n}"),"call_id":format!("call_{n}"),
                    "name":call.name,"arguments":call.arguments.to_string()});
                if let Some(ns) = &call.namespace {
                    item["namespace"] = json!(ns);
                }
                events.push(json!({"type":"response.output_item.done","output_index":index,"item":item}));
            }
        }
        Reply::Error { .. } | Reply::Reset => {}
    }
    events.push(json!({"type":"response.completed","response":{"id":response_id,
        "usage":{"input_tokens":USAGE_IN,"input_tokens_details":null,"output_tokens":USAGE_OUT,
                 "output_tokens_details":null,"total_tokens":USAGE_IN + USAGE_OUT}}}));
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e.get("type").and_then(Value::as_str).unwrap_or("message")))
        .collect()
}

/// Seconds since the epoch (the usage-limit body names when the limit resets).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_nest_and_split_on_the_top_level_bar() {
        let markers = parse_markers("do [[subagent:helper|[[bg:echo a | wc]]]] then [[text:ok]]");
        assert_eq!(
            markers,
            vec![
                Marker::Subagent { name: Some("helper".into()), prompt: "[[bg:echo a | wc]]".into(), background: true },
                Marker::Text("ok".into()),
            ]
        );
        assert_eq!(
            parse_markers("[[subagent-fg:say hi | now]]")[0],
            Marker::Subagent { name: None, prompt: "say hi | now".into(), background: false }
        );
        assert!(parse_markers("unclosed [[bg:sleep 1").is_empty());
    }

    #[test]
    fn a_tool_result_is_answered_with_text() {
        let body = json!({"messages":[{"role":"user","content":"[[bg:sleep 1]]"},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"ok"}],
            "tools":[{"type":"function","function":{"name":"bash","parameters":{"properties":{"command":{}}}}}]});
        let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
        assert_eq!(reply, Reply::Text(AFTER_TOOL_TEXT.into()));
    }

    #[test]
    fn counted_errors_stop_after_n_attempts() {
        let body = json!({"messages":[{"role":"user","content":"go [[error:503*2]]"}],
            "tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]});
        let mut prompts = HashMap::new();
        let statuses: Vec<Option<u16>> = (0..3)
            .map(|_| match decide(Api::ChatCompletions, Origin::Main, &body, &mut prompts).0 {
                Reply::Error { status, .. } => Some(status),
                _ => None,
            })
            .collect();
        assert_eq!(statuses, vec![Some(503), Some(503), None]);
    }

    #[test]
    fn error_kinds_carry_their_wait_and_shape() {
        let ask = |text: &str| {
            let body = json!({"messages":[{"role":"user","content":text}]});
            decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new()).0
        };
        assert_eq!(ask("[[error:reset]]"), Reply::Reset);
        assert!(
            matches!(ask("[[error:429-rate~90]]"), Reply::Error { status: 429, retry_after: Some(90), .. }),
            "{:?}",
            ask("[[error:429-rate~90]]")
        );
        assert!(matches!(
            ask("[[error:502]]"),
            Reply::Error { status: 502, body: Value::String(_), retry_after: None }
        ));
        match ask("[[error:529]]") {
            Reply::Error { status: 529, body, .. } => assert_eq!(body["error"]["type"], "overloaded_error"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn prompts_joined_after_failed_turns_use_the_latest_markers() {
        let mut prompts = HashMap::new();
        let ask = |text: &str, prompts: &mut HashMap<String, u32>| {
            let body = json!({"messages":[{"role":"user","content":text}],
                "tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]});
            decide(Api::ChatCompletions, Origin::Main, &body, prompts).0
        };
        assert!(matches!(ask("a [[error:500]]", &mut prompts), Reply::Error { status: 500, .. }));
        assert!(matches!(ask("a [[error:500]]\n\nb [[error:503]]", &mut prompts), Reply::Error { status: 503, .. }));
        assert_eq!(ask("a [[error:500]]\n\nb [[error:503]]\n\nc", &mut prompts), Reply::Text(DEFAULT_TEXT.into()));
    }

    #[test]
    fn resume_last_finds_the_latest_subagent_id() {
        let items = vec![
            Item::ToolResult("task_id: agent-abcdefgh\nagent_id: agent-0".into()),
            Item::ToolResult("Subagent started in background.\nsubagent_id: 01a2".into()),
        ];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("01a2"));
        let items = vec![Item::ToolResult(r#"<task id="ses_x" state="running">"#.into())];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("ses_x"));
        let items = vec![Item::ToolResult(r#"{"task_name":"/root/worker_1"}"#.into())];
        assert_eq!(last_subagent_id(&items).as_deref(), Some("/root/worker_1"));
    }

    #[test]
    fn last_task_names_the_latest_task_id_of_a_tool_result() {
        let body = json!({"messages":[{"role":"user","content":"[[bg:sleep 30]]"},
            {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"Bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c","content":"task_id: bash-aaaa1111\npid: 7\nstatus: running"},
            {"role":"assistant","content":"ok"},
            {"role":"user","content":"stop it [[tool:TaskStop|{\"task_id\":\"$last_task\"}]]"}],
            "tools":[{"type":"function","function":{"name":"Bash","parameters":{"properties":{"command":{}}}}},
                {"type":"function","function":{"name":"TaskStop","parameters":{"properties":{"task_id":{}}}}}]});
        let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
        let Reply::Calls(calls) = reply else { panic!("{reply:?}") };
        assert_eq!(calls[0].name, "TaskStop");
        assert_eq!(calls[0].arguments, json!({"task_id": "bash-aaaa1111"}));
    }

    #[test]
    fn odd_bodies_get_text() {
        for body in [Value::Null, json!([]), json!({"messages": 3}), json!({"input": {"x": 1}, "tools": "no"})] {
            let (reply, _) = decide(Api::ChatCompletions, Origin::Main, &body, &mut HashMap::new());
            assert_eq!(reply, Reply::Text(DEFAULT_TEXT.into()));
            let (reply, _) = decide(Api::Responses, Origin::Main, &body, &mut HashMap::new());
            assert_eq!(reply, Reply::Text(DEFAULT_TEXT.into()));
        }
    }
}
