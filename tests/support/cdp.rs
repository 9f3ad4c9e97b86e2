//! A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`), for page tests.
//!
//! Chromium reads commands on its fd 3 and writes answers and events on its fd 4, each message JSON ended by a
//! NUL byte. No crate needed: a pipe pair, a reader thread and `serde_json`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

/// Longest wait for one answer: a guard against a hung browser, not a measurement.
const PATIENCE: Duration = Duration::from_secs(120);

/// The browser to drive: `$CODA_CHROMIUM`, else Debian's `/usr/bin/chromium`, when it exists.
pub fn chromium() -> Option<PathBuf> {
    let path =
        std::env::var_os("CODA_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    path.is_file().then_some(path)
}

/// The flags every headless run gets: no sandbox (CI runs as root), nothing fetched from the network.
pub fn flags(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,900",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors, which nothing else owns.
    let rc = unsafe { nix::libc::pipe2(fds.as_mut_ptr(), nix::libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors from pipe2.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

pub struct Browser {
    child: Child,
    commands: std::fs::File,
    messages: mpsc::Receiver<Value>,
    next: u64,
    /// Every event received so far (`{"method", "params", "sessionId"}`).
    pub events: Vec<Value>,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn launch(chromium: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (their_in, our_out) = pipe();
        let (our_in, their_out) = pipe();
        let (r, w) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut cmd = Command::new(chromium);
        cmd.args(flags(profile.path())).arg("--remote-debugging-pipe").arg("about:blank");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec. The copies at 10 and up keep dup2 from
        // meeting a pipe that already sits at 3 or 4; dup2 clears close-on-exec on 3 and 4.
        unsafe {
            cmd.pre_exec(move || {
                let r2 = nix::libc::fcntl(r, nix::libc::F_DUPFD, 10);
                let w2 = nix::libc::fcntl(w, nix::libc::F_DUPFD, 10);
                if r2 < 0 || w2 < 0 || nix::libc::dup2(r2, 3) < 0 || nix::libc::dup2(w2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                nix::libc::close(r2);
                nix::libc::close(w2);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium.display()));
        drop((their_in, their_out));
        let (tx, messages) = mpsc::channel();
        std::thread::spawn(move || {
            let mut input = BufReader::new(std::fs::File::from(our_in));
            loop {
                let mut buf = Vec::new();
                match input.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        let Ok(v) = serde_json::from_slice::<Value>(&buf) else { continue };
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Browser {
            child,
            commands: std::fs::File::from(our_out),
            messages,
            next: 0,
            events: Vec::new(),
            _profile: profile,
        }
    }

    /// Sends a command (to a page's `session`, or the browser) and returns its result; panics on an error.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).expect("the browser closed its pipe");
        loop {
            let v = self.recv(method);
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(e) = v.get("error") {
                    panic!("{method}: {e}");
                }
                return v["result"].clone();
            }
            self.events.push(v);
        }
    }

    /// Waits for an event `method` (one already received counts).
    pub fn wait_event(&mut self, method: &str) -> Value {
        if let Some(e) = self.events.iter().find(|e| e["method"] == method) {
            return e.clone();
        }
        loop {
            let v = self.recv(method);
            let hit = v["method"] == method;
            self.events.push(v.clone());
            if hit {
                return v;
            }
        }
    }

    fn recv(&mut self, waiting_for: &str) -> Value {
        match self.messages.recv_timeout(PATIENCE) {
            Ok(v) => v,
            Err(e) => panic!("no answer from the browser for {waiting_for} ({e})"),
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, session: &str, expr: &str) -> Value {
        let r = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
        );
        if let Some(ex) = r.get("exceptionDetails") {
            panic!("the page threw evaluating {expr}: {ex}");
        }
        r["result"]["value"].clone()
    }

    /// Opens `page` in a fresh tab of 1400 x 900 px; returns the tab's session once the page's script has set
    /// `document.body.dataset.ready`.
    pub fn open(&mut self, page: &Path) -> String {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}))["targetId"].clone();
        let session =
            self.call(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}))["sessionId"]
                .as_str()
                .unwrap()
                .to_owned();
        for m in ["Runtime.enable", "Log.enable", "Page.enable"] {
            self.call(Some(&session), m, json!({}));
        }
        let metrics = json!({"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": false});
        self.call(Some(&session), "Emulation.setDeviceMetricsOverride", metrics);
        self.events.clear();
        let url = format!("file://{}", page.display());
        self.call(Some(&session), "Page.navigate", json!({"url": url}));
        self.wait_event("Page.loadEventFired");
        let ready = self.eval(
            &session,
            "new Promise(r => { const f = () => document.body.dataset.ready ? r(true) : setTimeout(f, 20); f(); })",
        );
        assert_eq!(ready, json!(true));
        session
    }

    /// Console errors, uncaught exceptions and error log entries seen so far.
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| {
                e["method"] == "Runtime.exceptionThrown"
                    || (e["method"] == "Runtime.consoleAPICalled"
                        && matches!(e["params"]["type"].as_str(), Some("error" | "assert")))
                    || (e["method"] == "Log.entryAdded" && e["params"]["entry"]["level"] == "error")
                    || e["method"] == "Page.javascriptDialogOpening"
            })
            .map(Value::to_string)
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.commands.write_all(b"{\"id\":0,\"method\":\"Browser.close\"}\0");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
