//! coda-codex reports the Codex CLI version in `agentInfo` however codex-acp was installed: a symlink into
//! an npm package (npm -g), a wrapper script (pnpm's and volta's shims, `exec node …/dist/index.js`), an
//! `npx`-style command, or `CODEX_PATH`. Each stand-in runs the scripted test agent for ACP and answers
//! `cli -V` the way codex-acp 2.6.0 does (`codex-cli 0.166.0`).

use crate::support;

use support::{executable, shim, temp};

use std::path::Path;

use serde_json::{Value, json};

/// codex-acp 2.6.0's own initialize answer: its package as agentInfo, which coda-codex replaces.
const INIT: &str = r#"{"protocolVersion":1,"agentCapabilities":{"loadSession":true},"agentInfo":{"name":"@agentclientprotocol/codex-acp","title":"Codex","version":"2.6.0"}}"#;

fn write_script(path: &Path, body: &str) {
    executable::write(path, &format!("#!/bin/sh\n{body}\n"));
}

/// A codex-acp stand-in: `cli -V` after `skip` leading arguments prints `codex-cli <asked>` (or fails when
/// `None`), anything else runs the test agent.
fn stand_in(path: &Path, skip: usize, asked: Option<&str>) {
    let agent = shim::test_agent();
    let answer = match asked {
        Some(v) => format!("echo 'codex-cli {v}'; exit 0"),
        None => "echo 'error: unknown command cli' >&2; exit 2".to_owned(),
    };
    let shifts = "shift; ".repeat(skip);
    write_script(
        path,
        &format!(
            "{shifts}if [ \"$1\" = cli ] && [ \"$2\" = -V ]; then {answer}; fi\nexec '{}' \"$@\"",
            agent.display()
        ),
    );
}

fn agent_info(command: &str, env: &[(&str, &str)]) -> Value {
    let mut b = shim::command("codex").arg("--agent-command").arg(command).env("TEST_AGENT_INIT", INIT);
    b = b.env("CODA_SHIM_LOG", "error").env_remove("CODEX_PATH");
    for (k, v) in env {
        b = b.env(k, v);
    }
    let mut s = b.start();
    let (answer, _) = s.request(0, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    answer["result"].get("agentInfo").cloned().unwrap_or(Value::Null)
}

fn quoted(p: &Path) -> String {
    shell_words::quote(&p.display().to_string()).into_owned()
}

#[test]
fn npm_global_symlink_reads_the_codex_package() {
    let t = temp::TempDir::new("codex-npm");
    let package = t.join("lib/node_modules/@agentclientprotocol/codex-acp");
    // `cli -V` would say otherwise: the package installed beside codex-acp is read, not run.
    stand_in(&package.join("dist/index.js"), 0, Some("9.9.9"));
    let codex = package.join("node_modules/@openai/codex/package.json");
    std::fs::create_dir_all(codex.parent().unwrap()).unwrap();
    std::fs::write(&codex, r#"{"name":"@openai/codex","version":"0.166.0"}"#).unwrap();
    std::fs::create_dir_all(t.join("bin")).unwrap();
    std::os::unix::fs::symlink(
        "../lib/node_modules/@agentclientprotocol/codex-acp/dist/index.js",
        t.join("bin/codex-acp"),
    )
    .unwrap();
    assert_eq!(agent_info(&quoted(&t.join("bin/codex-acp")), &[]), json!({"name": "codex", "version": "0.166.0"}));
}

#[test]
fn a_wrapper_script_is_asked_with_cli_v() {
    // pnpm's and volta's shims, or `exec node …/dist/index.js`: no package beside the program.
    let t = temp::TempDir::new("codex-wrapper");
    stand_in(&t.join("bin/codex-acp"), 0, Some("0.166.0"));
    assert_eq!(agent_info(&quoted(&t.join("bin/codex-acp")), &[]), json!({"name": "codex", "version": "0.166.0"}));
}

#[test]
fn an_npx_style_command_is_asked_with_its_arguments_and_cli_v() {
    let t = temp::TempDir::new("codex-npx");
    // `npx @agentclientprotocol/codex-acp cli -V`: the package name comes first.
    stand_in(&t.join("npx"), 1, Some("0.165.2"));
    let command = format!("{} @agentclientprotocol/codex-acp", quoted(&t.join("npx")));
    assert_eq!(agent_info(&command, &[]), json!({"name": "codex", "version": "0.165.2"}));
}

#[test]
fn codex_path_is_asked_first() {
    let t = temp::TempDir::new("codex-path");
    stand_in(&t.join("bin/codex-acp"), 0, Some("9.9.9"));
    write_script(&t.join("codex"), "echo 'codex-cli 0.170.1'");
    let codex = t.join("codex").display().to_string();
    assert_eq!(
        agent_info(&quoted(&t.join("bin/codex-acp")), &[("CODEX_PATH", &codex)]),
        json!({"name": "codex", "version": "0.170.1"})
    );
}

#[test]
fn no_version_found_leaves_agent_info_out() {
    // A build that knows no `cli -V`, or says something else: codex-acp's own package is not the agent.
    let t = temp::TempDir::new("codex-unknown");
    stand_in(&t.join("bin/codex-acp"), 0, None);
    assert_eq!(agent_info(&quoted(&t.join("bin/codex-acp")), &[]), Value::Null);
    write_script(
        &t.join("other"),
        &format!("[ \"$1\" = cli ] && {{ echo 'cli 1.0'; exit 0; }}\nexec '{}'", shim::test_agent().display()),
    );
    assert_eq!(agent_info(&quoted(&t.join("other")), &[]), Value::Null);
}
