//! `coda-codex`: the binary; everything it does is in the library's `adapters::codex`.

fn main() {
    coda_shim::cli::adapter::main(coda_shim::adapters::codex::adapter())
}
