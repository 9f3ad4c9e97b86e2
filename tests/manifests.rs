//! The example Coda plugin manifests (`examples/plugins/<agent>/package.json`) against Coda's plugin schemas
//! `agents.json` and `common.json` (copied into `tests/plugin-schemas/` from the protocol package's
//! `schemas/plugin/`; when the shared seeds sit beside the repository the copy must still equal them).
//!
//! The checker below knows exactly the JSON Schema keywords those two files use and fails on any other,
//! so a schema change cannot make the test pass by being ignored. Patterns are the schema's own, run with
//! the `regex` crate; the one lookahead the schemas use, `(?=.*\S)` ("not blank"), is checked directly.

use crate::support;

use support::{executable, shim, temp};

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema(name: &str) -> Value {
    let text = std::fs::read_to_string(root().join("tests/plugin-schemas").join(name)).expect("schema copy");
    serde_json::from_str(&text).expect("schema JSON")
}

struct Checker {
    agents: Value,
    common: Value,
}

impl Checker {
    fn new() -> Checker {
        Checker { agents: schema("agents.json"), common: schema("common.json") }
    }

    /// Follows a `$ref` such as `common.json#/$defs/id` or `#/$defs/icon` from within `file`.
    fn resolve<'a>(&'a self, file: &'a Value, reference: &str) -> (&'a Value, &'a Value) {
        let (doc, pointer) = reference.split_once('#').expect("a $ref with #");
        let doc = match doc {
            "" => file,
            "common.json" => &self.common,
            "agents.json" => &self.agents,
            other => panic!("a $ref to {other}, which the test does not have"),
        };
        (doc, doc.pointer(pointer).unwrap_or_else(|| panic!("{reference} not found")))
    }

    /// Problems of `value` against `schema` (from `file`); `dir` is the plugin folder for `x-file`.
    fn check(&self, file: &Value, schema: &Value, value: &Value, at: &str, dir: &Path, problems: &mut Vec<String>) {
        let Some(obj) = schema.as_object() else { panic!("schema at {at} is not an object") };
        for (key, rule) in obj {
            match key.as_str() {
                "$schema" | "$id" | "title" | "description" | "$defs" => {}
                "$ref" => {
                    let (doc, target) = self.resolve(file, rule.as_str().expect("$ref string"));
                    self.check(doc, target, value, at, dir, problems);
                }
                "allOf" => {
                    for sub in rule.as_array().expect("allOf array") {
                        self.check(file, sub, value, at, dir, problems);
                    }
                }
                "type" => {
                    let ok = match rule.as_str().expect("type string") {
                        "string" => value.is_string(),
                        "object" => value.is_object(),
                        "array" => value.is_array(),
                        "boolean" => value.is_boolean(),
                        other => panic!("type {other} is not handled"),
                    };
                    if !ok {
                        problems.push(format!("{at}: not of type {rule}"));
                    }
                }
                "maxLength" => {
                    let max = rule.as_u64().expect("maxLength number") as usize;
                    if let Some(s) = value.as_str()
                        && s.chars().count() > max
                    {
                        problems.push(format!("{at}: longer than {max}"));
                    }
                }
                "pattern" => {
                    if let Some(s) = value.as_str()
                        && !matches(rule.as_str().expect("pattern string"), s)
                    {
                        problems.push(format!("{at}: {s:?} does not match {rule}"));
                    }
                }
                "required" => {
                    for name in rule.as_array().expect("required array").iter().filter_map(Value::as_str) {
                        if value.is_object() && value.get(name).is_none() {
                            problems.push(format!("{at}: {name} is required"));
                        }
                    }
                }
                "properties" => {
                    let Some(fields) = value.as_object() else { continue };
                    for (name, sub) in rule.as_object().expect("properties object") {
                        if let Some(v) = fields.get(name) {
                            self.check(file, sub, v, &format!("{at}/{name}"), dir, problems);
                        }
                    }
                }
                "additionalProperties" => {
                    assert_eq!(rule, &json!(false), "only additionalProperties: false is handled");
                    let allowed = obj.get("properties").and_then(Value::as_object);
                    for name in value.as_object().into_iter().flat_map(|o| o.keys()) {
                        if !allowed.is_some_and(|a| a.contains_key(name)) {
                            problems.push(format!("{at}: {name} is not allowed"));
                        }
                    }
                }
                "items" => {
                    for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                        self.check(file, rule, item, &format!("{at}/{i}"), dir, problems);
                    }
                }
                "maxItems" => {
                    let max = rule.as_u64().expect("maxItems number") as usize;
                    if value.as_array().is_some_and(|a| a.len() > max) {
                        problems.push(format!("{at}: more than {max} items"));
                    }
                }
                "x-unique-by" => {
                    let keys: Vec<&str> =
                        rule.as_array().expect("x-unique-by array").iter().filter_map(Value::as_str).collect();
                    let mut seen = std::collections::HashSet::new();
                    for item in value.as_array().into_iter().flatten() {
                        let id: Vec<String> =
                            keys.iter().map(|k| item.get(*k).map(Value::to_string).unwrap_or_default()).collect();
                        if !seen.insert(id.clone()) {
                            problems.push(format!("{at}: two items with {keys:?} = {id:?}"));
                        }
                    }
                }
                "x-file" => {
                    assert_eq!(rule["type"], "file", "only x-file of type file is handled");
                    let Some(name) = value.as_str() else { continue };
                    match std::fs::read(dir.join(name)) {
                        Err(e) => problems.push(format!("{at}: {name}: {e}")),
                        Ok(bytes) => {
                            let max = rule["maxBytes"].as_u64().expect("maxBytes") as usize;
                            if bytes.len() > max {
                                problems.push(format!("{at}: {name} has {} bytes, over {max}", bytes.len()));
                            }
                            let magic = rule["magic"].as_str().expect("magic");
                            if !bytes.starts_with(magic.as_bytes()) {
                                problems.push(format!("{at}: {name} does not start with {magic:?}"));
                            }
                        }
                    }
                }
                other => panic!("schema keyword {other:?} at {at} is not handled by this test"),
            }
        }
    }

    /// Problems of a whole manifest's `contributes.agents`.
    fn manifest(&self, manifest: &Value, dir: &Path) -> Vec<String> {
        let mut problems = Vec::new();
        match manifest.pointer("/contributes/agents") {
            None => problems.push("contributes.agents is missing".into()),
            Some(agents) => self.check(&self.agents, &self.agents, agents, "contributes/agents", dir, &mut problems),
        }
        problems
    }
}

