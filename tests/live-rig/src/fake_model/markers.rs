//! The markers in a prompt that script the fake model's answer (`[[name:arg]]`, nested markers in an argument).

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Marker {
    Text(String),
    Bg(String),
    Sh(String),
    Subagent {
        name: Option<String>,
        prompt: String,
        background: bool,
    },
    Resume {
        target: String,
        prompt: String,
    },
    Tool {
        name: String,
        arguments: String,
    },
    Error {
        kind: String,
        times: Option<u32>,
    },
    Delay(u64),
    /// The verdict of Codex's approval reviewer (`[[review:OUTCOME|RISK|RATIONALE]]`), see `review.rs`.
    Review {
        outcome: String,
        risk: String,
        rationale: String,
    },
}

/// Finds the top-level `[[name:arg]]` markers in `text`; an argument may hold nested markers.
pub(super) fn parse_markers(text: &str) -> Vec<Marker> {
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
        "review" => {
            let mut parts = arg.splitn(3, '|').map(|p| p.trim().to_string());
            let outcome = parts.next().unwrap_or_default();
            let risk = parts.next().unwrap_or_default();
            Marker::Review { outcome, risk, rationale: parts.next().unwrap_or_default() }
        }
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
}
