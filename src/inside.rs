//! Reading inside a CLI's data folder (Kimi's session folder, Codex's and Grok's data homes) without ever leaving
//! it.
//!
//! Every path is walked component by component
//! from the folder's descriptor with `O_NOFOLLOW`, so a symbolic link anywhere on the way (a folder or the file
//! itself) is refused, never followed; a file must be a regular file and is opened non-blocking (opening a FIFO
//! for reading would otherwise wait for a writer).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};

/// Why a path inside the folder was not opened. Says nothing of any file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Missing,
    Link,
    /// Not a folder where one is needed, or not a regular file.
    WrongKind,
    Io(Errno),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Missing => f.write_str("missing"),
            Refused::Link => f.write_str("a symbolic link (not followed)"),
            Refused::WrongKind => f.write_str("not a regular file or folder"),
            Refused::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<Errno> for Refused {
    fn from(e: Errno) -> Refused {
        match e {
            Errno::ENOENT => Refused::Missing,
            // O_NOFOLLOW on a link: ELOOP (Linux, macOS), EMLINK (FreeBSD).
            Errno::ELOOP | Errno::EMLINK => Refused::Link,
            Errno::ENOTDIR => Refused::WrongKind,
            other => Refused::Io(other),
        }
    }
}

/// What an entry of a folder is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Folder,
    File,
    Link,
    Other,
}

/// An open folder; everything below it is reached through it.
pub struct Folder {
    fd: OwnedFd,
}

const FOLDER: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);
const FILE: OFlag = OFlag::O_RDONLY.union(OFlag::O_NOFOLLOW).union(OFlag::O_NONBLOCK).union(OFlag::O_CLOEXEC);

impl Folder {
    /// Opens `path` itself as the root; its last component must not be a link (the folders above it may).
    pub fn open(path: &Path) -> Result<Folder, Refused> {
        let fd = nix::fcntl::open(path, FOLDER, Mode::empty()).map_err(|e| match Refused::from(e) {
            Refused::WrongKind if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) => Refused::Link,
            other => other,
        })?;
        Ok(Folder { fd })
    }

    /// The folder at `rel` (`/`-separated, relative) below this one.
    pub fn folder(&self, rel: &str) -> Result<Folder, Refused> {
        let mut at: Option<OwnedFd> = None;
        for part in parts(rel)? {
            let parent = at.as_ref().unwrap_or(&self.fd);
            let next = openat(parent, part, FOLDER, Mode::empty()).map_err(|e| refused(parent, part, e))?;
            at = Some(next);
        }
        match at {
            Some(fd) => Ok(Folder { fd }),
            None => Ok(Folder { fd: self.fd.try_clone().map_err(|e| Refused::Io(io_errno(&e)))? }),
        }
    }

    /// The regular file at `rel` below this folder, open for reading.
    pub fn file(&self, rel: &str) -> Result<File, Refused> {
        let (parent, name) = match rel.rsplit_once('/') {
            Some((parent, name)) => (Some(self.folder(parent)?), name),
            None => (None, rel),
        };
        let at = parent.as_ref().unwrap_or(self);
        if name.is_empty() || name == "." || name == ".." {
            return Err(Refused::WrongKind);
        }
        let fd = openat(&at.fd, name, FILE, Mode::empty()).map_err(|e| refused(&at.fd, name, e))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| Refused::Io(io_errno(&e)))?;
        if !meta.is_file() {
            return Err(Refused::WrongKind);
        }
        Ok(file)
    }

    /// The entries of this folder (names that are not UTF-8 are left out: the CLIs write none), sorted by name.
    pub fn entries(&self) -> Vec<(String, Meta)> {
        let Ok(fd) = self.fd.try_clone() else { return Vec::new() };
        let Ok(mut dir) = nix::dir::Dir::from_fd(fd) else { return Vec::new() };
        let mut out: Vec<(String, Meta)> = dir
            .iter()
            .flatten()
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
            .filter(|n| n != "." && n != "..")
            .filter_map(|n| self.meta(&n).map(|m| (n, m)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// What the entry `name` (no `/`) of this folder is; a link is not followed.
    // The field types of `stat` differ between systems: the casts are needed on some of them.
    #[allow(clippy::unnecessary_cast)]
    pub fn meta(&self, name: &str) -> Option<Meta> {
        if name.contains('/') {
            return None;
        }
        let st = fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let kind = match SFlag::from_bits_truncate(st.st_mode as _) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Kind::Folder,
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFLNK => Kind::Link,
            _ => Kind::Other,
        };
        Some(Meta {
            kind,
            id: (st.st_dev as u64, st.st_ino as u64),
            len: st.st_size as u64,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
        })
    }
}

/// An entry of a folder as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    /// Device and inode: a file replaced by a rename has another.
    pub id: (u64, u64),
    pub len: u64,
    pub mtime_ns: i128,
}

/// Why `name` in `parent` did not open: a link is named as one whatever the system's error for it
/// (`O_DIRECTORY | O_NOFOLLOW` on a link gives ENOTDIR on Linux).
fn refused(parent: &OwnedFd, name: &str, e: Errno) -> Refused {
    let link = || {
        fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode as _) & SFlag::S_IFMT == SFlag::S_IFLNK)
    };
    match Refused::from(e) {
        Refused::WrongKind if link() => Refused::Link,
        other => other,
    }
}

fn parts(rel: &str) -> Result<impl Iterator<Item = &str>, Refused> {
    if rel.starts_with('/') || rel.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
        return Err(Refused::WrongKind);
    }
    Ok(rel.split('/'))
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_anywhere_on_the_way_are_refused_and_special_files_too() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("session");
        std::fs::create_dir_all(root.join("agents/main")).unwrap();
        std::fs::write(root.join("agents/main/wire.jsonl"), "ok\n").unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("wire.jsonl"), "secret\n").unwrap();
        symlink(&outside, root.join("agents/evil")).unwrap();
        std::fs::create_dir_all(root.join("agents/sub")).unwrap();
        symlink(outside.join("wire.jsonl"), root.join("agents/sub/wire.jsonl")).unwrap();
        nix::unistd::mkfifo(&root.join("agents/main/fifo"), Mode::S_IRUSR | Mode::S_IWUSR).unwrap();

        let folder = Folder::open(&root).unwrap();
        let mut text = String::new();
        folder.file("agents/main/wire.jsonl").unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "ok\n");
        assert_eq!(folder.file("agents/evil/wire.jsonl").err(), Some(Refused::Link));
        assert_eq!(folder.folder("agents/evil").err(), Some(Refused::Link));
        assert_eq!(folder.file("agents/sub/wire.jsonl").err(), Some(Refused::Link));
        assert_eq!(folder.file("agents/main/fifo").err(), Some(Refused::WrongKind));
        assert_eq!(folder.file("agents/main").err(), Some(Refused::WrongKind));
        assert_eq!(folder.file("agents/none/wire.jsonl").err(), Some(Refused::Missing));
        assert_eq!(folder.file("agents/../agents/main/wire.jsonl").err(), Some(Refused::WrongKind));
        let agents: Vec<(String, Kind)> =
            folder.folder("agents").unwrap().entries().into_iter().map(|(n, m)| (n, m.kind)).collect();
        assert_eq!(agents, [("evil".into(), Kind::Link), ("main".into(), Kind::Folder), ("sub".into(), Kind::Folder)]);
        // The root itself may not be a link either.
        symlink(&root, tmp.path().join("link")).unwrap();
        assert_eq!(Folder::open(&tmp.path().join("link")).err(), Some(Refused::Link));
    }
}
