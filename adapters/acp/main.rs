//! `coda-acp`: the binary; everything it does is in the library's `adapters::acp`.

fn main() {
    coda_shim::adapters::acp::main()
}
