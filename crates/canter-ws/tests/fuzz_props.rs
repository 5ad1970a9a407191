//! Replays the WebSocket fuzz corpora (`fuzz/corpus/ws_frames`, `fuzz/corpus/ws_inflate`)
//! through the invariant checks of the fuzz targets on stable Rust, and as many seeded random
//! inputs again (mutations of the corpus files: flipped bits, cut and repeated pieces), since no
//! fuzzer runs in the test suite. The checks live in `fuzz/ws_harness.rs`, shared with the
//! cargo-fuzz targets.

#![allow(missing_docs)]

#[path = "../../../fuzz/ws_harness.rs"]
mod ws_harness;

#[path = "../../../fuzz/corpus.rs"]
mod corpus;

/// xorshift32: mutations that are the same on every run.
fn next(seed: &mut u32) -> u32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 17;
    *seed ^= *seed << 5;
    *seed
}

fn mutate(data: &[u8], seed: &mut u32, keep: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    for _ in 0..1 + next(seed) % 4 {
        if v.len() <= keep {
            break;
        }
        let at = keep + next(seed) as usize % (v.len() - keep);
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

fn replay(target: &str, check: fn(&[u8]), keep: usize) {
    let mut seed = 0x2545_f491;
    for path in corpus::files(target) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let inputs = std::iter::once(data.clone())
            .chain((0..200).map(|_| mutate(&data, &mut seed, keep)))
            .collect::<Vec<_>>();
        for input in inputs {
            if std::panic::catch_unwind(|| check(&input)).is_err() {
                panic!(
                    "{} (or a mutation of it) fails the {target} checks: input {:?}",
                    path.display(),
                    input
                );
            }
        }
    }
}

#[test]
fn ws_frames_corpus_and_mutations_keep_the_invariants() {
    replay(
        "ws_frames",
        ws_harness::ws_frames,
        ws_harness::FRAMES_PREFIX,
    );
}

#[test]
fn ws_inflate_corpus_and_mutations_keep_the_invariants() {
    replay("ws_inflate", ws_harness::ws_inflate, 4);
}
