//! Runs the live tests' fake model server by hand.
//!
//! `cargo run --example fake_model [-- --port-file FILE] [--dump-dir DIR]`
//! prints the base URL (`http://127.0.0.1:PORT/v1`) on stdout, logs one line per request to stderr
//! and serves until killed. Markers understood in prompts are listed in `tests/live-rig/src/fake_model/mod.rs`.

use std::path::PathBuf;

use live_rig::fake_model;

fn main() {
    let mut options = fake_model::Options { log_requests: true, dump_dir: None };
    let mut port_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port-file" => port_file = args.next().map(PathBuf::from),
            "--dump-dir" => options.dump_dir = args.next().map(PathBuf::from),
            other => {
                eprintln!(
                    "fake_model: unknown argument {other:?}; usage: fake_model [--port-file FILE] [--dump-dir DIR]"
                );
                std::process::exit(2);
            }
        }
    }
    let server = fake_model::FakeModel::start_with(options);
    println!("{}", server.base_url());
    if let Some(file) = port_file {
        let written = std::fs::write(&file, server.addr().port().to_string());
        if let Err(err) = written {
            eprintln!("fake_model: cannot write {}: {err}", file.display());
        }
    }
    loop {
        std::thread::park();
    }
}
