//! The demo server over raw sockets: framing, keep-alive, pipelining and strict parsing.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::thread;
use std::time::Duration;

use common::{assert_standard_headers, echo_request, random_bytes, Server};

const JSON: &str = r#"{"message":"Hello, World!"}"#;

#[test]
fn keep_alive_three_requests_on_one_connection() {
    let server = Server::start();
    let mut c = server.client();
    for path in ["/plaintext", "/json", "/plaintext"] {
        let r = c.get(path);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.reason, "OK");
        assert_standard_headers(&r);
        assert!(r.header("connection").is_none(), "{r:?}");
        if path == "/json" {
            assert_eq!(r.text(), JSON);
            assert_eq!(r.header("content-type"), Some("application/json"));
            assert_eq!(r.header("content-length"), Some("27"));
        } else {
            assert_eq!(r.text(), "Hello, World!");
            assert_eq!(r.header("content-type"), Some("text/plain"));
            assert_eq!(r.header("content-length"), Some("13"));
        }
    }
}

#[test]
fn exact_plaintext_response_bytes() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/plaintext");
    let date = r.header("date").unwrap().to_owned();
    let expected = format!(
        "HTTP/1.1 200 OK\r\nServer: canter\r\nDate: {date}\r\nContent-Length: 13\r\n\
         Content-Type: text/plain\r\n\r\n"
    );
    assert_eq!(String::from_utf8_lossy(&r.head), expected);
    assert_eq!(r.body, b"Hello, World!");
}

#[test]
fn http10_without_keep_alive_closes() {
    let server = Server::start();
    let mut c = server.client();
    c.send("GET /plaintext HTTP/1.0\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "Hello, World!");
    assert_standard_headers(&r);
    assert!(
        r.closes(),
        "HTTP/1.0 response says Connection: close: {r:?}"
    );
    c.expect_eof();
}

#[test]
fn http10_with_keep_alive_stays_open() {
    let server = Server::start();
    let mut c = server.client();
    for _ in 0..2 {
        c.send("GET /json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        let r = c.response();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), JSON);
        assert_eq!(r.header("connection"), Some("keep-alive"), "{r:?}");
        assert_eq!(r.header("content-length"), Some("27"));
    }
    // Still open: a third request without keep-alive is answered, then the server closes.
    c.send("GET /plaintext HTTP/1.0\r\n\r\n");
    let r = c.response();
    assert_eq!(r.text(), "Hello, World!");
    assert!(r.closes());
    c.expect_eof();
}

#[test]
fn connection_close_on_http11() {
    let server = Server::start();
    let mut c = server.client();
    c.send("GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "Hello, World!");
    assert_eq!(r.header("connection"), Some("close"));
    c.expect_eof();
}

#[test]
fn sixteen_pipelined_requests_in_one_write() {
    let server = Server::start();
    let mut c = server.client();
    let mut batch = Vec::new();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for i in 0..16 {
        match i % 4 {
            0 | 3 => {
                batch.extend_from_slice(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
                expected.push(b"Hello, World!".to_vec());
            }
            1 => {
                batch.extend_from_slice(b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n");
                expected.push(JSON.as_bytes().to_vec());
            }
            _ => {
                let body = format!("echo body number {i}");
                batch.extend(echo_request(body.as_bytes()));
                expected.push(body.into_bytes());
            }
        }
    }
    c.send(&batch);
    for (i, want) in expected.iter().enumerate() {
        let r = c.response();
        assert_eq!(r.status, 200, "response {i}: {r:?}");
        assert_eq!(
            r.body,
            *want,
            "response {i} out of order or wrong: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(!r.closes());
    }
    // The connection is still usable.
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn bad_request_in_the_middle_of_a_pipeline() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /json HTTP/1.1\r\nHost: x\r\n\r\n\
         POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n\
         GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, JSON));
    let r = c.response();
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.reason, "Bad Request");
    assert_eq!(r.header("connection"), Some("close"));
    assert_standard_headers(&r);
    c.expect_eof();
}

#[test]
fn head_has_length_but_no_body() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "HEAD /plaintext HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n\
         HEAD /bytes/100000 HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /json HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let r = c.head_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("13"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    // If the HEAD response had carried body bytes, this would not parse as a status line.
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
    let r = c.head_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100000"));
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, JSON));
}

