//! Property-style tests with a deterministic PRNG: random valid request streams parse the same
//! whichever way they are split, and random garbage never panics or over-consumes.

mod common;

use std::time::Instant;

use bytes::BytesMut;
use canter_h1::{BodyEvent, BodyLen, Conn, Next};
use canter_http::{Limits, Timeouts};
use common::{summary, Rng, Summary};

/// Events observed while serving a byte stream to completion.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Head(Summary),
    Body(Vec<u8>),
    Error(u16),
    /// Input exhausted while waiting for more.
    Starved,
    Closed,
}

/// Serves every request in `input`, fed in pieces ending at `cuts`; every exchange answers 200
/// with a small body. Body data is coalesced per request so that splits do not matter.
fn serve(input: &[u8], cuts: &[usize]) -> Vec<Event> {
    let t = Instant::now();
    let mut conn = Conn::new(Limits::default(), Timeouts::default(), t);
    let mut ends = cuts.iter().copied().chain([input.len()]);
    let mut fed = 0;
    let mut buf = BytesMut::new();
    let mut feed = |buf: &mut BytesMut| match ends.next() {
        Some(end) => {
            buf.extend_from_slice(&input[fed..end]);
            fed = end;
            true
        }
        None => false,
    };
    let mut events = Vec::new();
    let mut out = BytesMut::new();
    feed(&mut buf);
    loop {
        let head = match conn.poll_request(&mut buf, t) {
            Ok(Some(h)) => h,
            Ok(None) => {
                if feed(&mut buf) {
                    continue;
                }
                if !buf.is_empty() {
                    events.push(Event::Starved);
                }
                return events;
            }
            Err(e) => {
                events.push(Event::Error(e.status()));
                return events;
            }
        };
        events.push(Event::Head(summary(&head)));
        let mut body = Vec::new();
        loop {
            match conn.poll_body(&mut buf, t) {
                Ok(BodyEvent::Data(d)) => body.extend_from_slice(&d),
                Ok(BodyEvent::End) => break,
                Ok(BodyEvent::NeedMore) => {
                    if !feed(&mut buf) {
                        events.push(Event::Body(body));
                        events.push(Event::Starved);
                        return events;
                    }
                }
                Err(e) => {
                    events.push(Event::Body(body));
                    events.push(Event::Error(e.status()));
                    return events;
                }
            }
        }
        events.push(Event::Body(body));
        conn.write_continue(&mut out);
        conn.start_response(200, [], BodyLen::Unknown, b"D", b"S", &mut out);
        conn.data_prefix(2, &mut out).expect("chunked");
        out.extend_from_slice(b"ok");
        conn.data_suffix(2, &mut out);
        match conn.finish(&mut out, t) {
            Ok(Next::KeepAlive) => {}
            other => {
                assert_eq!(other, Ok(Next::Close));
                events.push(Event::Closed);
                return events;
            }
        }
    }
}

const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "X-CUSTOM",
];
const SEGMENTS: &[&str] = &["a", "b%20c", "index.html", "~user", "x-y_z", "1", ""];
const NAMES: &[&str] = &[
    "Accept",
    "User-Agent",
    "X-Custom-Header",
    "cookie",
    "A",
    "x-a.b",
];
const VALUES: &[&str] = &[
    "*/*",
    "text/html, */*;q=0.8",
    "a  b",
    "",
    "v=1; w=2",
    "\"quoted\"",
];

fn random_target(rng: &mut Rng) -> String {
    let mut t = String::new();
    let absolute = rng.chance(10);
    if absolute {
        t.push_str(rng.pick::<&str>(&["http://example.com", "HTTP://h:8080", "https://[::1]"]));
    }
    // Absolute-form may have an empty path ("http://h" means "/").
    if !absolute || rng.chance(70) {
        for _ in 0..=rng.below(4) {
            t.push('/');
            t.push_str(rng.pick::<&str>(SEGMENTS));
        }
    }
    if rng.chance(30) {
        t.push_str(rng.pick::<&str>(&["?", "?a=1", "?a=1&b=%2F", "?q"]));
    }
    t
}

