//! coda-kimi's activity layer, binary level: the real binary with a stand-in for `kimi acp`.
//!
//! The test writes the stand-in's stdout (through a FIFO) and Kimi's session files, so each rule is driven exactly:
//! a prompt held while Kimi runs a turn of its own, a prompt answer held until the wire shows the turn's end
//! (and released after `ANSWER_HOLD` when it never does), `_coda/wait/stop` refused, `session/cancel` of a
//! held prompt, a subagent run whose own turn end never shows; and faults in Kimi's files (garbage, torn lines,
//! thousands of tasks, the folder deleted, a wire replaced, task files and wire records out of order) and in its
//! data folder (symbolic links out of the session folder, a FIFO for a wire, a huge append, one huge line).

use crate::support;

use support::{shim, temp, wait};

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const SESSION: &str = "session_6b1d1f0e-0000-4000-8000-00000000a11e";

/// Logs what it receives into `$AGENT_LOG` and writes to its stdout what the test puts into `$AGENT_FIFO`.
const FAKE_KIMI: &str = r#"#!/bin/bash
exec 3<&0
cat <&3 > "$AGENT_LOG" &
exec cat "$AGENT_FIFO"
"#;

struct Kimi {
    shim: shim::Shim,
    fifo: File,
    session_dir: PathBuf,
    /// Milliseconds for the next wire record's `time`.
    clock: u64,
    /// Barriers sent so far (see [`Kimi::synced`]).
    syncs: u64,
    /// Last: removed after the shim (and through it the stand-in) has stopped.
    root: temp::TempDir,
}

impl Kimi {
    /// coda-kimi with the stand-in, after initialize (Coda declares waits) and session/new.
    fn start(name: &str) -> Kimi {
        Kimi::launch(name, |_| {})
    }

    /// The same, with `prepare(session folder)` run before Kimi's `session/new` answer (the folder and its main
    /// wire exist then).
    fn start_with(name: &str, prepare: impl FnOnce(&std::path::Path)) -> Kimi {
        Kimi::launch(name, prepare)
    }

