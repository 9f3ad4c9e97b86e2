//! Live (opt-in, `CODA_LIVE=1` after `scripts/install-clis`): each real CLI installed the way its installer lays
//! it out in one of the usual places, under a temporary HOME, and the shim started with a Dock app's PATH
//! (`/usr/bin:/bin:/usr/sbin:/sbin`) and no command override: doctor must name that place, and a prompt must
//! get an answer from the fake model.
//!
//! codex-acp and Kimi are `#!/usr/bin/env node` scripts, linked into the place with Node 22 beside them, as
//! npm does for a Node installed in the same prefix. The machine's own `/usr/bin/node` (on that PATH) may be
//! older than Kimi's minimum (22.19): the run only works when the child's PATH starts with the CLI's folder.

use crate::support;

use support::{fake_model, live, shim, temp};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const GUI_PATH: &str = "/usr/bin:/bin:/usr/sbin:/sbin";

fn link(target: &Path, link: &Path) {
    std::fs::create_dir_all(link.parent().expect("folder")).expect("make the folder");
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

/// Installs `agent`'s real CLI into a usual place under `home`; returns the folder and what doctor says of it.
fn install(agent: &str, lc: &live::LiveCommand) -> (PathBuf, String) {
    let cli = live::installed(agent).expect("installed");
    let home = &lc.home;
    match agent {
        "codex" | "kimi" => {
            let (dir, program, why) = if agent == "codex" {
                (home.join(".npm-global/bin"), "codex-acp", "the npm global prefix npm's documentation suggests")
            } else {
                (home.join(".volta/bin"), "kimi", "volta's default folder")
            };
            link(&cli, &dir.join(program));
            link(&live::node22(), &dir.join("node"));
            let how = format!("in {}: {why}; not on PATH", dir.display());
            (dir, how)
        }
        // Grok's npm postinstall and its installer both put it in $GROK_HOME/bin (the live set-up sets GROK_HOME).
        "grok" => {
            let grok_home = lc.env.iter().find(|(k, _)| k == "GROK_HOME").map(|(_, v)| PathBuf::from(v));
            let dir = grok_home.expect("GROK_HOME").join("bin");
            link(&std::fs::canonicalize(&cli).expect("grok binary"), &dir.join("grok"));
            (dir, "Grok's own install folder ($GROK_HOME/bin), looked at first".to_owned())
        }
        _ => {
            let dir = home.join(".bun/bin");
            link(&cli, &dir.join("opencode"));
            let how = format!("in {}: bun's default folder; not on PATH", dir.display());
            (dir, how)
        }
    }
}

#[test]
fn live_each_cli_is_found_and_runs_with_a_gui_path() {
    let agents = live::selected_agents("the real CLIs with a GUI PATH");
    if agents.is_empty() {
        return;
    }
    let model = fake_model::FakeModel::start();
    for agent in agents {
        let guard = temp::TempDir::new(&format!("coda-live-gui-path-{agent}"));
        let lc = live::prepare(agent, &model.base_url(), guard.path()).expect("prepare the CLI");
        let (dir, how) = install(agent, &lc);
        let shim = |args: &[&str]| {
            let mut cmd = Command::new(shim::binary(agent));
            lc.apply_env(&mut cmd);
            cmd.env("PATH", GUI_PATH).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let (status, out, err) = shim::finish(cmd.spawn().expect("start the shim"), Duration::from_secs(180));
            (status.code(), out, err)
        };

        let (code, out, err) = shim(&["doctor"]);
        println!("=== coda-{agent} doctor (exit {code:?})\n{out}");
        let cli_row = out.lines().find(|l| l.contains(" CLI ")).unwrap_or("");
        assert!(cli_row.starts_with("ok") && cli_row.ends_with(&format!("({how})")), "{out}\n{err}");
        assert!(cli_row.contains(&dir.display().to_string()), "{out}");
        assert!(out.contains("login      session/new works"), "coda-{agent} doctor: {out}\n{err}");

        let workdir = lc.workdir.display().to_string();
        let args = ["--prompt", "Say hello.", "--cwd", &workdir, "--system-prompt", "Answer briefly."];
        let (code, out, err) = shim(&args);
        println!("=== coda-{agent} --prompt (exit {code:?})\n{out}");
        assert_eq!(code, Some(0), "coda-{agent} --prompt with a GUI PATH: {out}\n{err}");
        assert!(out.contains("stop: end_turn"), "{out}");
    }
}
