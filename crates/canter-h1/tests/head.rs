//! Request head parsing: one table of cases, each fed whole, one byte at a time and at the end of
//! a larger buffer (see `common::run_head_cases`).

mod common;

use canter_http::Limits;
use canter_http::{BodyKind, Method, RequestHead, Version};
use common::{err, ok, partial, run_head_cases, HeadCase};

fn small_target() -> Limits {
    Limits::builder()
        .max_target(16)
        .build()
        .expect("valid limits")
}

fn small_head() -> Limits {
    Limits::builder()
        .max_head(64)
        .build()
        .expect("valid limits")
}

fn three_headers() -> Limits {
    Limits::builder()
        .max_headers(3)
        .build()
        .expect("valid limits")
}

fn small_body() -> Limits {
    Limits::builder()
        .max_body(10)
        .build()
        .expect("valid limits")
}

/// `method()` and `http_method()` agree with `method_str()`.
fn method_consistent(h: &RequestHead) {
    assert_eq!(h.http_method().as_str(), h.method_str());
    let expected = match h.method_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        "CONNECT" => Method::Connect,
        "TRACE" => Method::Trace,
        _ => Method::Other,
    };
    assert_eq!(h.method(), expected);
    assert_eq!(h.path(), "/");
    assert_eq!(h.body_kind(), BodyKind::Length(0));
}

fn many_headers(n: usize) -> Vec<u8> {
    let mut v = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 1..n {
        v.extend_from_slice(format!("X-H{i}: value {i}\r\n").as_bytes());
    }
    v.extend_from_slice(b"\r\n");
    v
}

fn target_of(len: usize) -> Vec<u8> {
    let mut v = b"GET /".to_vec();
    v.extend(std::iter::repeat_n(b'a', len - 1));
    v.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
    v
}

