//! `acp-replay stats`: per method, what each side of a trace carried and how long requests waited for their
//! answers, and what the shim added.
//!
//! The sides are the trace's two conversations ([`crate::replay::rpc`]): what Coda saw (`client->shim`,
//! `shim->client`) and what the CLI saw (`shim->agent`, `agent->shim`). A request's latency is the time from
//! the request to its answer on the same side, by the trace's clock. What the shim added is counted from the
//! pairing the viewer draws ([`crate::replay::view::changes`]): frames it made, frames it changed, and frames
//! of a peer it did not pass on as they came (held, dropped, or folded into one of its own).

use crate::HashMap;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;

use super::rpc::{Conversation, Shape, Side, shape, side_of};
use super::validate::Party;
use super::view::changes::{Found, Linker};
use super::view::read::{Line, Reader};

/// One method on one side, sent by one party.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MethodStats {
    pub requests: usize,
    pub notifications: usize,
    /// Answers with a result, and with an error.
    pub results: usize,
    pub errors: usize,
    /// Requests answered by no frame of the trace.
    pub unanswered: usize,
    /// Milliseconds from each answered request to its answer.
    pub latencies: Vec<f64>,
}

impl MethodStats {
    /// The `p`-th percentile of the latencies (nearest rank), when there are any.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        let mut v = self.latencies.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return None;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        Some(v[rank.clamp(1, n) - 1])
    }
}

/// What the shim did to the frames of one method.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Added {
    pub made: usize,
    pub changed: usize,
    pub not_passed: usize,
}

