//! `coda-opencode`: the binary; everything it does is in the library's `adapters::opencode`.

fn main() {
    coda_shim::cli::binary::main(coda_shim::adapters::opencode::adapter())
}