#[test]
fn chunked_request_body_with_extensions_and_trailer() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
         5;foo=bar\r\nHello\r\n\
         7;a;b=\"quoted value\"\r\n, World\r\n\
         1\r\n!\r\n\
         A\r\n0123456789\r\n\
         0;last\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n\
         GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let r = c.response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "Hello, World!0123456789");
    assert_eq!(r.header("content-length"), Some("23"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    // The trailer section was consumed exactly: the next pipelined request parses.
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
}

#[test]
fn chunked_body_split_across_writes() {
    let server = Server::start();
    let mut c = server.client();
    let body = random_bytes(300_000, 7);
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for piece in body.chunks(70_001) {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(piece);
        chunk.extend_from_slice(b"\r\n");
        // Split every chunk mid-way (including inside the size line and CRLFs).
        let (a, b) = chunk.split_at(chunk.len() / 2);
        c.send(a);
        thread::sleep(Duration::from_millis(5));
        c.send(b);
    }
    c.send("0\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());
    assert!(r.body == body, "echoed body differs");
}

#[test]
fn request_sent_byte_by_byte() {
    let server = Server::start();
    let mut c = server.client();
    let req = echo_request(b"slowly, one byte at a time");
    for b in &req {
        c.stream.write_all(&[*b]).unwrap();
        thread::sleep(Duration::from_millis(3));
    }
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "slowly, one byte at a time");
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let server = Server::start();
    let mut c = server.client();
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n");
    // The server must ask for the body before we send it.
    let interim = c.read_exact_bytes(25);
    assert_eq!(
        String::from_utf8_lossy(&interim),
        "HTTP/1.1 100 Continue\r\n\r\n"
    );
    c.send("hello world");
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "hello world");
    assert!(!r.closes(), "{r:?}");
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn expect_100_continue_with_too_large_body_gets_413_without_continue() {
    let server = Server::start();
    let mut c = server.client();
    c.send(format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        16 * 1024 * 1024 + 1
    ));
    let r = c.response();
    assert_eq!(r.status, 413, "no 100 Continue first: {r:?}");
    assert_eq!(r.reason, "Content Too Large");
    assert!(r.closes());
    c.expect_eof();
}

#[test]
fn unknown_expectation_is_417() {
    let server = Server::start();
    let mut c = server.client();
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: magic\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 417, "{r:?}");
    assert!(r.closes());
}