/// The statistics of a trace.
#[derive(Debug, Default)]
pub struct Stats {
    /// Per side (client, agent): per (method, sender).
    pub sides: [BTreeMap<(String, &'static str), MethodStats>; 2],
    /// Per method: what the shim added.
    pub added: BTreeMap<String, Added>,
    /// Answers to no open request, per side.
    pub stray_answers: [usize; 2],
    pub records: usize,
    pub bad_lines: usize,
}

/// Methods of records kept for naming what the linker settles later: bounded like its window.
const KEPT_METHODS: usize = 1 << 14;

/// The name counted for a frame whose method is not known: not JSON-RPC, or an answer to no open request.
const OTHER: &str = "(method not known)";

/// Reads a trace one line at a time and counts.
pub fn stats(input: impl BufRead) -> Stats {
    let mut st = Stats::default();
    let mut conversations: [Conversation; 2] = Default::default();
    let mut linker = Linker::default();
    let mut methods: BTreeMap<usize, String> = BTreeMap::new();
    let mut index = 0;
    let settle = |found: Vec<Found>, methods: &mut BTreeMap<usize, String>, st: &mut Stats| {
        for f in found {
            let (i, what) = match f {
                Found::Made { out } => (out, 0),
                Found::Edited { out, .. } => (out, 1),
                Found::NotPassed { inp, .. } => (inp, 2),
            };
            let method = methods.get(&i).cloned().unwrap_or_else(|| OTHER.to_owned());
            let a = st.added.entry(method).or_default();
            match what {
                0 => a.made += 1,
                1 => a.changed += 1,
                _ => a.not_passed += 1,
            }
        }
    };
    for line in Reader::new(input) {
        let rec = match line {
            Line::Record(rec) => rec,
            Line::Bad(_) => {
                st.bad_lines += 1;
                continue;
            }
        };
        st.records += 1;
        let i = index;
        index += 1;
        let Some((side, sender)) = side_of(rec.dir) else { continue };
        let s = usize::from(side == Side::Agent);
        let conversation = &mut conversations[s];
        let frame = super::rpc::frame_of(&rec);
        let method = match frame.as_deref().map(shape) {
            Some(Shape::Request { id, method }) => {
                conversation.requests(sender).sent(id, method, rec.t, rec.line);
                let m = st.sides[s].entry((method.to_owned(), sender.as_str())).or_default();
                m.requests += 1;
                Some(method.to_owned())
            }
            Some(Shape::Notification { method }) => {
                st.sides[s].entry((method.to_owned(), sender.as_str())).or_default().notifications += 1;
                Some(method.to_owned())
            }
            Some(Shape::Answer { id, ok }) => match conversation.requests(sender.other()).answered(id) {
                Some(open) => {
                    let m = st.sides[s].entry((open.method.clone(), sender.other().as_str())).or_default();
                    if ok {
                        m.results += 1;
                    } else {
                        m.errors += 1;
                    }
                    m.latencies.push((rec.t - open.t).max(0.0));
                    Some(open.method)
                }
                None => {
                    st.stray_answers[s] += 1;
                    None
                }
            },
            _ => None,
        };
        if let Some(m) = method {
            methods.insert(i, m);
            while methods.len() > KEPT_METHODS {
                methods.pop_first();
            }
        }
        let found = linker.push(i, &rec);
        settle(found, &mut methods, &mut st);
    }
    settle(linker.finish(), &mut methods, &mut st);
    for (s, conversation) in conversations.iter().enumerate() {
        for party in [Party::Client, Party::Agent] {
            let requests = match party {
                Party::Client => &conversation.by_client,
                Party::Agent => &conversation.by_agent,
            };
            let mut open: HashMap<String, usize> = HashMap::default();
            for o in requests.open_requests() {
                *open.entry(o.method.clone()).or_default() += 1;
            }
            for (method, n) in open {
                st.sides[s].entry((method, party.as_str())).or_default().unanswered += n;
            }
        }
    }
    st
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into())
}

impl Stats {
    /// The statistics as `acp-replay stats` prints them.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let titles = ["client side (what Coda saw)", "agent side (what the CLI saw)"];
        for (s, title) in titles.iter().enumerate() {
            let _ = writeln!(out, "{title}:");
            if self.sides[s].is_empty() {
                let _ = writeln!(out, "  no frames");
            } else {
                let _ = writeln!(
                    out,
                    "  {:<34} {:<6} {:>8} {:>8} {:>7} {:>6} {:>5} {:>8} {:>8} {:>8} {:>8}",
                    "method",
                    "from",
                    "requests",
                    "notices",
                    "results",
                    "errors",
                    "open",
                    "p50 ms",
                    "p90 ms",
                    "p99 ms",
                    "max ms"
                );
            }
            for ((method, from), m) in &self.sides[s] {
                let _ = writeln!(
                    out,
                    "  {:<34} {:<6} {:>8} {:>8} {:>7} {:>6} {:>5} {:>8} {:>8} {:>8} {:>8}",
                    method,
                    from,
                    m.requests,
                    m.notifications,
                    m.results,
                    m.errors,
                    m.unanswered,
                    ms(m.percentile(50.0)),
                    ms(m.percentile(90.0)),
                    ms(m.percentile(99.0)),
                    ms(m.percentile(100.0)),
                );
            }
            if self.stray_answers[s] > 0 {
                let _ = writeln!(out, "  answers to no open request: {}", self.stray_answers[s]);
            }
        }
        let _ = writeln!(
            out,
            "what the shim added (frames it made or changed; frames of a peer it did not pass on as they came):"
        );
        if self.added.is_empty() {
            let _ = writeln!(out, "  nothing: every frame passed on as it came");
        } else {
            let _ = writeln!(out, "  {:<34} {:>6} {:>8} {:>14}", "method", "made", "changed", "not passed on");
        }
        for (method, a) in &self.added {
            let _ = writeln!(out, "  {:<34} {:>6} {:>8} {:>14}", method, a.made, a.changed, a.not_passed);
        }
        let _ = writeln!(out, "{} records, {} unreadable lines", self.records, self.bad_lines);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64, dir: &str, shim: bool, frame: &str) -> String {
        let shim = if shim { r#","shim":true"# } else { "" };
        format!(r#"{{"t":{t},"dir":"{dir}"{shim},"frame":{frame}}}"#)
    }

    #[test]
    fn latencies_are_per_side_and_method_and_what_the_shim_made_is_counted() {
        let lines = [
            rec(0, "client->shim", false, r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}"#),
            rec(1, "shim->agent", false, r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}"#),
            rec(10, "agent->shim", false, r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}"#),
            rec(11, "shim->client", false, r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}"#),
            rec(12, "shim->client", true, r#"{"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s"}}"#),
            rec(40, "agent->shim", false, r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#),
            rec(43, "shim->client", true, r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn","_meta":{}}}"#),
            rec(50, "client->shim", false, r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{}}"#),
            rec(60, "shim->client", false, r#"{"jsonrpc":"2.0","id":9,"result":{}}"#),
        ]
        .join("\n");
        let st = stats(lines.as_bytes());
        let key = |m: &str, from: &'static str| (m.to_owned(), from);
        let client = &st.sides[0][&key("session/prompt", "client")];
        assert_eq!((client.requests, client.results, client.unanswered), (2, 1, 1));
        assert_eq!(client.latencies, [43.0]);
        assert_eq!(st.sides[1][&key("session/prompt", "client")].latencies, [39.0]);
        assert_eq!(st.sides[0][&key("session/update", "agent")].notifications, 1);
        assert_eq!(st.stray_answers, [1, 0]);
        assert_eq!(st.added["_coda/wait"], Added { made: 1, changed: 0, not_passed: 0 });
        // The answer the shim changed, and the second prompt, which the trace never shows passed on.
        assert_eq!(st.added["session/prompt"], Added { made: 0, changed: 1, not_passed: 1 });
        let text = st.text();
        assert!(text.contains("_coda/wait"), "{text}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let m = MethodStats { latencies: (1..=100).map(f64::from).collect(), ..Default::default() };
        assert_eq!((m.percentile(50.0), m.percentile(90.0), m.percentile(99.0)), (Some(50.0), Some(90.0), Some(99.0)));
        assert_eq!(m.percentile(100.0), Some(100.0));
        assert_eq!(MethodStats::default().percentile(50.0), None);
    }
}
