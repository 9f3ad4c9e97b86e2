//! Secrets in any text: the patterns Kimi's own title masking knows (`adapters/kimi/title.rs`: private key
//! blocks, `Authorization: Bearer …`, `api_key=…`/`token: …`/`password=…`, `sk-…` keys, long opaque tokens) and
//! a few well-known token shapes (GitHub, AWS, Slack, JWT), each masked as `[redacted]`.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

pub const MASK: &str = "[redacted]";

/// Token shapes that are secrets wherever they appear.
static SHAPES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r"(?i)-----BEGIN [^-]*PRIVATE KEY-----[\s\S]*?(-----END [^-]*PRIVATE KEY-----|$)", "[redacted]"),
        (r"(?i)\b(authorization)\s*[:=]\s*(bearer|basic|token)\s+[^\s\x22']+", "$1: $2 [redacted]"),
        (r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}", "Bearer [redacted]"),
        (r#"(?i)\b(api[_-]?key|access[_-]?key|token|secret|password|passwd|pwd|client[_-]?secret)\b(\x22?\s*[:=]\s*)(\x22[^\x22]*\x22|'[^']*'|[^\s,;}\x22']+)"#, "$1$2[redacted]"),
        (r"\bsk-[A-Za-z0-9_-]{12,}", "[redacted]"),
        (r"\bgh[pousr]_[A-Za-z0-9]{20,}", "[redacted]"),
        (r"\bgithub_pat_[A-Za-z0-9_]{20,}", "[redacted]"),
        (r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", "[redacted]"),
        (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "[redacted]"),
        (r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "[redacted]"),
    ]
    .into_iter()
    .map(|(re, with)| (Regex::new(re).expect("a valid pattern"), with))
    .collect()
});

/// Kimi's last pattern: any opaque run of 40 or more key characters. Not applied to ids and paths, which are
/// such runs and are kept.
static LONG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b[A-Za-z0-9][A-Za-z0-9+/=_-]{39,}").expect("a valid pattern"));

/// `text` with every secret masked; `long`: opaque runs of 40+ characters too.
pub fn mask(text: &str, long: bool) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for (re, with) in SHAPES.iter() {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, *with).into_owned());
        }
    }
    if long && LONG.is_match(&out) {
        // A run made only of path parts (`a/b/c`, no `+` or `=`) with a slash is a path, not a token.
        let masked = LONG.replace_all(&out, |c: &regex::Captures| {
            let m = &c[0];
            let looks_like_path = m.contains('/') && m.split('/').all(|p| p.len() < 40);
            if looks_like_path { m.to_owned() } else { MASK.to_owned() }
        });
        out = Cow::Owned(masked.into_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_known_shapes_are_masked() {
        for (text, gone) in [
            ("Authorization: Bearer abc.def-123456", "abc.def-123456"),
            ("curl -H 'authorization: bearer tok_987654321'", "tok_987654321"),
            ("OPENAI_API_KEY=sk-proj-abcdefghijklmnop", "sk-proj-abcdefghijklmnop"),
            ("{\"api_key\": \"hunter2hunter2\"}", "hunter2hunter2"),
            ("password=correct-horse", "correct-horse"),
            ("token: ghp_0123456789abcdefghijABCDEFGHIJ", "ghp_0123456789abcdefghijABCDEFGHIJ"),
            ("aws AKIAABCDEFGHIJKLMNOP here", "AKIAABCDEFGHIJKLMNOP"),
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "MIIE"),
            ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4f", "SflKxwRJSMeKKF2QT4f"),
        ] {
            let out = mask(text, false);
            assert!(!out.contains(gone), "{text:?} -> {out:?}");
            assert!(out.contains(MASK), "{out:?}");
        }
        let long = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3A";
        assert!(!mask(long, true).contains(long));
        assert_eq!(mask(long, false), long);
        let path = "/src/some-folder/another-folder-name/and-a-file-name.rs";
        assert_eq!(mask(path, true), path);
    }
}
