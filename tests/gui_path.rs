//! Each binary started the way Coda starts it from an app opened from the Dock: a bare environment whose PATH is
//! `/usr/bin:/bin:/usr/sbin:/sbin`, with the CLI installed in one of the usual places (src/locate.rs) and HOME
//! a temporary folder. The CLI is a fake shaped like an npm install: a `#!/usr/bin/env <node>` script beside
//! its own `<node>`, which only runs when the child's PATH has the CLI's folder in it. That `<node>` writes
//! down which script it ran and the PATH it got.
//!
//! Homebrew's `/opt/homebrew/bin` and `/usr/local/bin` are system folders a test may not write to; their place
//! in the order is checked by src/locate.rs's unit tests.

use crate::support;

use support::executable::write as executable;
use support::{shim, temp};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use temp::TempDir;

/// A Dock-started app's PATH on macOS.
const GUI_PATH: &str = "/usr/bin:/bin:/usr/sbin:/sbin";

/// The program each binary looks for.
const CLIS: [(&str, &str); 4] = [("codex", "codex-acp"), ("kimi", "kimi"), ("grok", "grok"), ("opencode", "opencode")];

/// The stand-in for `node`: a different name, so a real Node on the machine can never be the one run.
const NODE: &str = "fakenode";

/// `<dir>/<program>` as npm would install it, with its `fakenode` beside it. Asked `--version` (Grok's check
/// of a `grok` outside its own folder, Kimi's and OpenCode's version probe), it answers like Grok Build; asked
/// `cli -V` (coda-codex's probe of the Codex version, which runs beside the agent and may outlive the shim), it
/// answers like codex-acp. Otherwise it writes its report whole (written aside, then renamed) and exits.
fn install_fake(dir: &Path, program: &str) -> PathBuf {
    let cli = dir.join(program);
    executable(&cli, &format!("#!/usr/bin/env {NODE}\n// the CLI's script\n"));
    executable(
        &dir.join(NODE),
        "#!/bin/sh\n\
         if [ \"$2\" = --version ]; then echo 'grok 1.0.41 (fake)'; exit 0; fi\n\
         if [ \"$2\" = cli ]; then echo 'codex-cli 0.0.0-fake'; exit 0; fi\n\
         printf '%s\\n%s\\n' \"$1\" \"$PATH\" > \"$CODA_TEST_REPORT.$$\"\n\
         mv \"$CODA_TEST_REPORT.$$\" \"$CODA_TEST_REPORT\"\n",
    );
    cli
}

struct Run {
    code: Option<i32>,
    /// The script the fake node ran, and the PATH it got.
    report: Option<(PathBuf, String)>,
    stderr: String,
}

