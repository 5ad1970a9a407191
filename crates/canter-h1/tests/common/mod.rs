//! Shared helpers of the table-driven tests: feeding inputs whole, one byte at a time and at the
//! end of a buffer, a comparable summary of a parsed head, and a tiny PRNG.

#![allow(dead_code)]

use std::time::Instant;

use bytes::BytesMut;
use canter_h1::{BodyDecoder, BodyEvent, Conn, Error};
use canter_http::{BodyKind, Method, RequestHead, Version};
use canter_http::{Limits, Timeouts};

/// Everything observable about a parsed head, comparable with `==`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub method: Method,
    pub method_str: String,
    pub target: String,
    pub path_and_query: String,
    pub path: String,
    pub query: Option<String>,
    pub version: Version,
    pub body: BodyKind,
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub headers: Vec<(String, Vec<u8>)>,
    pub raw: Vec<u8>,
}

pub fn summary(h: &RequestHead) -> Summary {
    Summary {
        method: h.method(),
        method_str: h.method_str().to_owned(),
        target: h.target().to_owned(),
        path_and_query: h.path_and_query().to_owned(),
        path: h.path().to_owned(),
        query: h.query().map(str::to_owned),
        version: h.version(),
        body: h.body_kind(),
        keep_alive: h.keep_alive(),
        expect_continue: h.expect_continue(),
        headers: h
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        raw: h.raw().to_vec(),
    }
}

/// The outcome of feeding bytes to `Conn::poll_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per test case, compared and dropped: size is moot
pub enum Parsed {
    /// A head, and every byte that was not consumed (buffer plus bytes never fed).
    Head(Summary, Vec<u8>),
    /// All bytes fed, still waiting for more.
    Partial,
    /// Rejected.
    Err(Error),
}

impl Parsed {
    pub fn status(&self) -> Option<u16> {
        match self {
            Parsed::Err(e) => Some(e.status()),
            _ => None,
        }
    }
}

pub fn now() -> Instant {
    Instant::now()
}

fn conn(limits: Limits) -> Conn {
    Conn::new(limits, Timeouts::default(), now())
}

fn after_error(conn: &Conn, e: Error) -> Parsed {
    assert!(!conn.keep_alive(), "an error must drop keep-alive");
    assert_eq!(
        conn.deadline(),
        None,
        "an errored connection has no read phase"
    );
    Parsed::Err(e)
}

/// Feeds `input` in one piece.
pub fn parse_whole(input: &[u8], limits: Limits) -> Parsed {
    let mut c = conn(limits);
    let mut buf = BytesMut::from(input);
    let before = buf.len();
    match c.poll_request(&mut buf, now()) {
        Ok(Some(h)) => {
            assert_eq!(before - buf.len(), h.raw().len(), "consumed != head length");
            assert_eq!(&input[..h.raw().len()], &h.raw()[..]);
            Parsed::Head(summary(&h), buf.to_vec())
        }
        Ok(None) => {
            assert_eq!(buf.len(), before, "Ok(None) must not consume");
            Parsed::Partial
        }
        Err(e) => after_error(&c, e),
    }
}

/// Feeds `input` one byte at a time, polling after each byte, stopping at the first head or
/// error.
pub fn parse_bytewise(input: &[u8], limits: Limits) -> Parsed {
    let mut c = conn(limits);
    let mut buf = BytesMut::new();
    for (i, &b) in input.iter().enumerate() {
        buf.extend_from_slice(&[b]);
        let before = buf.len();
        match c.poll_request(&mut buf, now()) {
            Ok(Some(h)) => {
                assert_eq!(before - buf.len(), h.raw().len());
                let mut rest = buf.to_vec();
                rest.extend_from_slice(&input[i + 1..]);
                return Parsed::Head(summary(&h), rest);
            }
            Ok(None) => assert_eq!(buf.len(), before, "Ok(None) must not consume"),
            Err(e) => return after_error(&c, e),
        }
    }
    Parsed::Partial
}

/// Feeds `input` in pieces split at the given (sorted) offsets.
pub fn parse_split(input: &[u8], cuts: &[usize], limits: Limits) -> Parsed {
    let mut c = conn(limits);
    let mut buf = BytesMut::new();
    let mut start = 0;
    let ends = cuts.iter().copied().chain([input.len()]);
    for end in ends {
        buf.extend_from_slice(&input[start..end]);
        start = end;
        match c.poll_request(&mut buf, now()) {
            Ok(Some(h)) => {
                let mut rest = buf.to_vec();
                rest.extend_from_slice(&input[end..]);
                return Parsed::Head(summary(&h), rest);
            }
            Ok(None) => {}
            Err(e) => return Parsed::Err(e),
        }
    }
    Parsed::Partial
}

/// Bytes appended after a case's input in the "end of a buffer" run.
pub const TAIL: &[u8] = b"\x00TAIL\xff\r\n";

/// Feeds `input` followed by [`TAIL`] in a buffer of exactly that capacity: whatever the head
/// does not use must stay in the buffer untouched.
pub fn parse_with_tail(input: &[u8], limits: Limits) -> Parsed {
    let mut buf = BytesMut::with_capacity(input.len() + TAIL.len());
    buf.extend_from_slice(input);
    buf.extend_from_slice(TAIL);
    let mut c = conn(limits);
    match c.poll_request(&mut buf, now()) {
        Ok(Some(h)) => Parsed::Head(summary(&h), buf.to_vec()),
        Ok(None) => Parsed::Partial,
        Err(e) => after_error(&c, e),
    }
}

/// What a head case expects.
pub enum Expect {
    /// A head; the function asserts its properties.
    Head(fn(&RequestHead)),
    /// An error answered with this status.
    Status(u16),
    /// Still incomplete after all bytes.
    Partial,
}

