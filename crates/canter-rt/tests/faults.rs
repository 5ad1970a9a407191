//! Fault tests of the runtime over real sockets on 127.0.0.1: handler panics (synchronous, in a
//! future, in a body stream), clients that disconnect mid-request (checked for leaked
//! connection tasks), pipelined chunked requests in one write, `max_connections`, and graceful
//! shutdown with a request in flight. Also the check of the configured Server value and a
//! service factory that panics.
//!
//! Tests marked `#[ignore = "bug: …"]` fail today and document a runtime bug; run them with
//! `cargo test -p canter-rt --test faults -- --ignored`.
//!
//! Each test runs its own in-process [`canter_rt::Server`] (one worker, short timeouts) on a
//! background thread and stops it at the end. The timeouts (head, idle, body, minimum body rate,
//! handler, write), the paced and stalled response streams, a body arriving in delayed pieces,
//! and clients that close or half-close while their handler is pending are tested on virtual
//! time against a scripted peer in `http_scripted.rs`, which needs neither sockets nor
//! waiting. What stays here needs a kernel: resets, leaks across many connections, the
//! backlog, shutdown of a running server.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use canter_rt::http::StatusCode;
use canter_rt::{Body, BodyStream, Config, Reply, Request, Response, Timeouts};

use common::{chunked, test_builder, test_config, Client, TestServer};

/// Body of the 256 MiB `/stream` response, in 64 KiB pieces.
const STREAM_LEN: u64 = 256 << 20;
static FILL: [u8; 64 * 1024] = [b'x'; 64 * 1024];

/// Body of `/big`: more than a socket takes in one write.
static BIG: [u8; 8 << 20] = [b'y'; 8 << 20];

/// Handlers of `/sleep` that have started (only the shutdown test uses it).
static SLEEPERS: AtomicUsize = AtomicUsize::new(0);

/// The test application, routed by path.
fn app(req: Request) -> Reply {
    match req.path() {
        "/hello" => Response::text("hello").into(),
        "/panic" => panic!("test: synchronous handler panic"),
        "/panic-async" => Reply::future(boom()),
        "/panic-stream" => Response::text(Body::stream(Some(1000), PanicAfterOne(false))).into(),
        "/panic-stream-chunked" => Response::text(Body::stream(None, PanicAfterOne(false))).into(),
        "/never" => Reply::future(async {
            std::future::pending::<()>().await;
            Response::text("unreachable")
        }),
        "/slow-body" | "/sum" => common::sum_body(req),
        "/stream" => Response::new(StatusCode::OK)
            .with_body(Body::stream(Some(STREAM_LEN), Repeat { left: STREAM_LEN }))
            .into(),
        "/big" => Response::text(Bytes::from_static(&BIG)).into(),
        "/sleep" => Reply::future(async {
            SLEEPERS.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
            Response::text("slept")
        }),
        _ => Response::new(StatusCode::NOT_FOUND).into(),
    }
}

/// Waits until `counter` reaches `n`; panics after `timeout`. Returns how long it took.
fn wait_count(counter: &AtomicUsize, n: usize, timeout: Duration, what: &str) -> Duration {
    let start = Instant::now();
    while counter.load(Ordering::SeqCst) < n {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

async fn boom() -> Response {
    panic!("test: panic inside the handler's future")
}

fn start(config: Config) -> TestServer {
    TestServer::start(config, |_worker| app)
}

/// Yields one piece, then panics.
struct PanicAfterOne(bool);

impl BodyStream for PanicAfterOne {
    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<std::io::Result<Bytes>>> {
        if self.0 {
            panic!("test: panic inside a response body stream");
        }
        self.0 = true;
        Poll::Ready(Some(Ok(Bytes::from_static(b"first piece"))))
    }
}

/// `left` bytes of `x` in 64 KiB pieces.
struct Repeat {
    left: u64,
}

impl BodyStream for Repeat {
    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<std::io::Result<Bytes>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(FILL.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Bytes::from_static(&FILL[..n]))))
    }
}

