//! Scripts a test writes and then runs (a stand-in CLI, a fake `node`), written so that running them cannot fail
//! with ETXTBSY ("Text file busy").
//!
//! Linux refuses to run a file that some process holds open for writing. A test binary runs its tests on
//! threads: while one thread writes a script, another may be starting a process (fork, then exec), and the
//! child holds a copy of every descriptor of the test process, the script's included, until its exec closes it
//! (`O_CLOEXEC`). The script, closed by its writer, can then still be open for writing in that child when the
//! shim runs it (seen once in tests/gui_path.rs). Writing to a temporary name and renaming does not help: the
//! copy refers to the same file. So the test process never opens the script for writing at all: `tee`, a
//! process that starts no other, writes it, and the test waits for `tee` to end before anything runs the script.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Writes `text` to `path` (making its folder) with mode 0755, without a write descriptor in this process.
pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("make the folder");
    let mut tee = Command::new("tee")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("run tee to write {}: {e}", path.display()));
    tee.stdin.take().expect("tee's stdin").write_all(text.as_bytes()).expect("write to tee");
    let status = tee.wait().expect("wait for tee");
    assert!(status.success(), "tee could not write {}: {status}", path.display());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
}
