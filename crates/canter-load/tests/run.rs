//! End-to-end tests of `run()` against a tiny std::net HTTP server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use canter_load::{run, LoadError, LoadOptions};

/// The options `canter load` builds from these flags (the few the tests use; the URL last).
fn args(list: &[&str]) -> LoadOptions {
    let (url, flags) = list.split_last().expect("a URL");
    let mut o = LoadOptions::new(*url);
    let mut flags = flags.iter();
    while let Some(&flag) = flags.next() {
        let mut value = || flags.next().expect("a value").to_string();
        match flag {
            "-n" => o.requests = Some(value().parse().expect("-n")),
            "-c" => o.connections = value().parse().expect("-c"),
            "-m" => o.streams = Some(value().parse().expect("-m")),
            "-d" => o.duration = Some(canter_load::parse_duration(&value()).expect("-d")),
            "-H" => o.headers.push(value()),
            "--pipeline" => o.pipeline = value().parse().expect("--pipeline"),
            "--rate" => o.rate = Some(value().parse().expect("--rate")),
            "--json" => o.json = true,
            "--no-progress" => o.no_progress = true,
            "--no-keepalive" => o.no_keepalive = true,
            other => panic!("no such flag in this test: {other}"),
        }
    }
    o
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
    let e = run(args(&[
        "-m",
        "10",
        "-H",
        "Connection: close",
        "http://127.0.0.1:1/",
    ]))
    .expect_err("h2");
    assert!(matches!(e, LoadError::Usage(_)), "{e:?}");
    assert!(e.to_string().contains("not allowed in HTTP/2"), "{e}");
    let e = run(args(&["http://192.0.2.1:80/"])).expect_err("remote");
    assert!(matches!(e, LoadError::NotLoopback { .. }), "{e:?}");
    assert!(e.to_string().contains("loopback"), "{e}");
    // Nothing listens on port 1: the connect error, with its cause.
    let e = run(args(&["-n", "1", "http://127.0.0.1:1/"])).expect_err("closed port");
    assert!(matches!(e, LoadError::Unreachable { .. }), "{e:?}");
    assert!(std::error::Error::source(&e).is_some());
}

/// An HTTP/2 server (canter's own engine over blocking sockets) that advertises at most 2
/// concurrent streams and, counting the requests it sees across connections: refuses every
/// 5th (REFUSED_STREAM, which the client must send again), resets every 7th with
/// INTERNAL_ERROR (a `reset` error), and says GOAWAY after 40 answers on a connection (the
/// client must finish what is open, then connect again). Returns the port and the counters:
/// requests seen, answered, reset with INTERNAL_ERROR, and the most streams ever open at once.
fn h2_server(life: Duration) -> (u16, std::sync::Arc<[std::sync::atomic::AtomicU64; 4]>) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let counters = std::sync::Arc::new([
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ]);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let c = counters.clone();
    thread::spawn(move || {
        let deadline = Instant::now() + life;
        while Instant::now() < deadline {
            let Ok((mut s, _)) = listener.accept() else {
                thread::sleep(Duration::from_millis(2));
                continue;
            };
            let c = c.clone();
            thread::spawn(move || {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let settings = canter_h2::Settings::builder()
                    .max_concurrent_streams(2)
                    .build()
                    .expect("valid settings");
                let mut out = bytes::BytesMut::new();
                let mut conn = canter_h2::Connection::new(settings, &mut out);
                let mut input = bytes::BytesMut::new();
                let mut buf = [0u8; 16384];
                let mut answered = 0;
                let mut going_away = false;
                while Instant::now() < deadline {
                    if s.write_all(&out).is_err() {
                        return;
                    }
                    out.clear();
                    if going_away && conn.open_streams() == 0 {
                        return;
                    }
                    let n = match s.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                        Err(_) => return,
                    };
                    input.extend_from_slice(&buf[..n]);
                    if conn.recv(&mut input, &mut out).is_err() {
                        let _ = s.write_all(&out);
                        return;
                    }
                    c[3].fetch_max(conn.open_streams() as u64, Relaxed);
                    while let Some(ev) = conn.poll_event() {
                        let canter_h2::Event::Request { stream, .. } = ev else {
                            continue;
                        };
                        let k = c[0].fetch_add(1, Relaxed) + 1;
                        if k.is_multiple_of(5) {
                            conn.reset(stream, canter_h2::ErrorCode::REFUSED_STREAM, &mut out);
                        } else if k.is_multiple_of(7) {
                            c[2].fetch_add(1, Relaxed);
                            conn.reset(stream, canter_h2::ErrorCode::INTERNAL_ERROR, &mut out);
                        } else {
                            c[1].fetch_add(1, Relaxed);
                            answered += 1;
                            let fields = [(&b"content-type"[..], &b"text/plain"[..])];
                            let _ = conn.send_headers(stream, 200, fields, false, &mut out);
                            let _ = conn.send_data(stream, bytes::Bytes::from_static(b"ok"), true);
                        }
                    }
                    if answered >= 40 && !going_away {
                        going_away = true;
                        conn.go_away(&mut out);
                    }
                    conn.flush(&mut out);
                }
            });
        }
    });
    (port, counters)
}