/// A new connection is answered normally: the worker survived whatever came before.
fn assert_worker_alive(server: &TestServer) {
    let mut c = server.client();
    let r = c.get("/hello");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "hello");
    assert!(!r.closes(), "{r:?}");
    // Keep-alive still works on it too.
    let r = c.get("/hello");
    assert_eq!(r.text(), "hello");
}

fn get_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
}

// ---- panics --------------------------------------------------------------------------------

fn panic_answers_500(path: &str) {
    let server = start(test_config());
    for round in 0..3 {
        let mut c = server.client();
        let r = c.get(path);
        assert_eq!(r.status, 500, "round {round}: {r:?}");
        assert!(r.closes(), "500 must close the connection: {r:?}");
        c.expect_closed();
        drop(c);
        assert_worker_alive(&server);
    }
    // A panic on a kept-alive connection after a good exchange: same outcome.
    let mut c = server.client();
    assert_eq!(c.get("/hello").status, 200);
    let r = c.get(path);
    assert_eq!(r.status, 500, "{r:?}");
    assert!(r.closes());
    c.expect_closed();
    drop(c);
    server.wait_idle(Duration::from_secs(2), "after panics");
    assert_eq!(server.stats.accepted(), 7);
    server.stop();
}

#[test]
fn sync_panic_answers_500_and_closes() {
    panic_answers_500("/panic");
}

/// A synchronous panic while the request's body is still unread (whole or in part, by
/// Content-Length and chunked), and one after pipelined requests answered in the same turn:
/// the 500 arrives in full after the earlier responses, then the connection closes.
#[test]
fn sync_panic_with_a_body_or_after_pipelined_requests() {
    let server = start(test_config());
    let body = "b".repeat(20_000);
    for request in [
        format!(
            "POST /panic HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        "POST /panic HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc".to_owned(),
        format!(
            "POST /panic HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        ),
    ] {
        let mut c = server.client();
        c.send(request);
        let r = c.response();
        assert_eq!(r.status, 500, "{r:?}");
        assert!(r.closes(), "{r:?}");
        c.expect_closed();
    }
    let mut c = server.client();
    c.send(get_request("/hello") + &get_request("/hello") + &get_request("/panic"));
    for _ in 0..2 {
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, "hello"), "{r:?}");
    }
    let r = c.response();
    assert_eq!(r.status, 500, "{r:?}");
    c.expect_closed();
    drop(c);
    assert_worker_alive(&server);
    server.stop();
}

#[test]
fn async_panic_answers_500_and_closes() {
    panic_answers_500("/panic-async");
}

#[test]
fn stream_panic_truncates_the_response_and_closes() {
    let server = start(test_config());
    for _ in 0..3 {
        // With Content-Length: fewer body bytes than announced, then EOF.
        let mut c = server.client();
        c.send(get_request("/panic-stream"));
        let r = c.response_head();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("content-length"), Some("1000"), "{r:?}");
        let (body, end) = c.drain();
        assert!(
            end.is_ok() || end.as_ref().unwrap_err().kind() == ErrorKind::ConnectionReset,
            "{end:?}"
        );
        assert!(
            body.len() < 1000,
            "truncated body, got {} bytes",
            body.len()
        );
        assert_eq!(body, b"first piece");
        drop(c);
        assert_worker_alive(&server);

        // Chunked: the first chunk, then EOF without the terminating chunk.
        let mut c = server.client();
        c.send(get_request("/panic-stream-chunked"));
        let r = c.response_head();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{r:?}");
        let (body, _) = c.drain();
        assert_eq!(
            body,
            b"b\r\nfirst piece\r\n",
            "{:?}",
            String::from_utf8_lossy(&body)
        );
        drop(c);
        assert_worker_alive(&server);
    }
    server.wait_idle(Duration::from_secs(2), "after stream panics");
    server.stop();
}

// ---- disconnects: no leaked connection tasks -----------------------------------------------

const ROUNDS: u64 = 50;

