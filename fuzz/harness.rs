//! Invariant checks shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and the stable
//! corpus-replay test (`crates/canter-h1/tests/fuzz_props.rs`), which both include this file with
//! `#[path = ...] mod harness;`. Every check panics on a violated invariant.
//!
//! Input layouts (all reads past the end yield zeros, so every byte string is a valid input):
//!
//! - [`parse_head`] and [`chunked`]: 11 bytes of [`Limits`] (see [`limits`]), 1 byte split mode,
//!   4 bytes split seed, then the payload.
//! - [`conn_machine`]: 11 bytes of limits, 3 bytes of timeouts (idle, head, body seconds),
//!   1 byte read size of the automatic driver, 2 bytes (little endian) length of the operation
//!   program, the program, then the bytes the client sends.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::BytesMut;
use canter_h1::{reason, BodyDecoder, BodyEvent, BodyLen, Conn, Error, Next};
use canter_http::{BodyKind, Method, RequestHead, Version};
use canter_http::{Limits, Timeouts};

/// Length of the limits + split prefix of `parse_head` and `chunked` inputs.
pub const PREFIX: usize = 16;

/// The runtime's output high-water mark: no new request is parsed while more is buffered.
pub const HIGH_WATER: usize = 64 * 1024;

/// A cursor over the fuzz input that yields zeros once exhausted.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// The next byte, 0 when exhausted.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, little endian.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    /// The next four bytes, little endian.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    /// Up to `n` next bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Valid limits from 11 bytes (each at the edges of its range too): max_head 64..=64 KiB − 1,
/// max_headers 0..=256, max_target 1..=64 KiB, max_body up to 16 MiB or unlimited,
/// max_chunk_ext 0..=2040, max_trailers 0..=64 KiB.
pub fn limits(inp: &mut Input<'_>) -> Limits {
    let max_head = (64 + usize::from(inp.u16())).min(Limits::HEAD_CAP);
    let max_headers = match inp.u8() {
        255 => Limits::HEADER_COUNT_CAP,
        n => usize::from(n),
    };
    let max_target = usize::from(inp.u16()).max(1);
    let max_body = match inp.u8() {
        255 => u64::MAX,
        hi => (u64::from(hi) << 16) | u64::from(inp.u16()),
    };
    // Always consume the same number of bytes whatever the branch above took.
    if max_body == u64::MAX {
        inp.u16();
    }
    let max_chunk_ext = usize::from(inp.u8()) * 8;
    let max_trailers = usize::from(inp.u16());
    Limits::builder()
        .max_head(max_head)
        .max_headers(max_headers)
        .max_target(max_target)
        .max_body(max_body)
        .max_chunk_ext(max_chunk_ext)
        .max_trailers(max_trailers)
        .build()
        .expect("valid limits")
}

/// xorshift32, for split points.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.next() as usize % n
        }
    }
}

