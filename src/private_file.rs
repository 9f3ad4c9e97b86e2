//! Opening a file the shim writes (traces, recordings, reports): they hold prompts and the session
//! instruction, so they are private to the user.
//!
//! - A new file is created with mode 0600 (the umask can only narrow it).
//! - A symlink in the last component is refused (`O_NOFOLLOW`, on Linux and macOS alike), so a link planted
//!   at the path cannot send the prompts elsewhere; links in the folders above are the user's own choice.
//! - An existing regular file that others may read or write is tightened to the owner's bits with fchmod on
//!   the opened descriptor (not the path, which could be swapped in between). Tightened rather than refused:
//!   appending to the same trace across runs is how `--trace-file` is used, and after the fchmod nobody else
//!   can open it. Refused when it belongs to another user: they could loosen it again at any time.
//! - Something that is not a regular file (`/dev/null`, a FIFO the user made) is written as it is, never
//!   chmod'ed: it keeps nothing.

use std::fs::{File, OpenOptions};
use std::io::{Error, ErrorKind};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How an existing file is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Every write goes to the end (traces, event records).
    Append,
    /// The file is emptied first (a recording written whole).
    Replace,
}

/// Opens `path` for writing as described in the module docs; the error names what was refused and why.
pub fn open(path: &Path, how: Write) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).mode(0o600).custom_flags(nix::libc::O_NOFOLLOW);
    match how {
        Write::Append => options.append(true),
        // Not truncated at open: an existing file is checked before anything of it is lost.
        Write::Replace => options.write(true),
    };
    let file = options.open(path).map_err(|e| {
        // ELOOP is what O_NOFOLLOW gives for a symlink (Linux and macOS; FreeBSD says EMLINK).
        if matches!(e.raw_os_error(), Some(nix::libc::ELOOP) | Some(nix::libc::EMLINK)) {
            Error::new(ErrorKind::InvalidInput, "it is a symbolic link; refusing to follow it")
        } else {
            e
        }
    })?;
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(Error::new(ErrorKind::PermissionDenied, "it belongs to another user; refusing to write to it"));
        }
        if meta.mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o700))?;
        }
        if how == Write::Replace {
            file.set_len(0)?;
        }
    }
    Ok(file)
}

/// Folders of the shim's own (coda-acp's defaults file), removed when the process exits.
static REMOVE_AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_all() {
    for dir in removed_at_exit() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Removes `dir`, a folder the shim made for this run, when the process exits (`std::process::exit`, which every
/// path of the binaries ends in, signals included: the relay turns SIGINT, SIGTERM and SIGHUP into an exit) and,
/// where it is killed (SIGKILL), by the watchdog once the shim is gone (`crate::watchdog`, which takes the
/// folders named before the CLI starts).
pub fn remove_at_exit(dir: PathBuf) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: `remove_all` is an `extern "C" fn()` that does not unwind (every error is ignored).
        unsafe { nix::libc::atexit(remove_all) };
    });
    REMOVE_AT_EXIT.lock().unwrap_or_else(|p| p.into_inner()).push(dir);
}

/// The folders [`remove_at_exit`] was given.
pub fn removed_at_exit() -> Vec<PathBuf> {
    REMOVE_AT_EXIT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn creates_0600_and_tightens_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        open(&new, Write::Append).unwrap();
        assert_eq!(mode(&new), 0o600);
        let open_to_all = dir.path().join("old");
        std::fs::write(&open_to_all, "kept\n").unwrap();
        std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::io::Write::write_all(&mut open(&open_to_all, Write::Append).unwrap(), b"more\n").unwrap();
        assert_eq!(mode(&open_to_all), 0o600);
        assert_eq!(std::fs::read_to_string(&open_to_all).unwrap(), "kept\nmore\n");
        open(&open_to_all, Write::Replace).unwrap();
        assert_eq!(std::fs::read_to_string(&open_to_all).unwrap(), "");
    }

    #[test]
    fn refuses_a_symlink_and_leaves_its_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "untouched").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for how in [Write::Append, Write::Replace] {
            let e = open(&link, how).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        // A dangling link is refused too, and creates nothing.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(open(&dangling, Write::Append).is_err());
        assert!(!dir.path().join("nowhere").exists());
    }

    #[test]
    fn refuses_a_file_of_another_user() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::write(&theirs, "").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o666)).unwrap();
        // Only root can give a file away; for anyone else the kernel refuses a 0600 file of another user
        // itself, and a 0666 one cannot be made here. CI runs as root and sets CODA_REQUIRE_ROOT: there the test
        // cannot pass unrun.
        if let Err(e) = std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)) {
            assert!(std::env::var_os("CODA_REQUIRE_ROOT").is_none(), "CODA_REQUIRE_ROOT is set but chown failed: {e}");
            eprintln!("SKIPPED refuses_a_file_of_another_user: not root, cannot make a file of another user");
            return;
        }
        let e = open(&theirs, Write::Append).unwrap_err();
        assert!(e.to_string().contains("another user"), "{e}");
        assert_eq!(mode(&theirs), 0o666, "left as it was");
    }

    #[test]
    fn a_folder_named_is_removed_at_exit_and_told_to_the_watchdog() {
        let under = tempfile::tempdir().unwrap();
        let dir = under.path().join("coda-acp-x");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("defaults.json"), "{}").unwrap();
        remove_at_exit(dir.clone());
        assert!(removed_at_exit().contains(&dir));
        remove_all();
        assert!(!dir.exists());
    }

    #[test]
    fn a_device_is_written_and_not_chmoded() {
        let before = std::fs::metadata("/dev/null").unwrap().mode();
        open(Path::new("/dev/null"), Write::Replace).unwrap();
        assert_eq!(std::fs::metadata("/dev/null").unwrap().mode(), before);
    }
}
