//! Per-route limits over a real socket: a route's own head, field-count, target and body limits
//! answer 431, 414 and 413 before the handler runs (and before any body byte is read), while
//! other routes keep the server's limits.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use canter::{get, post, RouteLimits, Router};
use common::InProcess;

fn strict() -> RouteLimits {
    RouteLimits {
        max_head: Some(512),
        max_headers: Some(4),
        max_target: Some(64),
        max_body: Some(100),
        max_chunk_ext: Some(8),
    }
}

fn app() -> Router {
    Router::new()
        .route(
            "/strict",
            get(|| "ok\n")
                .post(|body: Bytes| format!("{}\n", body.len()))
                .limits(strict()),
        )
        .route("/loose", post(|body: Bytes| format!("{}\n", body.len())))
}

/// Sends `request` and returns the status code and the response text up to EOF or 1 s of silence.
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[test]
fn route_limits_answer_before_the_handler() {
    let server = InProcess::start(|_| app());
    let addr = server.addr;

    let (status, _) = exchange(
        addr,
        b"GET /strict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);

    // More fields than the route allows (the server allows 100).
    let many = "GET /strict HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nConnection: close\r\n\r\n";
    let (status, text) = exchange(addr, many.as_bytes());
    assert_eq!(status, 431, "{text}");
    assert!(
        text.contains("too many header fields for this route"),
        "{text}"
    );

    // A head larger than 512 bytes (the server allows 16 KiB).
    let big = format!(
        "GET /strict HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
        "p".repeat(600)
    );
    let (status, _) = exchange(addr, big.as_bytes());
    assert_eq!(status, 431);

    // A target longer than 64 bytes.
    let long = format!(
        "GET /strict?{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "q".repeat(80)
    );
    let (status, _) = exchange(addr, long.as_bytes());
    assert_eq!(status, 414);

    // A declared body over 100 bytes: 413 without reading the body and without 100 Continue.
    let (status, text) = exchange(
        addr,
        b"POST /strict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n",
    );
    assert_eq!(status, 413, "{text}");
    assert!(!text.contains("100 Continue"), "{text}");

    // A chunked body over the route's limit is cut off by the extractor with 413 too.
    let chunked = format!(
        "POST /strict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n96\r\n{}\r\n0\r\n\r\n",
        "b".repeat(150)
    );
    let (status, _) = exchange(addr, chunked.as_bytes());
    assert_eq!(status, 413);

    // A chunk extension longer than the route's 8 bytes (the server allows 1 KiB): 400; the
    // same body on the route without limits is accepted.
    let ext = "POST {} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;name=a-long-value\r\nhello\r\n0\r\n\r\n";
    let (status, text) = exchange(addr, ext.replace("{}", "/strict").as_bytes());
    assert_eq!(status, 400, "{text}");
    let (status, text) = exchange(addr, ext.replace("{}", "/loose").as_bytes());
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("5\n"), "{text}");

    // Within the limit, and the same body on a route without limits: accepted.
    let small = format!(
        "POST /strict HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{}",
        "s".repeat(50)
    );
    let (status, text) = exchange(addr, small.as_bytes());
    assert_eq!(status, 200);
    assert!(text.ends_with("50\n"), "{text}");
    let loose = format!(
        "POST /loose HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{}",
        "l".repeat(1000)
    );
    let (status, text) = exchange(addr, loose.as_bytes());
    assert_eq!(status, 200);
    assert!(text.ends_with("1000\n"), "{text}");

    server.stop();
}

/// `canter serve` with a limit or timeout out of its range exits at once with an error naming
/// it, instead of serving with a silently changed value.
#[test]
fn out_of_range_flags_are_refused_at_startup() {
    for (flag, value, setting) in [
        ("--max-head", "70000", "invalid max_head"),
        ("--idle-timeout", "0", "invalid idle"),
        ("--workers", "0", "invalid workers"),
        ("--max-pipeline", "0", "invalid max_pipeline"),
    ] {
        let args = ["serve", "--addr", "127.0.0.1:0", flag, value].map(std::ffi::OsStr::new);
        let (status, err) = common::canter_exits(&args);
        assert!(!status.success(), "{flag} {value}: {err}");
        assert!(err.contains(setting), "{flag} {value}: {err}");
    }
}

/// A port another process listens on is refused at start ("address in use"), whether that
/// listener shares it through SO_REUSEPORT (a second `canter serve`) or not; `--reuse-port`
/// starts beside it on purpose, for a hand-over.
#[test]
fn a_port_in_use_is_refused_unless_sharing_is_asked_for() {
    let first = common::Server::start();
    let addr = first.addr().to_string();
    let args = ["serve", "--addr", &addr].map(std::ffi::OsStr::new);
    let (status, err) = common::canter_exits(&args);
    assert!(!status.success(), "{err}");
    assert!(err.contains(&format!("{addr}: address in use")), "{err}");
    // The TLS listener's port too.
    let tls = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tls_addr = tls.local_addr().unwrap().to_string();
    let args = [
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--tls-self-signed",
        "--tls-addr",
        &tls_addr,
    ]
    .map(std::ffi::OsStr::new);
    let (status, err) = common::canter_exits(&args);
    assert!(!status.success(), "{err}");
    assert!(err.contains("address in use"), "{err}");
    drop(tls);
    // Asked for: it starts and serves beside the first.
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["serve", "--addr", &addr, "--workers", "1", "--reuse-port"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(second.stderr.take().unwrap());
    let started = std::io::BufRead::lines(stderr)
        .map_while(Result::ok)
        .any(|line| line.contains(&format!("app on http://{addr}")));
    let _ = second.kill();
    let _ = second.wait();
    assert!(started, "the second server with --reuse-port did not start");
}
