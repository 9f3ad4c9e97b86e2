//! `coda-codex`: the binary; everything it does is in the library's `adapters::codex`.

fn main() {
    coda_shim::cli::binary::main(coda_shim::adapters::codex::adapter())
}
