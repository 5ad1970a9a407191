//! Head, idle and body timeouts, and that a slow client does not stall others.
//!
//! The server's clock is coarse (its workers tick once a second), so a 1 s timeout fires after
//! somewhere between ~0 and ~2 s; the bounds below allow for that.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{ErrorKind, Write};
use std::thread;
use std::time::{Duration, Instant};

use canter_testkit::read_some;
use common::Server;

/// Reads until EOF or reset; returns what arrived and when the connection ended.
fn until_closed(c: &mut common::Client) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let (data, end) = c.drain();
    if let Err(e) = end {
        assert_eq!(
            e.kind(),
            ErrorKind::ConnectionReset,
            "expected EOF or reset: {e}"
        );
    }
    (data, start.elapsed())
}

/// Every flag that is a time takes a duration (`1s`, `1500ms`) or a bare number of seconds.
#[test]
fn half_a_request_head_gets_408() {
    for timeout in ["1", "1s", "1500ms"] {
        let server = Server::start_with(&["--head-timeout", timeout, "--write-timeout", "5s"]);
        let mut c = server.client();
        let start = Instant::now();
        c.send("GET /plaintext HTTP/1.1\r\nHo");
        let r = c.response();
        assert_eq!(r.status, 408, "{timeout}: {r:?}");
        assert_eq!(r.reason, "Request Timeout");
        assert!(r.closes());
        c.expect_eof();
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(4),
            "{timeout}: 408 after {took:?}"
        );
    }
}

#[test]
fn dribbling_head_is_cut_off_and_others_are_served() {
    let server = Server::start_with(&["--head-timeout", "1"]);
    let port = server.port;
    let other = thread::spawn(move || {
        // While the dribbler is connected, a normal client is answered at once.
        thread::sleep(Duration::from_millis(500));
        let mut latencies = Vec::new();
        for _ in 0..3 {
            let start = Instant::now();
            let mut c = common::Client::connect(([127, 0, 0, 1], port).into());
            let r = c.get("/plaintext");
            latencies.push(start.elapsed());
            assert_eq!(r.text(), "Hello, World!");
            thread::sleep(Duration::from_millis(100));
        }
        latencies
    });

    let mut c = server.client();
    c.stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let start = Instant::now();
    let head =
        b"GET /plaintext HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut received = Vec::new();
    let mut sent = 0;
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "never cut off; sent {sent} bytes"
        );
        if received.is_empty() && sent < head.len() {
            if c.stream.write_all(&head[sent..sent + 1]).is_err() {
                break;
            }
            sent += 1;
        }
        match read_some(&mut c.stream, &mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    let took = start.elapsed();
    assert!(
        sent < head.len(),
        "the whole head went through: {sent} bytes"
    );
    assert!(took < Duration::from_secs(4), "cut off after {took:?}");
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{text:?}"
    );

    let latencies = other.join().unwrap();
    for l in latencies {
        assert!(
            l < Duration::from_millis(200),
            "normal request took {l:?} next to a dribbler"
        );
    }
}

