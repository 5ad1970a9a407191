//! Replays the fuzz corpora (`fuzz/corpus/<target>/*`) through the invariant checks of the fuzz
//! targets on stable Rust. The checks live in `fuzz/harness.rs`, shared with the cargo-fuzz
//! targets (see `fuzz/README.md`). Minimized reproducers of canter-h1 bugs found by fuzzing go
//! here as named tests; the campaign of 2026-11-22 found none.

#[path = "../../../fuzz/harness.rs"]
mod harness;

#[path = "../../../fuzz/corpus.rs"]
mod corpus;

fn replay(target: &str, check: fn(&[u8])) {
    for path in corpus::files(target) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let result = std::panic::catch_unwind(|| check(&data));
        if let Err(panic) = result {
            eprintln!("corpus file {} fails", path.display());
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn parse_head_corpus() {
    replay("parse_head", harness::parse_head);
}

#[test]
fn chunked_corpus() {
    replay("chunked", harness::chunked);
}

#[test]
fn conn_machine_corpus() {
    replay("conn_machine", harness::conn_machine);
}
