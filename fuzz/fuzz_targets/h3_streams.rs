//! `h3_streams` fuzz target; the invariants are in `fuzz/h3_harness.rs` (shared with the stable
//! corpus-replay test `crates/canter-h3/tests/fuzz_props.rs`).

#![no_main]

#[path = "../h3_harness.rs"]
mod h3_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| h3_harness::h3_streams(data));
