//! Body decoding (chunked and Content-Length): one table of cases, each decoded whole, one byte
//! at a time, split in two at every offset, followed by extra bytes (pipelining), and through a
//! `Conn` after a request head.

mod common;

use bytes::BytesMut;
use canter_h1::{BodyDecoder, BodyEvent, Conn};
use canter_http::{Limits, LimitsBuilder, Timeouts};
use common::{decode_bytewise, decode_split, decode_whole, now, Decoded, TAIL};

enum Want {
    /// The decoded body.
    Body(&'static [u8]),
    /// Rejected with this status.
    Status(u16),
    /// Still waiting for more after all bytes, with this much data so far.
    Incomplete(&'static [u8]),
}

struct Case {
    name: &'static str,
    input: Vec<u8>,
    want: Want,
    limits: Limits,
}

fn case(name: &'static str, input: impl AsRef<[u8]>, want: Want) -> Case {
    Case {
        name,
        input: input.as_ref().to_vec(),
        want,
        limits: Limits::default(),
    }
}

impl Case {
    fn limits(mut self, limits: Limits) -> Case {
        self.limits = limits;
        self
    }
}

fn limits(f: impl FnOnce(LimitsBuilder) -> LimitsBuilder) -> Limits {
    f(Limits::builder()).build().expect("valid limits")
}

fn chunked_cases() -> Vec<Case> {
    use Want::{Body, Incomplete, Status};
    vec![
        case("empty body", "0\r\n\r\n", Body(b"")),
        case("single chunk", "5\r\nhello\r\n0\r\n\r\n", Body(b"hello")),
        case(
            "multiple chunks",
            "5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n",
            Body(b"hello world"),
        ),
        case(
            "lowercase hex",
            format!("a\r\n{}\r\n0\r\n\r\n", "x".repeat(10)),
            Body(b"xxxxxxxxxx"),
        ),
        case(
            "uppercase hex",
            format!("1A\r\n{}\r\n0\r\n\r\n", "y".repeat(26)),
            Body(b"yyyyyyyyyyyyyyyyyyyyyyyyyy"),
        ),
        case(
            "leading zeros",
            "0005\r\nhello\r\n000\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "16 hex digits",
            "0000000000000005\r\nhello\r\n0\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "binary data with CRLF inside",
            b"4\r\n\r\n\0\xff\r\n0\r\n\r\n",
            Body(b"\r\n\0\xff"),
        ),
        case(
            "extension a=b",
            "5;a=b\r\nhello\r\n0\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "extension with BWS and quoted value",
            "5 ; a=\"q \\\" ;\"\r\nhello\r\n0;last\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "extension name only",
            "5;x\r\nhello\r\n0\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "several extensions",
            "5;a=1;b=2\r\nhello\r\n0\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "extension exactly max_chunk_ext",
            "5;abcdefg\r\nhello\r\n0\r\n\r\n",
            Body(b"hello"),
        )
        .limits(limits(|l| l.max_chunk_ext(8))),
        case(
            "extension over max_chunk_ext",
            "5;abcdefgh\r\nhello\r\n0\r\n\r\n",
            Status(400),
        )
        .limits(limits(|l| l.max_chunk_ext(8))),
        case(
            "extension over default max_chunk_ext",
            format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(1100)),
            Status(400),
        ),
        case(
            "trailer consumed",
            "5\r\nhello\r\n0\r\nX-Sum: abc\r\nOther:\r\n\r\n",
            Body(b"hello"),
        ),
        case(
            "trailer with obs-text and spaces",
            b"0\r\nX: a \xff b\r\n\r\n",
            Body(b""),
        ),
        case(
            "trailers exactly max_trailers",
            // "X: 12345\r\n" = 10 bytes, the final CRLF is not part of the trailer section.
            "0\r\nX: 12345\r\n\r\n",
            Body(b""),
        )
        .limits(limits(|l| l.max_trailers(10))),
        case("no trailers with max_trailers 0", "0\r\n\r\n", Body(b""))
            .limits(limits(|l| l.max_trailers(0))),
        case(
            "trailers over max_trailers",
            "0\r\nX: 123456\r\n\r\n",
            Status(431),
        )
        .limits(limits(|l| l.max_trailers(10))),
        case(
            "trailers over default max_trailers",
            format!("0\r\nX: {}\r\n\r\n", "t".repeat(9000)),
            Status(431),
        ),
        case("trailer without colon", "0\r\nXyz\r\n\r\n", Status(400)),
        case("trailer with empty name", "0\r\n: v\r\n\r\n", Status(400)),
        case(
            "trailer name with space",
            "0\r\nX Y: v\r\n\r\n",
            Status(400),
        ),
        case("trailer obs-fold", "0\r\nX: a\r\n b\r\n\r\n", Status(400)),
        case("trailer with NUL", "0\r\nX: a\0b\r\n\r\n", Status(400)),
        case("trailer with bare LF", "0\r\nX: a\n\r\n", Status(400)),
        case("trailer with bare CR", "0\r\nX: a\rb\r\n\r\n", Status(400)),
        case("final line bare LF", "0\r\n\n", Status(400)),
        case("final line CR then garbage", "0\r\n\rX", Status(400)),
        case(
            "17 hex digits",
            "00000000000000005\r\nhello\r\n0\r\n\r\n",
            Status(400),
        ),
        case("size overflowing u64", "fffffffffffffffff\r\n", Status(400)),
        case(
            "size at u64::MAX is over max_body",
            "ffffffffffffffff\r\n",
            Status(413),
        ),
        case("non-hex size", "g\r\nhello\r\n0\r\n\r\n", Status(400)),
        case("0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", Status(400)),
        case("negative size", "-5\r\nhello\r\n0\r\n\r\n", Status(400)),
        case("empty size", "\r\nhello\r\n0\r\n\r\n", Status(400)),
        case("leading space", " 5\r\nhello\r\n0\r\n\r\n", Status(400)),
        case(
            "extension without size",
            ";a\r\nhello\r\n0\r\n\r\n",
            Status(400),
        ),
        case("bare LF after size", "5\nhello\r\n0\r\n\r\n", Status(400)),
        case(
            "bare LF in extension",
            "5;a\nhello\r\n0\r\n\r\n",
            Status(400),
        ),
        case(
            "CR not followed by LF",
            "5\rhello\r\n0\r\n\r\n",
            Status(400),
        ),
        case(
            "NUL in extension",
            "5;a\0\r\nhello\r\n0\r\n\r\n",
            Status(400),
        ),
        case(
            "missing CRLF after data",
            "5\r\nhello0\r\n\r\n",
            Status(400),
        ),
        case(
            "data longer than size",
            "5\r\nhello!\r\n0\r\n\r\n",
            Status(400),
        ),
        case("bare LF after data", "5\r\nhello\n0\r\n\r\n", Status(400)),
        case(
            "CR then garbage after data",
            "5\r\nhello\rx0\r\n\r\n",
            Status(400),
        ),
        case("bare LF after last chunk", "0\n\r\n", Status(400)),
        case(
            "chunked body exactly max_body",
            "5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n",
            Body(b"helloworld"),
        )
        .limits(limits(|l| l.max_body(10))),
        case(
            "chunked body over max_body",
            "5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n",
            Status(413),
        )
        .limits(limits(|l| l.max_body(10))),
        case(
            "no terminating chunk",
            "5\r\nhello\r\n",
            Incomplete(b"hello"),
        ),
        case("truncated data", "5\r\nhel", Incomplete(b"hel")),
        case("truncated trailer", "0\r\nX: y\r\n", Incomplete(b"")),
    ]
}

/// Decoded once whole; byte by byte, with a tail and split at every offset it must agree.
fn check(case: &Case) {
    let dec = || BodyDecoder::chunked(&case.limits);
    let whole = decode_whole(dec(), &case.input);
    match (&case.want, &whole) {
        (Want::Body(b), Decoded::End(data, rest)) => {
            assert_eq!(data, b);
            assert!(rest.is_empty());
        }
        (Want::Status(s), d) => assert_eq!(d.status(), Some(*s), "got {d:?}"),
        (Want::Incomplete(b), Decoded::Incomplete(data)) => assert_eq!(data, b),
        (_, d) => panic!("unexpected {d:?}"),
    }
    assert_eq!(decode_bytewise(dec(), &case.input), whole, "byte at a time");
    let errs = |d: &Decoded| d.status();
    for cut in 1..case.input.len() {
        let split = decode_split(dec(), &case.input, &[cut]);
        match &whole {
            // Errors may be noticed in the other piece, but must be the same status.
            Decoded::Err(_) => assert_eq!(errs(&split), errs(&whole), "split at {cut}"),
            _ => assert_eq!(split, whole, "split at {cut}"),
        }
    }
    // Pipelining: what follows the body stays in the buffer.
    let mut with_tail = case.input.clone();
    with_tail.extend_from_slice(TAIL);
    let tailed = decode_whole(dec(), &with_tail);
    match &whole {
        Decoded::End(data, _) => assert_eq!(tailed, Decoded::End(data.clone(), TAIL.to_vec())),
        Decoded::Err(_) => assert_eq!(tailed.status(), whole.status()),
        // An unterminated body swallows (or rejects) what follows; nothing to compare.
        Decoded::Incomplete(_) => {}
    }
}

fn run(cases: Vec<Case>) -> usize {
    let n = cases.len();
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            std::panic::catch_unwind(|| check(c)).err().map(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                format!("{}: {msg}", c.name)
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {n} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    n
}

#[test]
fn chunked_table() {
    let n = run(chunked_cases());
    eprintln!("{n} chunked cases");
    assert!(n >= 50, "{n}");
}

/// The same table through `Conn`: head plus body plus a following request, whole and one byte at
/// a time; the next request must still parse after the body (pipelining).
#[test]
fn chunked_table_through_conn() {
    for case in chunked_cases() {
        let mut input =
            b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        input.extend_from_slice(&case.input);
        input.extend_from_slice(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n");
        let whole = conn_body(&input, case.limits, false);
        let bytewise = conn_body(&input, case.limits, true);
        assert_eq!(whole, bytewise, "{}", case.name);
        match (&case.want, &whole) {
            (Want::Body(b), Ok((data, next))) => {
                assert_eq!(&data[..], *b, "{}", case.name);
                assert_eq!(next.as_deref(), Some("/next"), "{}", case.name);
            }
            (Want::Status(s), Err(status)) => assert_eq!(s, status, "{}", case.name),
            // The following request is taken as chunk data or garbage.
            (Want::Incomplete(_), _) => {}
            (_, got) => panic!("{}: unexpected {got:?}", case.name),
        }
    }
}

/// Reads one request with its body, finishes the exchange and parses the next head. `Ok((body,
/// next path))` or `Err(status)`.
fn conn_body(
    input: &[u8],
    limits: Limits,
    bytewise: bool,
) -> Result<(Vec<u8>, Option<String>), u16> {
    let t = now();
    let mut conn = Conn::new(limits, Timeouts::default(), t);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut feed = |buf: &mut BytesMut| -> bool {
        if fed == input.len() {
            return false;
        }
        let n = if bytewise { 1 } else { input.len() };
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        true
    };
    feed(&mut buf);
    let head = loop {
        match conn.poll_request(&mut buf, t) {
            Ok(Some(h)) => break h,
            Ok(None) => assert!(feed(&mut buf), "head incomplete"),
            Err(e) => return Err(e.status()),
        }
    };
    assert_eq!(head.path(), "/up");
    let mut body = Vec::new();
    loop {
        match conn.poll_body(&mut buf, t) {
            Ok(BodyEvent::Data(d)) => body.extend_from_slice(&d),
            Ok(BodyEvent::NeedMore) => {
                if !feed(&mut buf) {
                    return Ok((body, None));
                }
            }
            Ok(BodyEvent::End) => break,
            Err(e) => return Err(e.status()),
        }
    }
    assert!(conn.body_done());
    let mut out = BytesMut::new();
    conn.start_response(204, [], canter_h1::BodyLen::Known(0), b"d", b"s", &mut out);
    assert_eq!(conn.finish(&mut out, t), Ok(canter_h1::Next::KeepAlive));
    loop {
        match conn.poll_request(&mut buf, t) {
            Ok(Some(h)) => return Ok((body, Some(h.path().to_owned()))),
            Ok(None) => {
                if !feed(&mut buf) {
                    return Ok((body, None));
                }
            }
            Err(e) => return Err(e.status()),
        }
    }
}

/// Data split at every byte boundary (of a multi-chunk body) reassembles to the same bytes, for
/// every pair of cut points.
#[test]
fn chunked_every_pair_of_splits() {
    let input = b"3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n1\r\nZ\r\n0\r\nT: v\r\n\r\nNEXT";
    let want = Decoded::End(b"abc0123456789abcdefZ".to_vec(), b"NEXT".to_vec());
    for a in 1..input.len() {
        for b in a..input.len() {
            let cuts = if a == b { vec![a] } else { vec![a, b] };
            let got = decode_split(BodyDecoder::chunked(&Limits::default()), input, &cuts);
            assert_eq!(got, want, "cuts {cuts:?}");
        }
    }
}

#[test]
fn content_length_decoder() {
    let l = Limits::default();
    // (name, length, input, expected)
    let table: [(&str, u64, &[u8], Decoded); 5] = [
        ("zero", 0, b"NEXT", Decoded::End(vec![], b"NEXT".to_vec())),
        (
            "exact",
            5,
            b"hello",
            Decoded::End(b"hello".to_vec(), vec![]),
        ),
        (
            "pipelined",
            5,
            b"helloGET / HTTP/1.1",
            Decoded::End(b"hello".to_vec(), b"GET / HTTP/1.1".to_vec()),
        ),
        ("short", 5, b"hel", Decoded::Incomplete(b"hel".to_vec())),
        ("empty input", 5, b"", Decoded::Incomplete(vec![])),
    ];
    for (name, len, input, want) in table {
        assert_eq!(
            decode_whole(BodyDecoder::length(len, &l), input),
            want,
            "{name}"
        );
        assert_eq!(
            decode_bytewise(BodyDecoder::length(len, &l), input),
            want,
            "{name}"
        );
    }
    let mut d = BodyDecoder::length(5, &l);
    assert_eq!(d.remaining(), Some(5));
    let mut buf = BytesMut::from(&b"he"[..]);
    assert!(matches!(d.decode(&mut buf), Ok(BodyEvent::Data(_))));
    assert_eq!(
        (d.remaining(), d.received(), d.is_done()),
        (Some(3), 2, false)
    );
    assert_eq!(d.decode(&mut buf), Ok(BodyEvent::NeedMore));
    buf.extend_from_slice(b"llo!");
    assert_eq!(d.decode(&mut buf), Ok(BodyEvent::Data("llo".into())));
    assert_eq!(
        (d.remaining(), d.received(), d.is_done()),
        (Some(0), 5, true)
    );
    assert_eq!(d.decode(&mut buf), Ok(BodyEvent::End));
    assert_eq!(&buf[..], b"!");
    assert_eq!(BodyDecoder::chunked(&l).remaining(), None);
}
