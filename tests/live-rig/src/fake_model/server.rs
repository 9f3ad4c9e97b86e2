//! The fake model's HTTP server: listens on 127.0.0.1, records each request and writes the scripted answer.

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
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::origin::classify_origin;
use super::record::{RecordedRequest, summary_line};
use super::request::{classify_api, parse_body};
use super::wire::answer;

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

    /// Model requests only (chat completions, Responses API, Gemini, Anthropic Messages), in arrival order.
    pub fn model_requests(&self) -> Vec<RecordedRequest> {
        self.requests().into_iter().filter(|r| r.api.is_model()).collect()
    }

    /// `http://127.0.0.1:PORT`, for CLIs that add the API's own path (Gemini's `/v1beta/…`, Anthropic's `/v1/…`).
    pub fn origin_url(&self) -> String {
        format!("http://{}", self.addr)
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
    let at = std::time::SystemTime::now();
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
        Ok(mut prompts) => answer(api, origin, &method, &path, &body, &mut prompts),
        Err(_) => answer(api, origin, &method, &path, &body, &mut HashMap::new()),
    };
    let seq = shared.seq.fetch_add(1, Ordering::SeqCst) + 1;
    let input_tokens = super::wire::context_tokens(&body);
    let record = RecordedRequest {
        seq,
        method: method.to_string(),
        path,
        headers,
        body,
        api,
        origin,
        reply: answer.summary.clone(),
        at,
        input_tokens,
    };
    if shared.options.log_requests {
        eprintln!("{}", summary_line(&record));
    }
    if let Some(dir) = &shared.options.dump_dir {
        record.dump(dir);
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