#[test]
fn disconnect_mid_head_leaks_nothing() {
    let server = start(test_config());
    for i in 0..ROUNDS {
        let mut c = server.client();
        c.send("GET /hello HTTP/1.1\r\nHo");
        server.wait_accepted(i + 1, Duration::from_secs(2));
        drop(c);
        server.wait_idle(Duration::from_secs(2), &format!("half a head, round {i}"));
    }
    assert_eq!(server.stats.accepted(), ROUNDS);
    assert_worker_alive(&server);
    server.stop();
}

#[test]
fn disconnect_mid_body_leaks_nothing() {
    let server = start(test_config());
    let mut body = vec![b'a'; 100];
    for i in 0..ROUNDS {
        // Alternate a handler that reads the body and one that ignores it.
        let path = if i % 2 == 0 { "/sum" } else { "/hello" };
        let mut c = server.client();
        let mut req =
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n").into_bytes();
        req.append(&mut body.clone());
        c.send(req);
        server.wait_accepted(i + 1, Duration::from_secs(2));
        if i % 4 == 3 {
            // Sometimes let the handler run and wait for the rest first.
            thread::sleep(Duration::from_millis(5));
        }
        drop(c);
        server.wait_idle(
            Duration::from_secs(2),
            &format!("{path} with 100 of 1000 body bytes, round {i}"),
        );
    }
    body.clear();
    assert_eq!(server.stats.accepted(), ROUNDS);
    assert_worker_alive(&server);
    server.stop();
}

#[test]
fn disconnect_mid_stream_leaks_nothing() {
    let server = start(test_config());
    for i in 0..ROUNDS {
        let mut c = server.client();
        c.send(get_request("/stream"));
        let r = c.response_head();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("content-length"), Some("268435456"));
        let mut got = c.buffered().len();
        while got < 4096 {
            let n = c.fill().unwrap();
            assert!(n > 0, "EOF in the streamed body");
            got += n;
        }
        drop(c);
        server.wait_idle(
            Duration::from_secs(2),
            &format!("streamed body abandoned, round {i}"),
        );
    }
    assert_eq!(server.stats.accepted(), ROUNDS);
    assert_worker_alive(&server);
    server.stop();
}

// ---- async handlers reading bodies ---------------------------------------------------------

/// 200 chunks of varying sizes; returns them and their total length.
fn pieces(seed: usize) -> (Vec<Vec<u8>>, usize) {
    let pieces: Vec<Vec<u8>> = (0..200)
        .map(|i| vec![b'a' + (i % 26) as u8; (i * 37 + seed) % 700 + 1])
        .collect();
    let total = pieces.iter().map(Vec::len).sum();
    (pieces, total)
}

#[test]
fn two_pipelined_chunked_requests_in_one_write() {
    let server = start(test_config());
    let (p1, t1) = pieces(1);
    let (p2, t2) = pieces(5);
    assert_ne!(t1, t2);
    let mut all = b"POST /sum HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    all.extend(chunked(&p1));
    all.extend_from_slice(b"POST /sum HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    all.extend(chunked(&p2));
    all.extend_from_slice(get_request("/hello").as_bytes());
    let mut c = server.client();
    c.send(&all);
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, &*t1.to_string()), "{r:?}");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, &*t2.to_string()), "{r:?}");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "hello"), "{r:?}");
    drop(c);
    server.wait_idle(Duration::from_secs(2), "after pipelined bodies");
    server.stop();
}

// ---- max_connections -----------------------------------------------------------------------

