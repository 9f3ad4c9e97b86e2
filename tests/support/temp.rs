//! Temporary directories for tests (the `tempfile` crate), removed when dropped.
//!
//! Also when the test panics (the guard is dropped while unwinding). `CODA_TEST_KEEP_TEMP=1` keeps them and prints
//! where they are, for debugging.

use std::path::{Path, PathBuf};

pub struct TempDir {
    /// Present until the guard is dropped or kept.
    dir: Option<tempfile::TempDir>,
}

impl TempDir {
    /// A fresh, empty `<system temp dir>/<name>-<random>`.
    pub fn new(name: &str) -> TempDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temporary folder for {name}: {e}"));
        TempDir { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("present until dropped").path()
    }

    pub fn join(&self, rest: impl AsRef<Path>) -> PathBuf {
        self.path().join(rest)
    }

    /// Disarms the guard: the folder stays (e.g. a recording run that names it).
    pub fn keep(mut self) -> PathBuf {
        self.dir.take().expect("present until dropped").keep()
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        self.path()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if std::env::var_os("CODA_TEST_KEEP_TEMP").is_some_and(|v| !v.is_empty()) {
            eprintln!("kept {} (CODA_TEST_KEEP_TEMP)", dir.keep().display());
            return;
        }
        let path = dir.path().to_owned();
        if dir.close().is_ok() {
            return;
        }
        // A process the test started may still be finishing a write there: try again briefly.
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {}
                _ => return,
            }
        }
        eprintln!("could not remove {}", path.display());
    }
}
