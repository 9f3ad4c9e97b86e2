//! Finding the wrapped CLI when PATH is a GUI app's, and the PATH its child gets.
//!
//! Coda runs a plugin's `command` through `sh` from an app that may have been started from the Dock, whose
//! PATH is `/usr/bin:/bin:/usr/sbin:/sbin`: none of the places npm, Homebrew, pnpm, volta, bun or a CLI's
//! own installer put their commands. So a program not on PATH is looked for in those places, in this order:
//!
//! 1. the places the adapter names (a CLI's own install folder), since the CLI's own installer knows best;
//! 2. PATH, as the user set it;
//! 3. npm's global prefix: `$NPM_CONFIG_PREFIX`, else `prefix` in the user's `.npmrc` (`$NPM_CONFIG_USERCONFIG`,
//!    else `~/.npmrc`), and `~/.npm-global` (the prefix npm's own docs suggest), each with `/bin`;
//! 4. volta (`$VOLTA_HOME/bin`, `~/.volta/bin`), pnpm (`$PNPM_HOME`, `~/Library/pnpm` on macOS,
//!    `$XDG_DATA_HOME/pnpm` or `~/.local/share/pnpm` elsewhere), bun (`$BUN_INSTALL/bin`, `~/.bun/bin`),
//!    nvm (`$NVM_DIR` or `~/.nvm`: each installed Node's `bin`, newest first), `~/.local/bin`;
//! 5. Homebrew: `/opt/homebrew/bin` (Apple silicon), then `/usr/local/bin` (Intel Macs, and where Node's
//!    macOS installer puts npm's global commands).
//!
//! A user's own folders come before the system-wide ones, as the installers' lines in a shell profile put
//! them before Homebrew's. Nothing here runs npm or a shell: both would be slow, and neither is on that PATH.
//!
//! The child's PATH starts with the folder the CLI was found in: an npm-installed CLI is a
//! `#!/usr/bin/env node` script beside the `node` it was installed with. The user's PATH follows unchanged,
//! then the install places above that exist and are not on it, so nothing the user set is taken away or
//! overridden.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The most of a `.npmrc` that is read; a real one is a few hundred bytes.
const NPMRC_MAX: u64 = 64 * 1024;

/// What PATH is when it is not set at all (what `sh` and `execvp` use then).
const DEFAULT_PATH: &str = "/usr/bin:/bin";

/// A folder a program may be installed in, and why it is looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub dir: PathBuf,
    pub why: String,
}

impl Place {
    pub fn new(dir: impl Into<PathBuf>, why: impl Into<String>) -> Place {
        Place { dir: dir.into(), why: why.into() }
    }
}

/// A program found, and how: "on PATH", or the place and why it was looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub path: PathBuf,
    pub how: String,
}

/// What the lookup reads from the process: its environment and home folder, and whether it runs on macOS.
pub struct Env<'a> {
    pub var: &'a dyn Fn(&str) -> Option<OsString>,
    pub home: Option<PathBuf>,
    pub macos: bool,
}

impl Env<'_> {
    /// A variable that is set and not empty.
    fn get(&self, name: &str) -> Option<OsString> {
        (self.var)(name).filter(|v| !v.is_empty())
    }

    fn path_var(&self, name: &str) -> Option<PathBuf> {
        self.get(name).map(PathBuf::from).filter(|p| p.is_absolute())
    }
}

/// Runs `f` with this process's environment.
pub fn with_process_env<T>(f: impl FnOnce(&Env) -> T) -> T {
    let var = |name: &str| std::env::var_os(name);
    let env = Env {
        var: &var,
        home: std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from),
        macos: cfg!(target_os = "macos"),
    };
    f(&env)
}

