//! A settings layer of the agent's own, under the user's, that coda-acp writes for each run where the profile
//! says so (`defaults-file`, docs/coda-acp.md): how a profile sets a default the agent has no flag or variable
//! for, without taking a setting of the user's away.
//!
//! Qwen Code 0.24.4 is the case: its settings layers are its system defaults, then the user's
//! (`~/.qwen/settings.json`), the workspace's, then the system's, each over the one before. Its system defaults
//! file is `/etc/qwen-code/system-defaults.json` on Linux, `/Library/Application Support/QwenCode/
//! system-defaults.json` on macOS, `system-defaults.json` beside the file `QWEN_CODE_SYSTEM_SETTINGS_PATH` names
//! where that is set, or the file `QWEN_CODE_SYSTEM_DEFAULTS_PATH` names. It has no flag or variable for its
//! retries (`model.generationConfig.maxRetries` and its waits), so its profile puts the bound there.
//!
//! For each run (see [`prepare`]):
//! - The user's own `QWEN_CODE_SYSTEM_DEFAULTS_PATH` (the profile's `var`) is left as it is: nothing is written
//!   (said once, at debug level).
//! - Otherwise the machine's file of that layer, where it exists, is read and the profile's settings are merged
//!   over it (objects key by key, anything else replaced): the file the agent gets holds what the machine's said
//!   with the profile's defaults on top, and every other layer (the user's first) still outranks both.
//! - A machine file coda-acp cannot read as a JSON object (invalid JSON, comments, too big) is left to the agent
//!   as it is (nothing is written, the variable is not set: the agent treats it as it would without coda-acp),
//!   with a warning that the profile's defaults are not in force in this run.
//! - The file is written into a fresh folder of mode 0700 (a random name in the temporary folder), created new
//!   with mode 0600 and without following a symlink, and both are removed when coda-acp exits.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::profile::DefaultsFile;

/// The largest machine file read (a settings file is a few KiB).
const MACHINE_MAX: u64 = 1024 * 1024;

/// The operating systems whose machine file a profile names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
    Other,
}

impl Os {
    /// The one this binary runs on.
    pub fn this() -> Os {
        if cfg!(target_os = "macos") {
            Os::MacOs
        } else if cfg!(target_os = "linux") {
            Os::Linux
        } else {
            Os::Other
        }
    }
}

/// The machine's own file of the layer, as the agent finds it: beside the file `beside` names where that is set
/// (non-empty, as the agent reads it), else the profile's path for `os`.
pub fn machine_file(spec: &DefaultsFile, os: Os, env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let own = match os {
        Os::Linux => spec.linux.as_deref(),
        Os::MacOs => spec.macos.as_deref(),
        Os::Other => None,
    }
    .map(PathBuf::from);
    let beside = spec.beside.as_deref().and_then(env).filter(|v| !v.is_empty()).map(PathBuf::from);
    match beside {
        Some(other) => Some(other.parent().unwrap_or(Path::new("")).join(spec.file_name()?)),
        None => own,
    }
}

/// What the agent's file holds: the machine's (an object) with `settings` merged over it; `Err` says why the
/// machine's file cannot be read as one (not found counts as `{}`).
pub fn content(machine: Option<&Path>, settings: &Value) -> Result<Value, String> {
    let mut base = match machine {
        None => Value::Object(Map::new()),
        Some(path) => read_machine(path).map_err(|why| format!("{}: {why}", path.display()))?,
    };
    merge(&mut base, settings);
    Ok(base)
}

fn read_machine(path: &Path) -> Result<Value, String> {
    let bytes = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Value::Object(Map::new())),
        Err(e) => return Err(e.to_string()),
        Ok(meta) if meta.len() > MACHINE_MAX => {
            return Err(format!("{} bytes; read at most {MACHINE_MAX}", meta.len()));
        }
        Ok(_) => std::fs::read(path).map_err(|e| e.to_string())?,
    };
    let text = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&bytes);
    match serde_json::from_slice::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON that coda-acp reads ({e})")),
    }
}

