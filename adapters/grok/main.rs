//! `coda-grok`: the binary; everything it does is in the library's `adapters::grok`.

fn main() {
    coda_shim::cli::binary::main(coda_shim::adapters::grok::adapter())
}