/// Interior split points of `len` bytes, sorted and distinct: byte by byte (mode 0, short
/// inputs only, as each re-parse is linear), otherwise 1..=16 seeded random points.
pub fn cuts(mode: u8, seed: u32, len: usize) -> Vec<usize> {
    if len <= 1 {
        return Vec::new();
    }
    if mode & 3 == 0 && len <= 512 {
        return (1..len).collect();
    }
    let mut rng = Rng(seed | 1);
    let n = 1 + usize::from(mode / 4) % 16;
    let mut v: Vec<usize> = (0..n).map(|_| 1 + rng.below(len - 1)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Everything observable about a parsed head, comparable with `==`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadView {
    method: Method,
    method_str: String,
    target: String,
    path_and_query: String,
    version: Version,
    headers: Vec<(String, Vec<u8>)>,
    body_kind: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
    raw: Vec<u8>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Checks the invariants of one parsed head and returns its comparable view.
pub fn check_head(h: &RequestHead, limits: &Limits) -> HeadView {
    let raw = h.raw().to_vec();
    assert!(raw.len() <= limits.max_head(), "head longer than max_head");
    assert!(
        raw.ends_with(b"\r\n\r\n"),
        "head does not end with CRLF CRLF"
    );
    for (i, &b) in raw.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && raw[i - 1] == b'\r', "bare LF accepted");
        }
    }
    let method_str = h.method_str();
    assert!(
        !method_str.is_empty() && method_str.bytes().all(is_tchar),
        "method is not a token"
    );
    let target = h.target();
    assert!(!target.is_empty(), "empty target");
    assert!(
        target.len() <= limits.max_target(),
        "target longer than max_target"
    );
    assert!(
        target.bytes().all(|b| b.is_ascii_graphic()),
        "target has a byte outside VCHAR"
    );
    let pq = h.path_and_query();
    match h.method() {
        Method::Connect => assert_eq!(pq, target, "CONNECT path_and_query"),
        Method::Options if target == "*" => assert_eq!(pq, "*"),
        _ => assert!(pq.starts_with('/'), "path_and_query {pq:?} not absolute"),
    }
    match h.query() {
        Some(q) => assert_eq!(format!("{}?{}", h.path(), q), pq),
        None => assert_eq!(h.path(), pq),
    }
    let headers: Vec<(String, Vec<u8>)> = h
        .headers()
        .map(|(n, v)| (n.to_owned(), v.to_vec()))
        .collect();
    assert!(
        headers.len() <= limits.max_headers().min(Limits::HEADER_COUNT_CAP),
        "more headers than max_headers"
    );
    let mut hosts = 0;
    for (n, v) in &headers {
        assert!(
            !n.is_empty() && n.bytes().all(is_tchar),
            "header name not a token"
        );
        assert!(
            v.iter().all(|&b| b == b'\t' || b >= 0x20) && !v.contains(&0x7f),
            "control byte in header value"
        );
        let first = h.header(n).map(<[u8]>::to_vec);
        let expected = headers
            .iter()
            .find(|(m, _)| m.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone());
        assert_eq!(first, expected, "header() is not the first value");
        hosts += usize::from(n.eq_ignore_ascii_case("host"));
    }
    match h.version() {
        Version::Http11 => assert_eq!(hosts, 1, "HTTP/1.1 without exactly one Host"),
        Version::Http10 => {
            assert!(hosts <= 1, "several Hosts");
            assert_ne!(h.body_kind(), BodyKind::Chunked, "chunked HTTP/1.0 request");
            assert!(!h.expect_continue(), "100-continue for HTTP/1.0");
        }
        Version::Http2 | Version::Http3 => {
            panic!("the HTTP/1 parser produced an HTTP/2 or /3 head")
        }
    }
    if let BodyKind::Length(n) = h.body_kind() {
        assert!(n <= limits.max_body(), "declared body above max_body");
    }
    check_framing(h, &headers);
    HeadView {
        method: h.method(),
        method_str: method_str.to_owned(),
        target: target.to_owned(),
        path_and_query: pq.to_owned(),
        version: h.version(),
        headers,
        body_kind: h.body_kind(),
        keep_alive: h.keep_alive(),
        expect_continue: h.expect_continue(),
        raw,
    }
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
}

fn list_elems(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

/// An independent reading of RFC 9112 §6.1-§6.3 and §9.3 on an accepted head: the body framing,
/// keep-alive and 100-continue must follow from its header fields.
fn check_framing(h: &RequestHead, headers: &[(String, Vec<u8>)]) {
    let named = |name: &'static str| {
        headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    };
    let codings: Vec<&[u8]> = named("transfer-encoding").flat_map(list_elems).collect();
    let has_te = named("transfer-encoding").next().is_some();
    let lengths: Vec<&[u8]> = named("content-length").collect();
    if has_te {
        assert!(
            lengths.is_empty(),
            "accepted Transfer-Encoding with Content-Length"
        );
        assert_eq!(
            h.version(),
            Version::Http11,
            "accepted Transfer-Encoding in HTTP/1.0"
        );
        assert!(
            !codings.is_empty() && codings.iter().all(|c| c.eq_ignore_ascii_case(b"chunked")),
            "accepted codings other than chunked"
        );
        assert_eq!(codings.len(), 1, "accepted chunked applied twice");
        assert_eq!(
            h.body_kind(),
            BodyKind::Chunked,
            "Transfer-Encoding but not chunked"
        );
    } else if !lengths.is_empty() {
        let values: Vec<u64> = lengths
            .iter()
            .map(|v| {
                assert!(
                    !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit),
                    "accepted an invalid Content-Length {:?}",
                    String::from_utf8_lossy(v)
                );
                v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
            })
            .collect();
        // Repeated fields are accepted when they carry the same decimal value (RFC 9110 §8.6),
        // so `02` and `2` agree.
        assert!(
            values.iter().all(|&v| v == values[0]),
            "accepted conflicting Content-Length"
        );
        assert_eq!(
            h.body_kind(),
            BodyKind::Length(values[0]),
            "wrong Content-Length"
        );
    } else {
        assert_eq!(
            h.body_kind(),
            BodyKind::Length(0),
            "body without framing headers"
        );
    }
    let tokens: Vec<&[u8]> = named("connection").flat_map(list_elems).collect();
    let close = tokens.iter().any(|t| t.eq_ignore_ascii_case(b"close"));
    let ka = tokens.iter().any(|t| t.eq_ignore_ascii_case(b"keep-alive"));
    let keep_alive = match h.version() {
        Version::Http11 => !close,
        Version::Http10 => ka && !close,
        Version::Http2 | Version::Http3 => unreachable!("checked above"),
    };
    assert_eq!(
        h.keep_alive(),
        keep_alive,
        "keep_alive does not follow Connection"
    );
    for v in named("expect") {
        assert!(
            trim_ows(v).eq_ignore_ascii_case(b"100-continue"),
            "accepted an unsupported expectation"
        );
    }
    let expect = named("expect").next().is_some() && h.version() == Version::Http11;
    assert_eq!(h.expect_continue(), expect, "expect_continue");
}

