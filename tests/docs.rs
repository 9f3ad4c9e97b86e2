//! The documents: every relative link and `#anchor` in README.md, ARCHITECTURE.md, CONTRIBUTING.md,
//! CHANGELOG.md and docs/*.md resolves (anchors as GitHub makes them from headings, CJK ones included), and
//! docs/configuration.md names every flag and environment variable the binaries take, and none they do not.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use regex::Regex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents whose links are checked: the four at the top and every page of docs/.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> =
        ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "CHANGELOG.md"].iter().map(|d| root.join(d)).collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "md")).collect()
        })
        .unwrap_or_default();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: the text without its inline markup, lower case, every character
/// that is not a letter, a digit, `-`, `_` or a space dropped (letters of any script stay: `插话`), spaces as
/// `-`. Repeats get `-1`, `-2`, ... (in [`anchors`]).
pub fn slug(heading: &str) -> String {
    let links = Regex::new(r"!?\[([^\]]*)\]\([^)]*\)").unwrap();
    let text = links.replace_all(heading, "$1");
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text: one per ATX heading, and the `id`s of HTML anchors.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let heading = Regex::new(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$").unwrap();
    let html = Regex::new(r#"<a\s+(?:id|name)="([^"]+)""#).unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        if let Some(c) = heading.captures(line) {
            let base = slug(c[1].trim());
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
            *n += 1;
        }
        out.extend(html.captures_iter(line).map(|c| c[1].to_owned()));
    }
    out
}

/// The link targets of a Markdown text outside code (fenced blocks and code spans), with their line numbers:
/// inline links and images, and reference definitions.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let code_span = Regex::new(r"(`+)[^`]*?(?:`)+").unwrap();
    let inline = Regex::new(r#"\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)"#).unwrap();
    let definition = Regex::new(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)").unwrap();
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = code_span.replace_all(line, "");
        out.extend(inline.captures_iter(&line).map(|c| (n, c[1].to_owned())));
        out.extend(definition.captures_iter(&line).map(|c| (n, c[1].to_owned())));
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` folded, or `None` when it climbs out of the root.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// What is wrong with the links of `docs` (paths relative to `root`): each a line naming the document, the
/// line and the target.
pub fn broken_links(root: &Path, docs: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut anchors_of = |file: &Path| -> BTreeSet<String> {
        cache
            .entry(file.to_owned())
            .or_insert_with(|| anchors(&std::fs::read_to_string(file).unwrap_or_default()))
            .clone()
    };
    for doc in docs {
        let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
        let Ok(text) = std::fs::read_to_string(doc) else {
            problems.push(format!("{name}: missing"));
            continue;
        };
        let dir = doc.parent().unwrap_or(root).strip_prefix(root).unwrap_or(Path::new("")).to_owned();
        for (line, target) in links(&text) {
            let at = format!("{name}:{line}: {target}");
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if target.is_empty() {
                problems.push(format!("{at}: an empty link"));
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(percent_decode(a))),
                None => (target.as_str(), None),
            };
            if path.starts_with('/') {
                problems.push(format!("{at}: an absolute path (links are relative to the document)"));
                continue;
            }
            let file = if path.is_empty() {
                doc.clone()
            } else {
                match normalise(&dir.join(percent_decode(path))) {
                    Some(rel) => root.join(rel),
                    None => {
                        problems.push(format!("{at}: leads out of the repository"));
                        continue;
                    }
                }
            };
            if !file.exists() {
                problems.push(format!("{at}: no such file or folder"));
                continue;
            }
            if let Some(anchor) = anchor {
                if file.extension().is_none_or(|x| x != "md") {
                    problems.push(format!("{at}: an anchor into a file that is not Markdown"));
                } else if !anchors_of(&file).contains(&anchor) {
                    problems.push(format!("{at}: no heading makes the anchor #{anchor}"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_link_and_anchor_in_the_documents_resolves() {
    let root = root();
    let docs = documents(&root);
    let pages = docs.iter().filter(|d| d.starts_with(root.join("docs"))).count();
    assert!(pages >= 10, "docs/ holds {pages} pages: the documents are missing");
    let problems = broken_links(&root, &docs);
    assert!(problems.is_empty(), "links that do not resolve:\n{}", problems.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(slug("Steering (插话)"), "steering-插话");
    assert_eq!(slug("Upstream failures (执行失败)"), "upstream-failures-执行失败");
    assert_eq!(slug("Codex's automatic review"), "codexs-automatic-review");
    assert_eq!(slug("`doctor` and prompt mode"), "doctor-and-prompt-mode");
    assert_eq!(slug("`_coda/wait` and `CODA_SHIM_LOG`"), "_codawait-and-coda_shim_log");
    assert_eq!(slug("On macOS (FSEvents)"), "on-macos-fsevents");
    assert_eq!(slug("See [the guide](x.md) now"), "see-the-guide-now");
    let text = "# A\n## Twice\n```\n# not a heading\n```\n## Twice\n### Closed ###\n<a id=\"here\"></a>\n";
    let got: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(got, ["a", "closed", "here", "twice", "twice-1"]);
}