/// An ECMAScript-style schema pattern. `(?=.*\S)` right after `^` means "has a non-blank character".
fn matches(pattern: &str, s: &str) -> bool {
    let (pattern, not_blank) = match pattern.strip_prefix(r"^(?=.*\S)") {
        Some(rest) => (format!("^{rest}"), true),
        None => (pattern.to_owned(), false),
    };
    assert!(!pattern.contains("(?"), "pattern {pattern:?} has a construct this test does not handle");
    let re = regex::Regex::new(&pattern).unwrap_or_else(|e| panic!("pattern {pattern:?}: {e}"));
    re.is_match(s) && (!not_blank || s.chars().any(|c| !c.is_whitespace()))
}

fn plugins() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("examples/plugins"))
        .expect("examples/plugins")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("package.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn read_manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).expect("package.json"))
        .expect("package.json is JSON")
}

/// Each manifest's `command` run as Coda runs it: through `sh`, from an app started from the Dock (PATH
/// `/usr/bin:/bin:/usr/sbin:/sbin`, no `~/.cargo/bin`), with the shim installed where `cargo install` puts it
/// (a link to the built binary in `$HOME/.cargo/bin`) and a stand-in CLI in its usual place. The stand-in
/// writes down that it ran, so the whole chain sh -> shim -> CLI is shown to work.
///
/// A plugin with the npm dependency `coda-shim` (`<agent>-npm`) runs from its own folder, as Coda runs a
/// plugin installed from a repository, with the shim where `npm install` puts it there
/// (`node_modules/.bin/coda-<agent>` -> `../coda-shim/bin/coda-<agent>`, the binary after the package's
/// install script; `scripts/npm-check` runs the same command after a real `npm install`).
#[test]
fn every_agent_has_a_manifest_that_runs_its_shim_from_a_gui_path() {
    let names: Vec<String> =
        plugins().iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
    let profiles = coda_shim::adapters::acp::profile::built_in_names();
    let mut want: Vec<String> = profiles.iter().map(|p| format!("acp-{p}")).collect();
    want.extend(["codex", "grok", "kimi", "kimi-npm", "opencode"].map(String::from));
    want.sort();
    assert_eq!(names, want, "one manifest per binary and per coda-acp profile");
    for dir in plugins() {
        let name = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        // `acp-<profile>`: coda-acp with that profile, whose command's program stands in for the agent.
        let profile =
            name.strip_prefix("acp-").map(|p| coda_shim::adapters::acp::profile::built_in(p).expect("a profile"));
        let agent = if profile.is_some() { "acp".to_owned() } else { name.trim_end_matches("-npm").to_owned() };
        let manifest = read_manifest(&dir);
        let command = manifest.pointer("/contributes/agents/0/command").and_then(Value::as_str).expect("command");
        let home = temp::TempDir::new(&format!("coda-manifest-{name}"));
        let binary = format!("coda-{agent}");
        let run_in = if manifest.pointer("/dependencies/coda-shim").is_some() {
            let modules = home.join("plugin/node_modules");
            std::fs::create_dir_all(modules.join(".bin")).expect("node_modules/.bin");
            std::fs::create_dir_all(modules.join("coda-shim/bin")).expect("coda-shim/bin");
            std::os::unix::fs::symlink(shim::binary(&agent), modules.join("coda-shim/bin").join(&binary))
                .expect("binary");
            std::os::unix::fs::symlink(format!("../coda-shim/bin/{binary}"), modules.join(".bin").join(&binary))
                .expect("npm's link");
            home.join("plugin")
        } else {
            let cargo_bin = home.join(".cargo/bin");
            std::fs::create_dir_all(&cargo_bin).expect("~/.cargo/bin");
            std::os::unix::fs::symlink(shim::binary(&agent), cargo_bin.join(&binary)).expect("link");
            home.path().to_path_buf()
        };
        let from_profile = profile.as_ref().map(|p| p.words().expect("a command").0);
        let (folder, program) = match (agent.as_str(), &from_profile) {
            (_, Some(program)) => (".local/bin", program.as_str()),
            ("codex", _) => (".local/bin", "codex-acp"),
            ("grok", _) => (".grok/bin", "grok"),
            (other, _) => (".local/bin", other),
        };
        let cli = home.join(folder).join(program);
        executable::write(&cli, "#!/bin/sh\nprintf '%s\\n' \"$0\" > \"$HOME/ran\"\n");
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(command)
            .env_clear()
            .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", home.path())
            .current_dir(&run_in)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{agent}: {command}: {stderr}");
        let ran = std::fs::read_to_string(home.join("ran")).unwrap_or_default();
        assert_eq!(ran.trim_end(), cli.display().to_string(), "{agent}: {command}: {stderr}");
    }
}