/// The usual install places (steps 3 to 5 above), in order, whether or not they exist.
pub fn install_places(env: &Env) -> Vec<Place> {
    let mut places = Vec::new();
    let home = env.home.as_deref();
    let in_home = |rest: &str| home.map(|h| h.join(rest));
    // npm reads its settings from the environment case-insensitively.
    if let Some(prefix) = env.path_var("NPM_CONFIG_PREFIX").or_else(|| env.path_var("npm_config_prefix")) {
        places.push(Place::new(prefix.join("bin"), "npm's global prefix, from $NPM_CONFIG_PREFIX"));
    }
    let npmrc = env.path_var("NPM_CONFIG_USERCONFIG").or_else(|| env.path_var("npm_config_userconfig"));
    if let Some(npmrc) = npmrc.or_else(|| in_home(".npmrc"))
        && let Some(prefix) = npmrc_prefix(&npmrc, env)
    {
        places.push(Place::new(prefix.join("bin"), format!("npm's global prefix, from {}", npmrc.display())));
    }
    if let Some(dir) = in_home(".npm-global/bin") {
        places.push(Place::new(dir, "the npm global prefix npm's documentation suggests"));
    }
    if let Some(volta) = env.path_var("VOLTA_HOME") {
        places.push(Place::new(volta.join("bin"), "volta's folder, from $VOLTA_HOME"));
    }
    if let Some(dir) = in_home(".volta/bin") {
        places.push(Place::new(dir, "volta's default folder"));
    }
    if let Some(pnpm) = env.path_var("PNPM_HOME") {
        places.push(Place::new(pnpm, "pnpm's global folder, from $PNPM_HOME"));
    }
    let pnpm_default = if env.macos {
        in_home("Library/pnpm")
    } else {
        env.path_var("XDG_DATA_HOME").map(|d| d.join("pnpm")).or_else(|| in_home(".local/share/pnpm"))
    };
    if let Some(dir) = pnpm_default {
        places.push(Place::new(dir, "pnpm's default global folder"));
    }
    if let Some(bun) = env.path_var("BUN_INSTALL") {
        places.push(Place::new(bun.join("bin"), "bun's folder, from $BUN_INSTALL"));
    }
    if let Some(dir) = in_home(".bun/bin") {
        places.push(Place::new(dir, "bun's default folder"));
    }
    if let Some(nvm) = env.path_var("NVM_DIR").or_else(|| in_home(".nvm")) {
        for dir in nvm_bins(&nvm) {
            places.push(Place::new(dir, "a Node installed by nvm (newest first)"));
        }
    }
    if let Some(dir) = in_home(".local/bin") {
        places.push(Place::new(dir, "the per-user folder for installed commands"));
    }
    places.push(Place::new("/opt/homebrew/bin", "Homebrew on Apple silicon"));
    places.push(Place::new("/usr/local/bin", "Homebrew on Intel Macs, and Node's macOS installer"));
    dedup_places(places)
}

fn dedup_places(places: Vec<Place>) -> Vec<Place> {
    let mut seen = crate::HashSet::default();
    places.into_iter().filter(|p| seen.insert(p.dir.clone())).collect()
}

