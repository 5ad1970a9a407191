//! The connection state machine: pipelining, keep-alive decisions, response framing, 100-continue,
//! error responses and deadlines. Exchanges are tables of (request, response) with the exact bytes
//! expected on the wire.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use canter_h1::{reason, BodyEvent, BodyLen, Conn, Error, LengthMismatch, Next};
use canter_http::RequestHead;
use canter_http::{Limits, Timeouts};

const DATE: &[u8] = b"D";
const SERVER: &[u8] = b"S";

fn conn_at(t: Instant) -> Conn {
    Conn::new(Limits::default(), Timeouts::default(), t)
}

/// Drains the current body; returns its bytes.
fn read_body(conn: &mut Conn, buf: &mut BytesMut, t: Instant) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        match conn.poll_body(buf, t).expect("body") {
            BodyEvent::Data(d) => body.extend_from_slice(&d),
            BodyEvent::End => return body,
            BodyEvent::NeedMore => panic!("body incomplete"),
        }
    }
}

/// Writes a whole response: start_response, then each piece framed with data_prefix/suffix.
fn respond(
    conn: &mut Conn,
    status: u16,
    len: BodyLen,
    pieces: &[&[u8]],
    out: &mut BytesMut,
    t: Instant,
) -> Result<Next, LengthMismatch> {
    let wants_body = conn.start_response(status, [], len, DATE, SERVER, out);
    for piece in pieces {
        let write = conn.data_prefix(piece.len(), out)?;
        assert_eq!(write, wants_body);
        if write {
            out.extend_from_slice(piece);
            conn.data_suffix(piece.len(), out);
        }
    }
    conn.finish(out, t)
}

fn parse_one(conn: &mut Conn, buf: &mut BytesMut, t: Instant) -> RequestHead {
    conn.poll_request(buf, t).expect("valid").expect("complete")
}

struct Exchange {
    name: &'static str,
    request: &'static str,
    status: u16,
    len: BodyLen,
    pieces: &'static [&'static [u8]],
    /// Exact response bytes.
    response: &'static str,
    next: Result<Next, LengthMismatch>,
}

const H11: &str = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
const H10: &str = "GET / HTTP/1.0\r\n\r\n";
const H10_KA: &str = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
const HEAD11: &str = "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";

