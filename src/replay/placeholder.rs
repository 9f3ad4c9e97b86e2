//! `{{NAME}}` placeholders: learning their values from received text, and filling them into sent text.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// Values of `{{NAME}}` placeholders known so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings(pub BTreeMap<String, String>);

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Bindings {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Bindings {
        Bindings(pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl Bindings {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        self.0.insert(name.to_owned(), value.into());
    }

    /// Bindings from `ACP_REPLAY_BIND_<NAME>` variables.
    pub fn from_env() -> Bindings {
        let mut b = Bindings::default();
        for (key, value) in std::env::vars() {
            if let Some(name) = key.strip_prefix("ACP_REPLAY_BIND_")
                && is_name(name)
            {
                b.set(name, value);
            }
        }
        b
    }
}

/// Whether `s` is a placeholder name: an upper-case letter, then upper case, digits, `_`.
pub(crate) fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

#[derive(Debug, PartialEq)]
enum Seg<'a> {
    Lit(&'a str),
    Var(&'a str),
}

/// Splits a pattern into literal text and `{{NAME}}` placeholders.
fn segments(pattern: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    let mut rest = pattern;
    let mut lit_start = 0;
    let mut offset = 0;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        match after.find("}}") {
            Some(close) if is_name(&after[..close]) => {
                let at = offset + open;
                if at > lit_start {
                    out.push(Seg::Lit(&pattern[lit_start..at]));
                }
                out.push(Seg::Var(&after[..close]));
                let consumed = open + 2 + close + 2;
                offset += consumed;
                lit_start = offset;
                rest = &rest[consumed..];
            }
            _ => {
                offset += open + 1;
                rest = &rest[open + 1..];
            }
        }
    }
    if lit_start < pattern.len() {
        out.push(Seg::Lit(&pattern[lit_start..]));
    }
    out
}

fn match_segs(segs: &[Seg], text: &str, b: &mut Bindings) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return text.is_empty();
    };
    match first {
        Seg::Lit(lit) => text.strip_prefix(lit).is_some_and(|t| match_segs(rest, t, b)),
        Seg::Var(name) => {
            if let Some(value) = b.get(name) {
                let value = value.to_owned();
                return text.strip_prefix(value.as_str()).is_some_and(|t| match_segs(rest, t, b));
            }
            // Learn the shortest non-empty value that lets the rest match.
            let ends = text.char_indices().skip(1).map(|(i, _)| i).chain(std::iter::once(text.len()));
            for end in ends.filter(|&e| e > 0) {
                // An instant's placeholder (`{{AT_n}}`) binds only to an instant.
                if name.starts_with(super::instants::PREFIX) && !super::instants::is_instant(&text[..end]) {
                    continue;
                }
                let mut trial = b.clone();
                trial.set(name, &text[..end]);
                if match_segs(rest, &text[end..], &mut trial) {
                    *b = trial;
                    return true;
                }
            }
            false
        }
    }
}

/// Whether `text` matches `pattern`; placeholders not yet bound are learnt into `b` (only on success).
pub fn match_str(pattern: &str, text: &str, b: &mut Bindings) -> bool {
    if !pattern.contains("{{") {
        return pattern == text;
    }
    let mut trial = b.clone();
    if match_segs(&segments(pattern), text, &mut trial) {
        *b = trial;
        true
    } else {
        false
    }
}

/// Where two frames first differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// JSON pointer of the first difference ("" for the whole value).
    pub pointer: String,
    pub expected: String,
    pub got: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() { "the top" } else { &self.pointer };
        write!(f, "first difference at {at}: expected {}, got {}", self.expected, self.got)
    }
}

fn excerpt(v: &Value) -> String {
    cut(&v.to_string(), 400)
}

