//! Temporary directories for tests: removed when dropped, so also when the test panics (the guard is
//! dropped while unwinding). `CODA_TEST_KEEP_TEMP=1` keeps them and prints where they are, for debugging.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh, empty `<system temp dir>/<name>-<pid>-<n>` (`n` counts the guards of this process, so two
    /// tests of one binary never share a folder).
    pub fn new(name: &str) -> TempDir {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("cannot make {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, rest: impl AsRef<Path>) -> PathBuf {
        self.path.join(rest)
    }

    /// Disarms the guard: the folder stays (e.g. a recording run that names it).
    pub fn keep(self) -> PathBuf {
        let path = self.path.clone();
        std::mem::forget(self);
        path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("CODA_TEST_KEEP_TEMP").is_some_and(|v| !v.is_empty()) {
            eprintln!("kept {} (CODA_TEST_KEEP_TEMP)", self.path.display());
            return;
        }
        // A process the test started may still be finishing a write there: try again briefly.
        for _ in 0..5 {
            match std::fs::remove_dir_all(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                _ => return,
            }
        }
        eprintln!("could not remove {}", self.path.display());
    }
}