#[test]
fn h2_streams_refusals_resets_and_goaway() {
    use std::sync::atomic::Ordering::Relaxed;
    let (port, seen) = h2_server(Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/x");
    let report = run(args(&[
        "-n",
        "300",
        "-m",
        "8",
        "-c",
        "2",
        "--json",
        "--no-progress",
        &url,
    ]))
    .expect("run");
    let (requests, answered, resets, most_open) = (
        seen[0].load(Relaxed),
        seen[1].load(Relaxed),
        seen[2].load(Relaxed),
        seen[3].load(Relaxed),
    );
    // Every answered request is counted once; refused ones went out again (so the server saw
    // more requests than the budget); reset ones are errors and use up their request.
    assert_eq!(report.requests, answered);
    assert_eq!(report.errors.reset, resets);
    assert!(
        resets > 0 && requests > 300,
        "{requests} seen, {resets} reset"
    );
    assert_eq!(report.requests + report.errors.reset, 300);
    assert_eq!(report.errors.total(), resets, "{:?}", report.errors);
    assert_eq!(report.status.get("200"), Some(&answered));
    // The server's SETTINGS_MAX_CONCURRENT_STREAMS (2) wins over -m 8, per connection.
    assert!(most_open <= 2, "{most_open} streams open at once");
    // GOAWAY after 40 answers: the 300 requests needed several connections.
    assert!(answered > 80);
}

#[test]
fn h2_needs_streams_without_pipelining() {
    let port = server(false, Duration::from_secs(5));
    let url = format!("http://127.0.0.1:{port}/x");
    for bad in [&["-m", "0"][..], &["-m", "4", "--pipeline", "2"]] {
        let mut a = bad.to_vec();
        a.push(&url);
        assert!(matches!(run(args(&a)), Err(LoadError::Usage(_))), "{bad:?}");
    }
}

/// `--no-keepalive`: every request says `Connection: close` and goes on a connection of its
/// own (the server here would keep them open otherwise, and counts what it accepts).
#[test]
fn no_keepalive_opens_a_connection_per_request() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let without_close = Arc::new(AtomicUsize::new(0));
    {
        let (accepted, without_close) = (accepted.clone(), without_close.clone());
        thread::spawn(move || {
            for s in listener.incoming().take(100) {
                let Ok(mut s) = s else { break };
                accepted.fetch_add(1, Ordering::Relaxed);
                let (without_close, mut buf) = (without_close.clone(), Vec::new());
                thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut piece = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut piece) {
                            Ok(n) if n > 0 => buf.extend_from_slice(&piece[..n]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if !head.contains("connection: close\r\n") {
                        without_close.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                    // Kept open: only the client's request may end it.
                    let _ = s.read(&mut piece);
                });
            }
        });
    }
    let url = format!("http://127.0.0.1:{port}/");
    let report = run(args(&[
        "-n",
        "40",
        "-c",
        "4",
        "--no-keepalive",
        "--json",
        &url,
    ]))
    .expect("run");
    assert_eq!(report.requests, 40);
    assert_eq!(report.errors.total(), 0, "{:?}", report.errors);
    // One connection per request (the last few may open as the count is reached).
    let n = accepted.load(Ordering::Relaxed);
    assert!((40..=44).contains(&n), "{n} connections for 40 requests");
    assert_eq!(without_close.load(Ordering::Relaxed), 0);
    let e = run(args(&["-m", "4", "--no-keepalive", &url])).expect_err("h2");
    assert!(matches!(e, LoadError::Usage(_)), "{e:?}");
}
