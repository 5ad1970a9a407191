//! Invariant checks of the WebSocket engine (`crates/canter-ws`), shared by the cargo-fuzz
//! targets `ws_frames` and `ws_inflate` and the stable replay test
//! (`crates/canter-ws/tests/fuzz_props.rs`), which include this file with
//! `#[path = ...] mod ws_harness;`. Every check panics on a violated invariant.
//!
//! Input layouts (reads past the end yield zeros, so every byte string is a valid input):
//!
//! - [`ws_frames`]: 1 byte of flags (bit 0: permessage-deflate agreed; bit 1: the client's
//!   context is reset per message), 1 byte frame limit (×64 bytes, 0 = 16 MiB), 1 byte message
//!   limit (×256 bytes, 0 = 64 MiB), 1 byte fragment limit (+1), 4 bytes split seed, then the
//!   bytes a client sends.
//! - [`ws_inflate`]: 1 byte of flags (bit 0: context reset per message), 2 bytes limit (little
//!   endian), 1 byte: where the input is cut into two messages (×1/256 of it), then the
//!   compressed bytes.

#![allow(dead_code)]

use bytes::BytesMut;
use canter_ws::deflate::{Agreed, DeflateConfig, Inflater};
use canter_ws::frame::{parse_header, Opcode};
use canter_ws::{Connection, Error, Event, Limits, Role};

/// The prefix of a [`ws_frames`] input.
pub const FRAMES_PREFIX: usize = 8;

fn byte(data: &[u8], i: usize) -> u8 {
    data.get(i).copied().unwrap_or(0)
}

fn limits(data: &[u8]) -> Limits {
    let frame = byte(data, 1);
    let message = byte(data, 2);
    Limits {
        max_frame: if frame == 0 {
            16 << 20
        } else {
            u64::from(frame) * 64
        },
        max_message: if message == 0 {
            64 << 20
        } else {
            usize::from(message) * 256
        },
        max_fragments: usize::from(byte(data, 3)) + 1,
    }
}

fn server(data: &[u8]) -> Connection {
    let flags = byte(data, 0);
    let conn = Connection::new(Role::Server, limits(data));
    if flags & 1 == 0 {
        return conn;
    }
    conn.with_deflate(Agreed {
        server_no_context_takeover: false,
        client_no_context_takeover: flags & 2 != 0,
        server_window_bits: 15,
        client_window_bits: 15,
        config: DeflateConfig::default(),
    })
}

/// What the engine made of a client's bytes: its events, the error that ended them (if one
/// did), and what it wrote back.
#[derive(Debug, PartialEq)]
struct Outcome {
    events: Vec<Event>,
    error: Option<Error>,
    out: Vec<u8>,
}

/// Runs `payload` through a fresh server, handed over in the pieces `cuts` makes.
fn run(data: &[u8], payload: &[u8], cuts: &[usize]) -> Outcome {
    let limits = limits(data);
    let mut conn = server(data);
    let mut input = BytesMut::new();
    let mut out = Vec::new();
    let mut events = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&payload.len())) {
        input.extend_from_slice(&payload[from..to]);
        from = to;
        loop {
            match conn.poll(&mut input, &mut out) {
                Ok(Some(event)) => {
                    check_event(&event, &limits);
                    let close = matches!(event, Event::Close(_));
                    events.push(event);
                    if close {
                        assert!(conn.close_received());
                        // Nothing after a close is read.
                        assert_eq!(conn.poll(&mut input, &mut out), Ok(None));
                        assert!(input.is_empty());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    check_frames(&out);
                    return Outcome {
                        events,
                        error: Some(e),
                        out,
                    };
                }
            }
        }
        // What is left is one frame not yet complete: never more than a header and the limit.
        assert!(
            input.len() as u64 <= limits.max_frame + 14,
            "{} bytes held",
            input.len()
        );
    }
    check_frames(&out);
    Outcome {
        events,
        error: None,
        out,
    }
}

fn check_event(event: &Event, limits: &Limits) {
    match event {
        Event::Text(t) => {
            assert!(std::str::from_utf8(t).is_ok(), "text that is not UTF-8");
            assert!(t.len() <= limits.max_message);
        }
        Event::Binary(b) => assert!(b.len() <= limits.max_message),
        Event::Ping(p) | Event::Pong(p) => assert!(p.len() <= 125),
        Event::Close(Some((code, reason))) => {
            assert!(canter_ws::close::valid_on_wire(*code), "close code {code}");
            assert!(reason.len() <= 123);
        }
        Event::Close(None) => {}
    }
}

/// What the server wrote is whole, unmasked, control frames of at most 125 bytes, and at most
/// one close, last.
fn check_frames(out: &[u8]) {
    let mut rest = out;
    let mut closed = false;
    while !rest.is_empty() {
        let h = parse_header(rest)
            .expect("the server's own frame parses")
            .expect("the server's frames are whole");
        assert!(h.mask.is_none(), "a server frame is masked");
        assert!(!closed, "a frame after the close");
        if h.opcode.is_control() {
            assert!(h.len <= 125 && h.fin);
        }
        closed = h.opcode == Opcode::Close;
        let total = h.header_len + h.len as usize;
        assert!(rest.len() >= total);
        rest = &rest[total..];
    }
}

/// The engine as a server on the bytes a client sends: the same events, error and output
/// whether the bytes come whole or in pieces (byte by byte for short inputs); every event
/// within the limits, text valid UTF-8, close codes valid; the output well-formed frames.
pub fn ws_frames(data: &[u8]) {
    let payload = data.get(FRAMES_PREFIX..).unwrap_or_default();
    let whole = run(data, payload, &[]);
    let cuts: Vec<usize> = if payload.len() <= 256 {
        (1..payload.len()).collect()
    } else {
        let mut seed =
            u32::from_le_bytes([byte(data, 4), byte(data, 5), byte(data, 6), byte(data, 7)]) | 1;
        let mut cuts: Vec<usize> = (0..16)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed as usize % payload.len()
            })
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    };
    let pieces = run(data, payload, &cuts);
    assert_eq!(whole, pieces, "the split changed the outcome");
}

/// The bounded inflater: never more than the limit out (over it, `TooBig`), never a panic, on
/// any bytes; two messages in a row as a connection would inflate them.
pub fn ws_inflate(data: &[u8]) {
    let reset = byte(data, 0) & 1 != 0;
    let limit = usize::from(u16::from_le_bytes([byte(data, 1), byte(data, 2)]));
    let body = data.get(4..).unwrap_or_default();
    let cut = body.len() * usize::from(byte(data, 3)) / 256;
    let mut inflater = Inflater::new(reset);
    for message in [&body[..cut], &body[cut..]] {
        let mut out = Vec::new();
        match inflater.inflate(message, limit, &mut out) {
            Ok(()) => assert!(out.len() <= limit, "{} bytes out, limit {limit}", out.len()),
            Err(Error::TooBig) | Err(Error::Protocol(_)) => return,
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
}
