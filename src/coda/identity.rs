//! `agentInfo` in the initialize answer names the real CLI, not the shim (section ACP 部分, Agent 版本).

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::frame::{Frame, Id, Kind};
use crate::layer::{Cx, Layer};

/// Which agentInfo the client sees.
pub enum Policy {
    /// Keep the child's own `agentInfo`; where it sends none, build `{name, version}` from
    /// `_meta.agentVersion` of the answer or from the version probed at start-up.
    FillIn,
    /// Always report `{name, version}` (the child reports its adapter package, not the CLI).
    Replace,
}

pub struct Identity {
    name: &'static str,
    policy: Policy,
    probed: Option<String>,
    initialize: HashSet<Id>,
}

impl Identity {
    pub fn new(name: &'static str, policy: Policy, probed: Option<String>) -> Identity {
        Identity { name, policy, probed, initialize: HashSet::new() }
    }
}

impl Layer for Identity {
    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let Kind::Request { id, method } = frame.kind()
            && method == "initialize"
        {
            self.initialize.insert(id.clone());
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Response { id } = frame.kind() else {
            return cx.to_client(frame);
        };
        if !self.initialize.remove(id) {
            return cx.to_client(frame);
        }
        let mut value = match frame.value() {
            Ok(value) => value,
            Err(e) => return cx.unreadable(frame, &e, false),
        };
        let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) else {
            return cx.to_client(frame);
        };
        let has_own = result.get("agentInfo").is_some_and(Value::is_object);
        if has_own && matches!(self.policy, Policy::FillIn) {
            return cx.to_client(frame);
        }
        let from_meta = result.get("_meta").and_then(|m| m.get("agentVersion")).and_then(Value::as_str);
        let Some(version) = from_meta.map(str::to_owned).or_else(|| self.probed.clone()) else {
            tracing::debug!("no version of {} known; leaving agentInfo as it is", self.name);
            return cx.to_client(frame);
        };
        result.insert("agentInfo".into(), json!({ "name": self.name, "version": version }));
        cx.to_client(frame.rewritten(&value))
    }
}
