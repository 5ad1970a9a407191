//! `ws_frames` fuzz target; the invariants are in `fuzz/ws_harness.rs` (shared with the stable
//! replay test `crates/canter-ws/tests/fuzz_props.rs`).

#![no_main]

#[path = "../ws_harness.rs"]
mod ws_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| ws_harness::ws_frames(data));
