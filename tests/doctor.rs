//! `coda-<agent> doctor`: the checks and their table, with the scripted test agent (or a stand-in program)
//! as the wrapped CLI.

use crate::support;

use support::{executable, shim, temp};

use std::path::Path;
use std::process::{Command, Output, Stdio};

use temp::TempDir;

/// Removed when the test ends, passed or failed.
fn temp(name: &str) -> TempDir {
    TempDir::new(&format!("coda-doctor-test-{name}"))
}

fn doctor(agent: &str, args: &[&str], env: &[(&str, &Path)]) -> (i32, String) {
    let mut cmd = Command::new(shim::binary(agent));
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).env("CODA_SHIM_LOG", "warn");
    for var in ["CODA_GROK_COMMAND", "CODA_OPENCODE_COMMAND", "CODA_KIMI_COMMAND", "CODA_CODEX_COMMAND"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let Output { status, stdout, stderr } = cmd.output().expect("run doctor");
    let out = String::from_utf8_lossy(&stdout).into_owned();
    assert!(!out.contains('\x1b'), "no colours without a terminal: {out:?}");
    eprintln!("stderr: {}", String::from_utf8_lossy(&stderr));
    (status.code().unwrap_or(-1), out)
}

fn test_agent_flag() -> String {
    shell_words::quote(&shim::test_agent().display().to_string()).into_owned()
}

#[test]
fn doctor_runs_every_check_through_the_shim() {
    let data = temp("opencode-data");
    std::fs::create_dir_all(data.join("opencode")).expect("data dir");
    let (code, out) =
        doctor("opencode", &["--agent-command", &test_agent_flag(), "doctor"], &[("XDG_DATA_HOME", data.path())]);
    let agent = shim::test_agent();
    let expected = format!(
        "coda-opencode doctor
ok    CLI        {} (from --agent-command)
warn  version    OpenCode 9.9.9; tested with 1.18.33
                 fix: works if its ACP did not change; to match the tests: npm install -g opencode-ai@1.18.33
ok    data dir   {} is readable
ok    handshake  (no agentInfo) (protocol 1); declares: loadSession, systemPrompt, waits, compact
ok    login      session/new works (no login needed, or logged in)
warn  model      session/new reports no current model: Coda refuses the turn
                 fix: configure a default model in the CLI
warn  manifest   \"command\": \"{}\"
                 fix: this binary is in a cargo build folder; `cargo install --path .` puts it in ~/.cargo/bin for good
no problems, 3 warning(s)
",
        agent.display(),
        data.join("opencode").display(),
        shim::binary("opencode").display(),
    );
    assert_eq!(out, expected);
    assert_eq!(code, 0);
}

#[test]
fn doctor_reports_a_needed_login_with_a_fix() {
    let data = temp("kimi-home");
    let mut cmd_env: Vec<(&str, &Path)> = vec![("KIMI_CODE_HOME", data.path())];
    let one = Path::new("1");
    cmd_env.push(("TEST_AGENT_AUTH_REQUIRED", one));
    let (code, out) = doctor("kimi", &["--doctor", "--agent-command", &test_agent_flag()], &cmd_env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "FAIL  login      needs a login (session/new answered -32000)\n                 fix: run `kimi login`\n"
        ),
        "{out}"
    );
    assert!(out.ends_with("1 problem(s), 2 warning(s)\n"), "{out}");
}

#[test]
fn doctor_tells_debians_grok_from_grok_build() {
    let bin = temp("debian-grok-bin");
    let home = temp("debian-grok-home");
    let grok = bin.join("grok");
    executable::write(&grok, "#!/bin/sh\necho 'Usage: grok [-d] -f configfile'\nexit 1\n");
    let path = std::env::join_paths([bin.path(), Path::new("/usr/bin"), Path::new("/bin")]).expect("PATH");
    let mut cmd = Command::new(shim::binary("grok"));
    cmd.arg("doctor")
        .env("PATH", &path)
        .env("HOME", home.path())
        .env_remove("GROK_HOME")
        .env_remove("CODA_GROK_COMMAND")
        .stdin(Stdio::null());
    let output = cmd.output().expect("run doctor");
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let first = out.lines().nth(1).unwrap_or("");
    assert!(first.starts_with("FAIL  CLI"), "{out}");
    assert!(first.contains(&format!("wrong program: {} is not Grok Build", grok.display())), "{out}");
    assert!(
        out.contains("fix: install Grok Build: npm install -g @xai-official/grok; or point CODA_GROK_COMMAND at it")
    );
    assert!(!out.contains("handshake") && !out.contains("session/new"), "no login check without the CLI: {out}");
}

#[test]
fn doctor_says_how_to_install_a_missing_cli_and_checks_the_data_dir() {
    let empty = temp("empty-path");
    let file_dir = temp("kimi-file");
    let not_a_dir = file_dir.join("kimi-home");
    std::fs::write(&not_a_dir, "").expect("a file where the data dir should be");
    let env = [("PATH", empty.path()), ("HOME", empty.path()), ("KIMI_CODE_HOME", &not_a_dir)];
    let (code, out) = doctor("kimi", &["doctor"], &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  CLI       not found: cannot find `kimi` (Kimi Code CLI) on PATH"), "{out}");
    assert!(out.contains("fix: npm install -g @moonshot-ai/kimi-code (needs Node >= 22.19); or set CODA_KIMI_COMMAND"));
    assert!(out.contains(&format!("FAIL  data dir  {} is not a directory\n", not_a_dir.display())), "{out}");
    assert!(out.contains("fix: move it away or set KIMI_CODE_HOME to a directory"), "{out}");
}

/// What coda-grok declares is its own layers' (compaction, steering) plus the engine's (waits), whatever the CLI
/// says: doctor's handshake row lists them.
#[test]
fn doctor_lists_compact_among_what_coda_grok_declares() {
    let home = temp("grok-home");
    let (code, out) = doctor("grok", &["--agent-command", &test_agent_flag(), "doctor"], &[("GROK_HOME", home.path())]);
    let handshake = out.lines().find(|l| l.contains("handshake")).unwrap_or_else(|| panic!("no handshake row: {out}"));
    assert!(handshake.ends_with("declares: loadSession, systemPrompt, waits, compact, steering"), "{out}");
    assert!(code == 0 || code == 1, "{out}");
}