fn valid_cases() -> Vec<HeadCase> {
    let mut cases = vec![
        ok("simple GET", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", |h| {
            assert_eq!(h.method(), Method::Get);
            assert_eq!(h.method_str(), "GET");
            assert_eq!(h.target(), "/");
            assert_eq!(h.path(), "/");
            assert_eq!(h.query(), None);
            assert_eq!(h.version(), Version::Http11);
            assert_eq!(h.body_kind(), BodyKind::Length(0));
            assert!(h.keep_alive());
            assert!(!h.expect_continue());
            assert_eq!(h.header("HOST"), Some(&b"x"[..]));
            assert_eq!(h.headers().count(), 1);
            assert_eq!(&h.raw()[..], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        }),
        ok(
            "path and query",
            "GET /a/b?c=d&e HTTP/1.1\r\nHost: x\r\n\r\n",
            |h| {
                assert_eq!(h.path(), "/a/b");
                assert_eq!(h.query(), Some("c=d&e"));
                assert_eq!(h.path_and_query(), "/a/b?c=d&e");
            },
        ),
        ok("empty query", "GET /a? HTTP/1.1\r\nHost: x\r\n\r\n", |h| {
            assert_eq!(h.path(), "/a");
            assert_eq!(h.query(), Some(""));
        }),
        ok(
            "percent-encoding kept",
            "GET /a%20b?x=%2F HTTP/1.1\r\nHost: x\r\n\r\n",
            |h| {
                assert_eq!(h.path(), "/a%20b");
                assert_eq!(h.query(), Some("x=%2F"));
            },
        ),
        ok(
            "lowercase method is a custom token",
            "get / HTTP/1.1\r\nHost: x\r\n\r\n",
            |h| {
                assert_eq!(h.method(), Method::Other);
                assert_eq!(h.method_str(), "get");
            },
        ),
        ok(
            "HTTP/1.0 closes by default",
            "GET / HTTP/1.0\r\n\r\n",
            |h| {
                assert_eq!(h.version(), Version::Http10);
                assert!(!h.keep_alive());
            },
        ),
        ok(
            "HTTP/1.0 keep-alive",
            "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            |h| {
                assert_eq!(h.version(), Version::Http10);
                assert!(h.keep_alive());
            },
        ),
        ok(
            "HTTP/1.0 keep-alive and close: close wins",
            "GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
            |h| assert!(!h.keep_alive()),
        ),
        ok(
            "HTTP/1.0 with Host",
            "GET / HTTP/1.0\r\nHost: x\r\n\r\n",
            |h| assert_eq!(h.header("host"), Some(&b"x"[..])),
        ),
        ok(
            "HTTP/1.1 Connection: close",
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            |h| assert!(!h.keep_alive()),
        ),
        ok(
            "HTTP/1.1 Connection list with close",
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade , CLOSE\r\n\r\n",
            |h| assert!(!h.keep_alive()),
        ),
        ok(
            "HTTP/1.1 Connection: closed is not close",
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: closed\r\n\r\n",
            |h| assert!(h.keep_alive()),
        ),
        ok(
            "absolute-form",
            "GET http://example.com/a?b HTTP/1.1\r\nHost: example.com\r\n\r\n",
            |h| {
                assert_eq!(h.target(), "http://example.com/a?b");
                assert_eq!(h.path_and_query(), "/a?b");
                assert_eq!(h.path(), "/a");
                assert_eq!(h.query(), Some("b"));
            },
        ),
        ok(
            "absolute-form, uppercase scheme and port",
            "GET HTTP://EXAMPLE.COM:8080/x HTTP/1.1\r\nHost: example.com\r\n\r\n",
            |h| assert_eq!(h.path_and_query(), "/x"),
        ),
        ok(
            "absolute-form https",
            "GET https://h/p HTTP/1.1\r\nHost: h\r\n\r\n",
            |h| assert_eq!(h.path(), "/p"),
        ),
        ok(
            "absolute-form without path",
            "GET http://h HTTP/1.1\r\nHost: h\r\n\r\n",
            |h| {
                assert_eq!(h.target(), "http://h");
                assert_eq!(h.path_and_query(), "/");
                assert_eq!(h.path(), "/");
                assert_eq!(h.query(), None);
            },
        ),
        ok(
            "absolute-form without path, with query",
            "GET http://h?q=1 HTTP/1.1\r\nHost: h\r\n\r\n",
            |h| {
                // RFC 9112 §3.2.2: an empty path is "/"; the query is kept.
                assert_eq!(h.path_and_query(), "/?q=1");
                assert_eq!(h.path(), "/");
                assert_eq!(h.query(), Some("q=1"));
            },
        ),
        ok(
            "no headers at all with max_headers 0",
            "GET / HTTP/1.0\r\n\r\n",
            |h| assert_eq!(h.headers().count(), 0),
        )
        .limits(
            Limits::builder()
                .max_headers(0)
                .build()
                .expect("valid limits"),
        ),
        ok(
            "absolute-form with empty query",
            "GET http://h? HTTP/1.1\r\nHost: h\r\n\r\n",
            |h| {
                assert_eq!(h.path_and_query(), "/?");
                assert_eq!(h.query(), Some(""));
            },
        ),
        ok("OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", |h| {
            assert_eq!(h.method(), Method::Options);
            assert_eq!(h.target(), "*");
            assert_eq!(h.path(), "*");
            assert_eq!(h.query(), None);
        }),
        ok(
            "CONNECT authority-form",
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            |h| {
                assert_eq!(h.method(), Method::Connect);
                assert_eq!(h.target(), "example.com:443");
                assert_eq!(h.path_and_query(), "example.com:443");
            },
        ),
        ok(
            "CONNECT IPv6 authority-form",
            "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n",
            |h| assert_eq!(h.target(), "[::1]:8443"),
        ),
        ok(
            "leading CRLF",
            "\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
            |h| {
                assert_eq!(h.path(), "/");
                assert_eq!(h.method(), Method::Get);
            },
        ),
        ok(
            "several leading CRLFs",
            "\r\n\r\n\r\nGET /z HTTP/1.1\r\nHost: x\r\n\r\n",
            |h| assert_eq!(h.path(), "/z"),
        ),
        ok(
            "value with internal spaces, tabs and obs-text",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-V: a  b\t c \xff\x80 d\r\n\r\n",
            |h| assert_eq!(h.header("x-v"), Some(&b"a  b\t c \xff\x80 d"[..])),
        ),
        ok(
            "surrounding whitespace of a value is not part of it",
            "GET / HTTP/1.1\r\nHost: x\r\nX-V: \t v w \t \r\n\r\n",
            |h| assert_eq!(h.header("x-v"), Some(&b"v w"[..])),
        ),
        ok(
            "empty value",
            "GET / HTTP/1.1\r\nHost: x\r\nX-E:\r\nX-F: \r\n\r\n",
            |h| {
                assert_eq!(h.header("x-e"), Some(&b""[..]));
                assert_eq!(h.header("x-f"), Some(&b""[..]));
            },
        ),
        ok("empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", |h| {
            assert_eq!(h.header("host"), Some(&b""[..]))
        }),
        ok(
            "Host with port",
            "GET / HTTP/1.1\r\nhost: example.com:8080\r\n\r\n",
            |h| assert_eq!(h.header("Host"), Some(&b"example.com:8080"[..])),
        ),
        ok(
            "Host IPv6 literal",
            "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n",
            |h| assert_eq!(h.header("host"), Some(&b"[2001:db8::1]:80"[..])),
        ),
        ok(
            "header names keep their case, lookup ignores it",
            "GET / HTTP/1.1\r\nHOST: x\r\nx-Mixed-CASE: 1\r\nX-Dup: a\r\nx-dup: b\r\n\r\n",
            |h| {
                let names: Vec<&str> = h.headers().map(|(n, _)| n).collect();
                assert_eq!(names, ["HOST", "x-Mixed-CASE", "X-Dup", "x-dup"]);
                assert_eq!(h.header("X-MIXED-case"), Some(&b"1"[..]));
                assert_eq!(h.header("x-dup"), Some(&b"a"[..]));
                assert_eq!(h.header("missing"), None);
            },
        ),
        ok("100 headers (the default limit)", many_headers(100), |h| {
            assert_eq!(h.headers().count(), 100);
            assert_eq!(h.header("x-h99"), Some(&b"value 99"[..]));
        }),
        ok("3 headers with max_headers 3", many_headers(3), |h| {
            assert_eq!(h.headers().count(), 3);
        })
        .limits(three_headers()),
        ok("target exactly max_target", target_of(16), |h| {
            assert_eq!(h.target().len(), 16);
        })
        .limits(small_target()),
        ok(
            "head exactly max_head",
            // 64 bytes: request line 16 + "Host: x\r\n" 9 + "X: " 3 + 34 + CRLF 2 ... + final CRLF.
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
                "v".repeat(64 - 16 - 9 - 3 - 2 - 2)
            ),
            |h| assert_eq!(h.raw().len(), 64),
        )
        .limits(small_head()),
        ok(
            "Content-Length 0",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Length(0)),
        ),
        ok(
            "Content-Length N, body bytes stay in the buffer",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
            |h| {
                assert_eq!(h.body_kind(), BodyKind::Length(5));
                assert!(h.raw().ends_with(b"\r\n\r\n"));
            },
        ),
        ok(
            "Content-Length with leading zeros",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 007\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Length(7)),
        ),
        ok(
            // The parser strips the whitespace around a value (RFC 9110 §5.5: OWS is not part of
            // the field value), so "5 " is the value "5".
            "Content-Length with surrounding whitespace",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length:  5 \t\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Length(5)),
        ),
        ok(
            "Content-Length equal to max_body",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Length(10)),
        )
        .limits(small_body()),
        ok(
            // RFC 9110 §2.5: a higher minor version is processed as the highest we conform to.
            "HTTP/1.2 is served as 1.1",
            "GET / HTTP/1.2\r\nHost: x\r\n\r\n",
            |h| {
                assert_eq!(h.version(), Version::Http11);
                assert!(h.keep_alive());
            },
        ),
        ok(
            "HTTP/1.9 with Connection: close",
            "GET / HTTP/1.9\r\nHost: x\r\nConnection: close\r\n\r\n",
            |h| assert!(!h.keep_alive()),
        ),
        ok(
            "HTTP/1.0 with Content-Length",
            "POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
            |h| assert_eq!(h.body_kind(), BodyKind::Length(3)),
        ),
        ok(
            "Transfer-Encoding: chunked",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Chunked),
        ),
        ok(
            "Transfer-Encoding: CHUNKED",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Chunked),
        ),
        ok(
            "Transfer-Encoding list with empty elements",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: , Chunked ,\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Chunked),
        ),
        ok(
            "chunked ignores max_body at head time",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            |h| assert_eq!(h.body_kind(), BodyKind::Chunked),
        )
        .limits(small_body()),
        ok(
            "Expect: 100-continue",
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            |h| assert!(h.expect_continue()),
        ),
        ok(
            "Expect: 100-Continue is case-insensitive",
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-Continue\r\n\r\n",
            |h| assert!(h.expect_continue()),
        ),
        ok(
            // RFC 9110 §10.1.1: a server MUST ignore 100-continue in an HTTP/1.0 request.
            "Expect: 100-continue ignored in HTTP/1.0",
            "PUT / HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            |h| assert!(!h.expect_continue()),
        ),
    ];
    for method in [
        "GET",
        "HEAD",
        "POST",
        "PUT",
        "DELETE",
        "PATCH",
        "OPTIONS",
        "TRACE",
        "PURGE",
        "M-SEARCH",
        "X!#$%&'*+-.^_`|~9",
    ] {
        cases.push(ok(
            &format!("method {method}"),
            format!("{method} / HTTP/1.1\r\nHost: x\r\n\r\n"),
            method_consistent,
        ));
    }
    cases
}

