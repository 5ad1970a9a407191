//! Slow readers: the server must stop producing instead of buffering, so its memory stays flat.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use canter_testkit::read_some;
use common::Server;

const MIB: u64 = 1024;

#[test]
fn slow_reader_of_a_large_body() {
    let server = Server::start();
    // Warm up both workers' allocators and buffer pools.
    for _ in 0..4 {
        let mut c = server.client();
        assert_eq!(c.get("/bytes/1048576").body.len(), 1 << 20);
    }
    let before = server.rss_kib();

    let total: u64 = 64 << 20;
    let mut c = server.client();
    c.send(format!("GET /bytes/{total} HTTP/1.1\r\nHost: x\r\n\r\n"));
    let r = c.response_head();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("67108864"));

    // About 1 MiB/s for 2 s: 64 KiB every 62 ms.
    let mut got: u64 = 0;
    let start = Instant::now();
    let mut max_rss = before;
    while start.elapsed() < Duration::from_secs(2) {
        c.skip_bytes(64 * 1024, |_| {});
        got += 64 * 1024;
        max_rss = max_rss.max(server.rss_kib());
        thread::sleep(Duration::from_millis(62));
    }
    let growth = max_rss.saturating_sub(before);
    assert!(
        growth < 16 * MIB,
        "server RSS grew by {growth} KiB while the client read slowly ({before} KiB before)"
    );

    // Now read the rest quickly; every byte is 'x' and the length is exact.
    let mut bad = 0u64;
    c.skip_bytes(total - got, |piece| {
        bad += piece.iter().filter(|&&b| b != b'x').count() as u64;
    });
    assert_eq!(bad, 0);
    assert!(c.buffered().is_empty(), "bytes beyond Content-Length");
    // Still in sync.
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn pipelined_flood_without_reading() {
    let server = Server::start();
    for _ in 0..4 {
        let mut c = server.client();
        assert_eq!(c.get("/bytes/65536").body.len(), 65536);
    }
    let before = server.rss_kib();

    const N: usize = 2000;
    let mut c = server.client();
    let mut writer = c.stream.try_clone().unwrap();
    let request = b"GET /bytes/65536 HTTP/1.1\r\nHost: x\r\n\r\n";
    let batch: Vec<u8> = request.repeat(N);
    // The server stops reading once its output backs up, so this write blocks: use a thread.
    let t = thread::spawn(move || writer.write_all(&batch));

    let start = Instant::now();
    let mut max_rss = before;
    while start.elapsed() < Duration::from_secs(1) {
        max_rss = max_rss.max(server.rss_kib());
        thread::sleep(Duration::from_millis(50));
    }
    let growth = max_rss.saturating_sub(before);
    assert!(
        growth < 64 * MIB,
        "server RSS grew by {growth} KiB with {N} unread pipelined responses"
    );

    let mut count = 0;
    for i in 0..N {
        let r = c.response_head();
        assert_eq!(r.status, 200, "response {i}");
        assert_eq!(r.header("content-length"), Some("65536"), "response {i}");
        c.skip_bytes(65536, |piece| {
            assert!(piece.iter().all(|&b| b == b'x'), "response {i} body");
        });
        count += 1;
    }
    assert_eq!(count, N);
    t.join().unwrap().expect("write the pipelined batch");
    assert!(c.buffered().is_empty());
    // Nothing more is sent: the next read times out rather than returning data.
    c.stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 16];
    match read_some(&mut c.stream, &mut buf) {
        Ok(n) => panic!("unexpected {n} bytes (or EOF) after the last response"),
        Err(e) => assert!(matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
    }
}

#[test]
fn ten_thousand_tiny_pipelined_requests() {
    let server = Server::start();
    let mut c = server.client();
    const N: usize = 10_000;
    let mut writer = c.stream.try_clone().unwrap();
    let t = thread::spawn(move || {
        let mut batch = Vec::new();
        for i in 0..N {
            if i % 2 == 0 {
                batch.extend_from_slice(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n");
            } else {
                batch.extend_from_slice(b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n");
            }
        }
        writer.write_all(&batch)
    });
    for i in 0..N {
        let r = c.response();
        let want = if i % 2 == 0 {
            "Hello, World!"
        } else {
            r#"{"message":"Hello, World!"}"#
        };
        assert_eq!(r.text(), want, "response {i}");
    }
    t.join().unwrap().unwrap();
}
