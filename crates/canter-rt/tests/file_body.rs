//! `Body::File` over real sockets on 127.0.0.1: the head carries Content-Length, the bytes are
//! the file's (whole or a span), HEAD sends none, pipelined responses stay in order, a multi-MiB
//! file reaches a slow reader intact while the worker keeps answering other connections, a file
//! shorter than promised (or truncated while it is being sent) closes the connection instead of
//! ending the response, the write timeout applies, and a graceful shutdown lets the transfer
//! finish.
//!
//! Each test runs its own in-process server (one worker) and its own files under
//! `CARGO_TARGET_TMPDIR`.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use canter_rt::http::StatusCode;
use canter_rt::{Body, Config, Reply, Request, Response};
use canter_testkit::random_bytes;

use canter_testkit::read_some;
use common::{test_config, test_timeouts, TestServer};

/// A fresh directory for one test.
fn test_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "file_body-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Serves files of `dir`:
/// - `/f/<name>`: the whole file;
/// - `/span/<name>/<offset>/<len>`: `len` bytes from `offset`;
/// - `/short/<name>`: the file, promising 1000 bytes more than it has;
/// - `/hello`: a small text body.
fn start(config: Config, dir: PathBuf) -> TestServer {
    TestServer::start(config, move |_worker| {
        let dir = dir.clone();
        move |req: Request| -> Reply { serve(&dir, &req).into() }
    })
}

fn serve(dir: &Path, req: &Request) -> Response {
    let path = req.path();
    if path == "/hello" {
        return Response::text("hello");
    }
    let mut parts = path.trim_start_matches('/').split('/');
    let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let Ok(file) = File::open(dir.join(name)) else {
        return Response::new(StatusCode::NOT_FOUND);
    };
    let size = file.metadata().unwrap().len();
    let body = match kind {
        "f" => Body::file(file, 0, size),
        "short" => Body::file(file, 0, size + 1000),
        "span" => {
            let offset = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let len = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            Body::file(file, offset, len)
        }
        _ => return Response::new(StatusCode::NOT_FOUND),
    };
    Response::new(StatusCode::OK).with_body(body)
}

#[test]
fn whole_file_then_keep_alive() {
    let dir = test_dir("whole");
    let data = random_bytes(100_000, 1);
    std::fs::write(dir.join("a.bin"), &data).unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    for _ in 0..3 {
        let r = c.get("/f/a.bin");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("content-length"), Some("100000"), "{r:?}");
        assert!(r.header("transfer-encoding").is_none(), "{r:?}");
        assert!(!r.closes(), "{r:?}");
        assert!(r.body == data, "body differs from the file");
    }
    assert_eq!(c.get("/hello").text(), "hello");
}

#[test]
fn empty_file_and_span() {
    let dir = test_dir("span");
    let data = random_bytes(10_000, 2);
    std::fs::write(dir.join("a.bin"), &data).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    let r = c.get("/f/empty");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-length"), Some("0"), "{r:?}");
    let r = c.get("/span/a.bin/1234/5000");
    assert_eq!(r.header("content-length"), Some("5000"), "{r:?}");
    assert!(r.body == data[1234..6234], "span differs");
    let r = c.get("/span/a.bin/9999/1");
    assert_eq!(r.body, &data[9999..]);
    let r = c.get("/span/a.bin/10000/0");
    assert_eq!(r.header("content-length"), Some("0"), "{r:?}");
    assert!(!r.closes(), "{r:?}");
    assert_eq!(c.get("/hello").text(), "hello");
}

#[test]
fn head_sends_no_body() {
    let dir = test_dir("head");
    std::fs::write(dir.join("a.bin"), random_bytes(300_000, 3)).unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    c.send("HEAD /f/a.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.head_response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-length"), Some("300000"), "{r:?}");
    // The next response follows the head directly: not one body byte in between.
    let r = c.get("/hello");
    assert_eq!(r.text(), "hello", "{r:?}");
}