#[test]
fn too_large_chunked_echo_is_413() {
    let server = Server::start();
    let mut c = server.client();
    // 17 MiB in 1 MiB chunks; the server may stop reading early, so write from a thread.
    let mut writer = c.stream.try_clone().unwrap();
    let t = thread::spawn(move || {
        let chunk = vec![b'z'; 1 << 20];
        let _ = writer
            .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
        for _ in 0..17 {
            if writer.write_all(b"100000\r\n").is_err()
                || writer.write_all(&chunk).is_err()
                || writer.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
        let _ = writer.write_all(b"0\r\n\r\n");
    });
    let r = c.response();
    assert_eq!(r.status, 413, "{r:?}");
    assert!(r.closes());
    drop(c);
    t.join().unwrap();
}

fn single_error(server: &Server, request: &[u8], status: u16) -> common::Response {
    let mut c = server.client();
    c.send(request);
    let r = c.response();
    assert_eq!(
        r.status,
        status,
        "request {:?} -> {r:?}",
        String::from_utf8_lossy(&request[..request.len().min(200)])
    );
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert_standard_headers(&r);
    // The connection ends. When the server stopped reading before the end of the request, the
    // end may be a reset rather than a FIN (see `error_response_with_unread_request_bytes`).
    let (rest, end) = c.drain();
    assert!(rest.is_empty(), "bytes after the error response: {rest:?}");
    if let Err(e) = end {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    r
}

#[test]
fn header_section_too_large_is_431() {
    let server = Server::start();
    let big = "a".repeat(20 * 1024);
    let r = single_error(
        &server,
        format!("GET /plaintext HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes(),
        431,
    );
    assert_eq!(r.reason, "Request Header Fields Too Large");
}

#[test]
fn target_too_long_is_414() {
    let server = Server::start();
    let long = "a".repeat(9 * 1024);
    let r = single_error(
        &server,
        format!("GET /{long} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        414,
    );
    assert_eq!(r.reason, "URI Too Long");
}

#[test]
fn missing_host_is_400() {
    let server = Server::start();
    single_error(&server, b"GET /plaintext HTTP/1.1\r\n\r\n", 400);
    single_error(
        &server,
        b"GET /plaintext HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        400,
    );
}

#[test]
fn http2_version_is_505() {
    let server = Server::start();
    let r = single_error(&server, b"GET /plaintext HTTP/2.0\r\nHost: x\r\n\r\n", 505);
    assert_eq!(r.reason, "HTTP Version Not Supported");
}

/// RFC 9110 §2.5: a request with a higher minor version is served as HTTP/1.1, keep-alive
/// included; the response says HTTP/1.1.
#[test]
fn http_1_2_is_served_as_1_1() {
    let server = Server::start();
    let mut c = server.client();
    for _ in 0..2 {
        c.send(b"GET /plaintext HTTP/1.2\r\nHost: x\r\n\r\n");
        let r = c.response();
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.head.starts_with(b"HTTP/1.1 200 OK\r\n"), "{r:?}");
        assert_eq!(r.text(), "Hello, World!");
        assert!(!r.closes(), "{r:?}");
    }
}

/// A target has no fragment in RFC 9112's grammar: `#` in it is a 400, not a lookup of the
/// path before it.
#[test]
fn fragment_in_the_target_is_400() {
    let server = Server::start();
    for req in [
        &b"GET /#frag HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"GET /plaintext#x HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /plaintext?a=1#x HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        single_error(&server, req, 400);
    }
}

/// Content-Length once, with one value: two equal lines are refused like `5, 5`.
#[test]
fn repeated_content_length_is_400_however_spelled() {
    let server = Server::start();
    for req in [
        &b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab"[..],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\nab",
    ] {
        single_error(&server, req, 400);
    }
}

#[test]
fn transfer_encoding_with_content_length_is_400() {
    let server = Server::start();
    single_error(
        &server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        400,
    );
}

#[test]
fn gzip_transfer_coding_is_501() {
    let server = Server::start();
    let r = single_error(
        &server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        501,
    );
    assert_eq!(r.reason, "Not Implemented");
}

#[test]
fn other_framing_errors_are_400() {
    let server = Server::start();
    // Conflicting Content-Length values.
    single_error(
        &server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        400,
    );
    // Bare LF line endings.
    single_error(&server, b"GET /plaintext HTTP/1.1\nHost: x\n\n", 400);
    // Final coding not chunked.
    single_error(
        &server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        400,
    );
    // Bad chunk size.
    let mut c = server.client();
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    let r = c.response();
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.closes());
    c.expect_eof();
}

#[test]
fn absolute_form_target() {
    let server = Server::start();
    let mut c = server.client();
    c.send("GET http://x/plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
    c.send("GET http://x/json?q=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, JSON));
}

#[test]
fn bytes_endpoint_exact_lengths() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/bytes/0");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("0"));
    assert!(r.body.is_empty());
    let r = c.get("/bytes/1048576");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1048576"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.body.len(), 1 << 20);
    assert!(r.body.iter().all(|&b| b == b'x'));
    let r = c.get("/bytes/65537");
    assert_eq!(r.body.len(), 65537);
    // Still in sync after the streamed bodies.
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
    let r = c.get("/bytes/1073741825");
    assert_eq!(r.status, 400);
    let r = c.get("/bytes/abc");
    assert_eq!(r.status, 400);
}

#[test]
fn not_found_and_method_not_allowed() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.reason, "Not Found");
    assert_eq!(r.text(), "no such endpoint\n");
    assert_standard_headers(&r);

    c.send("DELETE /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 405);
    assert_eq!(r.reason, "Method Not Allowed");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));

    let r = c.get("/echo");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));

    c.send("POST /bytes/10 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    let r = c.response();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    // The unread 3-byte body was discarded; the connection stays in sync.
    assert!(!r.closes(), "{r:?}");
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn index_page() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r.text().starts_with("<!doctype html>"));
}

#[test]
fn date_header_is_imf_fixdate() {
    let server = Server::start();
    let mut c = server.client();
    for path in ["/plaintext", "/nope", "/bytes/3"] {
        let r = c.get(path);
        let date = r.header("date").unwrap();
        assert_eq!(date.len(), 29, "{date:?}");
        assert!(date.ends_with("GMT"), "{date:?}");
        common::assert_imf_fixdate(date);
    }
}

/// A client that writes its whole request before reading (as Python's http.client does) must
/// still get the error response when the server rejects the request early. The server closes
/// with the rest of the body unread, so the kernel answers the client's next segments with a
/// reset and the client's write fails (EPIPE/ECONNRESET) before it ever reads the 413.
#[test]
fn error_response_with_unread_request_bytes() {
    let server = Server::start();
    let mut c = server.client();
    let body = vec![b'z'; 17 << 20];
    let mut req = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let sent = c.stream.write_all(&req);
    assert!(
        sent.is_ok(),
        "write of the request failed ({sent:?}): the server reset the connection"
    );
    let r = c.response();
    assert_eq!(r.status, 413);
}

