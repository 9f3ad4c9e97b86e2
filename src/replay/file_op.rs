//! Session-file writes of a recording (`agent->file` records) and the player performing them.
//!
//! Placeholders are filled before an operation gets here (see [`super::script::Script`]); a path must then be
//! absolute and free of `..`.

use std::fmt;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::private_file;

/// A session-file write of the CLI.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct FileOp {
    pub op: FileOpKind,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// The target of `rename`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOpKind {
    Append,
    Replace,
    Write,
    Mkdir,
    Remove,
    Rename,
}

/// Why a file operation was not performed.
#[derive(Debug)]
pub enum FileOpError {
    /// A placeholder in the path had no value.
    Unbound(String),
    /// The path is relative or climbs with `..`.
    NotAbsolute(String),
    /// `data` / `base64` do not give the bytes (the path, and why).
    BadData(String, String),
    /// A `rename` without `to` (the path).
    RenameWithoutTo(String),
    /// The file system refused: what was tried, on which path.
    Io { what: &'static str, path: PathBuf, error: std::io::Error },
}

impl fmt::Display for FileOpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileOpError::Unbound(p) => {
                write!(f, "{p}: a placeholder in the path has no value (set ACP_REPLAY_BIND_<NAME>)")
            }
            FileOpError::NotAbsolute(p) => write!(f, "{p}: file paths must be absolute, without \"..\""),
            FileOpError::BadData(p, why) => write!(f, "{p}: {why}"),
            FileOpError::RenameWithoutTo(p) => write!(f, "{p}: \"rename\" without \"to\""),
            FileOpError::Io { what, path, error } => write!(f, "cannot {what} {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for FileOpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileOpError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Writes a whole file, private like every file the shim's tools write (src/private_file.rs).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    private_file::open(path, private_file::Write::Replace)?.write_all(bytes)
}

/// Performs a file operation whose placeholders are filled. Paths must be absolute and free of `..`.
pub fn apply_file_op(op: &FileOp) -> Result<(), FileOpError> {
    let path = checked_path(&op.path)?;
    let bytes = || -> Result<Vec<u8>, FileOpError> {
        match (&op.data, &op.base64) {
            (Some(d), None) => Ok(d.as_bytes().to_vec()),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| FileOpError::BadData(op.path.clone(), format!("\"base64\" is not valid base64: {e}"))),
            (None, None) => Ok(Vec::new()),
            (Some(_), Some(_)) => Err(FileOpError::BadData(op.path.clone(), "both \"data\" and \"base64\"".into())),
        }
    };
    let io = |what: &'static str, error: std::io::Error| FileOpError::Io { what, path: path.clone(), error };
    let parent = |p: &Path| -> Result<(), FileOpError> {
        match p.parent() {
            Some(dir) => std::fs::create_dir_all(dir).map_err(|e| io("create the folder of", e)),
            None => Ok(()),
        }
    };
    match op.op {
        FileOpKind::Append => {
            parent(&path)?;
            let mut f = private_file::open(&path, private_file::Write::Append).map_err(|e| io("open", e))?;
            f.write_all(&bytes()?).map_err(|e| io("append to", e))
        }
        FileOpKind::Write => {
            parent(&path)?;
            write_whole(&path, &bytes()?).map_err(|e| io("write", e))
        }
        FileOpKind::Replace => {
            parent(&path)?;
            let mut tmp = path.clone().into_os_string();
            tmp.push(".tmp.replay");
            let tmp = PathBuf::from(tmp);
            write_whole(&tmp, &bytes()?).map_err(|e| io("write", e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io("rename over", e))
        }
        FileOpKind::Mkdir => std::fs::create_dir_all(&path).map_err(|e| io("create", e)),
        FileOpKind::Remove => std::fs::remove_file(&path).map_err(|e| io("remove", e)),
        FileOpKind::Rename => {
            let to = op.to.as_deref().ok_or_else(|| FileOpError::RenameWithoutTo(op.path.clone()))?;
            let to = checked_path(to)?;
            parent(&to)?;
            std::fs::rename(&path, &to).map_err(|e| io("rename", e))
        }
    }
}

fn checked_path(p: &str) -> Result<PathBuf, FileOpError> {
    if p.contains("{{") {
        return Err(FileOpError::Unbound(p.to_owned()));
    }
    let path = PathBuf::from(p);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(FileOpError::NotAbsolute(p.to_owned()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: FileOpKind, path: &str) -> FileOp {
        FileOp { op: kind, path: path.into(), data: None, base64: None, to: None }
    }

    #[test]
    fn paths_must_be_absolute_filled_and_without_parent_steps() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_string_lossy().into_owned();
        let bad = op(FileOpKind::Write, &format!("{root}/../x"));
        let err = apply_file_op(&bad).unwrap_err();
        assert!(matches!(err, FileOpError::NotAbsolute(_)), "{err}");
        assert!(err.to_string().contains("without \"..\""), "{err}");
        let err = apply_file_op(&op(FileOpKind::Write, "{{NOPE}}/x")).unwrap_err();
        assert!(matches!(err, FileOpError::Unbound(_)), "{err}");
        assert!(err.to_string().contains("no value"), "{err}");
        let err = apply_file_op(&op(FileOpKind::Write, "rel/x")).unwrap_err();
        assert!(matches!(err, FileOpError::NotAbsolute(_)), "{err}");
    }

    #[test]
    fn rename_needs_a_target_and_bad_base64_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("a").to_string_lossy().into_owned();
        let err = apply_file_op(&op(FileOpKind::Rename, &from)).unwrap_err();
        assert!(matches!(err, FileOpError::RenameWithoutTo(_)), "{err}");
        let mut b64 = op(FileOpKind::Write, &from);
        b64.base64 = Some("not base64!".into());
        assert!(matches!(apply_file_op(&b64).unwrap_err(), FileOpError::BadData(..)));
        assert!(!dir.path().join("a").exists(), "nothing is written from bad data");
        let err = apply_file_op(&op(FileOpKind::Remove, &from)).unwrap_err();
        assert!(matches!(&err, FileOpError::Io { what: "remove", .. }), "{err}");
    }
}
