//! `coda-<agent> doctor`: checks what stands between Coda and the wrapped CLI, and says how to fix it.
//!
//! Finds the CLI the way the shim would (so an unrelated program of the same name shows up), compares its
//! version with the ones we tested, checks its data directory, and asks the CLI itself through the shim's own
//! layers whether it needs a login: `initialize` and `session/new` in a temporary folder, where -32000 is
//! ACP's `auth_required` (section ACP 部分, 未登录).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::cli::adapter::{Adapter, DataHome};
use crate::cli::client::{Client, RpcError, Stop};
use crate::cli::coda_view::{current_model, describe_agent};
use crate::cli::program::{FindError, Found};
use crate::cli::render::Renderer;
use crate::cli::setup;
use crate::lines::DEFAULT_MAX_LINE;

/// Doctor's part of `--help`.
pub const HELP: &str = "
Doctor:
  doctor, --doctor              find the wrapped CLI as the shim would and check its version, data
                                directory and login; prints a table with a fix for each problem
";

/// How long the login check waits for each answer (some CLIs take seconds to start).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Problem,
}

#[derive(Debug)]
pub struct Row {
    pub check: &'static str,
    pub status: Status,
    pub result: String,
    pub fix: String,
}

fn row(check: &'static str, status: Status, result: impl Into<String>, fix: impl Into<String>) -> Row {
    Row { check, status, result: result.into(), fix: fix.into() }
}

/// Runs every check, prints the table, and returns 0 when nothing is a problem, 1 otherwise.
pub fn run(adapter: &Adapter, flag: Option<String>) -> i32 {
    let rows = checks(adapter, flag);
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = std::io::Write::write_all(&mut std::io::stdout(), table(&adapter.binary(), &rows, color).as_bytes());
    if rows.iter().any(|r| r.status == Status::Problem) { 1 } else { 0 }
}

pub fn checks(adapter: &Adapter, flag: Option<String>) -> Vec<Row> {
    let mut rows = Vec::new();
    let env = adapter.command_env();
    let found = match adapter.resolve(flag) {
        Ok(found) => {
            rows.push(row("CLI", Status::Ok, format!("{} ({})", found.command.display(), found.how), ""));
            Some(found)
        }
        Err(FindError::WrongProgram(why)) => {
            // The adapter refused a program of the same name that is something else.
            rows.push(row(
                "CLI",
                Status::Problem,
                format!("wrong program: {why}"),
                format!("install {}: {}; or point {env} at it", adapter.cli_name, adapter.install_hint),
            ));
            None
        }
        Err(why) => {
            rows.push(row(
                "CLI",
                Status::Problem,
                format!("not found: {why}"),
                format!("{}; or set {env} to its command", adapter.install_hint),
            ));
            None
        }
    };
    if let Some(found) = &found {
        rows.extend(version_rows(adapter, found));
    }
    rows.push(data_dir_row(&adapter.data_home));
    if let Some(found) = found {
        rows.extend(login_rows(adapter, &found));
    }
    rows.push(manifest_row(std::env::current_exe(), adapter.manifest_args));
    rows
}

/// The plugin manifest's `command` for this machine: the running binary's absolute path, which `sh` runs
/// whatever PATH Coda was started with; for a binary from coda-shim's npm package, the command npm linked
/// for it ([`npm_command`]).
fn manifest_row(exe: std::io::Result<PathBuf>, args: &[&str]) -> Row {
    let exe = match exe {
        Ok(exe) => npm_command(&exe).unwrap_or(exe),
        Err(e) => return row("manifest", Status::Warn, format!("cannot tell this binary's path: {e}"), ""),
    };
    let Some(text) = exe.to_str() else {
        return row(
            "manifest",
            Status::Warn,
            format!("this binary's path {} is not UTF-8, which a manifest cannot hold", exe.display()),
            "install it under a UTF-8 path: cargo install --path . --root <folder>",
        );
    };
    let words: Vec<_> = std::iter::once(text).chain(args.iter().copied()).map(shell_words::quote).collect();
    let command = serde_json::to_string(&words.join(" ")).unwrap_or_default();
    let line = format!("\"command\": {command}");
    if in_cargo_build_folder(&exe) {
        return row(
            "manifest",
            Status::Warn,
            line,
            "this binary is in a cargo build folder; `cargo install --path .` puts it in ~/.cargo/bin for good",
        );
    }
    row("manifest", Status::Ok, line, "")
}