#[test]
fn connection_close_in_a_pipeline_stops_there() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n\
         GET /json HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let r = c.response();
    assert_eq!(r.text(), "Hello, World!");
    assert!(r.closes());
    let (rest, _) = c.drain();
    assert!(rest.is_empty(), "answered past Connection: close: {rest:?}");
}

#[test]
fn more_framing_and_syntax_errors() {
    let server = Server::start();
    // Transfer-Encoding in HTTP/1.0.
    single_error(
        &server,
        b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        400,
    );
    // obs-fold.
    single_error(
        &server,
        b"GET /plaintext HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
        400,
    );
    // Whitespace between field name and colon.
    single_error(&server, b"GET /plaintext HTTP/1.1\r\nHost : x\r\n\r\n", 400);
    // Signed Content-Length.
    single_error(
        &server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
        400,
    );
    // Too many header fields.
    let mut many = String::from("GET /plaintext HTTP/1.1\r\nHost: x\r\n");
    for i in 0..150 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    single_error(&server, many.as_bytes(), 431);
    // A control byte in a header value.
    single_error(
        &server,
        b"GET /plaintext HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        400,
    );
}

#[test]
fn empty_line_before_request_line_is_ignored() {
    // RFC 9112 section 2.2: a server SHOULD ignore at least one empty line before a request line
    // (some clients send an extra CRLF after a POST body).
    let server = Server::start();
    let mut c = server.client();
    c.send(echo_request(b"abc"));
    c.send("\r\nGET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.response().text(), "abc");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
}

#[test]
fn echo_at_exactly_the_limit() {
    let server = Server::start();
    let mut c = server.client();
    let body = random_bytes(16 * 1024 * 1024, 3);
    let mut writer = c.stream.try_clone().unwrap();
    let req = echo_request(&body);
    let t = thread::spawn(move || writer.write_all(&req));
    let r = c.response();
    t.join().unwrap().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());
    assert!(r.body == body);
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn handler_not_reading_an_expected_body_closes() {
    // 405 without reading the body the client holds back: the server cannot know whether the
    // client will send it, so it must close (and say so).
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "POST /plaintext HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    let r = c.response();
    assert_eq!(r.status, 405, "no 100 Continue first: {r:?}");
    assert!(r.closes(), "{r:?}");
    c.expect_eof();
}

/// When the body came along with the head (the client did not wait for 100 Continue) and the
/// handler read it all, nothing is ambiguous: the connection should stay open.
#[test]
fn expect_continue_with_the_body_already_sent_keeps_the_connection() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
    );
    let mut r = c.response();
    if r.status == 100 {
        r = c.response();
    }
    assert_eq!((r.status, r.text()), (200, "hello"));
    assert!(
        !r.closes(),
        "closed although the whole body was received: {r:?}"
    );
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

/// A handler that does not read a large body: the server will not discard more than 64 KiB, so
/// it closes — and then the response must say `Connection: close`.
#[test]
fn unread_large_body_response_says_close() {
    let server = Server::start();
    let mut c = server.client();
    // Head only; the 100 000-byte body is not sent before the response.
    c.send("POST /bytes/10 HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 405);
    if r.closes() {
        c.expect_eof();
    } else {
        // Promised keep-alive: the server must then accept the body and the next request.
        let mut rest = vec![b'z'; 100_000];
        rest.extend_from_slice(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
        let sent = c.stream.write_all(&rest);
        assert!(
            sent.is_ok(),
            "keep-alive promised by {r:?}, but sending failed: {sent:?}"
        );
        // (A reset here panics in the reader: the server closed after promising keep-alive.)
        let r2 = c.response();
        assert_eq!(
            (r2.status, r2.text()),
            (200, "Hello, World!"),
            "after {r:?}"
        );
    }
}

#[test]
fn chunk_size_overflow_is_rejected() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
         fffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
    );
    let r = c.response();
    assert!(matches!(r.status, 400 | 413), "{r:?}");
    assert!(r.closes());
}