/// Outcome of `poll_request` on some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadOutcome {
    /// `Ok(None)` with everything fed.
    NeedMore,
    /// Rejected.
    Err(Error),
    /// Parsed.
    Head(HeadView),
}

/// Classifies one `poll_request` result after checking what it did to the buffer; `fed` is
/// everything appended to `buf` so far.
fn head_outcome(
    r: Result<Option<RequestHead>, Error>,
    conn: &Conn,
    buf: &BytesMut,
    fed: &[u8],
    limits: &Limits,
) -> HeadOutcome {
    match r {
        Ok(None) => {
            assert_eq!(&buf[..], fed, "Ok(None) consumed bytes");
            assert!(
                buf.len() < limits.max_head(),
                "Ok(None) with max_head bytes buffered: unbounded growth"
            );
            HeadOutcome::NeedMore
        }
        Err(e) => {
            assert!(!conn.keep_alive(), "keep_alive after an error");
            assert_eq!(&buf[..], fed, "an error consumed bytes");
            HeadOutcome::Err(e)
        }
        Ok(Some(h)) => {
            let view = check_head(&h, limits);
            assert!(view.raw.len() <= fed.len(), "consumed more than given");
            assert_eq!(
                &fed[..view.raw.len()],
                &view.raw[..],
                "raw() is not the input"
            );
            assert_eq!(
                &buf[..],
                &fed[view.raw.len()..],
                "remaining buffer is wrong"
            );
            assert_eq!(conn.keep_alive(), view.keep_alive);
            HeadOutcome::Head(view)
        }
    }
}

/// `parse_head` target: `poll_request` on the whole payload and split at fuzzer-chosen points
/// must agree.
pub fn parse_head(data: &[u8]) {
    let mut inp = Input::new(data);
    let limits = limits(&mut inp);
    let mode = inp.u8();
    let seed = inp.u32();
    let payload = inp.rest();
    let t = Instant::now();

    let mut conn = Conn::new(limits, Timeouts::default(), t);
    let mut buf = BytesMut::from(payload);
    let r = conn.poll_request(&mut buf, t);
    let whole = head_outcome(r, &conn, &buf, payload, &limits);

    let mut conn = Conn::new(limits, Timeouts::default(), t);
    let mut buf = BytesMut::new();
    let mut split = HeadOutcome::NeedMore;
    let mut fed = 0;
    for end in cuts(mode, seed, payload.len())
        .into_iter()
        .chain([payload.len()])
    {
        buf.extend_from_slice(&payload[fed..end]);
        fed = end;
        let r = conn.poll_request(&mut buf, t);
        split = head_outcome(r, &conn, &buf, &payload[..fed], &limits);
        if split != HeadOutcome::NeedMore {
            break;
        }
    }
    assert_eq!(whole, split, "whole and split parses differ");
}

/// Outcome of decoding a chunked body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkOutcome {
    data: Vec<u8>,
    /// `Ok(true)`: End, `Ok(false)`: NeedMore with everything fed.
    end: Result<bool, Error>,
    /// Bytes consumed when the body ended.
    consumed: Option<usize>,
}