/// A plugin that gets its shim from npm depends on the version this repository builds (scripts/bump-version
/// changes them together), and names the command npm links, not a path of one machine.
#[test]
fn an_npm_plugin_depends_on_this_version_of_coda_shim() {
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let version = cargo.lines().find_map(|l| l.strip_prefix("version = \"")).and_then(|v| v.strip_suffix('"'));
    let npm: Vec<PathBuf> =
        plugins().into_iter().filter(|d| read_manifest(d).pointer("/dependencies/coda-shim").is_some()).collect();
    assert!(!npm.is_empty(), "no example plugin depends on coda-shim");
    for dir in npm {
        let manifest = read_manifest(&dir);
        assert_eq!(manifest.pointer("/dependencies/coda-shim").and_then(Value::as_str), version, "{}", dir.display());
        let command = manifest.pointer("/contributes/agents/0/command").and_then(Value::as_str).expect("command");
        assert!(command.starts_with("node_modules/.bin/coda-"), "{}: {command}", dir.display());
    }
}

#[test]
fn manifests_are_valid_against_codas_agents_and_common_schemas() {
    let checker = Checker::new();
    for dir in plugins() {
        let problems = checker.manifest(&read_manifest(&dir), &dir);
        assert!(problems.is_empty(), "{}: {problems:#?}", dir.display());
    }
}

#[test]
fn the_checker_rejects_what_the_schemas_reject() {
    let checker = Checker::new();
    let dir = root().join("examples/plugins/kimi");
    let good = read_manifest(&dir);
    let with = |pointer: &str, v: Value| {
        let mut m = good.clone();
        *m.pointer_mut(pointer).expect("pointer") = v;
        m
    };
    let mut extra = good.clone();
    extra["contributes"]["agents"][0]["colour"] = json!("red");
    let cases = [
        (with("/contributes/agents/0/id", json!("Kimi")), "does not match"),
        (with("/contributes/agents/0/id", json!("k".repeat(41))), "does not match"),
        (with("/contributes/agents/0/displayName", json!("x".repeat(41))), "longer than 40"),
        (with("/contributes/agents/0/displayName", json!("   ")), "does not match"),
        (with("/contributes/agents/0/command", json!("coda-kimi\n--x")), "does not match"),
        (with("/contributes/agents/0/command", json!("c".repeat(4001))), "longer than 4000"),
        (with("/contributes/agents/0/icon/light", json!("package.json")), "does not start with \"%PDF-\""),
        (with("/contributes/agents/0/icon", json!({"dark": "icon.pdf"})), "light is required"),
        (with("/contributes/agents/0/setupHint", json!("x".repeat(201))), "longer than 200"),
        (extra, "colour is not allowed"),
    ];
    for (i, (manifest, want)) in cases.into_iter().enumerate() {
        let problems = checker.manifest(&manifest, &dir);
        assert!(problems.iter().any(|p| p.contains(want)), "case {i}: expected {want:?} in {problems:?}");
    }
    let mut two = good.clone();
    let first = two["contributes"]["agents"][0].clone();
    two["contributes"]["agents"].as_array_mut().expect("array").push(first);
    assert!(checker.manifest(&two, &dir).iter().any(|p| p.contains("two items")));
}

#[test]
fn the_schema_copies_equal_the_shared_seeds_when_present() {
    let seeds = root().join("../shared/seeds/plugin-schemas");
    if !seeds.is_dir() {
        // CI always has shared/ beside the checkout: there, a missing copy is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "CI is set but {} is missing", seeds.display());
        eprintln!("skipped: no shared seeds beside the repository; using the committed copies as they are");
        return;
    }
    for name in ["agents.json", "common.json"] {
        let seed = std::fs::read(seeds.join(name)).expect("seed schema");
        let copy = std::fs::read(root().join("tests/plugin-schemas").join(name)).expect("copy");
        assert!(seed == copy, "tests/plugin-schemas/{name} differs from the shared seed: copy it again");
    }
}