#[test]
fn pipelined_responses_stay_in_order() {
    let dir = test_dir("pipeline");
    let a = random_bytes(70_000, 4);
    let b = random_bytes(5, 5);
    std::fs::write(dir.join("a"), &a).unwrap();
    std::fs::write(dir.join("b"), &b).unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    let mut batch = String::new();
    for path in ["/hello", "/f/a", "/hello", "/f/b", "/f/a"] {
        batch.push_str(&format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
    }
    c.send(batch);
    assert_eq!(c.response().text(), "hello");
    assert!(c.response().body == a);
    assert_eq!(c.response().text(), "hello");
    assert_eq!(c.response().body, b);
    assert!(c.response().body == a);
    assert_eq!(c.get("/hello").text(), "hello");
}

/// 8 MiB to a reader that first stalls, then reads in small pieces with pauses: every byte
/// arrives in order, and meanwhile the one worker answers another connection at once.
#[test]
fn large_file_to_a_slow_reader() {
    const LEN: usize = 8 << 20;
    let dir = test_dir("large");
    let data = random_bytes(LEN, 6);
    std::fs::write(dir.join("big"), &data).unwrap();
    let server = start(test_config(), dir);
    let mut slow = server.client();
    slow.send("GET /f/big HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = slow.response_head();
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-length"), Some("8388608"), "{head:?}");
    // The socket buffers fill up: the server is now waiting for writability.
    thread::sleep(Duration::from_millis(300));
    let mut other = server.client();
    let start = Instant::now();
    assert_eq!(other.get("/hello").text(), "hello");
    // A worker stuck in the transfer would not answer before the slow reader reads (the client
    // would time out); the bound only keeps the test honest on a busy machine.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "worker blocked by the file transfer: {:?}",
        start.elapsed()
    );
    let mut got = Vec::with_capacity(LEN);
    let mut pieces = 0u32;
    slow.skip_bytes(LEN as u64, |piece| {
        got.extend_from_slice(piece);
        pieces += 1;
        if pieces == 16 {
            pieces = 0;
            thread::sleep(Duration::from_millis(2));
        }
    });
    assert!(got == data, "the received bytes differ from the file");
    assert_eq!(slow.get("/hello").text(), "hello");
}

/// A file shorter than the length promised (as if truncated after it was measured): the
/// connection closes after the bytes the file has, without a false end.
#[test]
fn short_file_closes_the_connection() {
    let dir = test_dir("short");
    let data = random_bytes(50_000, 7);
    std::fs::write(dir.join("a"), &data).unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    c.send("GET /short/a HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response_head();
    assert_eq!(r.header("content-length"), Some("51000"), "{r:?}");
    let (rest, end) = c.drain();
    assert!(end.is_ok(), "clean close expected: {end:?}");
    assert!(rest == data, "exactly the file's bytes, then EOF");
    server.wait_idle(Duration::from_secs(5), "short file");
}

/// The file is truncated while the server waits for the client to read: the client gets what
/// was already queued and then the end of the connection, never the promised length.
#[test]
fn file_truncated_under_the_server() {
    const LEN: usize = 24 << 20;
    let dir = test_dir("truncate");
    let data = random_bytes(LEN, 8);
    let path = dir.join("big");
    std::fs::write(&path, &data).unwrap();
    let server = start(test_config(), dir);
    let mut c = server.client();
    c.send("GET /f/big HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response_head();
    assert_eq!(r.header("content-length"), Some(&*LEN.to_string()), "{r:?}");
    // Let the socket buffers fill, then cut the file down under the server.
    thread::sleep(Duration::from_millis(300));
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let (rest, end) = c.drain();
    assert!(end.is_ok(), "clean close expected: {end:?}");
    assert!(rest.len() < LEN, "a false end: all {LEN} bytes arrived");
    assert!(rest.len() >= 1 << 20, "got only {} bytes", rest.len());
    // The part the file still has arrives intact. Bytes beyond it that were already queued in
    // the socket are the page cache's pages, by reference: truncation may have changed them, as
    // with any sendfile(2) server, so they are not compared.
    assert!(
        rest[..1 << 20] == data[..1 << 20],
        "bytes differ from the file"
    );
    server.wait_idle(Duration::from_secs(5), "truncated file");
}

/// A client that never reads: the connection is closed after the write timeout.
#[test]
fn write_timeout_applies() {
    let dir = test_dir("timeout");
    std::fs::write(dir.join("big"), random_bytes(32 << 20, 9)).unwrap();
    let timeouts = test_timeouts()
        .write(Duration::from_millis(500))
        .build()
        .expect("valid timeouts");
    let config = test_config()
        .to_builder()
        .timeouts(timeouts)
        .build()
        .expect("valid config");
    let server = start(config, dir);
    let mut c = server.client();
    c.send("GET /f/big HTTP/1.1\r\nHost: x\r\n\r\n");
    server.wait_accepted(1, Duration::from_secs(5));
    let waited = server.wait_idle(Duration::from_secs(5), "write timeout");
    assert!(
        waited >= Duration::from_millis(400),
        "closed too early: {waited:?}"
    );
    // What was sent is there, then the end: fewer bytes than promised.
    let head = c.response_head();
    assert_eq!(head.status, 200);
    let (rest, _) = c.drain();
    assert!(
        rest.len() < 32 << 20,
        "all bytes arrived despite the timeout"
    );
}

/// A graceful shutdown while a file is being sent lets the transfer finish, then closes.
#[test]
fn shutdown_lets_the_transfer_finish() {
    const LEN: usize = 6 << 20;
    let dir = test_dir("shutdown");
    let data = random_bytes(LEN, 10);
    std::fs::write(dir.join("big"), &data).unwrap();
    let mut server = start(test_config(), dir);
    let mut c = server.client();
    c.send("GET /f/big HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.response_head();
    assert_eq!(head.status, 200);
    thread::sleep(Duration::from_millis(200));
    server.begin_shutdown();
    let mut got = Vec::with_capacity(LEN);
    c.skip_bytes(LEN as u64, |p| got.extend_from_slice(p));
    assert!(got == data, "bytes differ from the file");
    let mut byte = [0u8; 1];
    match read_some(&mut c.stream, &mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection to close, got {other:?}"),
    }
    let (result, _) = server.stop_within(Duration::from_secs(5));
    result.unwrap();
}