/// Whether `exe` lies in a cargo build folder, which `cargo clean` empties: under `target/debug` or
/// `target/release`, or in a folder (a profile's, or a target triple's profile's) of a build folder named
/// otherwise (`CARGO_TARGET_DIR`, `--target-dir`), which cargo marks with a `CACHEDIR.TAG` that says cargo
/// made it.
fn in_cargo_build_folder(exe: &Path) -> bool {
    let components: Vec<_> = exe.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if components.windows(2).any(|w| w[0] == "target" && matches!(w[1].as_str(), "debug" | "release")) {
        return true;
    }
    // `<build>/<profile>/<binary>` or `<build>/<triple>/<profile>/<binary>`; the tag is a few lines.
    let made_by_cargo = |dir: &Path| {
        use std::io::Read;
        let mut head = [0; 512];
        let read = std::fs::File::open(dir.join("CACHEDIR.TAG")).and_then(|mut f| f.read(&mut head));
        read.is_ok_and(|n| {
            let text = &head[..n];
            text.starts_with(b"Signature: 8a477f597d28d172789f06886806bc55")
                && memchr::memmem::find(text, b"created by cargo").is_some()
        })
    };
    exe.ancestors().skip(2).take(2).any(made_by_cargo)
}

/// The command npm linked for `exe` when the npm package `coda-shim` installed it: `<prefix>/bin/<name>` for a
/// global install (the package in `<prefix>/lib/node_modules`), `<folder>/node_modules/.bin/<name>` for a
/// project's (a plugin's dependency). The binary itself lies inside a package folder: the main package's
/// `bin/<name>`, where the install script linked it, or the platform package's, which the main package's
/// sh launcher execs where install scripts did not run (`packaging/npm/`). npm keeps the link's path the
/// same across updates. The link counts when it leads to `exe` itself or to `bin/<name>` of a package named
/// `coda-shim` (the launcher); `None` when no such link is found.
fn npm_command(exe: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(exe).ok()?;
    let name = exe.file_name()?;
    let ours = |link: &Path| {
        let Ok(target) = std::fs::canonicalize(link) else { return false };
        if target == real {
            return true;
        }
        let package = target.parent().filter(|bin| bin.file_name() == Some("bin".as_ref())).and_then(Path::parent);
        target.file_name() == Some(name) && package.is_some_and(|p| package_name(p).as_deref() == Some("coda-shim"))
    };
    for modules in real.ancestors().filter(|d| d.file_name() == Some("node_modules".as_ref())) {
        let project = modules.join(".bin").join(name);
        let global = modules
            .parent()
            .filter(|lib| lib.file_name() == Some("lib".as_ref()))
            .and_then(Path::parent)
            .map(|prefix| prefix.join("bin").join(name));
        if let Some(link) = std::iter::once(project).chain(global).find(|link| ours(link)) {
            return Some(link);
        }
    }
    None
}

/// The `name` in `dir/package.json`.
fn package_name(dir: &Path) -> Option<String> {
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("package.json")).ok()?).ok()?;
    manifest.get("name").and_then(Value::as_str).map(str::to_owned)
}