fn rejected_cases() -> Vec<HeadCase> {
    let post = |extra: &str| format!("POST / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
    let get = |extra: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
    let line = |line: &str| format!("{line}\r\nHost: x\r\n\r\n");
    let mut cases = vec![
        // ---- Content-Length -------------------------------------------------------------
        err("CL +5", post("Content-Length: +5\r\n"), 400),
        err("CL -1", post("Content-Length: -1\r\n"), 400),
        err("CL 0x5", post("Content-Length: 0x5\r\n"), 400),
        err("CL 5a", post("Content-Length: 5a\r\n"), 400),
        err("CL inner space", post("Content-Length: 5 5\r\n"), 400),
        err("CL empty", post("Content-Length:\r\n"), 400),
        err("CL list 1,1", post("Content-Length: 1,1\r\n"), 400),
        err("CL list 1, 1", post("Content-Length: 1, 1\r\n"), 400),
        err(
            "CL conflicting",
            post("Content-Length: 5\r\nContent-Length: 6\r\n"),
            400,
        ),
        err(
            "CL 20 digits",
            post("Content-Length: 12345678901234567890\r\n"),
            400,
        ),
        err(
            "CL 20 digits with leading zeros",
            post("Content-Length: 00000000000000000001\r\n"),
            400,
        ),
        err(
            "CL 19 digits over max_body",
            post("Content-Length: 9999999999999999999\r\n"),
            413,
        ),
        err("CL over max_body", post("Content-Length: 11\r\n"), 413).limits(small_body()),
        err(
            "CL over max_body, HTTP/1.0",
            "POST / HTTP/1.0\r\nContent-Length: 11\r\n\r\n",
            413,
        )
        .limits(small_body()),
        // ---- Transfer-Encoding ----------------------------------------------------------
        err(
            "TE and CL",
            post("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
            400,
        ),
        err(
            "CL and TE",
            post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
            400,
        ),
        err(
            "TE chunked, gzip",
            post("Transfer-Encoding: chunked, gzip\r\n"),
            400,
        ),
        err("TE gzip", post("Transfer-Encoding: gzip\r\n"), 400),
        err("TE identity", post("Transfer-Encoding: identity\r\n"), 400),
        err("TE empty", post("Transfer-Encoding:\r\n"), 400),
        err(
            "TE chunked with parameter",
            post("Transfer-Encoding: chunked;q=1\r\n"),
            400,
        ),
        err(
            "TE chunked, chunked",
            post("Transfer-Encoding: chunked, chunked\r\n"),
            400,
        ),
        err(
            "TE chunked on two lines",
            post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            400,
        ),
        err(
            "TE chunked then gzip on two lines",
            post("Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n"),
            400,
        ),
        err(
            "TE in HTTP/1.0",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        err(
            "TE gzip, chunked",
            post("Transfer-Encoding: gzip, chunked\r\n"),
            501,
        ),
        err(
            "TE gzip then chunked on two lines",
            post("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"),
            501,
        ),
        // ---- Host -----------------------------------------------------------------------
        err("missing Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", 400),
        err(
            "missing Host in HTTP/1.1 with other headers",
            "GET / HTTP/1.1\r\nX: y\r\n\r\n",
            400,
        ),
        err("two Hosts", get("Host: y\r\n"), 400),
        err("two identical Hosts", get("Host: x\r\n"), 400),
        err(
            "two Hosts in HTTP/1.0",
            "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            400,
        ),
        // RFC 9112 §3.2: a Host with an invalid field value is a 400.
        err(
            "Host with a space",
            "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            400,
        ),
        err(
            "Host with userinfo",
            "GET / HTTP/1.1\r\nHost: u@h\r\n\r\n",
            400,
        ),
        err(
            "Host with a path",
            "GET / HTTP/1.1\r\nHost: h/p\r\n\r\n",
            400,
        ),
        err(
            "Host with obs-text",
            b"GET / HTTP/1.1\r\nHost: h\xff\r\n\r\n",
            400,
        ),
        // ---- header syntax --------------------------------------------------------------
        err(
            "space before colon",
            "GET / HTTP/1.1\r\nHost : x\r\n\r\n",
            400,
        ),
        err(
            "tab before colon",
            "GET / HTTP/1.1\r\nHost\t: x\r\n\r\n",
            400,
        ),
        err("space in name", get("X Y: z\r\n"), 400),
        err("empty name", get(": z\r\n"), 400),
        err("name with (", get("X(: z\r\n"), 400),
        err("name with non-ASCII", get("X\u{e9}: z\r\n"), 400),
        err("line without colon", get("Xyz\r\n"), 400),
        err("obs-fold with SP", get("X: a\r\n b\r\n"), 400),
        err("obs-fold with HTAB", get("X: a\r\n\tb\r\n"), 400),
        err(
            "first header line starts with SP",
            "GET / HTTP/1.1\r\n Host: x\r\n\r\n",
            400,
        ),
        err("NUL in value", get("X: a\0b\r\n"), 400),
        err("CR in value", get("X: a\rb\r\n"), 400),
        err("LF in value", get("X: a\nb\r\n"), 400),
        err("control byte in value", get("X: a\x01b\r\n"), 400),
        err("escape in value", get("X: a\x1bb\r\n"), 400),
        err("DEL in value", get("X: a\x7fb\r\n"), 400),
        // ---- request line ---------------------------------------------------------------
        err("control byte in target", line("GET /a\x01b HTTP/1.1"), 400),
        err("tab in target", line("GET /a\tb HTTP/1.1"), 400),
        err("space in target", line("GET /a b HTTP/1.1"), 400),
        err("DEL in target", line("GET /a\x7fb HTTP/1.1"), 400),
        err("UTF-8 in target", line("GET /caf\u{e9} HTTP/1.1"), 400),
        err(
            "invalid UTF-8 in target",
            b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        err("method with space", line("GE T / HTTP/1.1"), 400),
        err("method with (", line("G(T / HTTP/1.1"), 400),
        err("method with /", line("G/T / HTTP/1.1"), 400),
        err("empty method", line(" / HTTP/1.1"), 400),
        err("tab separator", line("GET\t/ HTTP/1.1"), 400),
        err("double space after method", line("GET  / HTTP/1.1"), 400),
        err("double space before version", line("GET /  HTTP/1.1"), 400),
        err("trailing space after version", line("GET / HTTP/1.1 "), 400),
        err("missing target", line("GET HTTP/1.1"), 400),
        err("HTTP/0.9 style line", "GET /\r\n\r\n", 400),
        err(
            "bare LF after request line",
            "GET / HTTP/1.1\nHost: x\r\n\r\n",
            400,
        ),
        err(
            "bare LF after header",
            "GET / HTTP/1.1\r\nHost: x\n\r\n",
            400,
        ),
        err("bare LF final line", "GET / HTTP/1.1\r\nHost: x\r\n\n", 400),
        err("bare LF everywhere", "GET / HTTP/1.1\nHost: x\n\n", 400),
        err(
            "bare LF leading line",
            "\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        err(
            "bare CR after request line",
            "GET / HTTP/1.1\rHost: x\r\n\r\n",
            400,
        ),
        err(
            "bare CR leading line",
            "\rGET / HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        err(
            "bare CR final line",
            "GET / HTTP/1.1\r\nHost: x\r\n\rX",
            400,
        ),
        // ---- target forms ---------------------------------------------------------------
        err(
            "authority-form on GET",
            line("GET example.com:80 HTTP/1.1"),
            400,
        ),
        err("bare name", line("GET example.com HTTP/1.1"), 400),
        err("asterisk on GET", line("GET * HTTP/1.1"), 400),
        err("relative path", line("GET a/b HTTP/1.1"), 400),
        err("query only", line("GET ?a HTTP/1.1"), 400),
        err("other scheme", line("GET ftp://h/ HTTP/1.1"), 400),
        err(
            "absolute-form without authority",
            line("GET http:///a HTTP/1.1"),
            400,
        ),
        err(
            "absolute-form scheme only",
            line("GET http:// HTTP/1.1"),
            400,
        ),
        err(
            "absolute-form single slash",
            line("GET http:/a HTTP/1.1"),
            400,
        ),
        err(
            "https without authority",
            line("GET https:// HTTP/1.1"),
            400,
        ),
        // RFC 9110 §4.2.4: userinfo in an http(s) URI is an error.
        err(
            "absolute-form with userinfo",
            line("GET http://u:p@h/ HTTP/1.1"),
            400,
        ),
        // RFC 9110 §9.3.6: CONNECT's target is host and port only.
        err("CONNECT origin-form", line("CONNECT /a HTTP/1.1"), 400),
        err(
            "CONNECT without port",
            line("CONNECT example.com HTTP/1.1"),
            400,
        ),
        err(
            "CONNECT empty port",
            line("CONNECT example.com: HTTP/1.1"),
            400,
        ),
        err(
            "CONNECT absolute-form",
            line("CONNECT http://h:80/ HTTP/1.1"),
            400,
        ),
        err("CONNECT asterisk", line("CONNECT * HTTP/1.1"), 400),
        err("CONNECT userinfo", line("CONNECT u@h:443 HTTP/1.1"), 400),
        // ---- version ---------------------------------------------------------------------
        err("HTTP/2.0", line("GET / HTTP/2.0"), 505),
        err("HTTP/3.0", line("GET / HTTP/3.0"), 505),
        err("HTTP/0.9", line("GET / HTTP/0.9"), 505),
        err("HTTP/2.0 bare LF", "GET / HTTP/2.0\n\n", 505),
        err("HTTP/1", line("GET / HTTP/1"), 400),
        err("HTTP/2", line("GET / HTTP/2"), 400),
        err("HTTP/1.1x", line("GET / HTTP/1.1x"), 400),
        err("HTTP/1.10", line("GET / HTTP/1.10"), 400),
        err("HTTP/2.00", line("GET / HTTP/2.00"), 400),
        err("HTTP/11.1", line("GET / HTTP/11.1"), 400),
        err("FOO/1.1", line("GET / FOO/1.1"), 400),
        err("lowercase http/1.1", line("GET / http/1.1"), 400),
        err("space before a 2.0 version", line("GET /a b HTTP/2.0"), 400),
        err("method with space before 2.0", line("GE T / HTTP/2.0"), 400),
        // ---- Expect ----------------------------------------------------------------------
        err(
            "Expect: something-else",
            post("Content-Length: 1\r\nExpect: something-else\r\n"),
            417,
        ),
        err(
            "Expect: 100-continue list",
            post("Expect: 100-continue, foo\r\n"),
            417,
        ),
        err("Expect: empty", post("Expect:\r\n"), 417),
        // ---- size limits ------------------------------------------------------------------
        err(
            "head over max_head (complete)",
            get(&format!("X: {}\r\n", "v".repeat(40))),
            431,
        )
        .limits(small_head()),
        err(
            "head over max_head (partial)",
            format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}", "v".repeat(100)),
            431,
        )
        .limits(small_head()),
        err(
            "head over max_head (only leading CRLFs)",
            "\r\n".repeat(40),
            431,
        )
        .limits(small_head()),
        err(
            "head one byte over max_head",
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
                "v".repeat(64 - 16 - 9 - 3 - 2 - 2 + 1)
            ),
            431,
        )
        .limits(small_head()),
        err("101 headers", many_headers(101), 431),
        err("4 headers with max_headers 3", many_headers(4), 431).limits(three_headers()),
        err("target over max_target (complete)", target_of(17), 414).limits(small_target()),
        err(
            "target over max_target (request line still open)",
            format!("GET /{}", "a".repeat(40)),
            414,
        )
        .limits(small_target()),
        err(
            "target over max_target after leading CRLF (still open)",
            format!("\r\nGET /{}", "a".repeat(40)),
            414,
        )
        .limits(small_target()),
        err(
            "target over max_target and head over max_head",
            target_of(200),
            414,
        )
        .limits(
            Limits::builder()
                .max_target(16)
                .max_head(64)
                .build()
                .expect("valid limits"),
        ),
        err("default max_target", target_of(8 * 1024 + 1), 414),
        err(
            "absolute-form with empty host",
            line("GET http://:80/ HTTP/1.1"),
            400,
        ),
        err(
            "absolute-form with bad port",
            line("GET http://h:x/ HTTP/1.1"),
            400,
        ),
        err(
            "absolute-form with fragment",
            line("GET http://h#f HTTP/1.1"),
            400,
        ),
        // RFC 9112 §3.2: origin-form is absolute-path [ "?" query ]; a fragment is the
        // client's business and never sent.
        err(
            "origin-form with fragment",
            line("GET /#frag HTTP/1.1"),
            400,
        ),
        err("fragment after a query", line("GET /a?b#c HTTP/1.1"), 400),
        err(
            "fragment past the first 16 bytes",
            line("GET /abcdefghijklmnopqrstuvwxyz#c HTTP/1.1"),
            400,
        ),
        // One Content-Length field with one value, however it is spelled (RFC 9110 §8.6 lets a
        // server refuse both, as nginx does).
        err(
            "duplicate identical Content-Length lines",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
            400,
        ),
        err(
            "Content-Length list of identical values",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
            400,
        ),
        err(
            "Host with bad port",
            "GET / HTTP/1.1\r\nHost: h:8x\r\n\r\n",
            400,
        ),
        err(
            "Host with unclosed IPv6",
            "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
            400,
        ),
        // ---- the first problem in stream order wins, as it would byte by byte ---------------
        err(
            "long target, then a bad header",
            format!("GET /{} HTTP/1.1\r\nBad\0: x\r\n\r\n", "a".repeat(40)),
            414,
        )
        .limits(small_target()),
        err(
            "long target, then bare LF",
            format!("GET /{} HTTP/1.1\nHost: x\n\n", "a".repeat(40)),
            414,
        )
        .limits(small_target()),
        err(
            "bad method, then a long target",
            format!("G(T /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(40)),
            400,
        )
        .limits(small_target()),
        err(
            "bad byte in the target before it gets too long",
            format!("GET /a\x01{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(40)),
            400,
        )
        .limits(small_target()),
        err(
            "bad header inside max_head, head longer than max_head",
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\nA\0: b\r\nX: {}\r\n\r\n",
                "v".repeat(80)
            ),
            400,
        )
        .limits(small_head()),
        err(
            "bad header beyond max_head",
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\nA\0: b\r\n\r\n",
                "v".repeat(80)
            ),
            431,
        )
        .limits(small_head()),
        err(
            "too many headers and too large: the count comes first",
            many_headers(20),
            431,
        )
        .limits(
            Limits::builder()
                .max_headers(3)
                .max_head(200)
                .build()
                .expect("valid limits"),
        ),
        err("max_headers 0", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 431).limits(
            Limits::builder()
                .max_headers(0)
                .build()
                .expect("valid limits"),
        ),
    ];
    // Every control byte and DEL in a header value, and in a header name.
    for b in (0u8..0x20).chain([0x7f]) {
        if b == b'\t' {
            continue;
        }
        let mut v = b"GET / HTTP/1.1\r\nHost: x\r\nX: a".to_vec();
        v.push(b);
        v.extend_from_slice(b"b\r\n\r\n");
        cases.push(err(&format!("value byte {b:#04x}"), v, 400));
        let mut n = b"GET / HTTP/1.1\r\nHost: x\r\nX".to_vec();
        n.push(b);
        n.extend_from_slice(b"Y: z\r\n\r\n");
        cases.push(err(&format!("name byte {b:#04x}"), n, 400));
        let mut t = b"GET /a".to_vec();
        t.push(b);
        t.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
        cases.push(err(&format!("target byte {b:#04x}"), t, 400));
    }
    cases
}

fn partial_cases() -> Vec<HeadCase> {
    vec![
        partial("only CRLF", "\r\n"),
        partial("request line only", "GET / HTTP/1.1\r\n"),
        partial("no final CRLF", "GET / HTTP/1.1\r\nHost: x\r\n"),
        partial("final CR only", "GET / HTTP/1.1\r\nHost: x\r\n\r"),
        partial("version prefix", "GET / HTTP/1."),
        partial("other version, line open", "GET / HTTP/2.0"),
        partial("other version prefix", "GET / HTTP/2"),
    ]
}

#[test]
fn valid_heads() {
    let n = run_head_cases(valid_cases());
    eprintln!("{n} valid head cases");
    assert!(n >= 50, "{n}");
}

#[test]
fn rejected_heads() {
    let n = run_head_cases(rejected_cases());
    eprintln!("{n} rejected head cases");
    assert!(n >= 100, "{n}");
}

#[test]
fn partial_heads() {
    run_head_cases(partial_cases());
}

/// Every valid case also parses when split into two pieces at every offset.
#[test]
fn valid_heads_split_everywhere() {
    for case in valid_cases() {
        let whole = common::parse_whole(&case.input, case.limits);
        for cut in 1..case.input.len() {
            let split = common::parse_split(&case.input, &[cut], case.limits);
            assert_eq!(split, whole, "{} split at {cut}", case.name);
        }
    }
}

/// The error message names the problem (`Display`), and `Error::status` covers every variant.
#[test]
fn error_display_and_status() {
    use canter_h1::Error;
    let table: [(Error, u16, &str); 8] = [
        (
            Error::Malformed(canter_h1::Malformed::BareLf),
            400,
            "malformed request: bare LF line ending",
        ),
        (
            Error::BadBody(canter_h1::BadBody::ChunkSizeNotHex),
            400,
            "malformed request body: chunk size is not hex",
        ),
        (
            Error::HeadersTooLarge,
            431,
            "request header section too large",
        ),
        (Error::UriTooLong, 414, "request target too long"),
        (Error::BodyTooLarge, 413, "request body too large"),
        (
            Error::VersionNotSupported,
            505,
            "HTTP version not supported",
        ),
        (
            Error::UnsupportedTransferCoding,
            501,
            "unsupported transfer coding",
        ),
        (Error::ExpectationFailed, 417, "unsupported expectation"),
    ];
    for (e, status, text) in table {
        assert_eq!(e.status(), status, "{e:?}");
        assert_eq!(e.to_string(), text);
    }
}