/// `<nvm>/versions/node/v*/bin`, newest version first.
fn nvm_bins(nvm: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(nvm.join("versions/node")) else { return Vec::new() };
    let mut versions: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let numbers =
                name.to_str()?.strip_prefix('v')?.split('.').map(|n| n.parse().ok()).collect::<Option<_>>()?;
            Some((numbers, e.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

/// The `prefix` an `.npmrc` sets, as npm reads it: `key = value` lines, `;` and `#` comments, optional
/// quotes, `${VAR}` replaced from the environment and a leading `~/` meaning home. Unreadable, oversized,
/// relative or unset: `None` (a warning on stderr for what looks like a mistake).
fn npmrc_prefix(path: &Path, env: &Env) -> Option<PathBuf> {
    use std::io::Read;
    // A FIFO or a device would block or never end: only a regular file (symlinks followed) is read.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    if let Err(e) = file.take(NPMRC_MAX + 1).read_to_end(&mut bytes) {
        tracing::warn!("cannot read {}: {e}", path.display());
        return None;
    }
    if bytes.len() as u64 > NPMRC_MAX {
        tracing::warn!("{} is over {NPMRC_MAX} bytes; its prefix is not read", path.display());
        return None;
    }
    let text = String::from_utf8_lossy(&bytes);
    // Top-level keys only (before any `[section]`); the last setting wins, as in npm.
    let value = text
        .lines()
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter_map(|line| line.split_once('='))
        .filter(|(key, _)| key.trim() == "prefix")
        .map(|(_, value)| value.trim())
        .last()?;
    let quoted = |q: char| value.strip_prefix(q).and_then(|v| v.strip_suffix(q));
    // Unquoted, a `;` or `#` starts a comment.
    let value =
        quoted('"').or_else(|| quoted('\'')).unwrap_or_else(|| value.split([';', '#']).next().unwrap_or("").trim());
    let value = expand_vars(value, env)?;
    let prefix = match value.strip_prefix("~/") {
        Some(rest) => env.home.as_ref()?.join(rest),
        None => PathBuf::from(value),
    };
    if !prefix.is_absolute() {
        tracing::warn!("{}: prefix {:?} is not an absolute path; ignored", path.display(), prefix);
        return None;
    }
    Some(prefix)
}

/// `${NAME}` replaced by the variable's value; `None` when one is unset (npm would fail on it too).
fn expand_vars(value: &str, env: &Env) -> Option<String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}')? + start;
        let var = env.get(&rest[start + 2..end])?;
        out.push_str(var.to_str()?);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// Every `program` found, in the order above: `preferred` places, PATH, the install places. Each file once.
/// Whether a file may be run is `which`'s test (an executable file, symlinks followed: npm's commands are
/// symlinks), as for the PATH lookup a shell does.
pub fn candidates(program: &str, preferred: &[Place], env: &Env) -> Vec<Located> {
    if program.is_empty() || program.contains('/') {
        return Vec::new();
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut found: Vec<Located> = Vec::new();
    let mut push = |path: PathBuf, how: String| {
        if !found.iter().any(|f| f.path == path) {
            found.push(Located { path, how });
        }
    };
    for place in preferred {
        if let Ok(path) = which::which_in(program, Some(&place.dir), &cwd) {
            push(path, place.why.clone());
        }
    }
    if let Some(path_var) = env.get("PATH")
        && let Ok(all) = which::which_in_all(program, Some(path_var), &cwd)
    {
        for path in all {
            push(path, "on PATH".to_owned());
        }
    }
    for place in install_places(env) {
        if let Ok(path) = which::which_in(program, Some(&place.dir), &cwd) {
            push(path, format!("in {}: {}; not on PATH", place.dir.display(), place.why));
        }
    }
    found
}

/// The first of [`candidates`].
pub fn find(program: &str, preferred: &[Place]) -> Option<Located> {
    with_process_env(|env| candidates(program, preferred, env).into_iter().next())
}

/// Where [`candidates`] looks, for a not-found message: "PATH, ~/.npm-global/bin, …".
pub fn searched(preferred: &[Place]) -> String {
    with_process_env(|env| {
        let dirs = preferred.iter().map(|p| p.dir.display().to_string());
        let dirs = dirs.chain(std::iter::once("PATH".to_owned()));
        let dirs = dirs.chain(install_places(env).into_iter().map(|p| p.dir.display().to_string()));
        dirs.collect::<Vec<_>>().join(", ")
    })
}

/// The PATH for a child running `program`: its folder first, then the user's PATH unchanged, then the install
/// places that exist and are not on it. `None` when that cannot be a PATH (a folder with a `:` in its name).
pub fn child_path(program: &Path, env: &Env) -> Option<OsString> {
    let user = env.get("PATH").unwrap_or_else(|| OsString::from(DEFAULT_PATH));
    let user_dirs: Vec<PathBuf> = std::env::split_paths(&user).collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(own) = program.parent().filter(|d| d.is_absolute())
        && user_dirs.first().map(PathBuf::as_path) != Some(own)
    {
        dirs.push(own.to_path_buf());
    }
    dirs.extend(user_dirs.iter().cloned());
    for place in install_places(env) {
        if place.dir.is_dir() && !dirs.contains(&place.dir) {
            dirs.push(place.dir);
        }
    }
    match std::env::join_paths(&dirs) {
        Ok(path) => Some(path),
        Err(e) => {
            tracing::warn!("the child keeps the PATH it inherits: {e}");
            None
        }
    }
}

/// [`child_path`] with this process's environment, as a variable to set (nothing when it is `None`).
pub fn child_path_var(program: &Path) -> Option<(OsString, OsString)> {
    with_process_env(|env| child_path(program, env)).map(|path| (OsString::from("PATH"), path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashMap;
    use std::os::unix::fs::PermissionsExt;

    fn env_with<T>(home: &Path, vars: &[(&str, &str)], macos: bool, f: impl FnOnce(&Env) -> T) -> T {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| ((*k).to_owned(), OsString::from(v))).collect();
        let var = move |name: &str| map.get(name).cloned();
        f(&Env { var: &var, home: Some(home.to_path_buf()), macos })
    }

    fn script(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn dirs(places: &[Place]) -> Vec<String> {
        places.iter().map(|p| p.dir.display().to_string()).collect()
    }

    #[test]
    fn install_places_come_in_the_stated_order() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().display().to_string();
        std::fs::write(home.path().join(".npmrc"), "; comment\nprefix = \"~/npm-prefix\"\ncolor=false\n").unwrap();
        let vars = [
            ("NPM_CONFIG_PREFIX", "/env/npm"),
            ("VOLTA_HOME", "/env/volta"),
            ("PNPM_HOME", "/env/pnpm"),
            ("BUN_INSTALL", "/env/bun"),
        ];
        let places = env_with(home.path(), &vars, true, install_places);
        assert_eq!(
            dirs(&places),
            [
                "/env/npm/bin".to_owned(),
                format!("{h}/npm-prefix/bin"),
                format!("{h}/.npm-global/bin"),
                "/env/volta/bin".to_owned(),
                format!("{h}/.volta/bin"),
                "/env/pnpm".to_owned(),
                format!("{h}/Library/pnpm"),
                "/env/bun/bin".to_owned(),
                format!("{h}/.bun/bin"),
                format!("{h}/.local/bin"),
                "/opt/homebrew/bin".to_owned(),
                "/usr/local/bin".to_owned(),
            ]
        );
        let linux = env_with(home.path(), &[], false, install_places);
        assert!(dirs(&linux).contains(&format!("{h}/.local/share/pnpm")), "{linux:?}");
        assert!(!dirs(&linux).iter().any(|d| d.contains("Library")), "{linux:?}");
    }

    #[test]
    fn nvm_nodes_are_searched_newest_first() {
        let home = tempfile::tempdir().unwrap();
        for v in ["v18.20.1", "v22.9.0", "v22.19.0", "not-a-version"] {
            std::fs::create_dir_all(home.path().join(".nvm/versions/node").join(v).join("bin")).unwrap();
        }
        let places = env_with(home.path(), &[], true, install_places);
        let nvm: Vec<String> = dirs(&places).into_iter().filter(|d| d.contains(".nvm")).collect();
        let h = home.path().display();
        assert_eq!(
            nvm,
            [
                format!("{h}/.nvm/versions/node/v22.19.0/bin"),
                format!("{h}/.nvm/versions/node/v22.9.0/bin"),
                format!("{h}/.nvm/versions/node/v18.20.1/bin"),
            ]
        );
    }

    #[test]
    fn npmrc_prefix_reads_like_npm_and_refuses_what_it_cannot() {
        let home = tempfile::tempdir().unwrap();
        let rc = home.path().join(".npmrc");
        let read = |text: &[u8], vars: &[(&str, &str)]| {
            std::fs::write(&rc, text).unwrap();
            env_with(home.path(), vars, true, |env| npmrc_prefix(&rc, env))
        };
        assert_eq!(read(b"prefix=/a\nprefix = /b # a comment\n", &[]), Some(PathBuf::from("/b")));
        assert_eq!(read(b"prefix = \"/c d#e\"\n[section]\nprefix=/f\n", &[]), Some(PathBuf::from("/c d#e")));
        assert_eq!(read(b"prefix=/a\nprefix = '/b'\n", &[]), Some(PathBuf::from("/b")));
        assert_eq!(read(b"prefix=${NPM_HOME}/g\n", &[("NPM_HOME", "/x")]), Some(PathBuf::from("/x/g")));
        assert_eq!(read(b"prefix=${UNSET}/g\n", &[]), None);
        assert_eq!(read(b"prefix=relative/dir\n", &[]), None);
        assert_eq!(read(b"registry=https://example.invalid/\n", &[]), None);
        assert_eq!(
            read(b"prefix=/caf\xc3\xa9 \xe6\xbc\xa2\xff\n", &[]),
            Some(PathBuf::from("/caf\u{e9} \u{6f22}\u{fffd}"))
        );
        let mut huge = b"prefix=/a\n".to_vec();
        huge.resize(NPMRC_MAX as usize + 10, b'#');
        assert_eq!(read(&huge, &[]), None, "an oversized file is not read");
        assert_eq!(env_with(home.path(), &[], true, |env| npmrc_prefix(&home.path().join("none"), env)), None);
        // A FIFO (reading it would block until someone writes) and a device are not read.
        let fifo = home.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(env_with(home.path(), &[], true, |env| npmrc_prefix(&fifo, env)), None);
        assert_eq!(env_with(home.path(), &[], true, |env| npmrc_prefix(Path::new("/dev/zero"), env)), None);
    }

    #[test]
    fn preferred_places_then_path_then_install_places() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let on_path_dir = h.join("on-path");
        script(&on_path_dir.join("cli"));
        script(&h.join(".bun/bin/cli"));
        script(&h.join("own/cli"));
        // Not executable: never a candidate.
        std::fs::create_dir_all(h.join(".local/bin")).unwrap();
        std::fs::write(h.join(".local/bin/cli"), "#!/bin/sh\n").unwrap();
        // A symlink loop, a dangling symlink and a folder of the program's name: none is a candidate.
        std::fs::create_dir_all(h.join(".volta/bin")).unwrap();
        std::os::unix::fs::symlink(h.join(".volta/bin/cli"), h.join(".volta/bin/cli")).unwrap();
        std::fs::create_dir_all(h.join(".npm-global/bin")).unwrap();
        std::os::unix::fs::symlink(h.join("gone"), h.join(".npm-global/bin/cli")).unwrap();
        std::fs::create_dir_all(h.join("Library/pnpm/cli")).unwrap();
        let path = format!("/nonexistent:{}", on_path_dir.display());
        let found = env_with(h, &[("PATH", &path)], true, |env| {
            candidates("cli", &[Place::new(h.join("own"), "the CLI's own folder")], env)
        });
        let found: Vec<(PathBuf, &str)> = found.iter().map(|l| (l.path.clone(), l.how.as_str())).collect();
        let bun = format!("in {}: bun's default folder; not on PATH", h.join(".bun/bin").display());
        assert_eq!(
            found,
            [
                (h.join("own/cli"), "the CLI's own folder"),
                (on_path_dir.join("cli"), "on PATH"),
                (h.join(".bun/bin/cli"), bun.as_str()),
            ]
        );
        let none = env_with(h, &[("PATH", &path)], true, |env| candidates("a/b", &[], env));
        assert!(none.is_empty());
    }

    #[test]
    fn child_path_puts_the_cli_folder_first_and_keeps_the_users() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::create_dir_all(h.join(".volta/bin")).unwrap();
        let cli = h.join(".npm-global/bin/some-cli");
        let path = env_with(h, &[("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")], true, |env| child_path(&cli, env));
        let path = path.unwrap();
        let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
        assert_eq!(dirs[0], h.join(".npm-global/bin"));
        assert_eq!(dirs[1..5], ["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from));
        assert!(dirs[5..].contains(&h.join(".volta/bin")), "existing install places follow: {dirs:?}");
        assert!(!dirs.contains(&h.join(".bun/bin")), "places that do not exist are left out: {dirs:?}");
        // Already first: not repeated. Unset PATH: the system default after the CLI's folder.
        let first = env_with(h, &[("PATH", "/opt/x/bin:/bin")], true, |env| child_path(Path::new("/opt/x/bin/c"), env));
        assert!(first.unwrap().to_str().unwrap().starts_with("/opt/x/bin:/bin"));
        let unset = env_with(h, &[], true, |env| child_path(Path::new("/opt/x/bin/c"), env)).unwrap();
        assert!(unset.to_str().unwrap().starts_with("/opt/x/bin:/usr/bin:/bin"), "{unset:?}");
        // A folder that cannot be on a PATH: the child keeps the inherited one.
        assert_eq!(env_with(h, &[], true, |env| child_path(Path::new("/a:b/c"), env)), None);
    }
}
