//! `agentInfo` in the initialize answer names the real CLI, not the shim (section ACP 部分, Agent 版本).
//!
//! The version comes from the probe at start-up. A probe that runs beside the child ([`Identity::awaiting`])
//! hands its result in as a [`Probed`] event; an initialize answer that comes first is held, with every
//! agent frame after it (in order), until the probe answers or its deadline passes.

use std::convert::Infallible;
use std::time::Instant;

use serde_json::{Value, json};

use crate::frame::{Frame, Kind};
use crate::layer::{Cx, Layer};

/// Which agentInfo the client sees.
pub enum Policy {
    /// Keep the child's own `agentInfo`; where it sends none, build `{name, version}` from
    /// `_meta.agentVersion` of the answer or from the version probed at start-up.
    FillIn,
    /// Report `{name, version}` from the probe, in place of the child's own (it names its adapter package,
    /// not the CLI); with no version found, no `agentInfo` at all (reporting nothing is allowed).
    Replace,
}

/// The CLI's version, from a probe that ran off the relay loop; `None` when it could not be found. The event
/// for an [`Identity::awaiting`] layer.
pub struct Probed(pub Option<String>);

/// The wake-up that gives up on the probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GiveUp;

pub struct Identity {
    name: &'static str,
    policy: Policy,
    probed: Option<String>,
    /// Until this time an initialize answer waits for a probe that has not answered; `None` once it answered
    /// or was given up on.
    waiting_until: Option<Instant>,
    /// Agent frames from the initialize answer on, while it waits for the probe.
    held: Option<Vec<Frame>>,
}

impl Identity {
    /// With the version already probed (or known to be unknown).
    pub fn new(name: &'static str, policy: Policy, probed: Option<String>) -> Identity {
        Identity { name, policy, probed, waiting_until: None, held: None }
    }

    /// With the version still being probed: its [`Probed`] event comes later, and an initialize answer waits
    /// for it until `give_up_at` at most.
    pub fn awaiting(name: &'static str, policy: Policy, give_up_at: Instant) -> Identity {
        Identity { waiting_until: Some(give_up_at), ..Identity::new(name, policy, None) }
    }

    /// Lets the held frames go on, the initialize answer first.
    fn release(&mut self, cx: &mut Cx) {
        self.waiting_until = None;
        cx.cancel(&GiveUp);
        let mut held = self.held.take().unwrap_or_default().into_iter();
        if let Some(answer) = held.next() {
            self.answered(answer, cx);
        }
        for frame in held {
            self.from_agent(frame, cx);
        }
    }

    fn answered(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) else {
            return cx.to_client(frame);
        };
        let has_own = result.get("agentInfo").is_some_and(Value::is_object);
        let version = match self.policy {
            Policy::FillIn if has_own => return cx.to_client(frame),
            Policy::FillIn => {
                let from_meta = result.get("_meta").and_then(|m| m.get("agentVersion")).and_then(Value::as_str);
                from_meta.map(str::to_owned).or_else(|| self.probed.clone())
            }
            Policy::Replace => self.probed.clone(),
        };
        match (version, &self.policy) {
            (Some(version), _) => {
                result.insert("agentInfo".into(), json!({ "name": self.name, "version": version }));
            }
            (None, Policy::FillIn) => {
                tracing::debug!("no version of {} known; leaving agentInfo as it is", self.name);
                return cx.to_client(frame);
            }
            (None, Policy::Replace) => {
                // Reporting the adapter's package as the agent would be wrong.
                tracing::warn!("cannot find the version of {}; leaving agentInfo out", self.name);
                result.remove("agentInfo");
            }
        }
        cx.to_client(frame.rewritten(value))
    }
}

impl Layer for Identity {
    type Timer = GiveUp;
    type Event = Probed;
    type Reply = Infallible;

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if let Some(held) = &mut self.held {
            return held.push(frame);
        }
        if !cx.answer_to(&frame).is_some_and(|r| r.is("initialize")) {
            return cx.to_client(frame);
        }
        if let Some(until) = self.waiting_until {
            let left = until.saturating_duration_since(cx.now());
            if !left.is_zero() {
                self.held = Some(vec![frame]);
                return cx.after(left, GiveUp);
            }
            tracing::warn!("the version probe of {} is still running; answering initialize without it", self.name);
            self.waiting_until = None;
        }
        self.answered(frame, cx)
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        // Only answers are looked at (`answer_to` finds no request for anything else), unless frames are held.
        self.held.is_none() && !matches!(frame.kind(), Kind::Response { .. })
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    fn on_event(&mut self, probed: Probed, cx: &mut Cx) {
        if self.waiting_until.is_none() && self.held.is_none() {
            // Given up on already: the answer went out without it.
            tracing::debug!("the version probe of {} answered after its deadline", self.name);
        }
        self.probed = probed.0;
        self.release(cx);
    }