/// `s`, cut to about `max` bytes (at a character boundary) for a message.
pub(crate) fn cut(s: &str, max: usize) -> String {
    match crate::text::prefix(s, max, crate::text::Unit::Bytes) {
        kept if kept.len() == s.len() => s.to_owned(),
        kept => format!("{kept}… ({} bytes)", s.len()),
    }
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Compares `got` with the recorded `expected`; strings in `expected` may hold placeholders. Bindings learnt
/// on the way are kept only when the whole value matches.
pub fn match_value(expected: &Value, got: &Value, b: &mut Bindings) -> Result<(), Difference> {
    let mut trial = b.clone();
    let mut pointer = String::new();
    match_at(expected, got, &mut trial, &mut pointer)?;
    *b = trial;
    Ok(())
}

fn match_at(expected: &Value, got: &Value, b: &mut Bindings, pointer: &mut String) -> Result<(), Difference> {
    let differ = |pointer: &str, e: &Value, g: &Value, b: &Bindings| {
        let mut expected = excerpt(e);
        if let Value::String(s) = e
            && s.contains("{{")
        {
            let vars: Vec<String> = segments(s)
                .iter()
                .filter_map(
                    |seg| if let Seg::Var(n) = seg { b.get(n).map(|v| format!("{{{{{n}}}}} = {v:?}")) } else { None },
                )
                .collect();
            if !vars.is_empty() {
                expected = format!("{expected} (with {})", vars.join(", "));
            }
        }
        Difference { pointer: pointer.to_owned(), expected, got: excerpt(g) }
    };
    match (expected, got) {
        (Value::String(e), Value::String(g)) => {
            if match_str(e, g, b) {
                Ok(())
            } else {
                Err(differ(pointer, expected, got, b))
            }
        }
        (Value::Array(e), Value::Array(g)) => {
            for (i, (ei, gi)) in e.iter().zip(g).enumerate() {
                let len = pointer.len();
                pointer.push_str(&format!("/{i}"));
                match_at(ei, gi, b, pointer)?;
                pointer.truncate(len);
            }
            if e.len() != g.len() {
                let i = e.len().min(g.len());
                let len = pointer.len();
                pointer.push_str(&format!("/{i}"));
                let (ev, gv) = (e.get(i).cloned().unwrap_or(Value::Null), g.get(i).cloned().unwrap_or(Value::Null));
                let mut d = differ(pointer, &ev, &gv, b);
                pointer.truncate(len);
                if e.len() < g.len() {
                    d.expected = format!("no item (array of {})", e.len());
                } else {
                    d.got = format!("no item (array of {})", g.len());
                }
                return Err(d);
            }
            Ok(())
        }
        (Value::Object(e), Value::Object(g)) => {
            for (key, ev) in e {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&escape_pointer(key));
                match g.get(key) {
                    Some(gv) => match_at(ev, gv, b, pointer)?,
                    None => {
                        return Err(Difference {
                            pointer: pointer.clone(),
                            expected: excerpt(ev),
                            got: "no such key".into(),
                        });
                    }
                }
                pointer.truncate(len);
            }
            if let Some((key, gv)) = g.iter().find(|(k, _)| !e.contains_key(*k)) {
                return Err(Difference {
                    pointer: format!("{pointer}/{}", escape_pointer(key)),
                    expected: "no such key".into(),
                    got: excerpt(gv),
                });
            }
            Ok(())
        }
        _ if expected == got => Ok(()),
        _ => Err(differ(pointer, expected, got, b)),
    }
}

/// How a placeholder's value is escaped when filled into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// Inside JSON text: as the inside of a JSON string.
    Json,
    Raw,
}

