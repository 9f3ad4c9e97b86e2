//! The main agent's wire records that coda-kimi's failure, compaction and usage layers act on, picked from each
//! scan of the watch and handed to them as typed events ([`Tap`]).
//!
//! The watch ([`crate::adapters::kimi::watch`]) reads Kimi's session files for the activity layer; the same
//! scan also carries the main agent's turns, model requests, token counts and compactions, picked on the
//! watch's thread ([`crate::adapters::kimi::watch::Scan::facts`]). The activity layer hands them on when it
//! has handled the scan, in the engine's one queue, so a layer below it sees them after it has acted on the
//! same records, and no frame of Kimi's is handled between the two (the relay loop takes events before
//! frames).

use std::sync::{Arc, Mutex};

use crate::adapters::kimi::feed::Fed;
use crate::adapters::kimi::translate::MAIN;
use crate::adapters::kimi::wire::{Entry, Record};
use crate::layer::EventSender;

/// What one scan of a session's files said of its main agent, in wire order.
#[derive(Debug, Clone, PartialEq)]
pub struct WireFacts {
    pub session: String,
    pub entries: Vec<Entry>,
}

/// Whether a record is one the failure, compaction and usage layers read.
fn wanted(record: &Record) -> bool {
    matches!(
        record,
        Record::TurnPrompt { .. }
            | Record::TurnEnded { .. }
            | Record::StepRetrying(_)
            | Record::LlmRequest { .. }
            | Record::Usage { .. }
            | Record::TokenCount { .. }
            | Record::CompactionBegin { .. }
            | Record::CompactionApplied { .. }
            | Record::CompactionEnded { .. }
    )
}

/// The main agent's records of one scan that matter here (subagents have wires of their own, and their
/// requests are not the main thread's).
pub fn pick(session: &str, fed: &[Fed]) -> Option<WireFacts> {
    let entries: Vec<Entry> = fed
        .iter()
        .filter_map(|f| match f {
            Fed::Entries { agent, entries } if agent == MAIN => Some(entries),
            _ => None,
        })
        .flatten()
        .filter(|e| wanted(&e.record))
        .cloned()
        .collect();
    (!entries.is_empty()).then(|| WireFacts { session: session.to_owned(), entries })
}

/// The senders of the layers that take [`WireFacts`]. Made before the layers are (the activity layer, which
/// starts the watches, sits above them and is added first); filled as they are added, before any session
/// is watched.
#[derive(Clone, Default)]
pub struct Tap(Arc<Mutex<Vec<EventSender<WireFacts>>>>);

impl Tap {
    pub fn add(&self, sender: EventSender<WireFacts>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(sender);
    }

    /// Hands the facts of one scan to every layer that takes them; false once the relay has stopped.
    pub fn send(&self, facts: Option<WireFacts>) -> bool {
        let Some(facts) = facts else { return true };
        let senders = self.0.lock().unwrap_or_else(|p| p.into_inner());
        senders.iter().all(|s| s.send(facts.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::kimi::wire::parse_line;

    #[test]
    fn only_the_main_agents_records_that_matter_are_picked() {
        let e = |line: &str| parse_line(line.as_bytes()).unwrap();
        let request = e(r#"{"type":"llm.request","agentId":"main","kind":"loop","time":5}"#);
        let fed = vec![
            Fed::Entries {
                agent: "main".into(),
                entries: vec![e(r#"{"type":"step.begin","agentId":"main","time":4}"#), request.clone()],
            },
            Fed::Entries {
                agent: "agent-0".into(),
                entries: vec![e(r#"{"type":"llm.request","agentId":"agent-0","kind":"loop","time":6}"#)],
            },
            Fed::Nothing,
        ];
        assert_eq!(pick("s", &fed), Some(WireFacts { session: "s".into(), entries: vec![request] }));
        assert_eq!(pick("s", &fed[1..]), None);
    }

    #[test]
    fn a_huge_record_gives_no_fact() {
        use crate::adapters::kimi::feed::{Feed, RECORD_MAX};
        const WIRE: &str = "agents/main/wire.jsonl";
        let mut feed = Feed::new(0);
        let huge = format!(
            "{{\"type\":\"usage.record\",\"agentId\":\"main\",\"pad\":\"{}\",\"usage\":{{\"inputOther\":7}},\"time\":1}}\n",
            "x".repeat(RECORD_MAX)
        );
        let fed = [feed.piece(WIRE, false, huge.as_bytes())];
        assert_eq!(pick("s", &fed), None);
        let next = r#"{"type":"usage.record","agentId":"main","usage":{"inputOther":8},"time":2}
"#;
        let fed = [feed.piece(WIRE, false, next.as_bytes())];
        assert_eq!(pick("s", &fed).map(|f| f.entries[0].record.clone()), Some(Record::Usage { input: Some(8) }));
    }
}