/// `over` merged into `base`: objects key by key, anything else replaced.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, over) => *base = over.clone(),
    }
}

/// Writes `content` as `name` in a fresh folder (mode 0700) under `under`: the file is created new, mode 0600,
/// never through a symlink. Returns the folder and the file.
pub fn write_private(under: &Path, name: &str, content: &Value) -> std::io::Result<(PathBuf, PathBuf)> {
    let dir = tempfile::Builder::new().prefix("coda-acp-").tempdir_in(under)?.keep();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let file = dir.join(name);
    write_new(&file, content).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&dir);
    })?;
    Ok((dir, file))
}

/// Creates `file` (it must not exist, not even as a symlink) with mode 0600 and writes `content` to it.
pub fn write_new(file: &Path, content: &Value) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(file)?;
    out.write_all(format!("{content:#}\n").as_bytes())?;
    out.sync_all()
}

/// The variable and the file the agent gets for this run, or `None` (the user's own variable, a machine file
/// that cannot be read, or a file that cannot be written; the last two with a warning on stderr).
pub fn prepare(
    spec: &DefaultsFile,
    os: Os,
    env: &dyn Fn(&str) -> Option<OsString>,
    under: &Path,
) -> Option<(String, PathBuf, PathBuf)> {
    if env(&spec.var).is_some() {
        tracing::debug!(var = %spec.var, "set in the environment: coda-acp leaves it and writes no defaults file");
        return None;
    }
    let machine = machine_file(spec, os, env);
    let content = match content(machine.as_deref(), &spec.settings) {
        Ok(content) => content,
        Err(why) => {
            tracing::warn!(
                "the agent's defaults file {why}; left to the agent as it is, and the profile's defaults \
                 (defaults-file) are not in force in this run"
            );
            return None;
        }
    };
    match write_private(under, spec.file_name().unwrap_or("defaults.json"), &content) {
        Ok((dir, file)) => Some((spec.var.clone(), dir, file)),
        Err(e) => {
            tracing::warn!(
                "cannot write the agent's defaults file in {}: {e}; the profile's defaults (defaults-file) are \
                 not in force in this run",
                under.display()
            );
            None
        }
    }
}

