//! Graceful shutdown on SIGTERM: idle connections close, in-flight requests finish.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Client, Server};

/// How long the server may take to do what a test waits for (generous: a busy machine).
const WAIT: Duration = Duration::from_secs(20);

/// Waits until the server has read every byte `client` sent (the request is in its hands).
fn held(client: &Client) {
    assert!(
        canter_testkit::wait_until_read_by_peer(&client.stream, WAIT),
        "the server did not read the request within {WAIT:?}"
    );
}

/// Waits until the server has begun to drain: every worker has closed its listener, which it
/// does in the same turn as it marks its connections as draining.
fn draining(server: &Server) {
    assert!(
        canter_testkit::wait_until_refused(server.addr(), WAIT),
        "the server still accepted connections {WAIT:?} after SIGTERM; log:\n{}",
        server.log()
    );
}

#[test]
fn sigterm_drains_gracefully() {
    let mut server = Server::start();

    // An idle keep-alive connection (one request done).
    let mut idle = server.client();
    assert_eq!(idle.get("/plaintext").text(), "Hello, World!");

    // A request in flight: half of its body sent, and read by the server.
    let mut busy = server.client();
    busy.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234");
    held(&busy);

    server.signal("TERM");
    draining(&server);

    // The idle connection is closed without a response.
    let start = Instant::now();
    let (data, end) = idle.drain();
    assert!(data.is_empty(), "idle connection got {data:?}");
    assert!(end.is_ok(), "idle connection reset: {end:?}");
    assert!(start.elapsed() < Duration::from_secs(3));

    // The in-flight request completes, announcing the close.
    busy.send("56789");
    let r = busy.response();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "0123456789");
    busy.expect_eof();

    let status = server
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("server still running; log:\n{}", server.log()));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log()
    );

    // Nobody listens any more.
    let refused = TcpStream::connect_timeout(&server.addr(), Duration::from_secs(2));
    assert!(refused.is_err(), "connect after exit succeeded");
}

/// The server closes the connection right after the in-flight response, so that response must
/// say `Connection: close`; otherwise a client reuses the connection and loses its next request.
#[test]
fn in_flight_response_during_drain_says_connection_close() {
    let server = Server::start();
    let mut busy = server.client();
    busy.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234");
    held(&busy);
    server.signal("TERM");
    draining(&server);
    busy.send("56789");
    let r = busy.response();
    assert_eq!(r.text(), "0123456789");
    assert!(r.closes(), "no Connection: close: {r:?}");
    busy.expect_eof();
}

#[test]
fn sigterm_with_no_connections_exits_promptly() {
    let mut server = Server::start();
    // The handlers are in place once the address is announced (see
    // `sigterm_right_after_startup_is_graceful`).
    let start = Instant::now();
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(5))
        .expect("server exits");
    assert!(status.success(), "{status}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(TcpStream::connect_timeout(&server.addr(), Duration::from_secs(2)).is_err());
}

#[test]
fn new_connections_are_refused_while_draining() {
    let mut server = Server::start();
    // Keep the server draining with a request in flight.
    let mut busy = server.client();
    busy.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab");
    held(&busy);
    server.signal("TERM");
    // Connections are refused while the request is still in flight (the server cannot finish
    // draining before the rest of its body comes).
    assert!(
        canter_testkit::wait_until_refused(server.addr(), WAIT),
        "new connections were still accepted {WAIT:?} after SIGTERM; log:\n{}",
        server.log()
    );
    server.assert_alive();
    busy.send("cd");
    let r = busy.response();
    assert_eq!(r.text(), "abcd");
    let status = server.wait_exit(Duration::from_secs(5)).expect("exit");
    assert!(status.success());
}

/// A SIGTERM right after the server announced its address must be a graceful shutdown (exit 0),
/// not the default action of the signal.
#[test]
fn sigterm_right_after_startup_is_graceful() {
    let mut bad = Vec::new();
    for _ in 0..20 {
        let mut server = Server::start();
        server.signal("TERM");
        let status = server
            .wait_exit(Duration::from_secs(5))
            .expect("server exits");
        if !status.success() {
            bad.push(status.to_string());
        }
    }
    assert!(bad.is_empty(), "{} of 20 runs: {bad:?}", bad.len());
}