/// Runs `dec` on `buf` until it needs more, ends or fails, appending data to `out`.
fn decode_all(
    dec: &mut BodyDecoder,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<bool, Error> {
    loop {
        let before = buf.len();
        match dec.decode(buf)? {
            BodyEvent::Data(d) => {
                assert!(!d.is_empty(), "empty Data event");
                assert!(before - buf.len() >= d.len(), "Data longer than consumed");
                out.extend_from_slice(&d);
                assert!(out.len() as u64 <= limits.max_body(), "body above max_body");
                assert_eq!(dec.received(), out.len() as u64, "received() is wrong");
            }
            BodyEvent::NeedMore => {
                // Framing is consumed as it is read: nothing is retained between reads.
                assert!(buf.is_empty(), "NeedMore with {} bytes buffered", buf.len());
                assert!(!dec.is_done());
                return Ok(false);
            }
            BodyEvent::End => {
                assert!(dec.is_done(), "End but not done");
                let again = dec.decode(buf);
                assert_eq!(again, Ok(BodyEvent::End), "End is not sticky");
                return Ok(true);
            }
        }
    }
}

fn chunk_outcome(
    dec: &mut BodyDecoder,
    buf: &mut BytesMut,
    data: &mut Vec<u8>,
    limits: &Limits,
) -> Result<bool, Error> {
    let r = decode_all(dec, buf, data, limits);
    if r.is_err() {
        assert!(!dec.is_done(), "done after an error");
    }
    r
}

/// `chunked` target: a chunked body decoded whole and split at fuzzer-chosen points gives the
/// same data, the same end or error, and consumes the same bytes.
pub fn chunked(data: &[u8]) {
    let mut inp = Input::new(data);
    let limits = limits(&mut inp);
    let mode = inp.u8();
    let seed = inp.u32();
    let payload = inp.rest();

    let mut dec = BodyDecoder::chunked(&limits);
    let mut buf = BytesMut::from(payload);
    let mut got = Vec::new();
    let end = chunk_outcome(&mut dec, &mut buf, &mut got, &limits);
    let whole = ChunkOutcome {
        consumed: matches!(end, Ok(true)).then(|| payload.len() - buf.len()),
        data: got,
        end,
    };

    let mut dec = BodyDecoder::chunked(&limits);
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    let mut fed = 0;
    let mut end = Ok(false);
    for cut in cuts(mode, seed, payload.len())
        .into_iter()
        .chain([payload.len()])
    {
        buf.extend_from_slice(&payload[fed..cut]);
        fed = cut;
        end = chunk_outcome(&mut dec, &mut buf, &mut got, &limits);
        if end != Ok(false) {
            break;
        }
    }
    let split = ChunkOutcome {
        consumed: matches!(end, Ok(true)).then(|| fed - buf.len()),
        data: got,
        end,
    };
    assert_eq!(whole, split, "whole and split decodes differ");
}

// ---- conn_machine -------------------------------------------------------------------------

const STATUSES: [u16; 12] = [200, 201, 204, 304, 404, 400, 500, 418, 503, 299, 999, 202];
const DATE: &[u8] = b"Sun, 22 Nov 2026 12:00:00 GMT";
const SERVER: &[u8] = b"canter";

/// What the output stream must contain, in order.
#[derive(Debug)]
enum Expect {
    /// `HTTP/1.1 100 Continue`.
    Interim,
    Response(Resp),
}

#[derive(Debug)]
struct Resp {
    /// The request's sequence number (`x-seq`); `None` for error responses.
    seq: Option<u64>,
    status: u16,
    /// The request was HEAD: no body whatever the headers say.
    head: bool,
    /// The request was HTTP/1.0 (no chunked response; keep-alive must be explicit).
    http10: bool,
    body: Vec<u8>,
    /// The connection was closed before the response was complete.
    truncated: bool,
}

#[derive(Debug)]
enum Phase {
    /// Between requests: the driver calls `poll_request`.
    WaitHead,
    /// A request is with the handler.
    Handling(Exchange),
}

#[derive(Debug)]
struct Exchange {
    seq: u64,
    head: bool,
    http10: bool,
    body_kind: BodyKind,
    body_received: u64,
    /// `Some(with_body, remaining declared length)` once the response has started.
    started: Option<(bool, Option<u64>)>,
}

struct Machine<'a> {
    conn: Conn,
    limits: Limits,
    timeouts: Timeouts,
    t0: Instant,
    now: Instant,
    rbuf: BytesMut,
    out: BytesMut,
    sent: Vec<u8>,
    wire: Input<'a>,
    phase: Phase,
    /// The connection is closed for reading (error, close, abort): nothing more is fed.
    closed: bool,
    /// An `Err` was returned (by a poll, `data_prefix` or `finish`).
    failed: bool,
    /// The last poll asked for more bytes.
    wants_more: bool,
    next_seq: u64,
    expected: Vec<Expect>,
}

