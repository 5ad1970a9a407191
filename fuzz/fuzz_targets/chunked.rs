//! `chunked` fuzz target; the invariants are in `fuzz/harness.rs` (shared with the stable
//! corpus-replay test `crates/canter-h1/tests/fuzz_props.rs`).

#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::chunked(data));
