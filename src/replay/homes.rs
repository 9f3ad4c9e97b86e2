//! The wrapped CLIs' data folders as recordings and replays see them, read from each adapter.

use crate::cli::adapter::DataHome;

/// Data folders with session files the shim reads, whose variable names the CLI's folder alone: a recording
/// names each by its variable as placeholder (`{{<var>}}`), a check gives the shim a fresh one.
pub fn with_session_files() -> Vec<DataHome> {
    crate::adapters::all()
        .into_iter()
        .filter(|a| a.session_files.is_some() && a.data_home.owns_var())
        .map(|a| a.data_home)
        .collect()
}

/// Variables that name one CLI's own data folder (the player takes their placeholders from its environment).
pub fn own_vars() -> Vec<&'static str> {
    crate::adapters::all().into_iter().filter(|a| a.data_home.owns_var()).map(|a| a.data_home.var).collect()
}

/// Whether a recording leaves out a write to `path`: a temporary file of an atomic write (`<file>.tmp.<…>`),
/// or a file a CLI rewrites that the shim never reads.
pub fn ignored(path: &str) -> bool {
    path.contains(".tmp.")
        || crate::adapters::all()
            .iter()
            .filter_map(|a| a.session_files)
            .any(|s| s.ignored.iter().any(|part| path.contains(part)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_homes_have_own_variables_and_their_ignored_files_are_left_out() {
        let all = crate::adapters::all();
        let homes = with_session_files();
        assert!(!homes.is_empty(), "some adapter reads session files");
        for home in &homes {
            assert!(own_vars().contains(&home.var));
        }
        for files in all.iter().filter_map(|a| a.session_files) {
            for part in files.ignored {
                assert!(ignored(&format!("/r/home/x{part}y")), "{part}");
            }
        }
        assert!(ignored("/r/home/x/state.json.tmp.4242.0000dead"));
        assert!(!ignored("/r/home/x/sessions/s/wire.jsonl"));
    }
}