impl Machine<'_> {
    fn reading(&self) -> bool {
        !self.closed
            && match &self.phase {
                Phase::WaitHead => true,
                Phase::Handling(_) => !self.conn.body_done(),
            }
    }

    /// Appends up to `n` bytes from the wire, as a read of at most `n` bytes would. The driver
    /// only reads when the engine asked for more (or holds nothing), so the read buffer stays
    /// bounded by `max_head` plus one read.
    fn append(&mut self, n: usize) -> bool {
        if !self.reading() || !(self.wants_more || self.rbuf.is_empty()) || self.wire.is_empty() {
            return false;
        }
        let bytes = self.wire.take(n.max(1));
        self.rbuf.extend_from_slice(bytes);
        self.wants_more = false;
        assert!(
            self.rbuf.len() <= self.limits.max_head() + bytes.len(),
            "read buffer grew to {} (max_head {}, read {})",
            self.rbuf.len(),
            self.limits.max_head(),
            bytes.len()
        );
        true
    }

    fn fail(&mut self, e: &Error) {
        assert!(!self.conn.keep_alive(), "keep_alive after {e:?}");
        self.closed = true;
        self.failed = true;
    }

    fn poll_request(&mut self) {
        if self.closed || !matches!(self.phase, Phase::WaitHead) || self.out.len() > HIGH_WATER {
            return;
        }
        let before = self.rbuf.len();
        match self.conn.poll_request(&mut self.rbuf, self.now) {
            Ok(Some(h)) => {
                let view = check_head(&h, &self.limits);
                assert_eq!(before - self.rbuf.len(), view.raw.len(), "consumed != raw");
                let seq = self.next_seq;
                self.next_seq += 1;
                if h.body_kind() == BodyKind::Length(0) {
                    assert!(self.conn.body_done());
                } else {
                    assert!(!self.conn.body_done());
                }
                self.phase = Phase::Handling(Exchange {
                    seq,
                    head: h.method() == Method::Head,
                    http10: h.version() == Version::Http10,
                    body_kind: h.body_kind(),
                    body_received: 0,
                    started: None,
                });
                self.wants_more = false;
            }
            Ok(None) => {
                assert_eq!(before, self.rbuf.len(), "Ok(None) consumed bytes");
                assert!(
                    self.rbuf.is_empty() || self.rbuf.len() < self.limits.max_head(),
                    "Ok(None) holding max_head bytes"
                );
                self.wants_more = true;
            }
            Err(e) => {
                self.fail(&e);
                self.error_response(&e, false, false);
            }
        }
    }

    fn error_response(&mut self, e: &Error, head: bool, http10: bool) {
        self.conn.error_response(e, DATE, SERVER, &mut self.out);
        // A HEAD request's error response keeps its Content-Length but has no body.
        let mut body = Vec::new();
        if !head {
            body.extend_from_slice(reason(e.status()).as_bytes());
            body.push(b'\n');
        }
        self.expected.push(Expect::Response(Resp {
            seq: None,
            status: e.status(),
            head,
            http10,
            body,
            truncated: false,
        }));
    }

    fn truncate_last(&mut self) {
        if let Some(Expect::Response(r)) = self.expected.last_mut() {
            r.truncated = true;
        }
    }

    fn poll_body(&mut self) {
        let Phase::Handling(ex) = &mut self.phase else {
            return;
        };
        if self.closed || self.conn.body_done() {
            return;
        }
        if ex.started.is_none() {
            let before = self.out.len();
            self.conn.write_continue(&mut self.out);
            if self.out.len() > before {
                assert_eq!(&self.out[before..], b"HTTP/1.1 100 Continue\r\n\r\n");
                self.expected.push(Expect::Interim);
            }
        }
        let before = self.rbuf.len();
        match self.conn.poll_body(&mut self.rbuf, self.now) {
            Ok(BodyEvent::Data(d)) => {
                assert!(!d.is_empty(), "empty Data");
                let used = before - self.rbuf.len();
                match ex.body_kind {
                    BodyKind::Length(_) => assert_eq!(used, d.len(), "Data consumed extra bytes"),
                    BodyKind::Chunked => assert!(used >= d.len(), "Data longer than consumed"),
                }
                ex.body_received += d.len() as u64;
                assert!(
                    ex.body_received <= self.limits.max_body(),
                    "body above max_body"
                );
                if let BodyKind::Length(n) = ex.body_kind {
                    assert!(ex.body_received <= n, "body above Content-Length");
                    assert_eq!(self.conn.body_remaining(), Some(n - ex.body_received));
                    assert_eq!(self.conn.body_done(), ex.body_received == n);
                }
            }
            Ok(BodyEvent::NeedMore) => {
                assert!(self.rbuf.is_empty(), "NeedMore with bytes buffered");
                self.wants_more = true;
            }
            Ok(BodyEvent::End) => {
                assert!(self.conn.body_done(), "End but body not done");
                if let BodyKind::Length(n) = ex.body_kind {
                    assert_eq!(ex.body_received, n, "End before Content-Length");
                }
            }
            Err(e) => {
                let (head, http10, started) = (ex.head, ex.http10, ex.started.is_some());
                self.fail(&e);
                if started {
                    self.truncate_last();
                } else {
                    self.error_response(&e, head, http10);
                }
            }
        }
    }

    fn start_response(&mut self, status_sel: u8, len_sel: u8, bad_header: bool) {
        let Phase::Handling(ex) = &mut self.phase else {
            return;
        };
        if self.closed || ex.started.is_some() {
            return;
        }
        let status = STATUSES[usize::from(status_sel) % STATUSES.len()];
        let len = if len_sel & 1 == 1 {
            BodyLen::Unknown
        } else {
            BodyLen::Known(u64::from(len_sel >> 1) * 8)
        };
        let seq = ex.seq.to_string();
        let mut headers: Vec<(&[u8], &[u8])> = vec![(b"x-seq", seq.as_bytes())];
        if bad_header {
            // Must be dropped by the last line of defence against response splitting.
            headers.push((b"x-evil", b"a\r\nx-seq: 999"));
            headers.push((b"bad name", b"v"));
            headers.push((b"", b"v"));
        }
        let with_body = self
            .conn
            .start_response(status, headers, len, DATE, SERVER, &mut self.out);
        assert_eq!(
            with_body,
            !(ex.head || status == 204 || status == 304),
            "start_response body decision"
        );
        let remaining = match len {
            BodyLen::Known(n) => Some(n),
            BodyLen::Unknown => None,
        };
        ex.started = Some((with_body, remaining));
        self.expected.push(Expect::Response(Resp {
            seq: Some(ex.seq),
            status,
            head: ex.head,
            http10: ex.http10,
            body: Vec::new(),
            truncated: false,
        }));
    }

    fn data(&mut self, n: usize, overflow: bool) {
        let Phase::Handling(ex) = &mut self.phase else {
            return;
        };
        let Some((with_body, remaining)) = &mut ex.started else {
            return;
        };
        if self.closed {
            return;
        }
        let n = match remaining {
            Some(r) if !overflow => n.min(usize::try_from(*r).unwrap_or(usize::MAX)),
            _ => n.min(4096),
        };
        match self.conn.data_prefix(n, &mut self.out) {
            Ok(true) => {
                assert!(*with_body, "data_prefix allows a suppressed body");
                if let Some(r) = remaining {
                    *r -= n as u64;
                }
                let fill = b'a' + (ex.seq % 26) as u8;
                let start = self.out.len();
                self.out.resize(start + n, fill);
                self.conn.data_suffix(n, &mut self.out);
                if let Some(Expect::Response(r)) = self.expected.last_mut() {
                    r.body.resize(r.body.len() + n, fill);
                }
            }
            Ok(false) => assert!(!*with_body, "data_prefix suppresses a body"),
            Err(_) => {
                assert!(
                    remaining.is_some_and(|r| n as u64 > r),
                    "LengthMismatch within the declared length"
                );
                assert!(!self.conn.keep_alive(), "keep_alive after LengthMismatch");
                self.closed = true;
                self.failed = true;
                self.truncate_last();
            }
        }
    }

    fn finish(&mut self) {
        let Phase::Handling(ex) = &self.phase else {
            return;
        };
        let Some((with_body, remaining)) = ex.started else {
            return;
        };
        if self.closed {
            return;
        }
        let body_done = self.conn.body_done();
        match self.conn.finish(&mut self.out, self.now) {
            Ok(Next::KeepAlive) => {
                assert!(body_done, "keep-alive with an unread body");
                assert!(self.conn.keep_alive());
                assert!(!(with_body && remaining.is_some_and(|r| r > 0)));
                self.phase = Phase::WaitHead;
                self.wants_more = false;
            }
            Ok(Next::Close) => {
                assert!(!self.conn.keep_alive(), "Close but keep_alive");
                self.closed = true;
            }
            Err(_) => {
                assert!(
                    with_body && remaining.is_some_and(|r| r > 0),
                    "LengthMismatch on a complete body"
                );
                assert!(!self.conn.keep_alive(), "keep_alive after LengthMismatch");
                self.closed = true;
                self.failed = true;
                self.truncate_last();
            }
        }
    }

    fn drain(&mut self, k: usize) {
        let k = k.min(self.out.len());
        self.sent.extend_from_slice(&self.out.split_to(k));
    }

    /// Time passes; the driver enforces the deadline as the runtime does.
    fn advance(&mut self, d: Duration) {
        self.now = self.now.checked_add(d).unwrap_or(self.now);
        self.check_deadline();
        if self.closed || !matches!(self.phase, Phase::WaitHead) {
            return;
        }
        if self.conn.deadline().is_some_and(|at| at <= self.now) {
            if !self.conn.is_idle() || !self.rbuf.is_empty() {
                self.conn.reject(408, DATE, SERVER, &mut self.out);
                self.expected.push(Expect::Response(Resp {
                    seq: None,
                    status: 408,
                    head: false,
                    http10: false,
                    body: b"Request Timeout\n".to_vec(),
                    truncated: false,
                }));
                assert!(!self.conn.keep_alive());
            }
            self.closed = true;
        }
    }

    fn check_deadline(&self) {
        let _ = self.conn.is_idle();
        let _ = self.conn.body_remaining();
        let t = &self.timeouts;
        if let Some(at) = self.conn.deadline() {
            let lo = t.idle().min(t.head()).min(t.body());
            let hi = t.idle().max(t.head()).max(t.body());
            assert!(at >= self.t0 + lo, "deadline before the connection started");
            assert!(
                at <= self.now + hi,
                "deadline further than the longest timeout"
            );
        }
    }

    fn abort(&mut self) {
        if let Phase::Handling(Exchange {
            started: Some(_), ..
        }) = self.phase
        {
            if !self.closed {
                self.closed = true;
                self.truncate_last();
            }
        }
    }

    /// One fuzzer-chosen operation.
    fn op(&mut self, ops: &mut Input<'_>) {
        match ops.u8() % 10 {
            0 => {
                let b = ops.u8();
                let n = if b < 200 {
                    usize::from(b) + 1
                } else {
                    usize::from(b - 199) * 256
                };
                self.append(n);
            }
            1 => self.poll_request(),
            2 => self.poll_body(),
            3 => {
                let (s, l, bad) = (ops.u8(), ops.u8(), ops.u8());
                self.start_response(s, l, bad == 0xff);
            }
            4 => {
                let b = ops.u8();
                self.data(usize::from(b & 0x7f) * 16, b & 0x80 != 0 && b & 1 != 0);
            }
            5 => self.finish(),
            6 => {
                let b = ops.u8();
                self.drain(usize::from(b) * 64 + 1);
            }
            7 => {
                let (unit, n) = (ops.u8(), ops.u16());
                let d = match unit % 3 {
                    0 => Duration::from_millis(u64::from(n)),
                    1 => Duration::from_secs(u64::from(n)),
                    _ => Duration::from_secs(u64::from(n) * 3600),
                };
                self.advance(d);
            }
            8 => self.abort(),
            _ => {
                if let Phase::Handling(_) = self.phase {
                    self.conn.set_close();
                }
            }
        }
        self.check_deadline();
    }

    /// After the program: serve everything still on the wire like a simple runtime, each
    /// response a small fixed-length body.
    fn auto(&mut self, read: usize) {
        for _ in 0..100_000 {
            if self.closed {
                return;
            }
            let (seq, started) = match &self.phase {
                Phase::WaitHead => {
                    if self.out.len() > HIGH_WATER {
                        self.drain(usize::MAX);
                    }
                    self.poll_request();
                    if self.wants_more && !self.append(read) {
                        return;
                    }
                    continue;
                }
                Phase::Handling(ex) => (ex.seq, ex.started.is_some()),
            };
            if !self.conn.body_done() {
                self.poll_body();
                if self.wants_more && !self.closed && !self.append(read) {
                    // The client stopped sending mid-body: answer and close.
                    if !started {
                        self.conn.set_close();
                        self.start_response(0, 0, false);
                    }
                    self.finish();
                    return;
                }
            } else if !started {
                self.start_response((seq % 3) as u8, 6 + (seq % 2) as u8, false);
            } else {
                self.data(usize::MAX, false);
                self.finish();
            }
        }
    }
}