pub struct HeadCase {
    pub name: String,
    pub input: Vec<u8>,
    pub expect: Expect,
    pub limits: Limits,
}

pub fn ok(name: &str, input: impl AsRef<[u8]>, check: fn(&RequestHead)) -> HeadCase {
    HeadCase {
        name: name.to_owned(),
        input: input.as_ref().to_vec(),
        expect: Expect::Head(check),
        limits: Limits::default(),
    }
}

pub fn err(name: &str, input: impl AsRef<[u8]>, status: u16) -> HeadCase {
    HeadCase {
        name: name.to_owned(),
        input: input.as_ref().to_vec(),
        expect: Expect::Status(status),
        limits: Limits::default(),
    }
}

pub fn partial(name: &str, input: impl AsRef<[u8]>) -> HeadCase {
    HeadCase {
        name: name.to_owned(),
        input: input.as_ref().to_vec(),
        expect: Expect::Partial,
        limits: Limits::default(),
    }
}

impl HeadCase {
    pub fn limits(mut self, limits: Limits) -> HeadCase {
        self.limits = limits;
        self
    }
}

/// Runs every case whole, byte by byte and with a tail; panics listing every failing case.
pub fn run_head_cases(cases: Vec<HeadCase>) -> usize {
    let mut failures = Vec::new();
    let n = cases.len();
    for case in cases {
        let outcome = std::panic::catch_unwind(|| check_head_case(&case));
        if let Err(p) = outcome {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {msg}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    n
}

fn check_head_case(case: &HeadCase) {
    let whole = parse_whole(&case.input, case.limits);
    let bytewise = parse_bytewise(&case.input, case.limits);
    assert_eq!(whole, bytewise, "whole vs byte-at-a-time");
    match &case.expect {
        Expect::Head(check) => {
            let Parsed::Head(s, rest) = &whole else {
                panic!("expected a head, got {whole:?}");
            };
            // Re-parse to hand the checker the real RequestHead.
            let mut buf = BytesMut::from(&case.input[..]);
            let mut c = conn(case.limits);
            let head = c
                .poll_request(&mut buf, now())
                .expect("parse")
                .expect("complete");
            assert_eq!(&summary(&head), s);
            check(&head);
            // (c) at the end of a buffer: same head, and exactly the bytes after it remain.
            let with_tail = parse_with_tail(&case.input, case.limits);
            let mut expected_rest = rest.clone();
            expected_rest.extend_from_slice(TAIL);
            assert_eq!(
                with_tail,
                Parsed::Head(s.clone(), expected_rest),
                "with tail"
            );
        }
        Expect::Status(status) => {
            assert_eq!(whole.status(), Some(*status), "got {whole:?}");
            let with_tail = parse_with_tail(&case.input, case.limits);
            assert_eq!(
                with_tail.status(),
                Some(*status),
                "with tail: {with_tail:?}"
            );
        }
        Expect::Partial => assert_eq!(whole, Parsed::Partial),
    }
}

// ---- body decoding ---------------------------------------------------------------------------

/// The outcome of decoding a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// The body ended: its bytes, and the bytes left after it.
    End(Vec<u8>, Vec<u8>),
    /// All input consumed without reaching the end (data so far).
    Incomplete(Vec<u8>),
    /// Rejected.
    Err(Error),
}

impl Decoded {
    pub fn status(&self) -> Option<u16> {
        match self {
            Decoded::Err(e) => Some(e.status()),
            _ => None,
        }
    }
}

/// Decodes `input` with `dec`, fed in pieces ending at `cuts` (sorted offsets).
pub fn decode_split(mut dec: BodyDecoder, input: &[u8], cuts: &[usize]) -> Decoded {
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut start = 0;
    for end in cuts.iter().copied().chain([input.len()]) {
        buf.extend_from_slice(&input[start..end]);
        start = end;
        loop {
            let before = buf.len();
            match dec.decode(&mut buf) {
                Ok(BodyEvent::Data(d)) => {
                    assert!(!d.is_empty(), "Data is never empty");
                    // Framing bytes before the data are consumed by the same call.
                    assert!(
                        before - buf.len() >= d.len(),
                        "data consumed from the buffer"
                    );
                    data.extend_from_slice(&d);
                }
                Ok(BodyEvent::NeedMore) => {
                    assert!(buf.is_empty(), "NeedMore must use all buffered bytes");
                    break;
                }
                Ok(BodyEvent::End) => {
                    assert!(dec.is_done());
                    assert_eq!(dec.received(), data.len() as u64);
                    // End is sticky.
                    assert_eq!(dec.decode(&mut buf), Ok(BodyEvent::End));
                    let mut rest = buf.to_vec();
                    rest.extend_from_slice(&input[end..]);
                    return Decoded::End(data, rest);
                }
                Err(e) => return Decoded::Err(e),
            }
        }
    }
    Decoded::Incomplete(data)
}

pub fn decode_whole(dec: BodyDecoder, input: &[u8]) -> Decoded {
    decode_split(dec, input, &[])
}

pub fn decode_bytewise(dec: BodyDecoder, input: &[u8]) -> Decoded {
    let cuts: Vec<usize> = (1..input.len()).collect();
    decode_split(dec, input, &cuts)
}

// ---- PRNG ------------------------------------------------------------------------------------

/// xorshift64*: deterministic, dependency-free randomness for property-style tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Sorted, distinct cut points strictly inside `0..len`.
    pub fn cuts(&mut self, len: usize) -> Vec<usize> {
        if len < 2 {
            return Vec::new();
        }
        let n = self.below(len.min(12));
        let mut cuts: Vec<usize> = (0..n).map(|_| 1 + self.below(len - 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }
}