#[test]
fn a_broken_link_or_anchor_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/b.md"), "# Bee\n## 插话 (steering)\n").unwrap();
    let a = "# Top\n\
        [ok](docs/b.md) [ok](docs/b.md#插话-steering) [ok](docs/b.md#%E6%8F%92%E8%AF%9D-steering) [ok](#top)\n\
        [web](https://example.com/x#y) `[code](nowhere.md)`\n\
        ```\n[fenced](nowhere.md)\n```\n\
        [gone](docs/c.md)\n\
        [bad anchor](docs/b.md#bees)\n\
        [own](#nothing)\n\
        [out](../elsewhere.md)\n\
        [abs](/etc/passwd)\n\
        [def]: docs/d.md\n";
    std::fs::write(root.join("README.md"), a).unwrap();
    let problems = broken_links(root, &[root.join("README.md"), root.join("docs/b.md")]);
    let targets: Vec<&str> = problems.iter().map(|p| p.split(": ").nth(1).unwrap_or("")).collect();
    assert_eq!(
        targets,
        ["docs/c.md", "docs/b.md#bees", "#nothing", "../elsewhere.md", "/etc/passwd", "docs/d.md"],
        "{problems:#?}"
    );
}

/// Flags and environment variables.
mod configuration {
    use super::*;

    /// Every binary and its `--help`.
    fn helps() -> Vec<(&'static str, String)> {
        let bins = [
            ("coda-codex", env!("CARGO_BIN_EXE_coda-codex")),
            ("coda-kimi", env!("CARGO_BIN_EXE_coda-kimi")),
            ("coda-grok", env!("CARGO_BIN_EXE_coda-grok")),
            ("coda-opencode", env!("CARGO_BIN_EXE_coda-opencode")),
            ("coda-acp", env!("CARGO_BIN_EXE_coda-acp")),
            ("acp-replay", env!("CARGO_BIN_EXE_acp-replay")),
        ];
        bins.iter()
            .map(|(name, path)| {
                let out = Command::new(path).arg("--help").env_clear().output().expect("run --help");
                assert!(out.status.success(), "{name} --help failed: {out:?}");
                (*name, String::from_utf8(out.stdout).expect("UTF-8 help"))
            })
            .collect()
    }

    /// The flags a text names (`--name`, `-x`), leaving out what is inside code spans when `skip_code`.
    pub fn flags(text: &str, skip_code: bool) -> BTreeSet<String> {
        let text = if skip_code {
            Regex::new(r"`[^`\n]*`").unwrap().replace_all(text, "").into_owned()
        } else {
            text.to_owned()
        };
        let flag = Regex::new(r"(?:^|[\s\[(|,`/])(--[a-z][a-z0-9-]*[a-z0-9]|-[A-Za-z])\b").unwrap();
        flag.captures_iter(&text).map(|c| c[1].to_owned()).collect()
    }

    /// Names of variables with one of the project's prefixes (`CODA_`, `ACP_REPLAY_`); a part in angle brackets
    /// (`CODA_<AGENT>_COMMAND`) becomes `*`.
    pub fn prefixed_vars(text: &str) -> BTreeSet<String> {
        let var = Regex::new(r"\b(?:CODA|ACP_REPLAY)_(?:[A-Z0-9_]|<[A-Z_]+>)*").unwrap();
        let part = Regex::new(r"<[A-Z_]+>").unwrap();
        var.find_iter(text).map(|m| part.replace_all(m.as_str(), "*").into_owned()).collect()
    }