/// Runs `coda-<agent>` as an ACP agent with only `vars` set (and the report file), stdin closed at once.
fn run(agent: &str, home: &Path, vars: &[(&str, String)], args: &[&str]) -> Run {
    let report = home.join("report");
    let _ = std::fs::remove_file(&report);
    let mut cmd = Command::new(shim::binary(agent));
    cmd.env_clear()
        .env("PATH", GUI_PATH)
        .env("HOME", home)
        .env("CODA_TEST_REPORT", &report)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the shim");
    let report = std::fs::read_to_string(&report).ok().map(|text| {
        let mut lines = text.lines();
        (PathBuf::from(lines.next().unwrap_or("")), lines.next().unwrap_or("").to_owned())
    });
    Run { code: out.status.code(), report, stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
}

/// One install place: where the CLI goes under `home`, and the variables that name it.
struct Place {
    name: &'static str,
    dir: fn(&Path) -> PathBuf,
    vars: fn(&Path) -> Vec<(&'static str, String)>,
    /// Set up what else the place needs (an `.npmrc`).
    prepare: fn(&Path),
}

fn none(_: &Path) -> Vec<(&'static str, String)> {
    Vec::new()
}

fn nothing(_: &Path) {}

fn places() -> Vec<Place> {
    vec![
        Place {
            name: "$NPM_CONFIG_PREFIX",
            dir: |h| h.join("npm-env/bin"),
            vars: |h| vec![("NPM_CONFIG_PREFIX", h.join("npm-env").display().to_string())],
            prepare: nothing,
        },
        Place {
            name: "prefix in ~/.npmrc",
            dir: |h| h.join("npm-rc/bin"),
            vars: none,
            prepare: |h| std::fs::write(h.join(".npmrc"), "fund=false\nprefix=~/npm-rc\n").expect("npmrc"),
        },
        Place {
            name: "prefix in $NPM_CONFIG_USERCONFIG",
            dir: |h| h.join("npm-uc/bin"),
            vars: |h| vec![("NPM_CONFIG_USERCONFIG", h.join("conf/npmrc").display().to_string())],
            prepare: |h| {
                std::fs::create_dir_all(h.join("conf")).expect("conf");
                std::fs::write(h.join("conf/npmrc"), format!("prefix = \"{}\"\n", h.join("npm-uc").display()))
                    .expect("npmrc");
            },
        },
        Place { name: "~/.npm-global/bin", dir: |h| h.join(".npm-global/bin"), vars: none, prepare: nothing },
        Place {
            name: "$VOLTA_HOME/bin",
            dir: |h| h.join("volta/bin"),
            vars: |h| vec![("VOLTA_HOME", h.join("volta").display().to_string())],
            prepare: nothing,
        },
        Place { name: "~/.volta/bin", dir: |h| h.join(".volta/bin"), vars: none, prepare: nothing },
        Place {
            name: "$PNPM_HOME",
            dir: |h| h.join("pnpm-home"),
            vars: |h| vec![("PNPM_HOME", h.join("pnpm-home").display().to_string())],
            prepare: nothing,
        },
        Place {
            name: "pnpm's default home",
            dir: |h| if cfg!(target_os = "macos") { h.join("Library/pnpm") } else { h.join(".local/share/pnpm") },
            vars: none,
            prepare: nothing,
        },
        Place {
            name: "$BUN_INSTALL/bin",
            dir: |h| h.join("bun/bin"),
            vars: |h| vec![("BUN_INSTALL", h.join("bun").display().to_string())],
            prepare: nothing,
        },
        Place { name: "~/.bun/bin", dir: |h| h.join(".bun/bin"), vars: none, prepare: nothing },
        Place {
            name: "nvm's newest Node",
            dir: |h| h.join(".nvm/versions/node/v22.19.0/bin"),
            vars: none,
            prepare: |h| std::fs::create_dir_all(h.join(".nvm/versions/node/v20.1.0/bin")).expect("older node"),
        },
        Place { name: "~/.local/bin", dir: |h| h.join(".local/bin"), vars: none, prepare: nothing },
    ]
}

/// Asserts the fake at `cli` ran, with its folder first on PATH and the GUI PATH right after it.
fn assert_ran(agent: &str, place: &str, run: &Run, cli: &Path) {
    let Some((script, path)) = &run.report else {
        panic!("coda-{agent}, CLI in {place}: the fake CLI did not run (exit {:?}): {}", run.code, run.stderr)
    };
    assert_eq!(script, cli, "coda-{agent}, CLI in {place}: ran the wrong program");
    let dirs: Vec<PathBuf> = std::env::split_paths(path).collect();
    assert_eq!(dirs.first().map(PathBuf::as_path), cli.parent(), "coda-{agent}, {place}: PATH {path}");
    let user: Vec<PathBuf> = std::env::split_paths(GUI_PATH).collect();
    assert_eq!(dirs[1..=user.len()], user[..], "coda-{agent}, {place}: the user's PATH follows unchanged: {path}");
    assert_eq!(run.code, Some(0), "coda-{agent}, {place}: the child's status: {}", run.stderr);
}

#[test]
fn each_binary_finds_its_cli_in_each_install_place_with_a_gui_path() {
    for (agent, program) in CLIS {
        for place in places() {
            let home = TempDir::new(&format!("coda-gui-path-{agent}"));
            let h = home.path();
            (place.prepare)(h);
            let cli = install_fake(&(place.dir)(h), program);
            let run = run(agent, h, &(place.vars)(h), &[]);
            assert_ran(agent, place.name, &run, &cli);
        }
    }
}

#[test]
fn grok_prefers_its_own_folder_and_checks_a_grok_found_elsewhere() {
    let home = TempDir::new("coda-gui-path-grok-own");
    let h = home.path();
    let own = install_fake(&h.join(".grok/bin"), "grok");
    install_fake(&h.join(".npm-global/bin"), "grok");
    assert_ran("grok", "~/.grok/bin", &run("grok", h, &[], &[]), &own);
    let moved = install_fake(&h.join("grok-home/bin"), "grok");
    let vars = [("GROK_HOME", h.join("grok-home").display().to_string())];
    assert_ran("grok", "$GROK_HOME/bin", &run("grok", h, &vars, &[]), &moved);

    // A `grok` that is not Grok Build (Debian's) is passed over for the next place.
    let home = TempDir::new("coda-gui-path-grok-debian");
    let h = home.path();
    executable(&h.join(".npm-global/bin/grok"), "#!/bin/sh\necho 'Usage: grok [-d] -f configfile'\nexit 1\n");
    let real = install_fake(&h.join(".local/bin"), "grok");
    assert_ran("grok", "~/.local/bin after a wrong grok", &run("grok", h, &[], &[]), &real);
}

#[test]
fn the_first_place_in_the_stated_order_wins() {
    for (agent, program) in CLIS {
        let home = TempDir::new(&format!("coda-gui-path-order-{agent}"));
        let h = home.path();
        let on_path = install_fake(&h.join("user-bin"), program);
        let npm = install_fake(&h.join(".npm-global/bin"), program);
        let volta = install_fake(&h.join(".volta/bin"), program);
        let local = install_fake(&h.join(".local/bin"), program);
        let user_path = format!("{GUI_PATH}:{}", h.join("user-bin").display());
        let on_path_run = run(agent, h, &[("PATH", user_path.clone())], &[]);
        // Found on the user's PATH: its folder first, then the user's PATH whole.
        let (script, path) = on_path_run.report.clone().expect("ran");
        assert_eq!(script, on_path);
        assert_eq!(path.split(':').skip(1).take(5).collect::<Vec<_>>().join(":"), user_path, "{path}");
        std::fs::remove_file(&on_path).expect("rm");
        assert_ran(agent, "~/.npm-global/bin before volta", &run(agent, h, &[], &[]), &npm);
        std::fs::remove_file(&npm).expect("rm");
        let volta_run = run(agent, h, &[], &[]);
        assert_ran(agent, "~/.volta/bin before ~/.local/bin", &volta_run, &volta);
        // The install places that exist follow the user's PATH, so a CLI can find a `node` kept in another.
        let (_, path) = volta_run.report.expect("ran");
        assert!(std::env::split_paths(&path).any(|d| d == h.join(".local/bin")), "{path}");
        std::fs::remove_file(&volta).expect("rm");
        assert_ran(agent, "~/.local/bin", &run(agent, h, &[], &[]), &local);
    }
}

#[test]
fn not_found_says_where_it_looked_and_exits_127() {
    for (agent, program) in CLIS {
        let home = TempDir::new(&format!("coda-gui-path-none-{agent}"));
        let run = run(agent, home.path(), &[], &[]);
        assert_eq!(run.code, Some(127), "{}", run.stderr);
        let npm_global = home.join(".npm-global/bin").display().to_string();
        assert!(run.stderr.contains(&format!("cannot find `{program}`")), "{}", run.stderr);
        assert!(run.stderr.contains(&npm_global) && run.stderr.contains("/opt/homebrew/bin"), "{}", run.stderr);
    }
}

#[test]
fn doctor_says_which_place_it_used_and_why() {
    let home = TempDir::new("coda-gui-path-doctor");
    let h = home.path();
    let cli = install_fake(&h.join(".bun/bin"), "kimi");
    let mut cmd = Command::new(shim::binary("kimi"));
    cmd.env_clear().env("PATH", GUI_PATH).env("HOME", h).env("CODA_TEST_REPORT", h.join("report"));
    let out = cmd.arg("doctor").stdin(Stdio::null()).output().expect("doctor");
    let out = String::from_utf8_lossy(&out.stdout);
    let expected =
        format!("{} acp (in {}: bun's default folder; not on PATH)", cli.display(), h.join(".bun/bin").display());
    assert!(out.lines().any(|l| l.starts_with("ok    CLI") && l.ends_with(&expected)), "{out}");
    let manifest = format!("\"command\": \"{}\"", shim::binary("kimi").display());
    assert!(out.lines().any(|l| l.contains("manifest") && l.ends_with(&manifest)), "{out}");
}

#[test]
fn an_agent_command_by_bare_name_is_found_the_same_way() {
    let home = TempDir::new("coda-gui-path-override");
    let h = home.path();
    let cli = install_fake(&h.join(".local/bin"), "my-kimi");
    let vars = [("CODA_KIMI_COMMAND", "my-kimi acp".to_owned())];
    assert_ran("kimi", "~/.local/bin via CODA_KIMI_COMMAND", &run("kimi", h, &vars, &[]), &cli);
}

/// The race seen once in this file: a script written while another thread starts a process, run at once. Its
/// write descriptor, copied into the other thread's child until that child's exec, made the run fail with
/// ETXTBSY (8 of 300 runs with `std::fs::write` when this test was written); `executable::write` keeps no such
/// descriptor in this process.
#[test]
fn a_script_written_while_other_threads_start_processes_always_runs() {
    let dir = TempDir::new("coda-gui-path-etxtbsy");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawners: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = Command::new("true").status();
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for i in 0..300 {
        let script = dir.join(format!("script-{i}"));
        executable(&script, "#!/bin/sh\nexit 0\n");
        if let Err(e) = Command::new(&script).status() {
            failed.push(e.to_string());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in spawners {
        s.join().expect("spawner");
    }
    assert!(failed.is_empty(), "{} of 300 scripts did not run: {failed:?}", failed.len());
}

/// `coda-acp` finds each built-in profile's agent the same way (the profile's program, in each install place).
#[test]
fn coda_acp_finds_each_profiles_agent_in_each_install_place_with_a_gui_path() {
    for name in coda_shim::adapters::acp::profile::built_in_names() {
        let profile = coda_shim::adapters::acp::profile::built_in(name).expect("a profile");
        let (program, _) = profile.words().expect("a command");
        for place in places() {
            let home = TempDir::new(&format!("coda-gui-path-acp-{name}"));
            let h = home.path();
            (place.prepare)(h);
            let cli = install_fake(&(place.dir)(h), &program);
            let run = run("acp", h, &(place.vars)(h), &["--profile", name]);
            assert_ran(&format!("acp --profile {name}"), place.name, &run, &cli);
        }
    }
}