#[test]
fn half_closed_client_still_gets_its_responses() {
    let server = Server::start();
    let mut c = server.client();
    c.send(
        "GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n\
         POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    );
    c.shutdown_write();
    assert_eq!(c.response().text(), "Hello, World!");
    assert_eq!(c.response().text(), "abc");
    c.expect_eof();
}

#[test]
fn large_echo_then_pipelined_request() {
    let server = Server::start();
    let mut c = server.client();
    let body = random_bytes(1 << 20, 11);
    let mut batch = echo_request(&body);
    batch.extend_from_slice(b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut writer = c.stream.try_clone().unwrap();
    let t = thread::spawn(move || writer.write_all(&batch));
    let r = c.response();
    assert_eq!(r.status, 200);
    assert!(r.body == body, "echo differs");
    assert_eq!(c.response().text(), JSON);
    t.join().unwrap().unwrap();
}

#[test]
fn clients_vanishing_mid_response_do_not_hurt_the_server() {
    let mut server = Server::start();
    for i in 0..20 {
        let mut c = server.client();
        c.send("GET /bytes/10000000 HTTP/1.1\r\nHost: x\r\n\r\n");
        if i % 2 == 0 {
            let r = c.response_head();
            assert_eq!(r.status, 200);
            c.skip_bytes(100_000, |_| {});
        }
        drop(c);
        // Half-sent heads and bodies, abandoned.
        let mut c = server.client();
        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc");
        drop(c);
    }
    assert!(
        server.wait_exit(Duration::from_millis(100)).is_none(),
        "server died"
    );
    let mut c = server.client();
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn query_string_does_not_affect_routing() {
    let server = Server::start();
    let mut c = server.client();
    assert_eq!(c.get("/plaintext?a=1&b=%20").text(), "Hello, World!");
    assert_eq!(c.get("/bytes/5?x").body, b"xxxxx");
    assert_eq!(c.get("/plaintext/").status, 404);
}

/// A small chunked body the handler never reads is dropped like a Content-Length body of the
/// same size, so the pipelined requests behind it are still served on the same connection:
/// whether the body came with its head or after the response.
#[test]
fn small_unread_chunked_body_is_drained_like_content_length() {
    let server = Server::start();
    let mut c = server.client();
    for body in [
        "Content-Length: 5\r\n\r\nhello",
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\nx-trailer: 1\r\n\r\n",
    ] {
        // `/plaintext` is GET only: the 405 is answered without reading the body.
        c.send(format!(
            "POST /plaintext HTTP/1.1\r\nHost: x\r\n{body}GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n"
        ));
        let r = c.response();
        assert_eq!(r.status, 405, "{r:?}");
        assert!(!r.closes(), "{body:?}: {r:?}");
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, "Hello, World!"), "{body:?}");
    }
    // The body still on its way when the answer leaves (a client may wait for the answer
    // before sending it): read and dropped after it.
    for (framing, body) in [
        ("Transfer-Encoding: chunked", "400\r\n{x}\r\n0\r\n\r\n"),
        ("Content-Length: 1024", "{x}"),
    ] {
        c.send(format!(
            "POST /plaintext HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n"
        ));
        let r = c.response();
        assert_eq!(r.status, 405, "{r:?}");
        assert!(!r.closes(), "{r:?}");
        c.send(body.replace("{x}", &"x".repeat(0x400)));
        c.send("GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, "Hello, World!"), "{framing}");
    }
}

/// A chunked body the handler leaves unread that grows past the drain bound (64 KiB) closes
/// the connection after the answer: the request behind it is not read.
#[test]
fn large_unread_chunked_body_closes() {
    let server = Server::start();
    let mut c = server.client();
    let mut req =
        b"POST /plaintext HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..80 {
        req.extend_from_slice(b"400\r\n");
        req.extend_from_slice(&[b'x'; 0x400]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\nGET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
    c.send(req);
    let r = c.response();
    assert_eq!(r.status, 405, "{r:?}");
    let (rest, _) = c.drain();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

/// `OPTIONS *` asks about the server as a whole (RFC 9110 §9.3.7): 204 with the methods some
/// route serves. The asterisk with another method is a 400.
#[test]
fn options_asterisk_is_204_with_allow() {
    let server = Server::start();
    let mut c = server.client();
    c.send("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.header("allow"), Some("GET, HEAD, POST, OPTIONS"), "{r:?}");
    assert!(r.head.windows(7).any(|w| w == b"\r\nAllow"), "{r:?}");
    assert!(r.body.is_empty());
    // The connection goes on.
    assert_eq!(c.get("/plaintext").status, 200);
    single_error(&server, b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400);
}

/// Every field name goes out in one case, the application's and the server's alike.
#[test]
fn field_names_go_out_in_one_case() {
    let server = Server::start();
    let mut c = server.client();
    c.send("DELETE /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 405, "{r:?}");
    for (name, _) in &r.headers {
        let canonical: String = name
            .split('-')
            .map(|w| {
                let (first, rest) = w.split_at(1);
                first.to_ascii_uppercase() + &rest.to_ascii_lowercase()
            })
            .collect::<Vec<_>>()
            .join("-");
        assert_eq!(*name, canonical, "{r:?}");
    }
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}
