use super::*;

fn report(trace: &str) -> Report {
    validate(trace.as_bytes())
}

#[test]
fn every_fixture_prints() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    for agent in ["codex", "grok", "kimi", "opencode"] {
        let mut dirs: Vec<_> =
            std::fs::read_dir(root.join(agent)).unwrap().filter_map(Result::ok).map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            let f = d.join("trace.jsonl");
            if !f.is_file() {
                continue;
            }
            let r = validate(std::io::BufReader::new(std::fs::File::open(&f).unwrap()));
            println!("=== {}\n{}", d.display(), r.text(false));
        }
    }
    let _ = report("");
}