fn version_rows(adapter: &Adapter, found: &Found) -> Vec<Row> {
    let mut rows = Vec::new();
    let tested = &adapter.tested;
    // The npm package the command belongs to says it best: `node <script>` would answer `--version` with
    // Node's own version.
    let version = tested
        .package
        .and_then(|p| package_version_near(&found.command, p))
        .or_else(|| found.version.clone())
        .or_else(|| (adapter.version)(&found.command));
    let (what, install) = (tested.what, tested.install);
    // Further versions of the same thing the binary was tested with (Codex CLI 0.171 through `CODEX_PATH`).
    let others: Vec<&str> =
        adapter.also_tested.iter().filter(|t| t.what == what && t.package.is_none()).map(|t| t.version).collect();
    let is_tested = |v: &str| v == tested.version || others.contains(&v);
    let versions = std::iter::once(tested.version).chain(others.iter().copied()).collect::<Vec<_>>().join(" and ");
    let tested = tested.version;
    match version {
        // A profile of `coda-acp` that was never run here.
        Some(v) if tested.is_empty() => rows.push(row(
            "version",
            Status::Warn,
            format!("{what} {v}; not tested with this binary"),
            format!("its ACP may differ from what this binary expects ({install})"),
        )),
        Some(v) if is_tested(&v) => {
            let all = if others.is_empty() { String::new() } else { format!("; tested with {versions}") };
            rows.push(row("version", Status::Ok, format!("{what} {v} (tested{all})"), ""))
        }
        Some(v) => rows.push(row(
            "version",
            Status::Warn,
            format!("{what} {v}; tested with {versions}"),
            format!("works if its ACP did not change; to match the tests: {install}"),
        )),
        None => {
            let tested = if tested.is_empty() {
                "not tested with this binary".into()
            } else {
                format!("tested with {versions}")
            };
            rows.push(row(
                "version",
                Status::Warn,
                format!("cannot tell the version of {}", found.command.program.display()),
                format!("check it is {what}; {tested} ({install})"),
            ))
        }
    }
    // Checked only where found: the command may be another build of the same CLI.
    for also in adapter.also_tested {
        let Some(package) = also.package else { continue };
        match package_version_near(&found.command, package) {
            Some(v) if v == also.version => {
                rows.push(row("version", Status::Ok, format!("{} {v} (tested)", also.what), ""));
            }
            Some(v) => rows.push(row(
                "version",
                Status::Warn,
                format!("{} {v}; tested with {}", also.what, also.version),
                format!("to match the tests: {}", also.install),
            )),
            None => {}
        }
    }
    rows
}

/// The version in the `package.json` of npm package `name` that the command's program or first argument
/// (a script run by `node`) belongs to.
pub(crate) fn package_version_near(cmd: &crate::child::AgentCommand, name: &str) -> Option<String> {
    let paths = std::iter::once(cmd.program.clone()).chain(cmd.args.first().map(PathBuf::from));
    for path in paths.filter_map(|p| std::fs::canonicalize(p).ok()) {
        for dir in path.ancestors().skip(1) {
            let Ok(text) = std::fs::read_to_string(dir.join("package.json")) else { continue };
            let Ok(manifest) = serde_json::from_str::<Value>(&text) else { continue };
            if manifest.get("name").and_then(Value::as_str) == Some(name) {
                return manifest.get("version").and_then(Value::as_str).map(str::to_owned);
            }
        }
    }
    None
}

fn data_dir_row(home: &DataHome) -> Row {
    let (var, dir) = (home.var, home.dir());
    let shown = dir.display();
    match std::fs::metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => row(
            "data dir",
            Status::Warn,
            format!("{shown} does not exist yet"),
            format!("the CLI creates it on its first run or login; set {var} to use another"),
        ),
        Err(e) => {
            row("data dir", Status::Problem, format!("{shown}: {e}"), format!("fix its permissions or set {var}"))
        }
        Ok(meta) if !meta.is_dir() => row(
            "data dir",
            Status::Problem,
            format!("{shown} is not a directory"),
            format!("move it away or set {var} to a directory"),
        ),
        Ok(_) => match std::fs::read_dir(&dir) {
            Ok(_) => row("data dir", Status::Ok, format!("{shown} is readable"), ""),
            Err(e) => row(
                "data dir",
                Status::Problem,
                format!("{shown} cannot be read: {e}"),
                format!("give this user read and write access, or set {var}"),
            ),
        },
    }
}

