//! Any bytes at all, in any pieces: the engine answers with events or an error, never a panic
//! or a loop, and never buffers past its limits. Seeded, so a failure replays.

#![allow(clippy::unwrap_used, missing_docs)]

use bytes::BytesMut;
use canter_ws::deflate::{negotiate, DeflateConfig};
use canter_ws::frame::{apply_mask, put_header, Opcode};
use canter_ws::{Connection, Limits, Role};

/// xorshift64*: a reproducible stream of numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const LIMITS: Limits = Limits {
    max_frame: 4096,
    max_message: 8192,
    max_fragments: 8,
};

fn connections() -> Vec<Connection> {
    let agreed = negotiate(
        &["permessage-deflate".to_string()],
        DeflateConfig::default(),
    )
    .unwrap()
    .0;
    vec![
        Connection::new(Role::Server, LIMITS),
        Connection::new(Role::Server, LIMITS).with_deflate(agreed),
        Connection::new(
            Role::Client {
                keys: Box::new(|| [7, 7, 7, 7]),
            },
            LIMITS,
        ),
    ]
}

/// Feeds `bytes` in random pieces; returns how the run ended.
fn feed(conn: &mut Connection, bytes: &[u8], rng: &mut Rng) -> Result<usize, canter_ws::Error> {
    let mut input = BytesMut::new();
    let mut out = Vec::new();
    let mut events = 0;
    let mut at = 0;
    while at < bytes.len() {
        let n = 1 + rng.below(64) as usize;
        let end = (at + n).min(bytes.len());
        input.extend_from_slice(&bytes[at..end]);
        at = end;
        // Each poll either takes a whole frame or asks for more: bounded by the bytes fed.
        for _ in 0..=bytes.len() {
            match conn.poll(&mut input, &mut out)? {
                Some(_) => events += 1,
                None => break,
            }
        }
        // What waits unread is at most one frame: its header and the frame limit.
        assert!(
            input.len() <= 14 + LIMITS.max_frame as usize + 64,
            "{} buffered",
            input.len()
        );
    }
    Ok(events)
}

#[test]
fn random_bytes_end_in_events_or_an_error() {
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    for _ in 0..3000 {
        let len = rng.below(300) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        for mut conn in connections() {
            let _ = feed(&mut conn, &bytes, &mut rng);
        }
    }
}

#[test]
fn plausible_frames_with_random_fields_end_in_events_or_an_error() {
    // Headers that mostly parse: random opcodes, bits, lengths around the limits, masks.
    let mut rng = Rng(0xdead_beef_0bad_f00d);
    for _ in 0..3000 {
        let mut bytes = Vec::new();
        for _ in 0..1 + rng.below(6) {
            let opcode = [0x0u8, 0x1, 0x2, 0x8, 0x9, 0xA][rng.below(6) as usize];
            let len = [0u64, 1, 2, 125, 126, 127, 4096, 4097][rng.below(8) as usize];
            let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mask = (rng.below(4) != 0).then(|| (rng.next() as u32).to_ne_bytes());
            let start = bytes.len();
            put_header(
                &mut bytes,
                rng.below(3) != 0,
                rng.below(5) == 0,
                Opcode::from_bits(opcode).unwrap(),
                len,
                mask,
            );
            if rng.below(10) == 0 {
                bytes[start] ^= 1 << rng.below(8);
            }
            let p = bytes.len();
            bytes.extend_from_slice(&payload);
            if let Some(k) = mask {
                apply_mask(&mut bytes[p..], k, 0);
            }
        }
        for mut conn in connections() {
            let _ = feed(&mut conn, &bytes, &mut rng);
        }
    }
}