/// Fills placeholders into `text`. A name not bound is asked of `fallback` (and bound); still unknown, it is
/// left as it is and reported in the returned list.
pub fn fill(
    text: &str,
    escape: Escape,
    b: &mut Bindings,
    fallback: &dyn Fn(&str) -> Option<String>,
) -> (String, Vec<String>) {
    if !text.contains("{{") {
        return (text.to_owned(), Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut unknown = Vec::new();
    for seg in segments(text) {
        match seg {
            Seg::Lit(l) => out.push_str(l),
            Seg::Var(name) => {
                let value = match b.get(name) {
                    Some(v) => Some(v.to_owned()),
                    None => fallback(name).inspect(|v| b.set(name, v.clone())),
                };
                match (value, escape) {
                    (Some(v), Escape::Raw) => out.push_str(&v),
                    (Some(v), Escape::Json) => {
                        let quoted = Value::from(v).to_string();
                        out.push_str(&quoted[1..quoted.len() - 1]);
                    }
                    (None, _) => {
                        out.push_str(&format!("{{{{{name}}}}}"));
                        if !unknown.iter().any(|u| u == name) {
                            unknown.push(name.to_owned());
                        }
                    }
                }
            }
        }
    }
    (out, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn segments_split_placeholders_only() {
        assert_eq!(segments("a{{CWD}}/b"), vec![Seg::Lit("a"), Seg::Var("CWD"), Seg::Lit("/b")]);
        assert_eq!(segments("{{x}} {{A B}}"), vec![Seg::Lit("{{x}} {{A B}}")]);
        assert_eq!(segments("{{{HOME}}}"), vec![Seg::Lit("{"), Seg::Var("HOME"), Seg::Lit("}")]);
    }

    #[test]
    fn unbound_placeholders_are_learnt_and_then_hold() {
        let mut bind = Bindings::default();
        assert!(match_str("{{CWD}}/src/main.rs", "/x/y/src/main.rs", &mut bind));
        assert_eq!(bind.get("CWD"), Some("/x/y"));
        assert!(match_str("cd {{CWD}}", "cd /x/y", &mut bind));
        assert!(!match_str("cd {{CWD}}", "cd /x/z", &mut bind));
        assert!(!match_str("{{HOME}}/a", "/h/b", &mut bind));
        assert_eq!(bind.get("HOME"), None, "a failed match learns nothing");
        assert!(match_str("coda-shim-{{SHIM_PID}}-0", "coda-shim-4711-0", &mut bind));
        assert_eq!(bind.get("SHIM_PID"), Some("4711"));
    }

    #[test]
    fn match_value_points_at_the_first_difference() {
        let mut bind = Bindings::from_iter([("CWD", "/w")]);
        let expected = json!({"id":1,"params":{"cwd":"{{CWD}}","list":[1,2,3]}});
        assert!(match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2,3]}}), &mut bind).is_ok());
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/v","list":[1,2,3]}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/params/cwd");
        assert!(d.expected.contains("{{CWD}} = \"/w\""), "{d}");
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2]}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/params/list/2");
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2,3],"x~/":0}}), &mut bind)
            .unwrap_err();
        assert_eq!(d.pointer, "/params/x~0~1");
        let d = match_value(&expected, &json!({"id":2,"params":{}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/id");
        // A learnt value is kept only when the whole frame matched.
        let mut fresh = Bindings::default();
        assert!(match_value(&json!(["{{A}}", 1]), &json!(["x", 2]), &mut fresh).is_err());
        assert_eq!(fresh.get("A"), None);
    }

    #[test]
    fn fill_escapes_for_json_and_reports_unknown_names() {
        let mut bind = Bindings::from_iter([("HOME", "/h/\"q\"")]);
        let (out, unknown) = fill(r#"{"p":"{{HOME}}/x","q":"{{NOPE}}"}"#, Escape::Json, &mut bind, &|_| None);
        assert_eq!(out, r#"{"p":"/h/\"q\"/x","q":"{{NOPE}}"}"#);
        assert_eq!(unknown, vec!["NOPE".to_owned()]);
        let (out, _) = fill("{{TMPDIR}}/a", Escape::Raw, &mut bind, &|n| (n == "TMPDIR").then(|| "/t".into()));
        assert_eq!(out, "/t/a");
        assert_eq!(bind.get("TMPDIR"), Some("/t"), "a fallback value is bound for the rest of the run");
    }
}