/// The scenario of the hardening issue: 30 connections arrive at once with `max_connections`
/// 10. The accept loop compares the limit with `Worker::live()`, which only counts connection
/// tasks that have already run (`register` is the first thing `http1::serve` does), so every
/// connection already in the backlog is accepted in one burst before any of them is counted.
#[test]
fn max_connections_leaves_the_rest_waiting_in_the_backlog() {
    let config = test_config()
        .to_builder()
        .max_connections(10)
        .build()
        .expect("valid config");
    let server = start(config);
    let mut clients: Vec<Option<Client>> = (0..30)
        .map(|_| {
            let mut c = server.client();
            c.send(get_request("/hello"));
            Some(c)
        })
        .collect();
    let answer = |c: &mut Client, i: usize| {
        c.set_read_timeout(Duration::from_secs(3));
        let start = Instant::now();
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, "hello"), "client {i}: {r:?}");
        start.elapsed()
    };
    // The first 10 are answered at once.
    for (i, c) in clients.iter_mut().enumerate().take(10) {
        let took = answer(c.as_mut().unwrap(), i);
        assert!(
            took < Duration::from_secs(1),
            "client {i} answered after {took:?}"
        );
    }
    assert_eq!(server.stats.open_connections(), 10);
    assert_eq!(server.stats.accepted(), 10);
    // The others wait: no answer, no EOF, no reset.
    clients[10]
        .as_mut()
        .unwrap()
        .expect_silence(Duration::from_millis(300), "client 10");
    clients[29]
        .as_mut()
        .unwrap()
        .expect_silence(Duration::from_millis(50), "client 29");
    assert_eq!(server.stats.accepted(), 10);

    // Closing 5 lets exactly 5 more in, in order.
    for c in clients.iter_mut().take(5) {
        *c = None;
    }
    for (i, c) in clients.iter_mut().enumerate().skip(10).take(5) {
        answer(c.as_mut().unwrap(), i);
    }
    clients[15]
        .as_mut()
        .unwrap()
        .expect_silence(Duration::from_millis(200), "client 15");
    assert!(server.stats.open_connections() <= 10);
    assert_eq!(server.stats.accepted(), 15);

    // Then all the rest, as the earlier ones go.
    for i in 5..30 {
        if i + 10 < 30 {
            clients[i] = None;
            if i + 10 >= 15 {
                let c = clients[i + 10].as_mut().unwrap();
                answer(c, i + 10);
            }
        }
        assert!(server.stats.open_connections() <= 10);
    }
    assert_eq!(server.stats.accepted(), 30);
    // The waiting connections were kept, not refused: each still serves a second request.
    for (i, c) in clients.iter_mut().enumerate().skip(20) {
        let c = c.as_mut().unwrap();
        c.send(get_request("/hello"));
        answer(c, i);
    }
    clients.clear();
    server.wait_idle(Duration::from_secs(2), "after max_connections");
    server.stop();
}

