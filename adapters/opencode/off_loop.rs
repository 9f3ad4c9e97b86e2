//! Test: nothing the OpenCode layers ask for holds up the relay loop.
//!
//! The compaction, steering and activity layers run in the real relay on in-memory pipes, with the set-up's
//! calls replaced by ones that block until the test lets them go: the start of the server's reader, a
//! compaction's HTTP calls and a steering message's post. While each blocks, frames of other requests go
//! through both ways within a deadline; once let go, each outcome reaches the layer (and Coda) as the
//! layer's input, from one of the engine's worker threads.

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::adapters::opencode::activity::OpenCodeActivity;
use crate::adapters::opencode::compact::{Asker, OpenCodeCompact, Summarized};
use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent, SteerCallKind};
use crate::adapters::opencode::steering::{Call, Caller, OpenCodeSteering};
use crate::layer::{EventSender, Layers};
use crate::relay::{AgentSide, Options};

/// How long the test waits for any one frame: far below how long a blocked call would block.
const DEADLINE: Duration = Duration::from_secs(10);
/// How long a blocked call blocks at most, should the test fail before it lets it go.
const BLOCKS: Duration = Duration::from_secs(60);

/// A call the test holds: it says on which thread it runs, then blocks until let go.
#[derive(Clone)]
struct Held {
    go: Arc<Mutex<mpsc::Receiver<()>>>,
    runs_on: tokio::sync::mpsc::UnboundedSender<String>,
}

/// The test's side of a [`Held`]: what lets it go, and where it says its thread.
struct Holder {
    go: mpsc::Sender<()>,
    runs_on: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Held {
    fn new() -> (Held, Holder) {
        let (go_tx, go) = mpsc::channel();
        let (runs_on, runs_on_rx) = tokio::sync::mpsc::unbounded_channel();
        (Held { go: Arc::new(Mutex::new(go)), runs_on }, Holder { go: go_tx, runs_on: runs_on_rx })
    }

    /// Blocks until let go (true) or [`BLOCKS`] (false).
    fn block(&self) -> bool {
        let _ = self.runs_on.send(std::thread::current().name().unwrap_or("unnamed").to_owned());
        self.go.lock().expect("lock").recv_timeout(BLOCKS).is_ok()
    }
}

impl Holder {
    /// The thread the call runs on, once it runs (within [`DEADLINE`]).
    async fn running(&mut self, what: &str) -> String {
        let thread = tokio::time::timeout(DEADLINE, self.runs_on.recv()).await;
        thread.unwrap_or_else(|_| panic!("{what} did not run within {DEADLINE:?}")).expect("the call is there")
    }

