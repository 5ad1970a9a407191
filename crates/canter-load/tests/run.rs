//! End-to-end tests of `run()` against a tiny std::net HTTP server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use canter_load::{run, LoadArgs, LoadError};
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

fn args(list: &[&str]) -> LoadArgs {
    let mut v = vec!["load"];
    v.extend_from_slice(list);
    Cli::try_parse_from(v).expect("valid args").load
}

/// Starts a server answering every request (GET, no body) on keep-alive
/// connections. Odd responses use chunked encoding. With `close_each`, each
/// response carries `Connection: close` and the connection is closed.
/// Everything stops by itself after `life`.
fn server(close_each: bool, life: Duration) -> u16 {
    server_with(close_each, None, life)
}

/// Like [`server`]; with `drop_after = Some(n)` the server silently closes
/// each connection after `n` responses (as an idle keep-alive timeout does).
fn server_with(close_each: bool, drop_after: Option<u64>, life: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    thread::spawn(move || {
        let deadline = Instant::now() + life;
        while Instant::now() < deadline {
            match listener.accept() {
                Ok((s, _)) => {
                    thread::spawn(move || serve(s, close_each, drop_after, deadline));
                }
                Err(_) => thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    port
}

fn serve(mut s: TcpStream, close_each: bool, drop_after: Option<u64>, deadline: Instant) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 8192];
    let mut matched = 0usize; // progress through "\r\n\r\n"
    let mut served = 0u64;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        let n = match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                continue
            }
            Err(_) => return,
        };
        out.clear();
        for &b in &buf[..n] {
            let want = b"\r\n\r\n"[matched];
            matched = if b == want {
                matched + 1
            } else if b == b'\r' {
                1
            } else {
                0
            };
            if matched == 4 {
                matched = 0;
                served += 1;
                if close_each {
                    out.extend_from_slice(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    );
                    let _ = s.write_all(&out);
                    return;
                } else if served & 1 == 0 {
                    out.extend_from_slice(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nHello, World!",
                    );
                } else {
                    out.extend_from_slice(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHello\r\n8\r\n, World!\r\n0\r\n\r\n",
                    );
                }
            }
        }
        if !out.is_empty() && s.write_all(&out).is_err() {
            return;
        }
        if drop_after.is_some_and(|n| served >= n) {
            return;
        }
    }
}

#[test]
fn fixed_count_pipelined() {
    let port = server(false, Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/x");
    let report = run(args(&[
        "-n",
        "200",
        "--pipeline",
        "4",
        "-c",
        "4",
        "--json",
        "--no-progress",
        &url,
    ]))
    .expect("run");
    assert_eq!(report.requests, 200);
    assert_eq!(report.status.len(), 1);
    assert_eq!(report.status.get("200"), Some(&200));
    assert_eq!(report.errors.total(), 0);
    assert!(report.bytes_read > 200 * 40);
}

#[test]
fn connection_close_reconnects() {
    let port = server(true, Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/");
    let report = run(args(&[
        "-n",
        "60",
        "-c",
        "3",
        "--pipeline",
        "2",
        "--json",
        &url,
    ]))
    .expect("run");
    assert_eq!(report.requests, 60);
    assert_eq!(report.status.get("200"), Some(&60));
    assert_eq!(report.errors.total(), 0, "{:?}", report.errors);
}

#[test]
fn silent_keepalive_close_is_retried() {
    let port = server_with(false, Some(5), Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/");
    let report = run(args(&["-n", "100", "-c", "2", "--json", &url])).expect("run");
    assert_eq!(report.requests, 100);
    assert_eq!(report.errors.total(), 0, "{:?}", report.errors);
}

#[test]
fn open_loop_rate() {
    let port = server(false, Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/");
    let report = run(args(&[
        "--rate",
        "500",
        "-d",
        "2s",
        "-c",
        "10",
        "--json",
        "--no-progress",
        &url,
    ]))
    .expect("run");
    assert!(
        (450.0..=550.0).contains(&report.rps),
        "rps {} not within 10% of 500",
        report.rps
    );
    assert_eq!(report.rate, Some(500.0));
    assert_eq!(report.errors.total(), 0);
}

#[test]
fn setup_errors() {
    let e = run(args(&["-m", "10", "http://127.0.0.1:1/"])).expect_err("h2");
    assert!(matches!(e, LoadError::Usage(_)), "{e:?}");
    assert!(e.to_string().contains("HTTP/2 not supported yet"), "{e}");
    let e = run(args(&["http://192.0.2.1:80/"])).expect_err("remote");
    assert!(matches!(e, LoadError::NotLoopback { .. }), "{e:?}");
    assert!(e.to_string().contains("loopback"), "{e}");
    // Nothing listens on port 1: the connect error, with its cause.
    let e = run(args(&["-n", "1", "http://127.0.0.1:1/"])).expect_err("closed port");
    assert!(matches!(e, LoadError::Unreachable { .. }), "{e:?}");
    assert!(std::error::Error::source(&e).is_some());
}
