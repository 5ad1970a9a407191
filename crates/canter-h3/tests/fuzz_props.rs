//! Replays the HTTP/3 fuzz corpora (`fuzz/corpus/h3_streams`, `fuzz/corpus/qpack`) through the
//! invariant checks of the fuzz targets on stable Rust, and as many seeded random inputs again
//! (mutations of the corpus files: flipped bits, cut and repeated pieces), since no fuzzer runs
//! in the test suite. The checks live in `fuzz/h3_harness.rs`, shared with the cargo-fuzz
//! targets.

#![allow(missing_docs, clippy::unwrap_used)]

#[path = "../../../fuzz/h3_harness.rs"]
mod h3_harness;

#[path = "../../../fuzz/corpus.rs"]
mod corpus;

/// xorshift32: mutations that are the same on every run.
fn next(seed: &mut u32) -> u32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 17;
    *seed ^= *seed << 5;
    *seed
}

fn mutate(data: &[u8], seed: &mut u32) -> Vec<u8> {
    let mut v = data.to_vec();
    for _ in 0..1 + next(seed) % 4 {
        if v.is_empty() {
            break;
        }
        let at = next(seed) as usize % v.len();
        match next(seed) % 4 {
            0 => v[at] ^= 1 << (next(seed) % 8),
            1 => v.truncate(at),
            2 => {
                let end = (at + 1 + next(seed) as usize % 32).min(v.len());
                let piece = v[at..end].to_vec();
                v.splice(at..at, piece);
            }
            _ => v[at] = next(seed) as u8,
        }
    }
    v
}

fn replay(target: &str, check: fn(&[u8])) {
    let mut seed = 0x9e37_79b9;
    for path in corpus::files(target) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let inputs = std::iter::once(data.clone())
            .chain((0..2000).map(|_| mutate(&data, &mut seed)))
            .collect::<Vec<_>>();
        for input in inputs {
            if std::panic::catch_unwind(|| check(&input)).is_err() {
                panic!(
                    "{} (or a mutation of it) fails the {target} checks: input {input:?}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn h3_streams_corpus_and_mutations_hold_the_invariants() {
    replay("h3_streams", h3_harness::h3_streams);
}

#[test]
fn qpack_corpus_and_mutations_hold_the_invariants() {
    replay("qpack", h3_harness::qpack);
}

/// The seeds are what their names say: the checks above run on real requests, not only on
/// inputs the engine refuses at once.
#[test]
fn the_seeds_reach_the_engine() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let read = |t: &str, f: &str| std::fs::read(dir.join(t).join(f)).unwrap();
    for seed in [
        "seed-get",
        "seed-control-then-get",
        "seed-post-in-pieces",
        "seed-qpack-streams",
        "seed-unknown-frames",
        "seed-trailers",
    ] {
        assert_eq!(
            h3_harness::streams_requests(&read("h3_streams", seed)),
            1,
            "{seed}"
        );
    }
    for seed in [
        "seed-get-static",
        "seed-rfc9204-b1-path",
        "seed-huffman-authority",
        "seed-literal-name",
    ] {
        assert!(h3_harness::qpack_round_trip(&read("qpack", seed)), "{seed}");
    }
    assert!(!h3_harness::qpack_round_trip(&read(
        "qpack",
        "seed-dynamic-ref"
    )));
}