    /// The source files of the binaries, each without its test module.
    fn sources() -> Vec<(PathBuf, String)> {
        let mut files = Vec::new();
        let mut dirs = vec![root().join("src"), root().join("adapters")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read a source folder").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&path).expect("read a source file");
                    let cut = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
                    files.push((path, text[..cut].to_owned()));
                }
            }
        }
        files
    }

    /// Every string literal of the source that is a whole upper-case name (`"CODA_SHIM_LOG"`, `"HOME"`); one
    /// ending in `_` is a prefix, written `PREFIX_*`.
    fn source_names() -> BTreeSet<String> {
        let literal = Regex::new(r#""([A-Z][A-Z0-9_]*)""#).unwrap();
        let mut names = BTreeSet::new();
        for (_, text) in sources() {
            for c in literal.captures_iter(&text) {
                let name = &c[1];
                names.insert(if name.ends_with('_') { format!("{name}*") } else { name.to_owned() });
            }
        }
        names
    }

    /// The flags the argument parsers match on: `Long("name")`, `Short('x')` (the shims' and acp-replay's,
    /// both read with lexopt; `Long(flag @ ("a" | "b"))` names each), and `"--name"`, `"-x"` in acp-replay's.
    fn parsed_flags() -> BTreeSet<String> {
        let args = std::fs::read_to_string(root().join("src/cli/args.rs")).unwrap();
        let replay = std::fs::read_to_string(root().join("src/bin/acp-replay.rs")).unwrap();
        // coda-acp takes its profile options before the shared parser.
        let acp = std::fs::read_to_string(root().join("adapters/acp/mod.rs")).unwrap();
        let long = Regex::new(r#"Long\((?:[a-z]+ @ \()?("[a-z-]+"(?: \| "[a-z-]+")*)\)"#).unwrap();
        let name = Regex::new(r#""([a-z-]+)""#).unwrap();
        let short = Regex::new(r"Short\('([A-Za-z])'\)").unwrap();
        let quoted = Regex::new(r#""(--[a-z][a-z0-9-]*|-[A-Za-z])""#).unwrap();
        let mut out = BTreeSet::new();
        for text in [&args, &replay, &acp] {
            for c in long.captures_iter(text) {
                out.extend(name.captures_iter(&c[1]).map(|n| format!("--{}", &n[1])));
            }
            out.extend(short.captures_iter(text).map(|c| format!("-{}", &c[1])));
        }
        out.extend(quoted.captures_iter(&replay).map(|c| c[1].to_owned()));
        out.extend(quoted.captures_iter(&acp).map(|c| c[1].to_owned()));
        out
    }

    fn glob_matches(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            Some((head, tail)) => {
                name.len() > head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
            }
            None => pattern == name,
        }
    }

    #[test]
    fn configuration_names_every_flag_and_variable_and_nothing_else() {
        let page = std::fs::read_to_string(root().join("docs/configuration.md")).expect("docs/configuration.md");
        let helps = helps();
        let mut problems = Vec::new();

        // Flags: each binary's --help, and what the parsers match (a flag the help forgot is still one).
        let mut known_flags = BTreeSet::new();
        for (bin, help) in &helps {
            let named = flags(help, true);
            assert!(named.contains("--help") && named.contains("--version"), "{bin} --help names no flags:\n{help}");
            for flag in &named {
                if !flags(&page, false).contains(flag) {
                    problems.push(format!("{bin} --help names {flag}, docs/configuration.md does not"));
                }
            }
            known_flags.extend(named);
        }
        for flag in parsed_flags() {
            if !known_flags.contains(&flag) {
                problems.push(format!("the argument parser takes {flag}, no --help names it"));
            }
            if !flags(&page, false).contains(&flag) {
                problems.push(format!("the argument parser takes {flag}, docs/configuration.md does not name it"));
            }
            known_flags.insert(flag);
        }
        for flag in flags(&page, false) {
            if !known_flags.contains(&flag) {
                problems.push(format!("docs/configuration.md names {flag}, which no binary takes"));
            }
        }

        // Variables: the project's own (CODA_*, ACP_REPLAY_*) from the helps and the source must be on the
        // page; every name on the page must be one the helps or the source name.
        let source = source_names();
        let mut known_vars: BTreeSet<String> =
            source.iter().filter(|n| !prefixed_vars(n).is_empty()).cloned().collect();
        for (_, help) in &helps {
            known_vars.extend(prefixed_vars(help));
        }
        let on_page = prefixed_vars(&page);
        for var in &known_vars {
            if !on_page.contains(var) {
                problems.push(format!("{var} is read by a binary, docs/configuration.md does not name it"));
            }
        }
        for var in &on_page {
            if !known_vars.iter().any(|k| k == var || glob_matches(var, k)) {
                problems.push(format!("docs/configuration.md names {var}, which no binary reads"));
            }
        }
        // Any other upper-case name in a code span of the page (`HOME`, `GROK_HOME`, `TZ=UTC`) is one the
        // source names.
        let span = Regex::new(r"`\$?([A-Z][A-Z0-9_]*[A-Z0-9])(?:=[^`]*)?`").unwrap();
        for c in span.captures_iter(&page) {
            let name = &c[1];
            if prefixed_vars(name).is_empty() && !source.contains(name) {
                problems.push(format!("docs/configuration.md names {name}, which the source never names"));
            }
        }
        assert!(problems.is_empty(), "docs/configuration.md and the binaries disagree:\n{}", problems.join("\n"));
    }

    #[test]
    fn the_scanners_find_flags_and_variables_and_skip_code() {
        let help = "  --agent-command <CMD>  the child [env: CODA_KIMI_COMMAND]\n  -V, --version\n  \
            (what `cargo test --test all` does) -32000 ACP_REPLAY_BIND_<NAME> SESSION_ID\n";
        let got: Vec<String> = flags(help, true).into_iter().collect();
        assert_eq!(got, ["--agent-command", "--version", "-V"]);
        let got: Vec<String> = prefixed_vars(help).into_iter().collect();
        assert_eq!(got, ["ACP_REPLAY_BIND_*", "CODA_KIMI_COMMAND"]);
        assert!(glob_matches("CODA_*_COMMAND", "CODA_KIMI_COMMAND"));
        assert!(!glob_matches("CODA_*_COMMAND", "CODA_SHIM_LOG"));
    }
}
