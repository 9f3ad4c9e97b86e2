//! Test rig for the OpenCode layers: the stack the binary runs, in the engine's harness (a clock driven by hand).
//!
//! The engine's waits layer, the permission bridge, the activity layer and the failure layer (the session
//! instruction is left out: it is tested on its own), with OpenCode's server events handed to them by the set-up's own routing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::adapters::opencode::activity::OpenCodeActivity;
use crate::adapters::opencode::permissions::{Permissions, ask_options};
use crate::adapters::opencode::record::Record;
use crate::adapters::opencode::server::{FromServer, ServerEvent};
use crate::coda::waits::Waits;
use crate::layer::testing::Harness;

pub const P: &str = "ses_parent";
pub const C: &str = "ses_child";

/// Answers given on OpenCode's server: (directory, request id, reply).
pub type Replies = Arc<Mutex<Vec<(String, String, String)>>>;

/// What reached the client and the agent.
pub type Out = (Vec<Value>, Vec<Value>);

pub struct Rig {
    pub h: Harness,
    pub replies: Replies,
    /// Server events to every layer that takes them, as the set-up sends them.
    route: Box<dyn Fn(FromServer) -> bool>,
}

impl Rig {
    /// The layers, with nothing said yet.
    pub fn new(resume_delay: Duration, record: Record) -> Rig {
        let replies = Replies::default();
        let r = replies.clone();
        let replier = Arc::new(move |d: &str, id: &str, reply: &str| {
            r.lock().expect("lock").push((d.into(), id.into(), reply.into()));
            Ok(())
        });
        let bridge = Permissions::new(replier, record.clone(), resume_delay);
        let activity = OpenCodeActivity::new(None, record);
        let mut route = None;
        let h = Harness::build(|layers| {
            layers.push(Box::new(Waits::new()));
            layers.add(|_: crate::layer::EventSender<FromServer>| Box::new(bridge));
            layers.add(|_: crate::layer::EventSender<FromServer>| Box::new(activity));
            layers.add(|_: crate::layer::EventSender<FromServer>| {
                Box::new(crate::adapters::opencode::failure::layer(Duration::from_secs(60)))
            });
            let bus = layers.broadcast::<FromServer>();
            route = Some(move |e| bus.send(e));
        });
        let route = Box::new(route.expect("the layers' events"));
        Rig { h, replies, route }
    }

    /// Initialized, with a session P in /w.
    pub fn started() -> Rig {
        Rig::started_with(Duration::ZERO)
    }

    pub fn started_with(resume_delay: Duration) -> Rig {
        let mut rig = Rig::new(resume_delay, Record::off());
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}});
        rig.client(init);
        let (to_client, _) = rig.raw_agent(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}));
        assert_eq!(to_client[0]["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], json!({}));
        rig.client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        rig.raw_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":P}}));
        rig
    }

    /// What left the stack on each side since the last look.
    fn out(&mut self) -> Out {
        (self.h.to_client(), self.h.to_agent())
    }

    /// Coda's prompt `id` in session P.
    pub fn prompt(&mut self, id: u64) -> Out {
        self.client(json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":P,"prompt":[]}}))
    }

    pub fn client(&mut self, v: Value) -> Out {
        self.h.from_client(v);
        self.out()
    }

    pub fn raw_agent(&mut self, v: Value) -> Out {
        self.h.from_agent(v);
        self.out()
    }

    /// One agent frame, what it leads to dropped (a soak's pace).
    pub fn h_agent(&mut self, v: Value) {
        self.h.from_agent(v);
        self.h.take();
    }

    /// What reaches each side for one agent frame, which itself goes on first, untouched: the params of the
    /// frames after it, and what reached the agent.
    pub fn agent(&mut self, v: Value) -> Out {
        let (to_client, to_agent) = self.raw_agent(v.clone());
        assert_eq!(to_client.first(), Some(&v));
        (to_client[1..].iter().map(|f| f["params"].clone()).collect(), to_agent)
    }

    /// An event of OpenCode's server, handed to the layer the set-up routes it to.
    pub fn server(&mut self, e: ServerEvent) -> Out {
        assert!((self.route)(FromServer::Event(e)));
        self.h.deliver();
        self.out()
    }

    /// Lets `d` pass: what the wake-ups due by then sent.
    pub fn advance(&mut self, d: Duration) -> Out {
        self.h.advance(d);
        self.out()
    }

    /// How long until the next wake-up a layer asked for.
    pub fn wake_in(&self) -> Option<Duration> {
        self.h.next_wake()
    }

    /// Answers the shim's `session/resume` of C among `to_agent`: OpenCode knows the child from now on.
    pub fn resumed(&mut self, to_agent: &[Value]) {
        let resume = to_agent.iter().find(|f| f["method"] == "session/resume").expect("a session/resume");
        assert_eq!(resume["params"], json!({"sessionId":C,"cwd":"/w","mcpServers":[]}));
        let (to_client, _) = self.raw_agent(json!({"jsonrpc":"2.0","id":resume["id"],"result":{"configOptions":[]}}));
        assert!(to_client.is_empty(), "the shim's own resume is not Coda's");
    }

    /// Keeps the layers' jobs (their calls on OpenCode's server) until [`Rig::run_work`].
    pub fn hold_work(&mut self) {
        self.h.hold_work();
    }

    /// Runs the jobs kept: what their results sent.
    pub fn run_work(&mut self) -> Out {
        self.h.run_work();
        self.out()
    }

    pub fn replies(&self) -> Vec<(String, String, String)> {
        self.replies.lock().expect("lock").clone()
    }
}

pub fn update(session: &str, u: Value) -> Value {
    json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":u}})
}

pub fn task_running(call: &str, background: bool, follow_up: Option<&str>) -> Value {
    let mut input =
        json!({"background":background,"description":"worker_1 task","prompt":"child work","subagent_type":"general"});
    if let Some(t) = follow_up {
        input["task_id"] = json!(t);
    }
    update(
        P,
        json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"in_progress","kind":"think",
            "title":"worker_1 task","rawInput":input}),
    )
}

pub fn task_done(call: &str, background: bool) -> Value {
    let mut meta = json!({"parentSessionId":P,"sessionId":C,"model":{"modelID":"m","providerID":"p"}});
    if background {
        meta["background"] = json!(true);
    }
    update(
        P,
        json!({"sessionUpdate":"tool_call_update","toolCallId":call,"status":"completed","title":"worker_1 task",
            "rawOutput":{"output":"<task …>","metadata":meta}}),
    )
}

pub fn chunk(session: &str) -> Value {
    update(session, json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}))
}

pub fn end_turn(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn"}})
}

pub fn task_child(call: &str) -> ServerEvent {
    ServerEvent::TaskChild { session: P.into(), call: call.into(), child: C.into() }
}

pub fn status(session: &str, busy: bool) -> ServerEvent {
    ServerEvent::Status { session: session.into(), busy }
}

/// Child C asks to run `echo hi` (request `id`, tool call `call`).
pub fn asked(id: &str, call: &str) -> ServerEvent {
    ServerEvent::Asked {
        id: id.into(),
        session: C.into(),
        permission: "bash".into(),
        call: Some(call.into()),
        metadata: json!({"command":"echo hi"}),
        directory: "/w".into(),
    }
}

/// OpenCode's own forward of a child's request (shape as seen live).
pub fn forwarded(id: u64, call: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"session/request_permission","params":{"sessionId":C,
        "toolCall":{"toolCallId":call,"title":"echo hi","kind":"execute","status":"pending","locations":[],
        "rawInput":{"command":"echo hi"}},"options":ask_options()}})
}