/// `conn_machine` target: the connection state machine driven like the runtime drives it, the
/// fuzzer choosing reads, polls, response pieces, output drains and the passing of time.
pub fn conn_machine(data: &[u8]) {
    let mut inp = Input::new(data);
    let limits = limits(&mut inp);
    let timeouts = Timeouts::builder()
        .idle(Duration::from_secs(u64::from(inp.u8()).max(1)))
        .head(Duration::from_secs(u64::from(inp.u8()).max(1)))
        .body(Duration::from_secs(u64::from(inp.u8()).max(1)))
        .write(Duration::from_secs(30))
        .build()
        .expect("valid timeouts");
    let read = match inp.u8() {
        0 => 4096,
        n => usize::from(n),
    };
    let ops_len = usize::from(inp.u16());
    let mut ops = Input::new(inp.take(ops_len));
    let t0 = Instant::now();
    let mut m = Machine {
        conn: Conn::new(limits, timeouts, t0),
        limits,
        timeouts,
        t0,
        now: t0,
        rbuf: BytesMut::new(),
        out: BytesMut::new(),
        sent: Vec::new(),
        wire: Input::new(inp.rest()),
        phase: Phase::WaitHead,
        closed: false,
        failed: false,
        wants_more: true,
        next_seq: 0,
        expected: Vec::new(),
    };
    m.check_deadline();
    while !ops.is_empty() {
        m.op(&mut ops);
    }
    m.auto(read);
    if m.failed {
        assert!(!m.conn.keep_alive(), "keep_alive after an error");
    }
    m.drain(usize::MAX);
    check_output(&m.sent, &m.expected);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses the output stream as a client would and checks it against what the harness sent:
/// the responses in order (`x-seq`), their status, framing and body, nothing after a
/// `Connection: close`, nothing left over.
fn check_output(stream: &[u8], expected: &[Expect]) {
    let mut pos = 0;
    let mut last_seq = None;
    for (i, e) in expected.iter().enumerate() {
        let last = i + 1 == expected.len();
        let r = match e {
            Expect::Interim => {
                let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
                assert!(stream[pos..].starts_with(interim), "missing 100 Continue");
                pos += interim.len();
                continue;
            }
            Expect::Response(r) => r,
        };
        let rest = &stream[pos..];
        let Some(end) = find(rest, b"\r\n\r\n") else {
            panic!("response {i} has no complete head");
        };
        // The head with the CRLF of its last line: every line ends with CRLF.
        let head = &rest[..end + 2];
        pos += end + 4;
        let mut lines = head[..head.len() - 1].split(|&b| b == b'\n').map(|l| {
            let l = l
                .strip_suffix(b"\r")
                .unwrap_or_else(|| panic!("line without CR"));
            assert!(!l.contains(&b'\r'), "bare CR in response head");
            l
        });
        let status_line = lines.next().unwrap_or_default();
        let expected_line = format!("HTTP/1.1 {} {}", r.status, reason(r.status));
        assert_eq!(
            String::from_utf8_lossy(status_line),
            expected_line,
            "status line"
        );
        let (mut cl, mut chunked, mut close, mut keep_alive, mut seq) =
            (None, false, false, false, None);
        let mut te_count = 0;
        for line in lines {
            let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
            let (name, value) = (&line[..colon], line.get(colon + 2..).unwrap_or_default());
            assert!(
                !name.is_empty() && name.iter().all(|&b| is_tchar(b)),
                "invalid response header name {:?}",
                String::from_utf8_lossy(name)
            );
            assert_eq!(line.get(colon..colon + 2), Some(&b": "[..]));
            let value = std::str::from_utf8(value).unwrap_or("<non-utf8>");
            match name.to_ascii_lowercase().as_slice() {
                b"content-length" => {
                    assert!(cl.is_none(), "two Content-Length");
                    cl = Some(value.parse::<usize>().unwrap_or(usize::MAX));
                }
                b"transfer-encoding" => {
                    te_count += 1;
                    assert_eq!(value, "chunked");
                    chunked = true;
                }
                b"connection" => {
                    close |= value == "close";
                    keep_alive |= value == "keep-alive";
                }
                b"x-seq" => {
                    assert!(seq.is_none(), "two x-seq");
                    seq = Some(value.parse::<u64>().unwrap_or(u64::MAX));
                }
                _ => {}
            }
        }
        assert!(te_count <= 1);
        assert!(
            !(chunked && cl.is_some()),
            "both Content-Length and chunked"
        );
        assert_eq!(seq, r.seq, "response out of order");
        if let Some(s) = seq {
            assert!(last_seq < Some(s), "x-seq not increasing");
            last_seq = Some(s);
        }
        if r.http10 {
            assert!(!chunked, "chunked response to HTTP/1.0");
            assert!(
                last || close || keep_alive,
                "HTTP/1.0 reuse without keep-alive"
            );
        }
        if close {
            assert!(last, "response after Connection: close");
        }
        let body_allowed = !(r.head || r.status == 204 || r.status == 304);
        let body: Vec<u8> = if !body_allowed {
            Vec::new()
        } else if let Some(n) = cl {
            let rest = &stream[pos..];
            if rest.len() < n || n != r.body.len() {
                assert!(last && r.truncated, "short fixed-length body");
            }
            let take = n.min(rest.len());
            pos += take;
            rest[..take].to_vec()
        } else if chunked {
            let mut body = Vec::new();
            loop {
                let rest = &stream[pos..];
                let Some(eol) = find(rest, b"\r\n") else {
                    assert!(last && r.truncated, "truncated chunk size line");
                    pos = stream.len();
                    break;
                };
                let size = std::str::from_utf8(&rest[..eol])
                    .ok()
                    .and_then(|s| usize::from_str_radix(s, 16).ok());
                let Some(size) = size else {
                    panic!(
                        "bad chunk size line {:?}",
                        String::from_utf8_lossy(&rest[..eol])
                    );
                };
                pos += eol + 2;
                if size == 0 {
                    let end = stream.get(pos..pos + 2);
                    if end != Some(&b"\r\n"[..]) {
                        assert!(last && r.truncated, "missing final CRLF");
                    }
                    pos = (pos + 2).min(stream.len());
                    break;
                }
                let rest = &stream[pos..];
                if rest.len() < size + 2 {
                    assert!(last && r.truncated, "truncated chunk");
                    body.extend_from_slice(&rest[..size.min(rest.len())]);
                    pos = stream.len();
                    break;
                }
                body.extend_from_slice(&rest[..size]);
                assert_eq!(&rest[size..size + 2], b"\r\n", "chunk without CRLF");
                pos += size + 2;
            }
            body
        } else {
            assert!(last, "close-delimited response is not the last");
            assert!(close, "close-delimited response without Connection: close");
            let body = stream[pos..].to_vec();
            pos = stream.len();
            body
        };
        if r.truncated {
            assert!(
                r.body.starts_with(&body),
                "body differs from what was written"
            );
        } else {
            assert_eq!(body, r.body, "body differs from what was written");
        }
    }
    assert_eq!(
        pos,
        stream.len(),
        "unexpected bytes after the last response: {:?}",
        String::from_utf8_lossy(&stream[pos..])
    );
}