    fn on_timer(&mut self, _: GiveUp, cx: &mut Cx) {
        if self.held.is_some() {
            tracing::warn!("the version probe of {} is still running; answering initialize without it", self.name);
        }
        self.release(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use std::time::Duration;

    const INIT: &str = r#"{"jsonrpc":"2.0","id":"i","method":"initialize","params":{}}"#;

    fn init() -> Value {
        serde_json::from_str(INIT).unwrap()
    }

    /// What reaches the client for one frame of the agent.
    fn from_agent(h: &mut Harness, v: Value) -> Vec<Value> {
        h.from_agent(v);
        h.to_client()
    }

    fn answer(agent_info: Value) -> Value {
        json!({"jsonrpc":"2.0","id":"i","result":{"protocolVersion":1,"agentInfo":agent_info,"_meta":{"agentVersion":"9"}}})
    }

    #[test]
    fn fill_in_keeps_the_childs_own_and_fills_in_from_meta_or_the_probe() {
        let mut h = Harness::of(Identity::new("cli", Policy::FillIn, Some("1.2".into())));
        h.from_client(init());
        let own = json!({"name":"own","version":"3"});
        assert_eq!(from_agent(&mut h, answer(own.clone()))[0]["result"]["agentInfo"], own);
        h.from_client(init());
        assert_eq!(
            from_agent(&mut h, answer(Value::Null))[0]["result"]["agentInfo"],
            json!({"name":"cli","version":"9"})
        );
        h.from_client(init());
        let plain = json!({"jsonrpc":"2.0","id":"i","result":{"protocolVersion":1}});
        assert_eq!(from_agent(&mut h, plain)[0]["result"]["agentInfo"], json!({"name":"cli","version":"1.2"}));
    }

    #[test]
    fn replace_reports_the_probed_version_or_no_agent_info() {
        let own = json!({"name":"@scope/adapter","title":"X","version":"2.6.0"});
        for (probed, want) in [(Some("0.166.0"), Some(json!({"name":"cli","version":"0.166.0"}))), (None, None)] {
            let mut h = Harness::of(Identity::new("cli", Policy::Replace, probed.map(Into::into)));
            h.from_client(init());
            let out = from_agent(&mut h, answer(own.clone()));
            assert_eq!(out[0]["result"].get("agentInfo"), want.as_ref());
            assert_eq!(out[0]["result"]["protocolVersion"], 1);
        }
    }

    /// A harness with an awaiting layer whose deadline is 1 s after set-up, and that deadline.
    fn awaiting() -> (Harness, Instant) {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut h = Harness::of(Identity::awaiting("cli", Policy::Replace, deadline));
        h.from_client(init());
        h.to_agent();
        (h, deadline)
    }

    #[test]
    fn an_answer_before_the_probe_waits_for_it_with_what_follows_in_order() {
        let (mut h, _) = awaiting();
        assert!(from_agent(&mut h, answer(json!({"name":"a"}))).is_empty());
        let after = json!({"jsonrpc":"2.0","method":"_auth/status_update","params":{}});
        assert!(from_agent(&mut h, after.clone()).is_empty());
        h.event(0, Probed(Some("0.166.0".into())));
        let out = h.to_client();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["result"]["agentInfo"], json!({"name":"cli","version":"0.166.0"}));
        assert_eq!(out[1], after);
        assert_eq!(h.next_wake(), None, "the deadline is forgotten");
        assert_eq!(from_agent(&mut h, after.clone()), vec![after], "nothing is held any more");
    }

    #[test]
    fn a_probe_that_hangs_is_given_up_on_at_its_deadline() {
        let (mut h, deadline) = awaiting();
        h.advance(Duration::from_millis(200));
        assert!(from_agent(&mut h, answer(json!({"name":"a"}))).is_empty());
        let left = deadline.saturating_duration_since(h.now());
        assert_eq!(h.next_wake(), Some(left), "the deadline counts from set-up");
        h.advance(left);
        let out = h.to_client();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["result"].get("agentInfo"), None);
        // A late probe changes nothing already sent, and holds nothing.
        h.event(0, Probed(Some("1".into())));
        assert!(h.to_client().is_empty());
    }

    #[test]
    fn an_answer_after_the_deadline_is_not_held() {
        let (mut h, _) = awaiting();
        h.advance(Duration::from_secs(2));
        let out = from_agent(&mut h, answer(json!({"name":"a"})));
        assert_eq!(out.len(), 1);
        assert_eq!(h.next_wake(), None);
    }

    #[test]
    fn a_probe_before_the_answer_holds_nothing() {
        let (mut h, _) = awaiting();
        h.event(0, Probed(Some("7".into())));
        let out = from_agent(&mut h, answer(json!({"name":"a"})));
        assert_eq!(out[0]["result"]["agentInfo"], json!({"name":"cli","version":"7"}));
    }
}