/// The probe's working folder, removed however the probe ends (also when it panics).
/// `initialize` and `session/new` in a temporary folder, through the shim's own layers.
fn login_rows(adapter: &Adapter, found: &Found) -> Vec<Row> {
    let folder = match tempfile::Builder::new().prefix(&format!("coda-doctor-{}-", adapter.agent)).tempdir() {
        Ok(folder) => folder,
        Err(e) => return vec![row("login", Status::Warn, format!("cannot make a temporary folder: {e}"), "")],
    };
    let rows = match setup::block_on(Duration::from_millis(100), probe(adapter, found, folder.path())) {
        Ok(rows) => rows,
        Err(e) => return vec![row("login", Status::Warn, format!("cannot start the async runtime: {e}"), "")],
    };
    // After the probe shut its child down: nothing uses the folder any more.
    drop(folder);
    rows
}

async fn probe(adapter: &Adapter, found: &Found, folder: &Path) -> Vec<Row> {
    let renderer = Renderer::new(std::io::stdout(), false, false);
    let mut client = match Client::start(adapter, found, DEFAULT_MAX_LINE, None, renderer).await {
        Ok(client) => client,
        Err(e) => {
            return vec![row(
                "login",
                Status::Problem,
                format!("cannot start {}: {e}", found.command.display()),
                "check the program can run",
            )];
        }
    };
    let rows = probe_with(&mut client, adapter, folder).await;
    client.shut_down(false).await;
    rows
}

async fn probe_with(client: &mut Client, adapter: &Adapter, folder: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    let init = match client.initialize(Some(Instant::now() + ANSWER_TIMEOUT)).await {
        Ok(Ok(init)) => init,
        Ok(Err(e)) => {
            rows.push(login_error("initialize", &e, &Value::Null, adapter));
            return rows;
        }
        Err(stop) => {
            rows.push(stopped("initialize", stop));
            return rows;
        }
    };
    let agent_line = describe_agent(&init);
    let declares_instruction = init.pointer("/agentCapabilities/sessionCapabilities/systemPrompt").is_some();
    rows.push(row(
        "handshake",
        if declares_instruction { Status::Ok } else { Status::Warn },
        agent_line.trim_start_matches("agent: ").to_owned(),
        if declares_instruction { "" } else { "the agent does not declare systemPrompt: Coda's instruction is lost" },
    ));
    let params = serde_json::json!({"cwd": folder.to_string_lossy(), "mcpServers": []});
    match client.call("session/new", params, Some(Instant::now() + ANSWER_TIMEOUT)).await {
        Ok(Ok(answer)) => {
            rows.push(row("login", Status::Ok, "session/new works (no login needed, or logged in)", ""));
            match current_model(&answer) {
                Some(model) => rows.push(row("model", Status::Ok, model, "")),
                None => rows.push(row(
                    "model",
                    Status::Warn,
                    "session/new reports no current model: Coda refuses the turn",
                    "configure a default model in the CLI",
                )),
            }
        }
        Ok(Err(e)) => rows.push(login_error("session/new", &e, &init, adapter)),
        Err(stop) => rows.push(stopped("session/new", stop)),
    }
    rows
}

fn stopped(method: &str, stop: Stop) -> Row {
    let result = match stop {
        Stop::Deadline => format!("no answer to {method} within {}s", ANSWER_TIMEOUT.as_secs()),
        Stop::AgentGone => format!("the CLI exited before answering {method} (its stderr is above)"),
        Stop::Interrupted => format!("interrupted during {method}"),
    };
    row("login", Status::Problem, result, "run it with CODA_SHIM_LOG=debug and read the CLI's stderr")
}

fn login_error(method: &str, e: &RpcError, init: &Value, adapter: &Adapter) -> Row {
    if e.code == -32000 {
        return row(
            "login",
            Status::Problem,
            format!("needs a login ({method} answered -32000)"),
            login_fix(init, adapter),
        );
    }
    row(
        "login",
        Status::Problem,
        format!("{method} failed: error {}: {}", e.code, e.message),
        "run it with CODA_SHIM_LOG=debug and read the CLI's stderr",
    )
}