/// `max_connections` when connections arrive one at a time (each is running before the next
/// comes): the 11th waits in the backlog, unrefused, until one of the first 10 closes. Fails
/// today with 11 connections served: when the 10th is accepted the loop re-checks the limit
/// before that task has registered (9 < 10) and parks in `accept()`, which then takes the 11th.
#[test]
fn max_connections_paced_arrivals_wait_in_the_backlog() {
    let config = test_config()
        .to_builder()
        .max_connections(10)
        .build()
        .expect("valid config");
    let server = start(config);
    let mut first: Vec<Client> = (0..10)
        .map(|i| {
            let mut c = server.client();
            let r = c.get("/hello");
            assert_eq!((r.status, r.text()), (200, "hello"), "client {i}: {r:?}");
            c
        })
        .collect();
    assert_eq!(server.stats.open_connections(), 10);
    let mut late: Vec<Client> = (0..3)
        .map(|_| {
            let mut c = server.client();
            c.send(get_request("/hello"));
            c
        })
        .collect();
    late[0].expect_silence(Duration::from_millis(300), "11th connection");
    assert_eq!(server.stats.accepted(), 10);
    assert_eq!(server.stats.open_connections(), 10);
    for (i, c) in late.iter_mut().enumerate() {
        first.pop();
        let start = Instant::now();
        c.set_read_timeout(Duration::from_secs(3));
        let r = c.response();
        assert_eq!(
            (r.status, r.text()),
            (200, "hello"),
            "late client {i}: {r:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
    }
    drop(first);
    drop(late);
    server.wait_idle(Duration::from_secs(2), "after paced max_connections");
    assert_eq!(server.stats.accepted(), 13);
    server.stop();
}

// ---- graceful shutdown ---------------------------------------------------------------------

#[test]
fn graceful_shutdown_finishes_the_request_in_flight() {
    let config = test_config()
        .to_builder()
        .drain_timeout(Duration::from_secs(3))
        .build()
        .expect("valid config");
    let mut server = start(config);
    let addr = server.addr;

    // An idle keep-alive connection, and one with /sleep in flight.
    let mut idle = server.client();
    assert_eq!(idle.get("/hello").status, 200);
    let mut busy = server.client();
    let sent = Instant::now();
    busy.send(get_request("/sleep"));
    wait_count(&SLEEPERS, 1, Duration::from_secs(2), "/sleep handler start");

    server.begin_shutdown();
    let shutdown_at = Instant::now();
    // The idle connection closes promptly, without waiting for the busy one.
    let idle_thread = thread::spawn(move || {
        idle.expect_closed();
        shutdown_at.elapsed()
    });
    let r = busy.response();
    let answered = sent.elapsed();
    assert_eq!((r.status, r.text()), (200, "slept"), "{r:?}");
    assert!(
        r.closes(),
        "in-flight response during drain must close: {r:?}"
    );
    assert!(
        answered >= Duration::from_millis(450),
        "answered early: {answered:?}"
    );
    busy.expect_closed();
    let idle_closed = idle_thread.join().unwrap();
    println!("drain: in-flight /sleep answered {answered:?} after it was sent, idle connection closed {idle_closed:?} after shutdown()");
    assert!(
        idle_closed < Duration::from_millis(400),
        "idle connection closed {idle_closed:?} after shutdown"
    );

    let (result, took) = server.stop_within(Duration::from_secs(3));
    println!("serve() returned {took:?} after the in-flight response");
    result.expect("serve() returns Ok");
    assert!(
        took < Duration::from_secs(3),
        "serve() returned after {took:?}"
    );
    assert_eq!(server.stats.open_connections(), 0);
    // The listener is gone.
    match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
        Ok(mut s) => {
            // Only possible if another process grabbed the port meanwhile; it must not be us.
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let _ = s.write_all(get_request("/hello").as_bytes());
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            assert!(
                !String::from_utf8_lossy(&buf[..n]).contains("200"),
                "still served after shutdown"
            );
        }
    }
}

/// "No timeout" spelled as `Duration::MAX` must not overflow a deadline anywhere.
#[test]
fn duration_max_timeouts_mean_no_timeout() {
    let timeouts = Timeouts::builder()
        .idle(Duration::MAX)
        .head(Duration::MAX)
        .body(Duration::MAX)
        .write(Duration::MAX)
        .build()
        .expect("valid timeouts");
    let config = test_config()
        .to_builder()
        .handler_timeout(Duration::MAX)
        .drain_timeout(Duration::MAX)
        .timeouts(timeouts)
        .build()
        .expect("valid config");
    let server = start(config);
    let mut c = server.client();
    let r = c.get("/hello");
    assert_eq!(r.status, 200);
    let r = c.get("/hello");
    assert_eq!(r.status, 200);
}

// ---- configuration -------------------------------------------------------------------------

/// A configured Server value goes out on every response (the preformatted 200 block and the
/// other statuses alike); one that could split a response or does not fit is refused when the
/// configuration is built.
#[test]
fn server_name_is_sent_and_checked() {
    let config = test_config()
        .to_builder()
        .server_name("edge/2.1 (test)")
        .build()
        .expect("valid config");
    let server = start(config);
    let mut c = server.client();
    c.send(get_request("/hello") + &get_request("/missing"));
    for status in [200, 404] {
        let r = c.response();
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(r.header("server"), Some("edge/2.1 (test)"), "{r:?}");
    }
    server.stop();

    let too_long = "s".repeat(canter_rt::MAX_SERVER_NAME + 1);
    for bad in ["", "a\r\nX-Injected: 1", "caf\u{e9}", too_long.as_str()] {
        let err = test_config()
            .to_builder()
            .server_name(bad)
            .build()
            .expect_err(bad);
        assert_eq!(err.setting(), "server_name", "{bad:?}");
    }
}