fn exchanges() -> Vec<Exchange> {
    use BodyLen::{Known, Unknown};
    use Next::{Close, KeepAlive};
    vec![
        Exchange {
            name: "1.1 known length",
            request: H11,
            status: 200,
            len: Known(5),
            pieces: &[b"hel", b"lo"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 5\r\n\r\nhello",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.1 empty known body",
            request: H11,
            status: 200,
            len: Known(0),
            pieces: &[],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.1 chunked",
            request: H11,
            status: 200,
            len: Unknown,
            pieces: &[b"hello"],
            response:
                "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nTransfer-Encoding: chunked\r\n\r\n\
                       5\r\nhello\r\n0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.1 chunked, several pieces and an empty one",
            request: H11,
            status: 200,
            len: Unknown,
            pieces: &[b"ab", b"", b"0123456789abcdefg"],
            response:
                "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nTransfer-Encoding: chunked\r\n\r\n\
                       2\r\nab\r\n11\r\n0123456789abcdefg\r\n0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.1 chunked, empty body",
            request: H11,
            status: 200,
            len: Unknown,
            pieces: &[],
            response:
                "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nTransfer-Encoding: chunked\r\n\r\n\
                       0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.1 Connection: close",
            request: "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            status: 200,
            len: Known(2),
            pieces: &[b"ok"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 2\r\n\
                       Connection: close\r\n\r\nok",
            next: Ok(Close),
        },
        Exchange {
            name: "1.0 closes",
            request: H10,
            status: 200,
            len: Known(2),
            pieces: &[b"ok"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 2\r\n\
                       Connection: close\r\n\r\nok",
            next: Ok(Close),
        },
        Exchange {
            name: "1.0 keep-alive",
            request: H10_KA,
            status: 200,
            len: Known(2),
            pieces: &[b"ok"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 2\r\n\
                       Connection: keep-alive\r\n\r\nok",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "1.0 keep-alive, unknown length is close-delimited",
            request: H10_KA,
            status: 200,
            len: Unknown,
            pieces: &[b"he", b"llo"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nConnection: close\r\n\r\nhello",
            next: Ok(Close),
        },
        Exchange {
            name: "1.0 unknown length is close-delimited",
            request: H10,
            status: 200,
            len: Unknown,
            pieces: &[b"hello"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nConnection: close\r\n\r\nhello",
            next: Ok(Close),
        },
        Exchange {
            name: "HEAD keeps Content-Length, suppresses the body",
            request: HEAD11,
            status: 200,
            len: Known(5),
            pieces: &[b"hello"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 5\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "HEAD with unknown length: no framing header",
            request: HEAD11,
            status: 200,
            len: Unknown,
            pieces: &[b"hello"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "HEAD on 1.0 with unknown length keeps alive",
            request: "HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            status: 200,
            len: Unknown,
            pieces: &[],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nConnection: keep-alive\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "204 has no Content-Length and no body",
            request: H11,
            status: 204,
            len: Known(5),
            pieces: &[b"hello"],
            response: "HTTP/1.1 204 No Content\r\nServer: S\r\nDate: D\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "204 with unknown length is not chunked",
            request: H11,
            status: 204,
            len: Unknown,
            pieces: &[],
            response: "HTTP/1.1 204 No Content\r\nServer: S\r\nDate: D\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "304 has no Content-Length and no body",
            request: H11,
            status: 304,
            len: Known(5),
            pieces: &[b"hello"],
            response: "HTTP/1.1 304 Not Modified\r\nServer: S\r\nDate: D\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "304 on 1.0 is not close-delimited",
            request: H10_KA,
            status: 304,
            len: Unknown,
            pieces: &[],
            response: "HTTP/1.1 304 Not Modified\r\nServer: S\r\nDate: D\r\n\
                       Connection: keep-alive\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "body longer than Content-Length",
            request: H11,
            status: 200,
            len: Known(3),
            pieces: &[b"hello"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 3\r\n\r\n",
            next: Err(LengthMismatch),
        },
        Exchange {
            name: "body shorter than Content-Length",
            request: H11,
            status: 200,
            len: Known(10),
            pieces: &[b"hello"],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 10\r\n\r\nhello",
            next: Err(LengthMismatch),
        },
        Exchange {
            name: "unknown status code has an empty reason",
            request: H11,
            status: 299,
            len: Known(0),
            pieces: &[],
            response: "HTTP/1.1 299 \r\nServer: S\r\nDate: D\r\nContent-Length: 0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "invalid status code becomes 500",
            request: H11,
            status: 1000,
            len: Known(0),
            pieces: &[],
            response: "HTTP/1.1 500 Internal Server Error\r\nServer: S\r\nDate: D\r\n\
                       Content-Length: 0\r\n\r\n",
            next: Ok(KeepAlive),
        },
        Exchange {
            name: "unread request body forces close",
            request: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            status: 200,
            len: Known(0),
            pieces: &[],
            response: "HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 0\r\n\r\n",
            next: Ok(Close),
        },
    ]
}

#[test]
fn exchange_table() {
    for ex in exchanges() {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut buf = BytesMut::from(ex.request);
        parse_one(&mut conn, &mut buf, t);
        let mut out = BytesMut::new();
        let next = respond(&mut conn, ex.status, ex.len, ex.pieces, &mut out, t);
        assert_eq!(
            String::from_utf8_lossy(&out),
            ex.response,
            "{}: response bytes",
            ex.name
        );
        assert_eq!(next, ex.next, "{}", ex.name);
        let kept = next == Ok(Next::KeepAlive);
        assert_eq!(conn.keep_alive(), kept, "{}", ex.name);
        assert_eq!(conn.is_idle(), kept, "{}", ex.name);
        if !kept {
            // A closing connection takes no further request.
            let mut more = BytesMut::from(H11);
            assert!(
                matches!(conn.poll_request(&mut more, t), Ok(None)),
                "{}",
                ex.name
            );
            assert_eq!(conn.deadline(), None, "{}", ex.name);
        }
    }
}

#[test]
fn pipelining_three_requests() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n\
           POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
           POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n"[..],
    );
    let mut out = BytesMut::new();
    let mut seen = Vec::new();
    for i in 1..=3 {
        let head = parse_one(&mut conn, &mut buf, t);
        // Strictly sequential: nothing more is parsed until this exchange is finished.
        assert!(matches!(conn.poll_request(&mut buf, t), Ok(None)));
        let body = read_body(&mut conn, &mut buf, t);
        seen.push((head.path().to_owned(), body));
        let n = respond(&mut conn, 200, BodyLen::Known(1), &[b"k"], &mut out, t);
        assert_eq!(n, Ok(Next::KeepAlive), "request {i}");
    }
    assert_eq!(
        seen,
        [
            ("/1".to_owned(), vec![]),
            ("/2".to_owned(), b"abc".to_vec()),
            ("/3".to_owned(), b"de".to_vec()),
        ]
    );
    assert!(buf.is_empty());
    assert_eq!(
        out.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count(),
        3
    );
    assert!(conn.is_idle());
}

#[test]
fn bad_request_after_two_good_ones() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\nGET /3 HTTP/1.1\r\n\r\n"
            [..],
    );
    let mut out = BytesMut::new();
    for path in ["/1", "/2"] {
        assert_eq!(parse_one(&mut conn, &mut buf, t).path(), path);
        assert_eq!(
            respond(&mut conn, 204, BodyLen::Known(0), &[], &mut out, t),
            Ok(Next::KeepAlive)
        );
    }
    let e = conn.poll_request(&mut buf, t).expect_err("missing Host");
    assert_eq!(e.status(), 400);
    assert!(!conn.keep_alive());
    let mut err_out = BytesMut::new();
    conn.error_response(&e, DATE, SERVER, &mut err_out);
    assert!(err_out.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
    assert_eq!(conn.finish(&mut err_out, t), Ok(Next::Close));
    // Nothing more is parsed once closed.
    let mut more = BytesMut::from(H11);
    assert!(matches!(conn.poll_request(&mut more, t), Ok(None)));
}

#[test]
fn error_response_bytes() {
    let table: [(Error, &str); 8] = [
        (
            Error::Malformed(canter_h1::Malformed::Target),
            "400 Bad Request",
        ),
        (
            Error::BadBody(canter_h1::BadBody::ChunkSizeNotHex),
            "400 Bad Request",
        ),
        (
            Error::HeadersTooLarge,
            "431 Request Header Fields Too Large",
        ),
        (Error::UriTooLong, "414 URI Too Long"),
        (Error::BodyTooLarge, "413 Content Too Large"),
        (Error::VersionNotSupported, "505 HTTP Version Not Supported"),
        (Error::UnsupportedTransferCoding, "501 Not Implemented"),
        (Error::ExpectationFailed, "417 Expectation Failed"),
    ];
    for (e, line) in table {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut out = BytesMut::new();
        conn.error_response(&e, DATE, SERVER, &mut out);
        let reason_text = &line[4..];
        let body = format!("{reason_text}\n");
        let want = format!(
            "HTTP/1.1 {line}\r\nServer: S\r\nDate: D\r\nContent-Length: {}\r\n\
             Connection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(reason(e.status()), reason_text);
        assert!(!conn.keep_alive());
        assert_eq!(conn.deadline(), None);
        assert_eq!(conn.finish(&mut out, t), Ok(Next::Close));
    }
}

#[test]
fn error_response_to_a_head_request_has_no_body() {
    // A HEAD with a bad chunked body: the error response keeps its Content-Length but, being the
    // answer to a HEAD, carries no body (RFC 9110 §9.3.2); no 100 Continue is owed any more.
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"HEAD / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\nzz"[..],
    );
    parse_one(&mut conn, &mut buf, t);
    let e = conn.poll_body(&mut buf, t).expect_err("bad chunk size");
    assert_eq!(e.status(), 400);
    let mut out = BytesMut::new();
    conn.error_response(&e, DATE, SERVER, &mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "HTTP/1.1 400 Bad Request\r\nServer: S\r\nDate: D\r\nContent-Length: 12\r\n\
         Connection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
    );
    let len = out.len();
    conn.write_continue(&mut out);
    assert_eq!(out.len(), len, "no 100 Continue after an error");
}

#[test]
fn error_after_a_head_exchange_has_a_body() {
    // The HEAD was the previous exchange; the malformed request after it gets a full response.
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(&b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n"[..]);
    parse_one(&mut conn, &mut buf, t);
    let mut out = BytesMut::new();
    let next = respond(&mut conn, 200, BodyLen::Known(5), &[b"hello"], &mut out, t);
    assert_eq!(next, Ok(Next::KeepAlive));
    let e = conn.poll_request(&mut buf, t).expect_err("no Host");
    out.clear();
    conn.error_response(&e, DATE, SERVER, &mut out);
    assert!(out.ends_with(b"\r\n\r\nBad Request\n"));
}

#[test]
fn reject_table() {
    // (status, expected response) for conditions the driver detects.
    let table: [(u16, &str); 3] = [
        (
            408,
            "HTTP/1.1 408 Request Timeout\r\nServer: S\r\nDate: D\r\nContent-Length: 16\r\n\
             Connection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nRequest Timeout\n",
        ),
        (
            503,
            "HTTP/1.1 503 Service Unavailable\r\nServer: S\r\nDate: D\r\nContent-Length: 20\r\n\
             Connection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n\
             Service Unavailable\n",
        ),
        (
            599,
            "HTTP/1.1 599 \r\nServer: S\r\nDate: D\r\nContent-Length: 1\r\n\
             Connection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n\n",
        ),
    ];
    for (status, want) in table {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut buf = BytesMut::from(&b"GET / HT"[..]);
        assert!(matches!(conn.poll_request(&mut buf, t), Ok(None)));
        let mut out = BytesMut::new();
        conn.reject(status, DATE, SERVER, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(conn.deadline(), None);
        assert!(matches!(conn.poll_request(&mut buf, t), Ok(None)));
        assert_eq!(conn.finish(&mut out, t), Ok(Next::Close));
    }
}

#[test]
fn write_continue_table() {
    // (name, request, expected 100 Continue)
    let table: [(&str, &str, bool); 6] = [
        (
            "with Content-Length body",
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            true,
        ),
        (
            "with chunked body",
            "PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
            true,
        ),
        (
            "without a body",
            "GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            false,
        ),
        (
            "with Content-Length 0",
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nExpect: 100-continue\r\n\r\n",
            false,
        ),
        (
            "HTTP/1.0",
            "PUT / HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            false,
        ),
        (
            "no Expect",
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            false,
        ),
    ];
    for (name, req, want) in table {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut buf = BytesMut::from(req);
        parse_one(&mut conn, &mut buf, t);
        let mut out = BytesMut::new();
        conn.write_continue(&mut out);
        conn.write_continue(&mut out);
        let expected: &[u8] = if want {
            b"HTTP/1.1 100 Continue\r\n\r\n"
        } else {
            b""
        };
        assert_eq!(&out[..], expected, "{name}");
    }
}

#[test]
fn continue_then_body_keeps_alive() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"[..],
    );
    parse_one(&mut conn, &mut buf, t);
    let mut out = BytesMut::new();
    conn.write_continue(&mut out);
    assert_eq!(&out[..], b"HTTP/1.1 100 Continue\r\n\r\n");
    buf.extend_from_slice(b"hello");
    assert_eq!(read_body(&mut conn, &mut buf, t), b"hello");
    out.clear();
    let next = respond(&mut conn, 200, BodyLen::Known(0), &[], &mut out, t);
    assert_eq!(next, Ok(Next::KeepAlive));
    assert!(!out.windows(17).any(|w| w == b"Connection: close"));
}

#[test]
fn response_without_reading_a_continue_body_closes() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"[..],
    );
    parse_one(&mut conn, &mut buf, t);
    let mut out = BytesMut::new();
    let next = respond(&mut conn, 417, BodyLen::Known(0), &[], &mut out, t);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "HTTP/1.1 417 Expectation Failed\r\nServer: S\r\nDate: D\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    assert_eq!(next, Ok(Next::Close));
    // The 100 Continue is no longer owed.
    out.clear();
    conn.write_continue(&mut out);
    assert!(out.is_empty());
}

/// RFC 9110 §10.1.1: a client may send the body without waiting for 100 Continue. Once the body
/// was read completely, nothing is out of sync and the connection stays open.
#[test]
fn continue_body_sent_without_waiting_keeps_alive() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(
        &b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello"[..],
    );
    parse_one(&mut conn, &mut buf, t);
    assert_eq!(read_body(&mut conn, &mut buf, t), b"hello");
    let mut out = BytesMut::new();
    // The body is already here: no 100 Continue is needed.
    conn.write_continue(&mut out);
    assert!(out.is_empty());
    let next = respond(&mut conn, 200, BodyLen::Known(0), &[], &mut out, t);
    assert_eq!(next, Ok(Next::KeepAlive));
    assert!(!out.windows(17).any(|w| w == b"Connection: close"));
}

#[test]
fn unread_body_at_finish_closes() {
    for (name, req, feed) in [
        (
            "untouched Content-Length body",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            "",
        ),
        (
            "partly read Content-Length body",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            "he",
        ),
        (
            "partly read chunked body",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5\r\nhello\r\n",
        ),
    ] {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut buf = BytesMut::from(req);
        parse_one(&mut conn, &mut buf, t);
        buf.extend_from_slice(feed.as_bytes());
        while let Ok(BodyEvent::Data(_)) = conn.poll_body(&mut buf, t) {}
        assert!(!conn.body_done(), "{name}");
        let mut out = BytesMut::new();
        let next = respond(&mut conn, 200, BodyLen::Known(0), &[], &mut out, t);
        assert_eq!(next, Ok(Next::Close), "{name}");
        assert!(!conn.keep_alive(), "{name}");
    }
}

#[test]
fn body_bookkeeping() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(&b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe"[..]);
    parse_one(&mut conn, &mut buf, t);
    assert!(!conn.body_done());
    assert_eq!(conn.body_remaining(), Some(5));
    assert_eq!(
        conn.poll_body(&mut buf, t),
        Ok(BodyEvent::Data("he".into()))
    );
    assert_eq!(conn.body_remaining(), Some(3));
    assert_eq!(conn.poll_body(&mut buf, t), Ok(BodyEvent::NeedMore));
    buf.extend_from_slice(b"lloGET");
    assert_eq!(
        conn.poll_body(&mut buf, t),
        Ok(BodyEvent::Data("llo".into()))
    );
    assert!(conn.body_done());
    assert_eq!(conn.body_remaining(), Some(0));
    assert_eq!(conn.poll_body(&mut buf, t), Ok(BodyEvent::End));
    assert_eq!(&buf[..], b"GET");
    // A request without a body is done at once; poll_body says End.
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(H11);
    parse_one(&mut conn, &mut buf, t);
    assert!(conn.body_done());
    assert_eq!(conn.poll_body(&mut buf, t), Ok(BodyEvent::End));
    // Chunked: remaining length is unknown.
    let mut conn = conn_at(t);
    let mut buf =
        BytesMut::from(&b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"[..]);
    parse_one(&mut conn, &mut buf, t);
    assert_eq!(conn.body_remaining(), None);
}

#[test]
fn body_errors_through_conn() {
    // (name, request with body, status)
    let table: [(&str, &str, u16); 3] = [
        (
            "chunked over max_body",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n7\r\nworld!!\r\n0\r\n\r\n",
            413,
        ),
        (
            "bad chunk size",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n",
            400,
        ),
        (
            "trailers too large",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
             0\r\nX: 0123456789\r\n\r\n",
            431,
        ),
    ];
    let limits = Limits::builder()
        .max_body(10)
        .max_trailers(8)
        .build()
        .expect("valid limits");
    for (name, req, status) in table {
        let t = Instant::now();
        let mut conn = Conn::new(limits, Timeouts::default(), t);
        let mut buf = BytesMut::from(req);
        parse_one(&mut conn, &mut buf, t);
        let e = loop {
            match conn.poll_body(&mut buf, t) {
                Ok(BodyEvent::Data(_)) => {}
                Ok(other) => panic!("{name}: {other:?}"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.status(), status, "{name}");
        assert!(!conn.keep_alive(), "{name}");
        assert_eq!(conn.deadline(), None, "{name}");
    }
}

#[test]
fn length_mismatch_details() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(H11);
    parse_one(&mut conn, &mut buf, t);
    let mut out = BytesMut::new();
    assert!(conn.start_response(200, [], BodyLen::Known(3), DATE, SERVER, &mut out));
    assert_eq!(conn.data_prefix(2, &mut out), Ok(true));
    assert_eq!(conn.data_prefix(2, &mut out), Err(LengthMismatch));
    assert!(!conn.keep_alive());
    assert_eq!(conn.finish(&mut out, t), Err(LengthMismatch));
    assert!(!conn.is_idle());
}

#[test]
fn chunk_size_lines_in_hex() {
    for (len, line) in [
        (1usize, "1"),
        (15, "f"),
        (16, "10"),
        (255, "ff"),
        (0x1234, "1234"),
        (0xabcdef, "abcdef"),
    ] {
        let t = Instant::now();
        let mut conn = conn_at(t);
        let mut buf = BytesMut::from(H11);
        parse_one(&mut conn, &mut buf, t);
        let mut out = BytesMut::new();
        conn.start_response(200, [], BodyLen::Unknown, DATE, SERVER, &mut out);
        out.clear();
        assert_eq!(conn.data_prefix(len, &mut out), Ok(true));
        assert_eq!(String::from_utf8_lossy(&out), format!("{line}\r\n"));
    }
}

#[test]
fn response_headers_are_validated() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    let mut buf = BytesMut::from(H11);
    parse_one(&mut conn, &mut buf, t);
    let mut out = BytesMut::new();
    let headers: [(&[u8], &[u8]); 6] = [
        (b"X-Ok", b"a b\tc"),
        (b"X-Split", b"a\r\nSet-Cookie: evil"),
        (b"X Bad", b"v"),
        (b"", b"v"),
        (b"X-Nul", b"a\0b"),
        (b"X-Obs", b"caf\xc3\xa9"),
    ];
    conn.start_response(200, headers, BodyLen::Known(0), DATE, SERVER, &mut out);
    assert_eq!(
        &out[..],
        &b"HTTP/1.1 200 OK\r\nServer: S\r\nDate: D\r\nContent-Length: 0\r\n\
           X-Ok: a b\tc\r\nX-Obs: caf\xc3\xa9\r\n\r\n"[..]
    );
}

#[test]
fn set_close_and_idle_state() {
    let t = Instant::now();
    let mut conn = conn_at(t);
    assert!(conn.is_idle());
    assert!(conn.keep_alive());
    assert_eq!(conn.limits(), &Limits::default());
    let mut buf = BytesMut::new();
    assert!(matches!(conn.poll_request(&mut buf, t), Ok(None)));
    assert!(conn.is_idle(), "no bytes: still idle");
    buf.extend_from_slice(b"GE");
    assert!(matches!(conn.poll_request(&mut buf, t), Ok(None)));
    assert!(!conn.is_idle(), "head bytes seen");
    buf.extend_from_slice(b"T / HTTP/1.1\r\nHost: x\r\n\r\n");
    parse_one(&mut conn, &mut buf, t);
    conn.set_close();
    let mut out = BytesMut::new();
    let next = respond(&mut conn, 200, BodyLen::Known(0), &[], &mut out, t);
    assert_eq!(next, Ok(Next::Close));
    assert!(out.ends_with(b"Connection: close\r\n\r\n"));
}

#[test]
fn deadlines_follow_the_phases() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let timeouts = Timeouts::builder()
        .idle(s(100))
        .head(s(10))
        .body(s(20))
        .write(s(30))
        .build()
        .expect("valid timeouts");
    let mut conn = Conn::new(Limits::default(), timeouts, t0);
    assert_eq!(conn.deadline(), Some(t0 + s(100)), "idle since accept");

    // Empty reads do not start the head timer.
    let mut buf = BytesMut::new();
    assert!(matches!(conn.poll_request(&mut buf, t0 + s(1)), Ok(None)));
    assert_eq!(conn.deadline(), Some(t0 + s(100)));

    // The first head byte starts the head timer; more bytes do not extend it.
    buf.extend_from_slice(b"POST / HTTP/1.1\r\n");
    assert!(matches!(conn.poll_request(&mut buf, t0 + s(2)), Ok(None)));
    assert_eq!(conn.deadline(), Some(t0 + s(12)));
    buf.extend_from_slice(b"Host: x\r\n");
    assert!(matches!(conn.poll_request(&mut buf, t0 + s(5)), Ok(None)));
    assert_eq!(
        conn.deadline(),
        Some(t0 + s(12)),
        "slow head is not extended"
    );

    // Head complete: the body timer runs from then, and every piece of data extends it.
    buf.extend_from_slice(b"Content-Length: 4\r\n\r\n");
    parse_one(&mut conn, &mut buf, t0 + s(6));
    assert_eq!(conn.deadline(), Some(t0 + s(26)));
    assert_eq!(conn.poll_body(&mut buf, t0 + s(7)), Ok(BodyEvent::NeedMore));
    assert_eq!(
        conn.deadline(),
        Some(t0 + s(26)),
        "no progress, no extension"
    );
    buf.extend_from_slice(b"ab");
    assert!(matches!(
        conn.poll_body(&mut buf, t0 + s(8)),
        Ok(BodyEvent::Data(_))
    ));
    assert_eq!(conn.deadline(), Some(t0 + s(28)));

    // Body complete: the request is with the handler, no read deadline.
    buf.extend_from_slice(b"cd");
    assert!(matches!(
        conn.poll_body(&mut buf, t0 + s(9)),
        Ok(BodyEvent::Data(_))
    ));
    assert_eq!(conn.deadline(), None);

    // Responding: still none (the driver applies its write timeout).
    let mut out = BytesMut::new();
    conn.start_response(200, [], BodyLen::Known(0), DATE, SERVER, &mut out);
    assert_eq!(conn.deadline(), None);

    // Finished: idle again from the finish time.
    assert_eq!(conn.finish(&mut out, t0 + s(11)), Ok(Next::KeepAlive));
    assert_eq!(conn.deadline(), Some(t0 + s(111)));

    // An error: no deadline at all.
    buf.extend_from_slice(b"BAD\0");
    assert!(conn.poll_request(&mut buf, t0 + s(12)).is_err());
    assert_eq!(conn.deadline(), None);
}

#[test]
fn deadline_for_a_request_without_body_and_pipelined_next() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut conn = Conn::new(Limits::default(), Timeouts::default(), t0);
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\n"[..]);
    parse_one(&mut conn, &mut buf, t0 + s(1));
    assert_eq!(conn.deadline(), None, "with the handler");
    let mut out = BytesMut::new();
    respond(&mut conn, 204, BodyLen::Known(0), &[], &mut out, t0 + s(2)).expect("ok");
    assert_eq!(
        conn.deadline(),
        Some(t0 + s(2) + Timeouts::default().idle())
    );
    // The partial pipelined head switches to the head timer from the time it is polled.
    assert!(matches!(conn.poll_request(&mut buf, t0 + s(3)), Ok(None)));
    assert_eq!(
        conn.deadline(),
        Some(t0 + s(3) + Timeouts::default().head())
    );
}
