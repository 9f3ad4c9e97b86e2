//! `coda-kimi`: the binary; everything it does is in the library's `adapters::kimi`.

fn main() {
    coda_shim::cli::binary::main(coda_shim::adapters::kimi::adapter())
}
