//! Invariant checks of the HTTP/3 engine (`crates/canter-h3`), shared by the cargo-fuzz targets
//! `h3_streams` and `qpack` and the stable replay test (`crates/canter-h3/tests/fuzz_props.rs`),
//! which include this file with `#[path = ...] mod h3_harness;`. Every check panics on a violated
//! invariant.
//!
//! Input layouts (every byte string is a valid input):
//!
//! - [`qpack`]: a field section as a HEADERS frame carries it.
//! - [`h3_streams`]: a sequence of pieces, each 2 bytes of header then its bytes: the first byte
//!   picks the stream (its low 3 bits: request streams 0, 4, 8, 12, unidirectional 2, 6, 10, 14)
//!   and bit 3 is the FIN; the second is the piece's length; a piece cut short by the end of
//!   the input is given as far as it goes.

#![allow(dead_code)]

use bytes::Bytes;
use canter_h3::qpack::{decode, Encoder};
use canter_h3::{Connection, Event, Settings};

/// The decoder takes any section without panicking; a section it accepts re-encodes (with the
/// static table and literals) into one that decodes to the same fields.
pub fn qpack(data: &[u8]) {
    qpack_round_trip(data);
}

/// [`qpack`]'s check; true when the section decoded and its round trip was checked.
pub fn qpack_round_trip(data: &[u8]) -> bool {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let Ok(decoded) = decode(data, 64 * 1024, |n, v| {
        fields.push((n.to_vec(), v.to_vec()))
    }) else {
        return false;
    };
    if decoded.over_limit {
        return false;
    }
    let mut enc = Encoder::new();
    let mut again = Vec::new();
    enc.begin(&mut again);
    for (n, v) in &fields {
        enc.field(n, v, &mut again);
    }
    let mut back: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let round = decode(&again, 64 * 1024, |n, v| {
        back.push((n.to_vec(), v.to_vec()))
    });
    assert!(
        round.is_ok(),
        "re-encoded section does not decode: {round:?}"
    );
    assert_eq!(back, fields, "re-encoded section decodes to other fields");
    true
}

const STREAMS: [u64; 8] = [0, 4, 8, 12, 2, 6, 10, 14];

/// The engine takes any sequence of stream pieces without panicking, and what it says holds
/// together: a stream's request comes before its body, its body ends once, nothing follows a
/// connection error, and the state it keeps is bounded by the streams it was given.
pub fn h3_streams(data: &[u8]) {
    streams_requests(data);
}

/// [`h3_streams`]'s check; returns how many requests the engine reported.
pub fn streams_requests(data: &[u8]) -> usize {
    let mut requests = 0;
    let mut conn = Connection::new(Settings::default().with_connect_protocol(true));
    let mut at = 0;
    let mut requested = [false; 16];
    let mut ended = [false; 16];
    while at + 2 <= data.len() {
        let pick = data[at];
        let len = data[at + 1] as usize;
        at += 2;
        let piece = &data[at..(at + len).min(data.len())];
        at += len;
        let stream = STREAMS[(pick & 7) as usize];
        let fin = pick & 8 != 0;
        let result = conn.recv(stream, Bytes::copy_from_slice(piece), fin);
        while let Some(ev) = conn.poll_event() {
            match ev {
                Event::Request {
                    stream,
                    head,
                    end_stream,
                } => {
                    let s = stream as usize;
                    assert!(!requested[s], "a second request on stream {stream}");
                    requested[s] = true;
                    requests += 1;
                    assert!(!head.method().is_empty());
                    ended[s] |= end_stream;
                }
                Event::Data {
                    stream, end_stream, ..
                } => {
                    let s = stream as usize;
                    assert!(requested[s], "body before the request on stream {stream}");
                    assert!(!ended[s], "body after the end on stream {stream}");
                    ended[s] |= end_stream;
                }
                Event::Trailers { stream, .. } => {
                    let s = stream as usize;
                    assert!(
                        requested[s] && !ended[s],
                        "trailers out of place on {stream}"
                    );
                    ended[s] = true;
                }
                _ => {}
            }
        }
        if result.is_err() {
            // A connection error ends the connection: the driver closes it.
            return requests;
        }
        assert!(
            conn.open_requests() <= 4,
            "more request state than request streams"
        );
    }
    requests
}