#[test]
fn idle_keep_alive_connection_is_closed() {
    let server = Server::start_with(&["--idle-timeout", "1000ms"]);
    let mut c = server.client();
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
    let (data, took) = until_closed(&mut c);
    assert!(data.is_empty(), "no response for an idle close: {data:?}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
}

#[test]
fn silent_new_connection_is_closed_after_idle_timeout() {
    // Accepted at once; by default (below) the kernel holds a silent client for about a second
    // before handing it over.
    let server = Server::start_with(&[
        "--idle-timeout",
        "1",
        "--head-timeout",
        "5",
        "--no-defer-accept",
    ]);
    let mut c = server.client();
    let (data, took) = until_closed(&mut c);
    assert!(data.is_empty(), "{data:?}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");

    let server = Server::start_with(&["--idle-timeout", "1", "--head-timeout", "5"]);
    let mut c = server.client();
    let (data, took) = until_closed(&mut c);
    assert!(data.is_empty(), "{data:?}");
    assert!(took < Duration::from_secs(4), "closed after {took:?}");
}

/// By default a connection is handed over with its first bytes (TCP_DEFER_ACCEPT), so a
/// silent one is not counted as accepted yet; `--no-defer-accept` accepts it at once.
#[test]
fn a_silent_connection_is_accepted_only_without_deferral() {
    let accepted = |server: &Server| -> u64 {
        let text = server.client().get("/metrics").text().to_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with("canter_connections_accepted_total"))
            .unwrap_or_else(|| panic!("no accepted counter in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    // Deferred: after a while, only the scrapes' own connections are counted (each scrape
    // counts itself). A slow server can only count fewer, so the wait cannot make this pass.
    let server = Server::start_with(&["--metrics"]);
    let before = accepted(&server);
    let _silent = server.client();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        accepted(&server) - before,
        1,
        "the silent connection was accepted"
    );

    // Not deferred: the silent connection is counted, once the server has taken it (waited
    // for, not assumed after a fixed time: a busy machine can take longer).
    let server = Server::start_with(&["--metrics", "--no-defer-accept"]);
    let before = accepted(&server);
    let _silent = server.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut scrapes = 0;
    loop {
        scrapes += 1;
        let silent = accepted(&server) - before - scrapes;
        if silent == 1 {
            break;
        }
        assert_eq!(silent, 0, "more connections accepted than were opened");
        assert!(
            std::time::Instant::now() < deadline,
            "the silent connection was not accepted without deferral"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stalled_request_body_is_cut_off() {
    let server = Server::start_with(&["--body-timeout", "1"]);
    let mut c = server.client();
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
    let (data, took) = until_closed(&mut c);
    assert!(took < Duration::from_secs(4), "closed after {took:?}");
    if !data.is_empty() {
        let text = String::from_utf8_lossy(&data);
        assert!(
            text.starts_with("HTTP/1.1 400 ") || text.starts_with("HTTP/1.1 408 "),
            "{text:?}"
        );
        assert!(text.contains("\r\nConnection: close\r\n"), "{text:?}");
    }
}

#[test]
fn slow_but_steady_body_is_not_cut_off() {
    // The body timeout is about progress, not the total time.
    let server = Server::start_with(&["--body-timeout", "2"]);
    let mut c = server.client();
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n");
    for b in b"0123456789" {
        thread::sleep(Duration::from_millis(350));
        c.send([*b]);
    }
    let r = c.response();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "0123456789");
}

#[test]
fn stalled_pipelined_head_after_a_complete_request_gets_408() {
    let server = Server::start_with(&["--head-timeout", "1"]);
    let mut c = server.client();
    c.send("GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\nGET /js");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "Hello, World!"));
    let r = c.response();
    assert_eq!(r.status, 408, "{r:?}");
    assert!(r.closes());
    c.expect_eof();
}

/// A keep-alive client that comes back well within the idle timeout must find the connection
/// open, every time.
#[test]
fn idle_timeout_does_not_fire_early() {
    let server = Server::start_with(&["--idle-timeout", "1"]);
    let mut c = server.client();
    for i in 0..8 {
        let r = c.get("/plaintext");
        assert_eq!(r.text(), "Hello, World!", "request {i}");
        // Come back after 400 ms, well inside the 1 s idle timeout.
        thread::sleep(Duration::from_millis(400));
        c.stream
            .set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        let mut probe = [0u8; 1];
        let early = matches!(c.stream.peek(&mut probe), Ok(0));
        c.stream.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
        assert!(
            !early,
            "closed after only 400 ms idle (before request {})",
            i + 1
        );
    }
}

/// A client that reads slowly through a 4 KiB receive buffer: the kernel grows the server's send
/// buffer to megabytes and reports the socket writable only once a good part of it is free, so
/// the server's own output waits longer than the write timeout while the client takes data all
/// along. The write timeout judges what the peer takes (the kernel's queue going down), so the
/// client gets every byte, over plain TCP and TLS alike.
#[test]
fn a_slow_reader_gets_every_byte_of_a_large_response() {
    let server = Server::start_with(&[
        "--write-timeout",
        "1",
        "--tls-addr",
        "127.0.0.1:0",
        "--tls-self-signed",
    ]);
    // 5 MB at 500 kB/s: ten seconds, more than the 4 MiB the send buffer grows to.
    let (size, rate) = ("5000000", "500000");
    let script = format!("{}/tests/py/slow_reader.py", env!("CARGO_MANIFEST_DIR"));
    let runs: Vec<_> = [(server.addr().port(), ""), (server.tls_port(), "tls")]
        .into_iter()
        .map(|(port, tls)| {
            let script = script.clone();
            thread::spawn(move || {
                let port = port.to_string();
                let mut args = vec![script.as_str(), port.as_str(), size, rate];
                if !tls.is_empty() {
                    args.push(tls);
                }
                let out = common::run_python(&args, None);
                (tls, out)
            })
        })
        .collect();
    for run in runs {
        let (tls, out) = run.join().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("HTTP/1.1 200 OK\nbody 5000000\n"),
            "tls={tls:?}: {stdout}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            server.log()
        );
    }
}