/// [`prepare`] for this process: its environment, its OS, the temporary folder; the folder is removed at exit.
/// The pair is the variable and its value, for the agent's environment.
pub fn for_this_run(spec: &DefaultsFile) -> Option<(String, String)> {
    let env = |name: &str| std::env::var_os(name);
    let (var, dir, file) = prepare(spec, Os::this(), &env, &std::env::temp_dir())?;
    crate::private_file::remove_at_exit(dir);
    match file.into_os_string().into_string() {
        Ok(path) => Some((var, path)),
        Err(_) => {
            tracing::warn!("the temporary folder's path is not UTF-8; the profile's defaults are not in force");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::MetadataExt;

    fn qwen() -> DefaultsFile {
        super::super::profile::built_in("qwen").unwrap().defaults_file.expect("qwen bounds its retries")
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| OsString::from(v))
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn the_qwen_file_holds_the_retry_bound_in_a_private_folder() {
        let spec = qwen();
        let under = tempfile::tempdir().unwrap();
        let (var, dir, file) = prepare(&spec, Os::Linux, &env_of(&[]), under.path()).expect("written");
        assert_eq!(var, "QWEN_CODE_SYSTEM_DEFAULTS_PATH");
        assert_eq!(file, dir.join("system-defaults.json"));
        assert!(dir.starts_with(under.path()));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(
            written,
            json!({"model": {"generationConfig": {"maxRetries": 0, "retryInitialDelayMs": 1000,
                "retryMaxDelayMs": 2000}}})
        );
        // A second run gets a folder of its own.
        let (_, other, _) = prepare(&spec, Os::Linux, &env_of(&[]), under.path()).unwrap();
        assert_ne!(other, dir);
    }

    #[test]
    fn the_machine_defaults_are_kept_under_the_bound() {
        let spec = qwen();
        let etc = tempfile::tempdir().unwrap();
        // The machine's file is found beside its system settings file where that is moved.
        let settings = etc.path().join("settings.json");
        std::fs::write(
            etc.path().join("system-defaults.json"),
            "\u{feff}{\"ui\": {\"theme\": \"Dracula\"}, \"model\": {\"name\": \"qwen3\", \
             \"generationConfig\": {\"maxRetries\": 10, \"timeout\": 5000}}}",
        )
        .unwrap();
        let env = env_of(&[("QWEN_CODE_SYSTEM_SETTINGS_PATH", settings.to_str().unwrap())]);
        assert_eq!(machine_file(&spec, Os::Linux, &env), Some(etc.path().join("system-defaults.json")));
        let under = tempfile::tempdir().unwrap();
        let (_, _, file) = prepare(&spec, Os::Linux, &env, under.path()).unwrap();
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(
            written,
            json!({"ui": {"theme": "Dracula"}, "model": {"name": "qwen3", "generationConfig": {"maxRetries": 0,
                "timeout": 5000, "retryInitialDelayMs": 1000, "retryMaxDelayMs": 2000}}})
        );
        // Without that variable, the operating system's own place.
        assert_eq!(
            machine_file(&spec, Os::Linux, &env_of(&[])),
            Some(PathBuf::from("/etc/qwen-code/system-defaults.json"))
        );
        assert_eq!(
            machine_file(&spec, Os::MacOs, &env_of(&[("QWEN_CODE_SYSTEM_SETTINGS_PATH", "")])),
            Some(PathBuf::from("/Library/Application Support/QwenCode/system-defaults.json"))
        );
    }

    #[test]
    fn a_malformed_machine_file_is_left_to_the_agent() {
        let spec = qwen();
        let etc = tempfile::tempdir().unwrap();
        let settings = etc.path().join("settings.json");
        let env = env_of(&[("QWEN_CODE_SYSTEM_SETTINGS_PATH", settings.to_str().unwrap())]);
        let under = tempfile::tempdir().unwrap();
        for bad in ["{\"model\": ", "// a comment\n{}", "[1, 2]", "\u{ff}"] {
            std::fs::write(etc.path().join("system-defaults.json"), bad).unwrap();
            let why = content(machine_file(&spec, Os::Linux, &env).as_deref(), &spec.settings).unwrap_err();
            assert!(why.contains("system-defaults.json: not "), "{bad:?}: {why}");
            assert_eq!(prepare(&spec, Os::Linux, &env, under.path()), None, "{bad:?}");
        }
        // Nothing was written for it.
        assert_eq!(std::fs::read_dir(under.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_users_own_variable_is_left_alone() {
        let spec = qwen();
        let under = tempfile::tempdir().unwrap();
        for value in ["/srv/mine.json", ""] {
            let env = env_of(&[("QWEN_CODE_SYSTEM_DEFAULTS_PATH", value)]);
            assert_eq!(prepare(&spec, Os::Linux, &env, under.path()), None);
        }
        assert_eq!(std::fs::read_dir(under.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_symlink_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "theirs").unwrap();
        let link = dir.path().join("system-defaults.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_new(&link, &json!({"a": 1})).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
        // A dangling link is refused too (create_new never creates through it).
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(write_new(&dangling, &json!({})).is_err());
        assert!(!dir.path().join("nowhere").exists());
    }

    #[test]
    fn an_unwritable_place_is_a_warning_not_a_failure() {
        let spec = qwen();
        assert_eq!(prepare(&spec, Os::Linux, &env_of(&[]), Path::new("/nonexistent/coda-acp")), None);
    }
}