    /// Every shim runs with its file log (`CODA_KIMI_RECORD`: what the activity layer read, in the order it
    /// handled it) in `files.log`: the test waits on it for the layer to have read what the test wrote.
    fn launch(name: &str, prepare: impl FnOnce(&std::path::Path)) -> Kimi {
        let root = temp::TempDir::new(&format!("coda-kimi-activity-{name}"));
        std::fs::create_dir_all(root.join("home/.kimi-code")).unwrap();
        let script = root.join("fake-kimi.sh");
        std::fs::write(&script, FAKE_KIMI).unwrap();
        let fifo_path = root.join("stdout.fifo");
        assert!(Command::new("mkfifo").arg(&fifo_path).status().unwrap().success(), "mkfifo");
        let mut cmd = Command::new(shim::binary("kimi"));
        cmd.env("CODA_KIMI_RECORD", root.join("files.log"));
        let shim = shim::Builder::from_command(cmd)
            .env("CODA_KIMI_COMMAND", &format!("bash {}", script.display()))
            .env("KIMI_CODE_HOME", &root.join("home/.kimi-code").display().to_string())
            .env("HOME", &root.join("home").display().to_string())
            .env("AGENT_LOG", &root.join("agent.log").display().to_string())
            .env("AGENT_FIFO", &fifo_path.display().to_string())
            .env("CODA_SHIM_LOG", "warn")
            .start();
        // Blocks until the stand-in opens the FIFO.
        let fifo = OpenOptions::new().write(true).open(&fifo_path).unwrap();
        let session_dir = root.join(format!("home/.kimi-code/sessions/wd_work_000000000000/{SESSION}"));
        let mut k = Kimi { shim, fifo, session_dir, clock: 1_796_000_000_000, syncs: 0, root };
        let caps = json!({"_meta": {"coda": {"waits": {}}}});
        k.client(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":caps}}));
        k.agent_gets(|v| v["method"] == "initialize");
        k.agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}));
        let init = k.recv();
        assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}), "{init}");
        k.client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        k.agent_gets(|v| v["method"] == "session/new");
        std::fs::create_dir_all(k.session_dir.join("agents/main")).unwrap();
        k.wire("main", &[json!({"type":"metadata","protocol_version":"1.5","created_at":1})]);
        prepare(&k.session_dir);
        k.agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":SESSION}}));
        assert_eq!(k.recv()["result"]["sessionId"], SESSION);
        k
    }

    fn client(&mut self, v: Value) {
        self.shim.send_json(&v);
    }

    /// A frame from `kimi acp` to the shim.
    fn agent(&mut self, v: Value) {
        writeln!(self.fifo, "{v}").unwrap();
        self.fifo.flush().unwrap();
    }

    /// Appends records to `agents/<agent>/wire.jsonl` in one write, as Kimi flushes; `time` is set. Returns
    /// what it wrote.
    fn wire(&mut self, agent: &str, records: &[Value]) -> String {
        let path = self.session_dir.join(format!("agents/{agent}/wire.jsonl"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = String::new();
        for r in records {
            let mut r = r.clone();
            if r.get("time").is_none() {
                self.clock += 1;
                r["time"] = json!(self.clock);
            }
            text += &format!("{r}\n");
        }
        let mut f = OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        text
    }

    /// [`Kimi::wire`], then waits until the activity layer has read those records: what comes next (an answer
    /// from Kimi, a prompt from Coda) then meets a layer that knows them, as it does when Kimi writes its wire
    /// well before it answers (a model round trip), whatever the load on the machine.
    fn wire_read(&mut self, agent: &str, records: &[Value]) {
        let text = self.wire(agent, records);
        self.layer_read(agent, &text);
    }

    /// Waits until the activity layer has read `text` from `agents/<agent>/wire.jsonl` (its file log holds it).
    fn layer_read(&self, agent: &str, text: &str) {
        let path = format!("{}/agents/{agent}/wire.jsonl", self.session_dir.display());
        let read = || {
            let log = std::fs::read_to_string(self.root.join("files.log")).unwrap_or_default();
            log.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|r| r["path"] == path.as_str())
                .filter_map(|r| r["data"].as_str().map(str::to_owned))
                .collect::<String>()
        };
        wait::until(
            shim::TIMEOUT,
            || read().contains(text).then_some(()),
            || format!("the layer never read {text:?} from {path}; it read {:?}", read()),
        );
    }

    /// A barrier: a notification from Coda that the shim passes on, waited for at the stand-in. Whatever the shim
    /// passed on before it is in the stand-in's log then (frames go to Kimi in order); returns that log.
    fn synced(&mut self) -> Vec<Value> {
        self.syncs += 1;
        let n = self.syncs;
        self.client(json!({"jsonrpc":"2.0","method":"_test/sync","params":{"n":n}}));
        self.agent_gets(|v| v["method"] == "_test/sync" && v["params"]["n"] == n);
        self.agent_log()
    }

    /// Writes `agents/<agent>/tasks/<id>.json` as Kimi does: a `<file>.tmp.<pid>.<8hex>` renamed over it
    /// (seen live on Kimi 2.1.0). `info` is the whole task record.
    fn task_file(&mut self, agent: &str, info: &Value) {
        let id = info["taskId"].as_str().expect("taskId");
        let dir = self.session_dir.join(format!("agents/{agent}/tasks"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{id}.json"));
        self.clock += 1;
        let tmp = dir.join(format!("{id}.json.tmp.4242.{:08x}", self.clock & 0xffff_ffff));
        std::fs::write(&tmp, info.to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// The files the shim's watcher read (relative to the session folder), from its file log.
    fn files_read(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.root.join("files.log")).unwrap_or_default();
        let dir = format!("{}/", self.session_dir.display());
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r.get("at").is_none())
            .filter_map(|r| r["path"].as_str().and_then(|p| p.strip_prefix(&dir)).map(str::to_owned))
            .collect()
    }

    /// Frames the stand-in received so far.
    fn agent_log(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.root.join("agent.log")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Waits until the stand-in received a frame matching `want`.
    fn agent_gets(&self, want: impl Fn(&Value) -> bool) -> Value {
        wait::until(
            shim::TIMEOUT,
            || self.agent_log().into_iter().find(&want),
            || format!("the agent never received the frame; it got {:?}", self.agent_log()),
        )
    }

    fn recv(&mut self) -> Value {
        self.shim.recv_json()
    }

    /// [`Kimi::recv`] after work that is not a matter of milliseconds (reading tens of MiB in a debug build on a
    /// loaded machine): `wait` only bounds a hang.
    fn recv_within(&mut self, wait: std::time::Duration) -> Value {
        let line = self.shim.try_recv(wait).unwrap_or_else(|| panic!("no frame from the shim within {wait:?}"));
        coda_shim::json::from_str(&line).unwrap_or_else(|e| panic!("shim wrote a line that is not JSON ({e}): {line}"))
    }

    /// Ends the session (Coda closes the shim's stdin, the stand-in's stdout ends) and returns all the shim
    /// wrote on stderr, once it has exited: nothing still on its way is missed.
    fn finish(self) -> String {
        let Kimi { mut shim, fifo, root, .. } = self;
        shim.close_stdin();
        drop(fifo);
        shim.wait(shim::TIMEOUT);
        let stderr = shim.stderr_to_the_end().join("\n");
        drop(shim);
        drop(root);
        stderr
    }

    /// Nothing reaches the client for `quiet`.
    fn nothing_for(&mut self, quiet: Duration) {
        if let Some(line) = self.shim.try_recv(quiet) {
            panic!("expected nothing for {quiet:?}, got {line}");
        }
    }
}

fn user_turn(turn: i64) -> Value {
    json!({"type":"turn.prompt","agentId":"main","turnId":turn,"origin":{"kind":"user"},"input":[]})
}
fn own_turn(turn: i64, task: &str) -> Value {
    json!({"type":"turn.prompt","agentId":"main","turnId":turn,"origin":{"kind":"task","taskId":task,"status":"completed"},"input":[]})
}
fn turn_ended(turn: i64) -> Value {
    json!({"type":"turn.ended","agentId":"main","turnId":turn,"reason":"completed"})
}
fn task(ty: &str, id: &str, status: &str) -> Value {
    json!({"type":ty,"agentId":"main","info":{"taskId":id,"kind":"process","status":status,"description":"bg sleep","command":"sleep 1","detached":true}})
}
fn text(turn: i64, t: &str) -> Value {
    json!({"type":"context.append_loop_event","agentId":"main","event":{"type":"content.part","turnId":turn.to_string(),"step":1,"part":{"type":"text","text":t}}})
}
fn prompt(id: i64, words: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":SESSION,"prompt":[{"type":"text","text":words}]}})
}
fn wait_line(v: &Value) -> String {
    let p = &v["params"];
    format!(
        "{} {} {}",
        v["method"].as_str().unwrap_or("?"),
        p["waitId"].as_str().unwrap_or(""),
        p["state"].as_str().unwrap_or("")
    )
}

/// A task that ended after the client turn puts Kimi in a turn of its own: the state every test below starts from.
fn kimi_in_its_own_turn(k: &mut Kimi) {
    k.wire("main", &[user_turn(0), task("task.started", "bash-aaaa1111", "running"), turn_ended(0)]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa1111 waiting");
    k.wire("main", &[task("task.terminated", "bash-aaaa1111", "completed")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa1111 handling");
    k.wire_read("main", &[own_turn(1, "bash-aaaa1111")]);
}

#[test]
fn a_prompt_sent_while_kimi_runs_its_own_turn_is_held_until_that_turn_ends() {
    let mut k = Kimi::start("held");
    kimi_in_its_own_turn(&mut k);
    k.client(prompt(5, "next"));
    assert!(
        !k.synced().iter().any(|v| v["id"] == 5),
        "Kimi would answer it empty and run it unreported (fixtures/kimi/prompt-during-kimi-turn): it must not get it yet"
    );
    k.wire("main", &[text(1, "handled it"), turn_ended(1)]);
    let update = k.recv();
    assert_eq!(update["params"]["update"]["content"]["text"], "handled it", "{update}");
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa1111 done");
    let got = k.agent_gets(|v| v["id"] == 5);
    assert_eq!(got["method"], "session/prompt");
    // The prompt's own turn, then its answer.
    k.wire("main", &[user_turn(2), turn_ended(2)]);
    k.agent(json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
    assert_eq!(k.recv(), json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
}

#[test]
fn a_prompt_answer_waits_for_the_turn_end_on_the_wire_and_at_most_answer_hold() {
    let mut k = Kimi::start("answer");
    k.client(prompt(5, "go"));
    k.agent_gets(|v| v["id"] == 5);
    // Kimi writes the turn's start long before it answers (at least one model round trip).
    k.wire_read("main", &[user_turn(0)]);
    // Kimi answers before it flushed the records of that turn (seen live: the tool call's records land
    // ~70 ms after the answer).
    k.agent(json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
    k.nothing_for(Duration::from_millis(300));
    k.wire("main", &[task("task.started", "bash-bbbb2222", "running"), turn_ended(0)]);
    // Rule 1: registered inside the turn that started it, so before that turn's answer.
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-bbbb2222 waiting");
    assert_eq!(k.recv()["id"], 5);

    // A turn whose end never shows on the wire: the answer goes out once ANSWER_HOLD has passed (when exactly
    // is shown on the engine's clock, driven by hand, in the layer's own tests), with a warning.
    k.client(prompt(6, "again"));
    k.agent_gets(|v| v["id"] == 6);
    k.wire_read("main", &[user_turn(1)]);
    k.agent(json!({"jsonrpc":"2.0","id":6,"result":{"stopReason":"end_turn"}}));
    let answer = k.recv();
    assert_eq!(answer["id"], 6);
    k.shim.stderr_with("has not shown that turn's end");
}

#[test]
fn wait_stop_is_refused_with_invalid_params() {
    let mut k = Kimi::start("stop");
    k.client(
        json!({"jsonrpc":"2.0","id":9,"method":"_coda/wait/stop","params":{"sessionId":SESSION,"waitId":"bash-x"}}),
    );
    let answer = k.recv();
    assert_eq!(answer["id"], 9);
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(!k.synced().iter().any(|v| v["id"] == 9), "Kimi never sees Coda's stop");
}

#[test]
fn cancel_of_a_held_prompt_answers_it_cancelled_and_kimi_sees_neither() {
    let mut k = Kimi::start("cancel");
    kimi_in_its_own_turn(&mut k);
    // The layer takes Coda's frames in order: the prompt is held before the cancel comes.
    k.client(prompt(7, "next"));
    k.client(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":SESSION}}));
    assert_eq!(k.recv(), json!({"jsonrpc":"2.0","id":7,"result":{"stopReason":"cancelled"}}));
    // Kimi's own turn goes on and settles; the cancelled prompt is never sent.
    k.wire("main", &[turn_ended(1)]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa1111 done");
    let log = k.synced();
    assert!(!log.iter().any(|v| v["id"] == 7 || v["method"] == "session/cancel"), "{log:?}");
}

#[test]
fn a_subagent_run_whose_turn_end_never_shows_is_settled_after_the_grace() {
    let mut k = Kimi::start("subagent");
    k.wire("main", &[user_turn(0)]);
    k.wire("main", &[json!({"type":"subagent.spawned","subagentId":"agent-0","parentAgentId":"main","description":"helper","runInBackground":false,"taskId":"agent-cccc3333"})]);
    k.wire(
        "agent-0",
        &[
            json!({"type":"metadata","protocol_version":"1.5","created_at":1}),
            json!({"type":"turn.prompt","agentId":"agent-0","turnId":0,"origin":{"kind":"system_trigger","name":"subagent"},"input":[]}),
        ],
    );
    let w = k.recv();
    assert_eq!(wait_line(&w), "_coda/wait agent-cccc3333 waiting");
    assert_eq!(w["params"]["childSessionId"], "agent-0");
    // The parent records the end; the subagent's wire never shows its turn end.
    // Settled once RUN_END_GRACE has passed (when exactly: the layer's own tests, on a clock driven by hand).
    k.wire("main", &[json!({"type":"subagent.completed","subagentId":"agent-0"}), turn_ended(0)]);
    let done = k.recv();
    assert_eq!(wait_line(&done), "_coda/wait agent-cccc3333 done");
}

// Faults in Kimi's files (hardening): the shim warns and goes on, never loses or repeats a `_coda/wait`.

#[test]
fn garbage_and_a_line_written_in_two_pieces_lose_no_wait() {
    let mut k = Kimi::start("garbage");
    k.wire("main", &[user_turn(0)]);
    let path = k.session_dir.join("agents/main/wire.jsonl");
    let record = {
        let mut r = task("task.started", "bash-cccc3333", "running");
        r["time"] = json!(1_796_000_000_500u64);
        format!("{r}\n")
    };
    let (first, second) = record.split_at(record.len() / 2);
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"this is not a record\n{\"type\":\n").unwrap();
    f.write_all(first.as_bytes()).unwrap();
    f.flush().unwrap();
    // The layer reads the first half (a torn line) before the second is written.
    k.layer_read("main", first);
    f.write_all(second.as_bytes()).unwrap();
    f.flush().unwrap();
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-cccc3333 waiting");
    k.wire("main", &[task("task.terminated", "bash-cccc3333", "completed"), turn_ended(0)]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-cccc3333 done");
    k.nothing_for(Duration::from_millis(300));
    k.shim.stderr_with("malformed");
}

#[test]
fn thousands_of_tasks_each_reported_once_per_state() {
    let mut k = Kimi::start("thousands");
    let n = 2000;
    let ids: Vec<String> = (0..n).map(|i| format!("bash-{i:08}")).collect();
    let mut started = vec![user_turn(0)];
    started.extend(ids.iter().map(|id| task("task.started", id, "running")));
    k.wire("main", &started);
    let mut ended: Vec<Value> = ids.iter().map(|id| task("task.terminated", id, "completed")).collect();
    ended.push(turn_ended(0));
    k.wire("main", &ended);
    let mut seen = std::collections::HashMap::new();
    for _ in 0..2 * n {
        let line = wait_line(&k.recv());
        *seen.entry(line).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2 * n, "every task once waiting and once done");
    assert!(seen.values().all(|&c| c == 1));
    for id in &ids {
        assert!(
            seen.contains_key(&format!("_coda/wait {id} waiting"))
                && seen.contains_key(&format!("_coda/wait {id} done"))
        );
    }
    k.nothing_for(Duration::from_millis(300));
}

#[test]
fn the_session_folder_deleted_under_the_shim_breaks_nothing() {
    let mut k = Kimi::start("deleted");
    k.wire("main", &[user_turn(0), task("task.started", "bash-dddd4444", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-dddd4444 waiting");
    std::fs::remove_dir_all(&k.session_dir).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The relay goes on: a frame from Kimi still reaches the client.
    let note = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SESSION,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"still here"}}}});
    k.agent(note.clone());
    assert_eq!(k.recv(), note);
    assert!(k.shim.child.try_wait().unwrap().is_none(), "the shim is still running");
}

#[test]
fn a_wire_file_replaced_by_rename_is_reread_without_repeats() {
    let mut k = Kimi::start("renamed");
    k.wire("main", &[user_turn(0), task("task.started", "bash-eeee5555", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-eeee5555 waiting");
    // Kimi (or a tool) rewrites the journal atomically: the same records, plus a new one.
    let path = k.session_dir.join("agents/main/wire.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let mut r = task("task.started", "bash-ffff6666", "running");
    // A real time: on a re-read, records from before the shim started are history (the harness's
    // clock is in the past).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    r["time"] = json!(now.as_millis() as u64);
    text += &format!("{r}\n");
    let tmp = path.with_extension("jsonl.tmp.1");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-ffff6666 waiting");
    k.nothing_for(Duration::from_millis(400));
}

/// A task record as Kimi writes it into `tasks/<id>.json` and into the wire's `task.*` records (Kimi 2.1.0).
fn task_info(id: &str, status: &str) -> Value {
    let ended = status != "running";
    json!({"taskId":id,"description":"bg sleep","status":status,"detached":true,"startedAt":1_796_000_000_000u64,
           "endedAt":if ended { json!(1_796_000_001_000u64) } else { Value::Null },"timeoutMs":600000,
           "kind":"process","command":"sleep 1","pid":4242,"exitCode":if ended { json!(0) } else { Value::Null },
           "parentToolCallId":"call_1"})
}

/// Receives the next frame, which must be `_coda/wait <id> <state>`, and logs it.
fn expect_wait(k: &mut Kimi, log: &mut Vec<(String, String)>, id: &str, state: &str) {
    let v = k.recv();
    assert_eq!(wait_line(&v), format!("_coda/wait {id} {state}"), "{v}; waits so far: {log:?}");
    log.push((id.to_owned(), state.to_owned()));
}

/// A task file is rewritten at start, at settle and for markers, and can lag or lead the wire records by a
/// few ms; seen live (fixtures/kimi/bg-stopped): the wire's `task.started` 7 ms before the first
/// task file, the file's `killed` 21 ms before the wire's `task.terminated`, a marker rewrite after it. The
/// wire is the event order: whichever comes first, each wait is reported once per state, never reopened.
#[test]
fn task_files_and_wire_records_out_of_order_report_each_state_once_and_never_go_back() {
    let mut k = Kimi::start("out-of-order");
    let mut log = Vec::new();
    k.wire("main", &[user_turn(0)]);

    // A: the file leads both the start and the end.
    k.task_file("main", &task_info("bash-aaaa0001", "running"));
    k.nothing_for(Duration::from_millis(250));
    k.wire("main", &[task("task.started", "bash-aaaa0001", "running")]);
    expect_wait(&mut k, &mut log, "bash-aaaa0001", "waiting");
    k.task_file("main", &task_info("bash-aaaa0001", "completed"));
    k.nothing_for(Duration::from_millis(250));
    k.wire("main", &[task("task.terminated", "bash-aaaa0001", "completed")]);
    expect_wait(&mut k, &mut log, "bash-aaaa0001", "done");

    // B: the file says the task finished before the wire record that started it arrives.
    k.task_file("main", &task_info("bash-bbbb0002", "completed"));
    k.nothing_for(Duration::from_millis(250));
    k.wire("main", &[task("task.started", "bash-bbbb0002", "running")]);
    expect_wait(&mut k, &mut log, "bash-bbbb0002", "waiting");
    k.wire("main", &[task("task.terminated", "bash-bbbb0002", "completed")]);
    expect_wait(&mut k, &mut log, "bash-bbbb0002", "done");

    // C: the wire reports start and end before any file is written; then a stale `running` file lands
    // after the end, then the settled one, then a marker rewrite; and a `.tmp.` file a crash left behind.
    k.wire(
        "main",
        &[task("task.started", "bash-cccc0003", "running"), task("task.terminated", "bash-cccc0003", "completed")],
    );
    expect_wait(&mut k, &mut log, "bash-cccc0003", "waiting");
    expect_wait(&mut k, &mut log, "bash-cccc0003", "done");
    k.task_file("main", &task_info("bash-cccc0003", "running"));
    k.task_file("main", &task_info("bash-cccc0003", "completed"));
    let mut marked = task_info("bash-cccc0003", "completed");
    marked["resumeReminded"] = json!(true);
    k.task_file("main", &marked);
    let stray = k.session_dir.join("agents/main/tasks/bash-cccc0003.json.tmp.4242.0000dead");
    std::fs::write(stray, "{\"taskId\":\"bash-cccc0003\",\"sta").unwrap();
    k.nothing_for(Duration::from_millis(300));

    // D: a task still running when the client turn ends settles later, outside a turn (handling until
    // Kimi's own turn for it ends); its settled file leads the wire's end, a stale file trails it.
    k.wire("main", &[task("task.started", "bash-dddd0004", "running")]);
    expect_wait(&mut k, &mut log, "bash-dddd0004", "waiting");
    k.wire("main", &[turn_ended(0)]);
    k.task_file("main", &task_info("bash-dddd0004", "failed"));
    k.nothing_for(Duration::from_millis(250));
    k.wire("main", &[task("task.terminated", "bash-dddd0004", "failed")]);
    expect_wait(&mut k, &mut log, "bash-dddd0004", "handling");
    k.task_file("main", &task_info("bash-dddd0004", "running"));
    k.wire("main", &[own_turn(1, "bash-dddd0004"), turn_ended(1)]);
    expect_wait(&mut k, &mut log, "bash-dddd0004", "failed");
    let mut marked = task_info("bash-dddd0004", "failed");
    marked["terminalNotificationSuppressed"] = json!(true);
    k.task_file("main", &marked);
    k.nothing_for(Duration::from_millis(300));

    // Once per state, none lost, none after a terminal one.
    let states = |id: &str| log.iter().filter(|(w, _)| w == id).map(|(_, s)| s.as_str()).collect::<Vec<_>>();
    assert_eq!(states("bash-aaaa0001"), ["waiting", "done"]);
    assert_eq!(states("bash-bbbb0002"), ["waiting", "done"]);
    assert_eq!(states("bash-cccc0003"), ["waiting", "done"]);
    assert_eq!(states("bash-dddd0004"), ["waiting", "handling", "failed"]);

    // The relay goes on: a frame from Kimi reaches the client, and a prompt is neither held nor lost.
    let note = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SESSION,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"still here"}}}});
    k.agent(note.clone());
    assert_eq!(k.recv(), note);
    k.client(prompt(5, "next"));
    k.agent_gets(|v| v["id"] == 5);
    k.wire("main", &[user_turn(2), turn_ended(2)]);
    k.agent(json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
    assert_eq!(k.recv(), json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}));
    assert!(k.shim.child.try_wait().unwrap().is_none(), "the shim is still running");
    let stderr = k.finish();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `notify` adds its watch on a new folder only after it has reported the folder, so a file written into a
/// folder just made raises no event: Kimi's first task file goes into a `tasks/` it has just made, a new
/// subagent's wire into a new `agents/agent-N/`. The watcher must read them anyway, without a later write.
#[test]
fn files_written_into_folders_just_made_are_read() {
    let mut k = Kimi::start("new-folders");
    k.wire("main", &[user_turn(0)]);
    let mut want = Vec::new();
    for i in 0..5 {
        let agent = format!("agent-{i}");
        let id = format!("bash-{i:08}");
        // agents/agent-N/ and its tasks/ made, the task file written into it at once.
        k.task_file(&agent, &task_info(&id, "running"));
        want.push(format!("agents/{agent}/tasks/{id}.json"));
        std::thread::sleep(Duration::from_millis(50));
    }
    k.wire("agent-9", &[json!({"type":"metadata","protocol_version":"1.5","created_at":1})]);
    want.push("agents/agent-9/wire.jsonl".into());
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let read = k.files_read();
        let missing: Vec<&String> = want.iter().filter(|w| !read.contains(w)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "never read: {missing:?}; read: {read:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// Kimi's data folder is not trusted (issue #13 §4): nothing outside the session folder is watched or read, no
// file content reaches stderr at the default level, and memory does not grow with the size of one append.

/// Peak resident memory of a process (`VmHWM`), in bytes.
#[cfg(target_os = "linux")]
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmHWM kB");
    kb * 1024
}

/// The inotify watches a process holds.
#[cfg(target_os = "linux")]
fn inotify_watches(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|info| info.lines().filter(|l| l.starts_with("inotify wd:")).count())
        .sum()
}

/// A task record with a real time (records older than the shim's start are history when a file is read whole).
fn task_now(ty: &str, id: &str, status: &str) -> Value {
    let mut r = task(ty, id, status);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    r["time"] = json!(now.as_millis() as u64);
    r
}

const SECRET: &str = "root:x:0:0:SECRET-LINE-FROM-OUTSIDE:/root:/bin/bash";

#[test]
fn a_symlinked_folder_in_the_session_is_neither_watched_nor_read() {
    // Outside the session: a tree of folders (each one got an inotify watch) and a wire that reports a task.
    let outside = temp::TempDir::new("coda-kimi-outside-tree");
    for i in 0..300 {
        std::fs::create_dir_all(outside.join(format!("d{i}/e"))).unwrap();
    }
    let target = outside.path().to_owned();
    let mut k = Kimi::start_with("symlinked-folder", |dir| {
        std::os::unix::fs::symlink(&target, dir.join("agents/evil")).unwrap();
    });
    k.wire("main", &[user_turn(0), task("task.started", "bash-aaaa0001", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0001 waiting");
    #[cfg(target_os = "linux")]
    {
        let watches = inotify_watches(k.shim.child.id());
        assert!(watches < 10, "{watches} inotify watches: the symlinked folder was walked");
    }
    // A record written through the symlink is not the session's: not reported; the session's own is.
    let mut f = OpenOptions::new().create(true).append(true).open(outside.join("wire.jsonl")).unwrap();
    writeln!(f, "{}", json!({"type":"metadata","protocol_version":"1.5","created_at":1})).unwrap();
    writeln!(f, "{}", task_now("task.started", "bash-0u7s1de0", "running")).unwrap();
    drop(f);
    std::thread::sleep(Duration::from_millis(300));
    k.wire("main", &[task("task.started", "bash-aaaa0002", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0002 waiting");
    k.nothing_for(Duration::from_millis(300));
}

/// The session folder itself is Kimi's own (made by `session/new`): a link there is not followed; the relay goes on
/// without activity. (The folders above it may be links: where Kimi keeps its data is the user's choice.)
#[test]
fn a_symlinked_session_folder_is_not_followed() {
    let outside = temp::TempDir::new("coda-kimi-outside-session");
    let moved = outside.join("session");
    let mut k = Kimi::start_with("symlinked-session", |dir| {
        std::fs::rename(dir, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, dir).unwrap();
    });
    k.wire("main", &[user_turn(0), task("task.started", "bash-aaaa0006", "running")]);
    k.nothing_for(Duration::from_millis(300));
    let note = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SESSION,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"still here"}}}});
    k.agent(note.clone());
    assert_eq!(k.recv(), note);
    k.shim.stderr_with("is a symbolic link");
}

#[test]
fn a_symlinked_or_special_wire_file_is_not_read_and_no_content_is_logged() {
    let outside = temp::TempDir::new("coda-kimi-outside-file");
    let secret = outside.join("passwd");
    std::fs::write(&secret, format!("{SECRET}\n{}\n", task_now("task.started", "bash-5ecre7aa", "running"))).unwrap();
    let mut k = Kimi::start("symlinked-wire");
    k.wire("main", &[user_turn(0)]);
    // A subagent folder whose wire is a symlink to a file outside, another whose wire is a FIFO (opening it
    // for reading would block until a writer comes), and a task file that is a symlink.
    let sub1 = k.session_dir.join("agents/sub1");
    std::fs::create_dir_all(&sub1).unwrap();
    std::os::unix::fs::symlink(&secret, sub1.join("wire.jsonl")).unwrap();
    let sub2 = k.session_dir.join("agents/sub2");
    std::fs::create_dir_all(&sub2).unwrap();
    assert!(Command::new("mkfifo").arg(sub2.join("wire.jsonl")).status().unwrap().success());
    let tasks = k.session_dir.join("agents/main/tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    std::os::unix::fs::symlink(&secret, tasks.join("bash-5ecre7aa.json")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The watch goes on with the session's own files.
    k.wire("main", &[task("task.started", "bash-aaaa0003", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0003 waiting");
    k.wire("main", &[task("task.terminated", "bash-aaaa0003", "completed"), turn_ended(0)]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0003 done");
    k.nothing_for(Duration::from_millis(300));
    let refused =
        ["agents/sub1/wire.jsonl is a symbolic link", "agents/main/tasks/bash-5ecre7aa.json is a symbolic link"];
    let warned = "agents/sub2/wire.jsonl is not a regular file";
    k.shim.stderr_until("the three warnings", |lines| {
        refused.iter().chain([&warned]).all(|w| lines.iter().any(|l| l.contains(w)))
    });
    let stderr = k.finish();
    assert!(!stderr.contains("SECRET"), "file content on stderr at the default level: {stderr}");
    for refused in refused {
        assert_eq!(stderr.matches(refused).count(), 1, "warned once: {refused}; {stderr}");
    }
}

/// Appends `total` bytes of ~1 KiB records (a tool's output, as Kimi records it) to `agents/main/wire.jsonl` in
/// one write, so that the shim finds them all at once.
fn append_records(k: &Kimi, total: usize) {
    let path = k.session_dir.join("agents/main/wire.jsonl");
    let mut batch = String::with_capacity(total + 2048);
    let out = "x".repeat(900);
    let mut n = 0u64;
    while batch.len() < total {
        let r = json!({"type":"context.append_loop_event","agentId":"main","event":{"type":"tool.result","toolCallId":format!("call_{n}"),"result":{"output":out}},"time":1_796_000_000_000u64 + n});
        n += 1;
        batch += &format!("{r}\n");
    }
    OpenOptions::new().append(true).open(path).unwrap().write_all(batch.as_bytes()).unwrap();
}

#[test]
fn a_huge_append_is_read_in_bounded_memory() {
    let mut k = Kimi::start("huge-append");
    k.wire("main", &[user_turn(0)]);
    append_records(&k, 48 << 20);
    k.wire("main", &[task("task.started", "bash-aaaa0004", "running")]);
    // The shim reads the 48 MiB first: seconds in a debug build, more on a loaded machine.
    assert_eq!(wait_line(&k.recv_within(std::time::Duration::from_secs(180))), "_coda/wait bash-aaaa0004 waiting");
    // The relay goes on.
    let note = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SESSION,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"still here"}}}});
    k.agent(note.clone());
    assert_eq!(k.recv(), note);
    #[cfg(target_os = "linux")]
    {
        let peak = peak_rss(k.shim.child.id());
        assert!(peak < 32 << 20, "peak RSS {} MiB after a 48 MiB append", peak >> 20);
    }
}

#[test]
fn one_huge_line_is_skipped_with_a_warning_that_quotes_nothing() {
    let mut k = Kimi::start("huge-line");
    k.wire("main", &[user_turn(0)]);
    let path = k.session_dir.join("agents/main/wire.jsonl");
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    // 50 MB in one record, written in pieces as a slow writer would.
    f.write_all(b"{\"type\":\"context.append_loop_event\",\"agentId\":\"main\",\"pad\":\"").unwrap();
    let piece = SECRET.repeat((1 << 20) / SECRET.len());
    for _ in 0..50 {
        f.write_all(piece.as_bytes()).unwrap();
    }
    f.write_all(b"\"}\n").unwrap();
    drop(f);
    k.wire("main", &[task("task.started", "bash-aaaa0005", "running")]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0005 waiting");
    k.wire("main", &[task("task.terminated", "bash-aaaa0005", "completed"), turn_ended(0)]);
    assert_eq!(wait_line(&k.recv()), "_coda/wait bash-aaaa0005 done");
    let stderr = k.shim.stderr_with("skipped a record");
    assert!(!stderr.contains("SECRET"), "{stderr}");
    #[cfg(target_os = "linux")]
    {
        let peak = peak_rss(k.shim.child.id());
        assert!(peak < 40 << 20, "peak RSS {} MiB after a 50 MiB line", peak >> 20);
    }
}

// Runs of one subagent in order (the protocol's Kimi row): registration, progress and settlement of each
// run, and the next run of the same subagent only after the previous one settled, on every path.

fn spawned(task: &str, background: bool) -> Value {
    json!({"type":"subagent.spawned","subagentId":"agent-0","parentAgentId":"main","description":"helper","runInBackground":background,"taskId":task})
}
fn agent_task(ty: &str, id: &str, status: &str) -> Value {
    json!({"type":ty,"agentId":"main","info":{"taskId":id,"kind":"agent","agentId":"agent-0","status":status,"description":"helper","detached":true}})
}
fn run_turn(turn: i64) -> Value {
    json!({"type":"turn.prompt","agentId":"agent-0","turnId":turn,"origin":{"kind":"system_trigger","name":"subagent"},"input":[]})
}
fn sub_text(turn: i64, t: &str) -> Value {
    json!({"type":"context.append_loop_event","agentId":"agent-0","event":{"type":"content.part","turnId":turn.to_string(),"step":1,"part":{"type":"text","text":t}}})
}
fn sub_turn_ended(turn: i64) -> Value {
    json!({"type":"turn.ended","agentId":"agent-0","turnId":turn,"reason":"completed"})
}
fn sub_completed() -> Value {
    json!({"type":"subagent.completed","subagentId":"agent-0"})
}

/// `_coda/wait <id> <state>` or `update <session> <text>`, for one line per frame the client got.
fn activity_line(v: &Value) -> String {
    if v["method"] == "_coda/wait" {
        return wait_line(v);
    }
    let p = &v["params"];
    format!(
        "update {} {}",
        p["sessionId"].as_str().unwrap_or(""),
        p["update"]["content"]["text"].as_str().unwrap_or("")
    )
}

fn next_lines(k: &mut Kimi, n: usize) -> Vec<String> {
    (0..n).map(|_| activity_line(&k.recv())).collect()
}

/// agent-0's first run, in the background, ended after the client turn: handling.
fn first_run_handling(k: &mut Kimi) {
    k.wire(
        "main",
        &[user_turn(0), agent_task("task.started", "agent-aaaa0001", "running"), spawned("agent-aaaa0001", true)],
    );
    k.wire(
        "agent-0",
        &[json!({"type":"metadata","protocol_version":"1.5","created_at":1}), run_turn(0), sub_text(0, "one")],
    );
    k.wire("main", &[turn_ended(0)]);
    assert_eq!(next_lines(k, 2), ["_coda/wait agent-aaaa0001 waiting", "update agent-0 one"]);
    k.wire("agent-0", &[sub_turn_ended(0)]);
    k.wire("main", &[sub_completed(), agent_task("task.terminated", "agent-aaaa0001", "completed")]);
    assert_eq!(next_lines(k, 1), ["_coda/wait agent-aaaa0001 handling"]);
}

/// Kimi's own turn on the first run's result resumes agent-0 in the foreground; the turn ends after it.
fn resumed_in_own_turn(k: &mut Kimi, turn: i64) {
    k.wire("main", &[own_turn(turn, "agent-aaaa0001"), spawned("agent-aaaa0002", false)]);
    k.wire("agent-0", &[run_turn(1), sub_text(1, "two"), sub_turn_ended(1)]);
    k.wire("main", &[sub_completed()]);
    k.nothing_for(Duration::from_millis(300));
    k.wire("main", &[turn_ended(turn)]);
    assert_eq!(
        next_lines(k, 4),
        [
            "_coda/wait agent-aaaa0001 done",
            "_coda/wait agent-aaaa0002 waiting",
            "update agent-0 two",
            "_coda/wait agent-aaaa0002 done"
        ]
    );
}

#[test]
fn runs_of_a_subagent_in_a_coda_turn_come_one_after_the_other() {
    let mut k = Kimi::start("runs-coda-turn");
    k.wire("main", &[user_turn(0), spawned("agent-aaaa0001", false)]);
    k.wire(
        "agent-0",
        &[json!({"type":"metadata","protocol_version":"1.5","created_at":1}), run_turn(0), sub_text(0, "one")],
    );
    // The second run is asked for before the first one's end is read.
    k.wire("main", &[spawned("agent-aaaa0002", false)]);
    k.wire("agent-0", &[sub_turn_ended(0), run_turn(1), sub_text(1, "two"), sub_turn_ended(1)]);
    k.wire("main", &[sub_completed(), sub_completed(), turn_ended(0)]);
    assert_eq!(
        next_lines(&mut k, 6),
        [
            "_coda/wait agent-aaaa0001 waiting",
            "update agent-0 one",
            "_coda/wait agent-aaaa0001 done",
            "_coda/wait agent-aaaa0002 waiting",
            "update agent-0 two",
            "_coda/wait agent-aaaa0002 done"
        ]
    );
}

#[test]
fn a_run_resumed_in_kimis_own_turn_waits_until_the_handled_run_settled() {
    let mut k = Kimi::start("runs-own-turn");
    first_run_handling(&mut k);
    resumed_in_own_turn(&mut k, 1);
}

#[test]
fn a_background_run_started_while_the_previous_is_handling_follows_its_settlement() {
    let mut k = Kimi::start("runs-handling");
    first_run_handling(&mut k);
    k.wire("main", &[own_turn(1, "agent-aaaa0001"), agent_task("task.started", "agent-aaaa0002", "running")]);
    k.wire("main", &[spawned("agent-aaaa0002", true)]);
    k.wire("agent-0", &[run_turn(1), sub_text(1, "two")]);
    k.nothing_for(Duration::from_millis(300));
    k.wire("main", &[turn_ended(1)]);
    assert_eq!(
        next_lines(&mut k, 3),
        ["_coda/wait agent-aaaa0001 done", "_coda/wait agent-aaaa0002 waiting", "update agent-0 two"]
    );
    k.wire("agent-0", &[sub_turn_ended(1)]);
    k.wire("main", &[sub_completed(), agent_task("task.terminated", "agent-aaaa0002", "completed")]);
    assert_eq!(next_lines(&mut k, 1), ["_coda/wait agent-aaaa0002 handling"]);
    k.wire("main", &[own_turn(2, "agent-aaaa0002"), turn_ended(2)]);
    assert_eq!(next_lines(&mut k, 1), ["_coda/wait agent-aaaa0002 done"]);
}

#[test]
fn the_order_holds_across_a_session_load_in_the_same_process() {
    let mut k = Kimi::start("runs-load");
    first_run_handling(&mut k);
    // Coda loads the session again (a reconnect) while the first run is handling.
    k.client(json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":SESSION,"cwd":"/w","mcpServers":[]}}));
    k.agent_gets(|v| v["method"] == "session/load");
    k.agent(json!({"jsonrpc":"2.0","id":3,"result":{}}));
    assert_eq!(k.recv()["id"], 3);
    resumed_in_own_turn(&mut k, 1);
}