    fn release(&self) {
        self.go.send(()).expect("the call waits");
    }
}

type ClientReads = tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>;

/// The next line `lines` gives, as JSON, within [`DEADLINE`].
async fn next(lines: &mut ClientReads, what: &str) -> Value {
    let line = tokio::time::timeout(DEADLINE, lines.next_line()).await;
    let line = line.unwrap_or_else(|_| panic!("{what}: nothing within {DEADLINE:?}: the loop is held up"));
    crate::json::from_str(&line.expect("read").expect("a line")).expect("JSON")
}

async fn send(to: &mut tokio::io::WriteHalf<tokio::io::DuplexStream>, v: Value) {
    to.write_all(format!("{v}\n").as_bytes()).await.expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_reader_start_compaction_or_steering_call_holds_up_no_frame() {
    let (reader, mut start_reader) = Held::new();
    let (ask, mut answer_ask) = Held::new();
    let (post, mut answer_post) = Held::new();

    let (mut layers, events) = Layers::new();
    let a = ask.clone();
    let asker: Asker = Arc::new(move |_| {
        let released = a.block();
        Some(Summarized::Failed { why: format!("let go: {released}") })
    });
    layers.add(|_| Box::new(crate::coda::compact::Compaction::new(OpenCodeCompact::new(Some(asker), Record::off()))));
    let p = post.clone();
    let caller: Caller = Arc::new(move |call| {
        let Call::Post { session, .. } = call else { panic!("only a post is asked for: {call:?}") };
        let released = p.block();
        let error = Some(format!("let go: {released}"));
        Some(ServerEvent::SteerCall { session, call: SteerCallKind::Post, message: String::new(), error })
    });
    let mut steering_events: Option<EventSender<FromServer>> = None;
    layers.add(|events| {
        steering_events = Some(events);
        Box::new(crate::coda::steering::Steering::new(OpenCodeSteering::new(Some(caller), Record::off())))
    });
    let r = reader.clone();
    let start = Box::new(move || {
        r.block();
    });
    layers.add(|_| Box::new(OpenCodeActivity::new(Some(start), Record::off())));
    let steering_events = steering_events.expect("a sender");

    let (agent, agent_end) = AgentSide::memory();
    let (client, client_end) = tokio::io::duplex(64 << 10);
    let (client_read, client_write) = tokio::io::split(client);
    let options = Options { max_line: crate::lines::DEFAULT_MAX_LINE, trace: None };
    let relay =
        tokio::spawn(crate::relay::run_with_client(layers.stack(), agent, events, options, client_read, client_write));
    let (from_relay, mut to_relay) = tokio::io::split(client_end);
    let mut client_reads = BufReader::new(from_relay).lines();
    let (agent_read, mut agent_write) = tokio::io::split(agent_end);
    let mut agent_reads = BufReader::new(agent_read).lines();

    // The answer to `initialize` starts the reader, which blocks: the answer reaches Coda all the same.
    send(&mut to_relay, json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}})).await;
    assert_eq!(next(&mut agent_reads, "initialize").await["method"], "initialize");
    send(&mut agent_write, json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}})).await;
    let init = next(&mut client_reads, "the answer to initialize").await;
    assert_eq!(init["result"]["_meta"]["steering"]["supported"], true, "{init}");
    // Two sessions, with their model.
    for (id, session) in [(1, "ses_a"), (2, "ses_b")] {
        let new = json!({"jsonrpc":"2.0","id":id,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}});
        send(&mut to_relay, new).await;
        next(&mut agent_reads, "session/new").await;
        let options = json!([{"id":"model","currentValue":"fake/fake-model"}]);
        let answer = json!({"jsonrpc":"2.0","id":id,"result":{"sessionId":session,"configOptions":options}});
        send(&mut agent_write, answer.clone()).await;
        assert_eq!(next(&mut client_reads, "the answer to session/new").await, answer);
    }

    // Coda compacts ses_a: the ask blocks; a request and an answer go through meanwhile.
    let compact = json!({"jsonrpc":"2.0","id":3,"method":"_coda/session/compact","params":{"sessionId":"ses_a"}});
    send(&mut to_relay, compact).await;
    let other = json!({"jsonrpc":"2.0","id":4,"method":"x","params":{}});
    send(&mut to_relay, other.clone()).await;
    assert_eq!(next(&mut agent_reads, "a request while the compaction's call blocks").await, other);
    send(&mut agent_write, json!({"jsonrpc":"2.0","id":4,"result":{}})).await;
    assert_eq!(next(&mut client_reads, "its answer").await, json!({"jsonrpc":"2.0","id":4,"result":{}}));

    // Coda steers ses_b's running turn: the post blocks; an update of the turn reaches Coda meanwhile.
    let prompt = json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"ses_b","prompt":[]}});
    send(&mut to_relay, prompt.clone()).await;
    assert_eq!(next(&mut agent_reads, "the prompt").await, prompt);
    assert!(steering_events.send(FromServer::Event(ServerEvent::Status { session: "ses_b".into(), busy: true })));
    let steer = json!({"jsonrpc":"2.0","id":6,"method":"_session/steering","params":{"sessionId":"ses_b",
        "prompt":[{"type":"text","text":"also this"}]}});
    send(&mut to_relay, steer).await;
    let update = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"ses_b",
        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}});
    send(&mut agent_write, update.clone()).await;
    assert_eq!(next(&mut client_reads, "an update while the steering call blocks").await, update);

    // All three block at once, each on a worker thread of the engine's.
    for (holder, what) in
        [(&mut start_reader, "the reader's start"), (&mut answer_ask, "the compaction"), (&mut answer_post, "the post")]
    {
        let thread = holder.running(what).await;
        assert!(thread.starts_with("coda-work-"), "{what} ran on {thread}");
    }

    // Let go, the outcomes reach the layers as their input and Coda gets its answers.
    start_reader.release();
    answer_ask.release();
    let compacted = next(&mut client_reads, "the answer to the compaction").await;
    assert_eq!(compacted["id"], 3, "{compacted}");
    assert_eq!(compacted["result"]["compacted"], false, "{compacted}");
    assert!(compacted.to_string().contains("let go: true"), "{compacted}");
    answer_post.release();
    let steered = next(&mut client_reads, "the answer to the steering").await;
    assert_eq!(steered["id"], 6, "{steered}");
    assert!(steered["error"]["message"].as_str().is_some_and(|m| m.contains("let go: true")), "{steered}");

    to_relay.shutdown().await.expect("close");
    assert_eq!(tokio::time::timeout(DEADLINE, agent_reads.next_line()).await.expect("closed").expect("read"), None);
    agent_write.shutdown().await.expect("close");
    assert_eq!(tokio::time::timeout(DEADLINE, relay).await.expect("the relay ends").expect("relay"), 0);
}