/// How to log in: from the agent's own `authMethods` (a terminal command where it names one), else ours.
fn login_fix(init: &Value, adapter: &Adapter) -> String {
    let mut ways = Vec::new();
    for method in init.get("authMethods").and_then(Value::as_array).into_iter().flatten() {
        if let Some(term) = method.pointer("/_meta/terminal-auth")
            && let Some(command) = term.get("command").and_then(Value::as_str)
        {
            let program = Path::new(command).file_name().map_or(command.into(), |n| n.to_string_lossy());
            // Started as `node <script>`, the CLI names its script, which is no command for a person.
            if program.ends_with(".mjs") || program.ends_with(".js") || program.ends_with(".cjs") {
                continue;
            }
            let args: Vec<&str> =
                term.get("args").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            let args: String = args.iter().map(|a| format!(" {a}")).collect();
            ways.push(format!("run `{program}{args}`"));
        } else if let Some(text) = method.get("description").or_else(|| method.get("name")).and_then(Value::as_str) {
            ways.push(text.to_owned());
        }
    }
    if ways.is_empty() {
        ways.push(adapter.login_hint.to_owned());
    }
    ways.join("; or ")
}

/// The table: one line per check, with the fix under problems and warnings.
pub fn table(binary: &str, rows: &[Row], color: bool) -> String {
    let paint = |s: &str, code: &str| if color { format!("\x1b[{code}m{s}\x1b[0m") } else { s.to_owned() };
    let width = rows.iter().map(|r| r.check.len()).max().unwrap_or(0);
    let mut out = format!("{binary} doctor\n");
    for r in rows {
        let status = match r.status {
            Status::Ok => paint("ok  ", "32"),
            Status::Warn => paint("warn", "33"),
            Status::Problem => paint("FAIL", "31"),
        };
        out += &format!("{status}  {:width$}  {}\n", r.check, crate::cli::render::clean(&r.result));
        if !r.fix.is_empty() {
            out += &format!("      {:width$}  fix: {}\n", "", r.fix);
        }
    }
    let problems = rows.iter().filter(|r| r.status == Status::Problem).count();
    let warnings = rows.iter().filter(|r| r.status == Status::Warn).count();
    out += &match (problems, warnings) {
        (0, 0) => "all good\n".to_owned(),
        (0, w) => format!("no problems, {w} warning(s)\n"),
        (p, w) => format!("{p} problem(s), {w} warning(s)\n"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::adapter::Tested;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn the_table_has_a_fix_under_each_problem() {
        let rows = vec![
            row("CLI", Status::Ok, "/usr/bin/demo acp (on PATH)", ""),
            row("login", Status::Problem, "needs a login", "run `demo auth login`"),
        ];
        assert_eq!(
            table("coda-demo", &rows, false),
            "coda-demo doctor\nok    CLI    /usr/bin/demo acp (on PATH)\nFAIL  login  needs a login\n             fix: run `demo auth login`\n1 problem(s), 0 warning(s)\n"
        );
    }

    #[test]
    fn the_manifest_line_is_the_binarys_absolute_path_quoted_for_sh_and_json() {
        let plain = manifest_row(Ok(PathBuf::from("/Users/me/.cargo/bin/coda-demo")), &[]);
        assert_eq!(
            (plain.status, plain.result.as_str()),
            (Status::Ok, r#""command": "/Users/me/.cargo/bin/coda-demo""#)
        );
        let spaced = manifest_row(Ok(PathBuf::from("/Users/me/Coda \"tools\"/bin/coda-demo")), &[]);
        assert_eq!(spaced.result, r#""command": "'/Users/me/Coda \"tools\"/bin/coda-demo'""#);
        let built = manifest_row(Ok(PathBuf::from("/src/coda-shim/target/release/coda-demo")), &[]);
        assert_eq!(built.status, Status::Warn);
        assert!(built.fix.contains("cargo install --path ."), "{built:?}");
        // A build folder named otherwise (`CARGO_TARGET_DIR`) is told by the tag cargo writes in it.
        let dir = tempfile::tempdir().expect("temp dir");
        let tag =
            "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by cargo.\n";
        for profile in ["debug", "aarch64-apple-darwin/release"] {
            std::fs::create_dir_all(dir.path().join("build").join(profile)).unwrap();
            let exe = dir.path().join("build").join(profile).join("coda-demo");
            assert_eq!(manifest_row(Ok(exe.clone()), &[]).status, Status::Ok, "no tag yet");
            std::fs::write(dir.path().join("build/CACHEDIR.TAG"), tag).unwrap();
            assert_eq!(manifest_row(Ok(exe), &[]).status, Status::Warn, "{profile}");
            std::fs::remove_file(dir.path().join("build/CACHEDIR.TAG")).unwrap();
        }
        // Another program's cache tag, or one further up than a build folder's binaries lie, is not cargo's.
        std::fs::write(dir.path().join("build/CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55\n").unwrap();
        assert_eq!(manifest_row(Ok(dir.path().join("build/debug/coda-demo")), &[]).status, Status::Ok);
        std::fs::write(dir.path().join("CACHEDIR.TAG"), tag).unwrap();
        assert_eq!(manifest_row(Ok(dir.path().join("build/x/y/coda-demo")), &[]).status, Status::Ok);
        let odd = manifest_row(Ok(PathBuf::from(std::ffi::OsString::from_vec(b"/x/\xff/coda-demo".to_vec()))), &[]);
        assert_eq!(odd.status, Status::Warn);
        assert_eq!(manifest_row(Err(std::io::Error::other("gone")), &[]).status, Status::Warn);
        let profiled = manifest_row(Ok(PathBuf::from("/Users/me/.cargo/bin/coda-acp")), &["--profile", "qwen"]);
        assert_eq!(profiled.result, r#""command": "/Users/me/.cargo/bin/coda-acp --profile qwen""#);
    }

    /// npm's layouts, as `npm install` leaves them (seen in scripts/npm-check): the package and its
    /// platform package under `<prefix>/lib/node_modules`, the command a link in `<prefix>/bin`.
    fn npm_layout(root: &Path, installed_by_script: bool) -> (PathBuf, PathBuf) {
        let package = root.join("lib/node_modules/coda-shim");
        let platform = package.join("node_modules/@coda-shim/linux-x64");
        for (dir, name) in [(&package, "coda-shim"), (&platform, "@coda-shim/linux-x64")] {
            std::fs::create_dir_all(dir.join("bin")).expect("package folder");
            std::fs::write(dir.join("package.json"), format!(r#"{{"name": "{name}", "version": "0.1.0"}}"#))
                .expect("package.json");
        }
        std::fs::write(platform.join("bin/coda-demo"), b"\x7fELF").expect("binary");
        if installed_by_script {
            std::fs::hard_link(platform.join("bin/coda-demo"), package.join("bin/coda-demo")).expect("link");
        } else {
            std::fs::write(package.join("bin/coda-demo"), "#!/bin/sh\n").expect("launcher");
        }
        std::fs::create_dir_all(root.join("bin")).expect("prefix/bin");
        std::os::unix::fs::symlink("../lib/node_modules/coda-shim/bin/coda-demo", root.join("bin/coda-demo"))
            .expect("npm's link");
        (package.join("bin/coda-demo"), platform.join("bin/coda-demo"))
    }

    #[test]
    fn an_npm_installed_binary_is_named_by_the_command_npm_linked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let prefix = std::fs::canonicalize(dir.path()).expect("real path").join("global");
        let (linked, platform_binary) = npm_layout(&prefix, true);
        let want = format!("\"command\": \"{}\"", prefix.join("bin/coda-demo").display());
        // Run through npm's link (what the kernel reports on Linux: the real file) and through the link itself
        // (what macOS reports).
        for exe in [linked.clone(), prefix.join("bin/coda-demo")] {
            let row = manifest_row(Ok(exe), &[]);
            assert_eq!((row.status, row.result.as_str()), (Status::Ok, want.as_str()));
        }
        // Without the install script: the launcher in the main package exec'd the platform package's binary.
        let other = std::fs::canonicalize(dir.path()).expect("real path").join("no-scripts");
        let (_, platform_binary_2) = npm_layout(&other, false);
        let row = manifest_row(Ok(platform_binary_2), &[]);
        assert_eq!(row.result, format!("\"command\": \"{}\"", other.join("bin/coda-demo").display()));
        // A project's dependency (a plugin's): node_modules/.bin.
        let project = std::fs::canonicalize(dir.path()).expect("real path").join("plugin");
        let modules = project.join("node_modules");
        std::fs::create_dir_all(modules.join(".bin")).expect(".bin");
        std::fs::create_dir_all(modules.join("coda-shim/bin")).expect("package");
        std::fs::write(modules.join("coda-shim/package.json"), r#"{"name": "coda-shim"}"#).expect("package.json");
        std::fs::copy(&platform_binary, modules.join("coda-shim/bin/coda-demo")).expect("binary");
        std::os::unix::fs::symlink("../coda-shim/bin/coda-demo", modules.join(".bin/coda-demo")).expect("link");
        let row = manifest_row(Ok(modules.join("coda-shim/bin/coda-demo")), &[]);
        assert_eq!(row.result, format!("\"command\": \"{}\"", modules.join(".bin/coda-demo").display()));
    }

    #[test]
    fn a_link_of_the_same_name_to_another_package_is_not_taken() {
        let dir = tempfile::tempdir().expect("temp dir");
        let prefix = std::fs::canonicalize(dir.path()).expect("real path").join("global");
        let (linked, _) = npm_layout(&prefix, false);
        // The link leads to a package of another name: the binary's own path stays.
        std::fs::write(
            linked.parent().and_then(Path::parent).expect("package").join("package.json"),
            r#"{"name": "other"}"#,
        )
        .expect("package.json");
        let binary = prefix.join("lib/node_modules/coda-shim/node_modules/@coda-shim/linux-x64/bin/coda-demo");
        assert_eq!(manifest_row(Ok(binary.clone()), &[]).result, format!("\"command\": \"{}\"", binary.display()));
        // Outside node_modules nothing is looked for.
        let plain = dir.path().join("coda-demo");
        std::fs::write(&plain, b"\x7fELF").expect("binary");
        assert_eq!(npm_command(&plain), None);
    }

    /// A made-up adapter: doctor reads every fact from the value, never from an agent's name.
    fn demo() -> Adapter {
        let tested = Tested { what: "Demo CLI", version: "1.2.3", package: None, install: "get demo@1.2.3" };
        Adapter {
            agent: "demo",
            cli_name: "Demo CLI",
            install_hint: "get demo",
            tested,
            also_tested: &[],
            data_home: DataHome { var: "DEMO_HOME", default: ".demo", sub: "" },
            session_files: None,
            login_hint: "run `demo sign-in`",
            default_command: &|| Err(FindError::WrongProgram("/usr/bin/demo is not Demo CLI".into())),
            version: &|_| None,
            env_defaults: &[],
            layers: &|_| {},
            manifest_args: &[],
        }
    }

    #[test]
    fn the_version_row_names_every_version_of_the_cli_that_was_tested() {
        let mut adapter = demo();
        adapter.also_tested = &[
            Tested { what: "Demo CLI", version: "1.4.0", package: None, install: "get demo@1.4.0" },
            Tested { what: "demo-acp", version: "9.9.9", package: Some("demo-acp"), install: "get demo-acp" },
        ];
        let command = crate::child::AgentCommand { program: "/nonexistent/demo".into(), args: Vec::new() };
        let found = |v: &str| Found { command: command.clone(), version: Some(v.into()), how: String::new() };
        let row = |v: &str| version_rows(&adapter, &found(v)).remove(0);
        let (newer, pinned, other) = (row("1.4.0"), row("1.2.3"), row("2.0.0"));
        assert_eq!(
            (newer.result.as_str(), pinned.result.as_str()),
            (
                "Demo CLI 1.4.0 (tested; tested with 1.2.3 and 1.4.0)",
                "Demo CLI 1.2.3 (tested; tested with 1.2.3 and 1.4.0)"
            )
        );
        assert!(matches!(newer.status, Status::Ok) && matches!(other.status, Status::Warn));
        assert_eq!(other.result, "Demo CLI 2.0.0; tested with 1.2.3 and 1.4.0");
        assert_eq!(version_rows(&demo(), &found("1.2.3")).remove(0).result, "Demo CLI 1.2.3 (tested)");
    }

    #[test]
    fn every_built_in_profile_of_coda_acp_says_a_tested_version_or_not_tested() {
        let command = crate::child::AgentCommand { program: "/nonexistent/agent".into(), args: Vec::new() };
        let found =
            |v: Option<&str>| Found { command: command.clone(), version: v.map(str::to_owned), how: String::new() };
        for name in crate::adapters::acp::profile::built_in_names() {
            let profile = crate::adapters::acp::profile::built_in(name).expect("a built-in profile");
            let tested = profile.tested_version.clone();
            let adapter = crate::adapters::acp::adapter(Some(profile));
            for v in [Some("0.0.1"), None] {
                for r in version_rows(&adapter, &found(v)) {
                    let said = format!("{} {}", r.result, r.fix);
                    assert!(!said.contains("tested with  ") && !said.contains("tested with ("), "{name}: {said}");
                    match &tested {
                        Some(t) => assert!(said.contains(&format!("tested with {t}")), "{name}: {said}"),
                        None => assert!(said.contains("not tested with this binary"), "{name}: {said}"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_cli_never_tested_is_said_so_never_with_an_empty_version() {
        let mut adapter = demo();
        adapter.tested.version = "";
        let command = crate::child::AgentCommand { program: "/nonexistent/demo".into(), args: Vec::new() };
        let found =
            |v: Option<&str>| Found { command: command.clone(), version: v.map(str::to_owned), how: String::new() };
        for v in [Some("2.0.0"), None] {
            for r in version_rows(&adapter, &found(v)) {
                let said = format!("{} {}", r.result, r.fix);
                assert!(said.contains("not tested with this binary"), "{said}");
                assert!(!said.contains("tested with  ") && !said.contains("tested with ("), "{said}");
            }
        }
    }

    #[test]
    fn login_fix_prefers_the_agents_terminal_command() {
        let init = serde_json::json!({"authMethods": [{"id": "login", "name": "Login with Demo account",
            "_meta": {"terminal-auth": {"command": "/opt/demo/bin/demo", "args": ["login"]}}}]});
        let adapter = demo();
        assert_eq!(login_fix(&init, &adapter), "run `demo login`");
        let via_node = serde_json::json!({"authMethods": [{"id": "login", "name": "Login with Demo account",
            "_meta": {"terminal-auth": {"command": "/opt/demo/dist/main.mjs", "args": ["login"]}}}]});
        assert_eq!(login_fix(&via_node, &adapter), "run `demo sign-in`");
        let described = serde_json::json!({"authMethods": [{"id": "demo-login", "name": "Login with demo",
            "description": "Run `demo auth login` in the terminal"}]});
        assert_eq!(login_fix(&described, &adapter), "Run `demo auth login` in the terminal");
        assert_eq!(login_fix(&Value::Null, &adapter), "run `demo sign-in`");
    }

    #[test]
    fn a_refused_program_is_a_wrong_program_with_the_install_line() {
        let rows = checks(&demo(), None);
        let cli = &rows[0];
        assert_eq!((cli.check, cli.status), ("CLI", Status::Problem));
        assert_eq!(cli.result, "wrong program: /usr/bin/demo is not Demo CLI");
        assert_eq!(cli.fix, "install Demo CLI: get demo; or point CODA_DEMO_COMMAND at it");
        assert!(rows.iter().all(|r| r.check != "version" && r.check != "login"), "{rows:?}");
    }
}