fn random_chunked(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = 1 + rng.below(rest.len());
        let size = if rng.chance(50) {
            format!("{n:x}")
        } else {
            format!("{n:X}")
        };
        out.extend_from_slice(size.as_bytes());
        if rng.chance(20) {
            out.extend_from_slice(rng.pick::<&[u8]>(&[&b";a=b"[..], b" ; x", b";q=\"v v\""]));
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n");
    if rng.chance(20) {
        out.extend_from_slice(b"X-Trailer: t\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// One random, valid request (head and body).
fn random_request(rng: &mut Rng) -> Vec<u8> {
    let mut r = Vec::new();
    if rng.chance(5) {
        r.extend_from_slice(b"\r\n");
    }
    let method = *rng.pick(METHODS);
    let http10 = rng.chance(15);
    r.extend_from_slice(
        format!(
            "{method} {} HTTP/1.{}\r\n",
            random_target(rng),
            if http10 { 0 } else { 1 }
        )
        .as_bytes(),
    );
    let mut fields: Vec<String> = Vec::new();
    if !http10 || rng.chance(50) {
        fields.push("Host: example.com".into());
    }
    for _ in 0..rng.below(6) {
        fields.push(format!("{}: {}", rng.pick(NAMES), rng.pick(VALUES)));
    }
    if http10 && rng.chance(50) {
        fields.push("Connection: keep-alive".into());
    }
    let data: Vec<u8> = (0..rng.below(40)).map(|_| rng.below(256) as u8).collect();
    let chunked = !http10 && rng.chance(40);
    let with_body = method != "GET" && method != "HEAD" && (chunked || rng.chance(70));
    if with_body && chunked {
        fields.push("Transfer-Encoding: chunked".into());
    } else if with_body {
        fields.push(format!("Content-Length: {}", data.len()));
    }
    if with_body && !http10 && rng.chance(20) {
        fields.push("Expect: 100-continue".into());
    }
    // Shuffle the fields.
    for i in (1..fields.len()).rev() {
        fields.swap(i, rng.below(i + 1));
    }
    for f in &fields {
        r.extend_from_slice(f.as_bytes());
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    if with_body && chunked {
        r.extend_from_slice(&random_chunked(rng, &data));
    } else if with_body {
        r.extend_from_slice(&data);
    }
    r
}

#[test]
fn random_valid_streams_split_anywhere() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut heads = 0;
    for i in 0..2000 {
        let mut stream = Vec::new();
        for _ in 0..1 + rng.below(3) {
            stream.extend_from_slice(&random_request(&mut rng));
        }
        let whole = serve(&stream, &[]);
        assert!(
            !whole
                .iter()
                .any(|e| matches!(e, Event::Error(_) | Event::Starved)),
            "case {i}: valid stream rejected: {whole:?}\n{}",
            String::from_utf8_lossy(&stream)
        );
        heads += whole.iter().filter(|e| matches!(e, Event::Head(_))).count();
        for _ in 0..3 {
            let cuts = rng.cuts(stream.len());
            let split = serve(&stream, &cuts);
            assert_eq!(split, whole, "case {i}, cuts {cuts:?}");
        }
        if i % 50 == 0 {
            let bytewise: Vec<usize> = (1..stream.len()).collect();
            assert_eq!(serve(&stream, &bytewise), whole, "case {i} byte at a time");
        }
    }
    assert!(heads >= 2000, "{heads}");
}

/// Random bytes drawn mostly from the alphabet of HTTP heads.
fn garbage(rng: &mut Rng) -> Vec<u8> {
    const ALPHABET: &[u8] = b"GETPOSThtp/1.0 \r\n\r\n:;,-Hhost\t\0\x7f\xff?=%*";
    let len = rng.below(120);
    let mut v = Vec::with_capacity(len);
    // Half the cases start with a plausible request line, to reach the header parser.
    if rng.chance(50) {
        v.extend_from_slice(rng.pick::<&[u8]>(&[
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST /x HTTP/1.0\r\nHost: h\r\n",
            b"\r\nOPTIONS * HTTP/1.1\r\nHost: h\r\nContent-Length: ",
            b"GET http://h HTTP/1.1\r\nTransfer-Encoding: ",
        ]));
    }
    for _ in 0..len {
        v.push(if rng.chance(80) {
            *rng.pick(ALPHABET)
        } else {
            rng.below(256) as u8
        });
    }
    v
}

/// A valid request with a few random byte edits: reaches every part of the parser.
fn mutated(rng: &mut Rng) -> Vec<u8> {
    const ALPHABET: &[u8] = b" \r\n:;,\t\0\x7f\xff/?#@[]0123456789aAzZ";
    let mut v = random_request(rng);
    for _ in 0..rng.below(4) {
        if v.is_empty() {
            break;
        }
        let at = rng.below(v.len());
        match rng.below(4) {
            0 => v[at] = *rng.pick(ALPHABET),
            1 => v.insert(at, *rng.pick(ALPHABET)),
            2 => {
                v.remove(at);
            }
            _ => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                let dup = v[at..end].to_vec();
                v.splice(at..at, dup);
            }
        }
    }
    v
}

#[test]
fn random_garbage_never_panics_or_overconsumes() {
    let mut rng = Rng::new(0xdead_beef_cafe_f00d);
    let t = Instant::now();
    let limits = Limits::builder()
        .max_head(96)
        .max_target(32)
        .max_headers(4)
        .build()
        .expect("valid limits");
    let mut seen = [0usize; 3]; // heads, partial, errors
    for i in 0..5000 {
        let input = if i % 2 == 0 {
            garbage(&mut rng)
        } else {
            mutated(&mut rng)
        };
        for limits in [Limits::default(), limits] {
            let mut conn = Conn::new(limits, Timeouts::default(), t);
            let mut buf = BytesMut::from(&input[..]);
            match conn.poll_request(&mut buf, t) {
                Ok(Some(head)) => {
                    seen[0] += 1;
                    let used = input.len() - buf.len();
                    assert_eq!(head.raw().len(), used, "case {i}");
                    assert_eq!(&input[..used], &head.raw()[..], "case {i}");
                    assert!(head.raw().ends_with(b"\r\n\r\n"), "case {i}");
                    // Every accessor works on whatever was accepted.
                    let _ = summary(&head);
                    // And a body poll never panics either.
                    while let Ok(BodyEvent::Data(_)) = conn.poll_body(&mut buf, t) {}
                }
                Ok(None) => {
                    seen[1] += 1;
                    assert_eq!(buf.len(), input.len(), "case {i}");
                }
                Err(e) => {
                    seen[2] += 1;
                    assert!([400, 413, 414, 417, 431, 501, 505].contains(&e.status()));
                    assert_eq!(
                        buf.len(),
                        input.len(),
                        "case {i}: an error consumes nothing"
                    );
                }
            }
            // Byte at a time agrees on the status of the first error, if any.
            let whole = common::parse_whole(&input, limits);
            let bytewise = common::parse_bytewise(&input, limits);
            assert_eq!(
                whole,
                bytewise,
                "case {i}: {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
    eprintln!("garbage outcomes (heads, partial, errors): {seen:?}");
    assert!(seen.iter().all(|&n| n >= 50), "{seen:?}");
}

/// Random garbage as a chunked body: never panics, never consumes bytes it did not decode.
#[test]
fn random_chunked_garbage() {
    let mut rng = Rng::new(42);
    const ALPHABET: &[u8] = b"0123456789abcdefABCDEFxg;= \t\r\n\r\n\r\n:Xy\"\0";
    for i in 0..5000 {
        let len = rng.below(64);
        let input: Vec<u8> = (0..len)
            .map(|_| {
                if rng.chance(90) {
                    *rng.pick(ALPHABET)
                } else {
                    rng.below(256) as u8
                }
            })
            .collect();
        let limits = Limits::builder()
            .max_chunk_ext(8)
            .max_trailers(16)
            .max_body(64)
            .build()
            .expect("valid limits");
        let dec = || canter_h1::BodyDecoder::chunked(&limits);
        let whole = common::decode_whole(dec(), &input);
        let bytewise = common::decode_bytewise(dec(), &input);
        match (&whole, &bytewise) {
            (common::Decoded::Err(a), common::Decoded::Err(b)) => {
                assert_eq!(a.status(), b.status(), "case {i}: {input:?}")
            }
            _ => assert_eq!(whole, bytewise, "case {i}: {input:?}"),
        }
    }
}