/// Settings out of range are refused, by name, when the configuration is built: a `Config` in
/// hand is always one `bind` can serve.
#[test]
fn config_builder_refuses_out_of_range_settings() {
    let b = || test_config().to_builder();
    for (builder, name) in [
        (b().workers(0), "workers"),
        (b().high_water(0), "high_water"),
        (b().read_budget(0), "read_budget"),
        (b().max_pipeline(0), "max_pipeline"),
        (b().max_connections(0), "max_connections"),
        (b().backlog(0), "backlog"),
        (b().handler_timeout(Duration::ZERO), "handler_timeout"),
    ] {
        let err = builder.build().expect_err(name);
        assert_eq!(err.setting(), name, "{err}");
    }
    let config = b().workers(3).max_pipeline(1).build().expect("valid");
    assert_eq!((config.workers(), config.max_pipeline()), (3, 1));
    // Zero means "no summary" for the fault log, not a mistake.
    let quiet = b()
        .fault_log_interval(Duration::ZERO)
        .build()
        .expect("valid");
    assert!(quiet.fault_log_interval().is_zero());
}

// ---- worker start-up -----------------------------------------------------------------------

#[test]
fn a_panicking_service_factory_ends_serve_with_an_error() {
    let server = canter_rt::Server::bind(test_config()).expect("bind");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let result = server.serve(|_worker| -> fn(Request) -> Reply { panic!("no service today") });
        let _ = tx.send(result);
    });
    let result = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("serve() returned");
    let err = result.expect_err("a worker without a service must fail serve()");
    assert!(err.to_string().contains("panicked"), "{err}");
}

/// An HTTP listener hands a connection over only once its request has arrived
/// (`TCP_DEFER_ACCEPT`): a silent client is not accepted at connect, but is served as soon as
/// it speaks. Without the option the accept comes at once.
#[test]
fn connections_are_handed_over_with_their_request() {
    for defer in [true, false] {
        let server = start(test_builder().defer_accept(defer).build().unwrap());
        // Serving already (the option is set when `serve` starts, after `bind`).
        assert_worker_alive(&server);
        let mut c = server.client();
        if !defer {
            server.wait_accepted(2, Duration::from_secs(2));
            server.stop();
            continue;
        }
        thread::sleep(Duration::from_millis(300));
        assert_eq!(
            server.stats.accepted(),
            1,
            "accepted before the client spoke"
        );
        c.send(get_request("/hello"));
        server.wait_accepted(2, Duration::from_secs(5));
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, "hello"), "{r:?}");
        server.stop();
    }
}

/// A client that connects and stays silent is handed over once the kernel stops waiting for
/// it (about a second), and is served when it speaks.
#[test]
fn a_silent_client_is_handed_over_after_the_defer_period() {
    let server = start(test_config());
    assert_worker_alive(&server);
    let mut c = server.client();
    let waited = Instant::now();
    server.wait_accepted(2, Duration::from_secs(10));
    assert!(
        waited.elapsed() >= Duration::from_millis(500),
        "accepted after {:?}: not deferred",
        waited.elapsed()
    );
    c.send(get_request("/hello"));
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "hello"), "{r:?}");
    server.stop();
}

/// A response to the client's last request (`Connection: close`) leaves with the close; one
/// larger than the socket takes at once is written in pieces as the client reads, all of it
/// arrives, then the end of the stream.
#[test]
fn a_large_last_answer_arrives_whole_before_the_close() {
    let server = start(test_config());
    for pause in [Duration::ZERO, Duration::from_millis(200)] {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        thread::sleep(pause);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&got[..end]);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("Connection: close"), "{head}");
        assert_eq!(got.len() - end, BIG.len(), "{head}");
        assert!(got[end..].iter().all(|&b| b == b'y'));
    }
    server.stop();
}
