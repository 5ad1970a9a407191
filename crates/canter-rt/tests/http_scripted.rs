//! The HTTP/1.1 connection actor against a scripted peer on virtual time, through
//! `canter_rt::serve_connection`: the transport is an in-memory pipe (`tokio::io::duplex`) and
//! the clock is tokio's paused clock, which jumps to the next timer whenever everything is
//! idle. Timeouts of seconds are tested exactly, in milliseconds of real time, with no sleeps
//! and no sockets. What needs a kernel (resets, backlogs, many connections) stays in
//! `faults.rs`.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use canter_rt::http::StatusCode;
use canter_rt::{serve_connection, Body, ClientFault, Config, Reply, Request, Response, Timeouts};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

/// The coarse clock's resolution: a timeout fires at most this late (never early).
const TICK: Duration = Duration::from_millis(100);

fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4000))
}

fn app(req: Request) -> Reply {
    match req.path() {
        "/hello" => Response::text("hello").into(),
        "/never" => Reply::future(async {
            std::future::pending::<()>().await;
            Response::text("unreachable")
        }),
        "/big" => Response::text(vec![b'x'; 4 << 20]).into(),
        "/trickle" => Response::new(StatusCode::OK)
            .with_body(Body::stream(None, Trickle::new(5)))
            .into(),
        "/stall-stream" => Response::new(StatusCode::OK)
            .with_body(Body::stream(Some(1000), StallAfterOne::default()))
            .into(),
        "/sum" => common::sum_body(req),
        "/hold" => Reply::future(async {
            let hold = Hold::start();
            tokio::time::sleep(HOLD_FOR).await;
            hold.done();
            Response::text("held")
        }),
        _ => Response::new(StatusCode::NOT_FOUND).into(),
    }
}

/// `/hold` sleeps this long (virtual time) before answering "held".
const HOLD_FOR: Duration = Duration::from_millis(1500);

thread_local! {
    /// `/hold` handler futures on this test's thread: started, dropped (finished or not),
    /// finished. Each test runs on a thread of its own, so each has its own counts.
    static HOLDS: std::cell::Cell<[u32; 3]> = const { std::cell::Cell::new([0; 3]) };
}

/// Counts a `/hold` handler's start, end and drop.
struct Hold;

impl Hold {
    fn start() -> Hold {
        bump(0);
        Hold
    }
    fn done(&self) {
        bump(2);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        bump(1);
    }
}

fn bump(i: usize) {
    HOLDS.with(|h| {
        let mut v = h.get();
        v[i] += 1;
        h.set(v);
    });
}

/// `/hold` handlers (started, dropped, finished) so far on this thread.
fn holds() -> [u32; 3] {
    HOLDS.with(|h| h.get())
}

/// Lets the server's side run until a `/hold` handler has started.
async fn until_held(started: u32) {
    while holds()[0] < started {
        tokio::task::yield_now().await;
    }
}

/// One worker's settings with the given timeouts and handler timeout.
fn config(timeouts: Timeouts, handler_timeout: Duration) -> Config {
    Config::builder()
        .timeouts(timeouts)
        .handler_timeout(handler_timeout)
        .build()
        .unwrap()
}

/// Serves `app` on one end of a pipe while `script` plays the peer on the other; returns the
/// server's counters and the virtual time at which the connection ended.
async fn converse<F>(
    config: Config,
    capacity: usize,
    script: impl FnOnce(DuplexStream) -> F,
) -> (std::sync::Arc<canter_rt::Stats>, Instant)
where
    F: std::future::Future<Output = ()>,
{
    let (ours, theirs) = tokio::io::duplex(capacity);
    let server = async {
        let stats = serve_connection(ours, peer(), app, config).await;
        (stats, Instant::now())
    };
    // Bounded in virtual time: a timeout that never fires fails the test instead of hanging it.
    let both = async { tokio::join!(server, script(theirs)) };
    let ((stats, ended), ()) = tokio::time::timeout(Duration::from_secs(600), both)
        .await
        .expect("the connection or the script did not end within 600 s of virtual time");
    (stats, ended)
}

/// Everything the server sends until it closes its side.
async fn read_to_close(peer: &mut DuplexStream) -> String {
    let mut out = Vec::new();
    peer.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads until the server closes; checks that it answered `status` (`"408"`) with `Connection:
/// close`, `want` after `since` (within a tick).
async fn expect_closing_answer(p: &mut DuplexStream, status: &str, since: Instant, want: Duration) {
    let text = read_to_close(p).await;
    assert!(text.starts_with(&format!("HTTP/1.1 {status} ")), "{text}");
    assert!(text.contains("Connection: close\r\n"), "{text}");
    assert_within_a_tick(status, since.elapsed(), want);
}

fn assert_within_a_tick(what: &str, took: Duration, want: Duration) {
    assert!(
        took >= want && took <= want + 2 * TICK,
        "{what} after {took:?}, wanted {want:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn pipelined_requests_are_answered_in_order_and_the_connection_kept() {
    let start = Instant::now();
    let idle = Duration::from_secs(30);
    let timeouts = Timeouts::builder().idle(idle).build().unwrap();
    let (_, ended) = converse(
        config(timeouts, Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(
                b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
            )
            .await
            .unwrap();
            let mut buf = vec![0; 4096];
            let mut text = String::new();
            while text.matches("HTTP/1.1 ").count() < 2 || !text.ends_with("\r\n\r\n") {
                let n = p.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed early: {text}");
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            let first = text.find("HTTP/1.1 200 OK").unwrap();
            let second = text.find("HTTP/1.1 404 Not Found").unwrap();
            assert!(first < second, "{text}");
            assert!(text.contains("\r\n\r\nhello"), "{text}");
            // Kept open: the next request on the same connection is answered too.
            p.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let rest = read_to_close(&mut p).await;
            assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
            assert!(rest.contains("Connection: close\r\n"), "{rest}");
        },
    )
    .await;
    // Closed at once on `Connection: close`, not at the idle timeout.
    assert!(ended - start < TICK, "{:?}", ended - start);
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_closes_at_the_idle_timeout() {
    let idle = Duration::from_secs(7);
    let timeouts = Timeouts::builder().idle(idle).build().unwrap();
    let (stats, _) = converse(
        config(timeouts, Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = vec![0; 4096];
            let n = p.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
            let answered = Instant::now();
            // Nothing more is sent; the server closes without a word at the idle timeout.
            assert_eq!(read_to_close(&mut p).await, "");
            assert_within_a_tick("idle close", answered.elapsed(), idle);
        },
    )
    .await;
    assert_eq!(stats.client_faults(ClientFault::IdleTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_request_head_gets_408_at_the_head_timeout() {
    let head = Duration::from_secs(5);
    let timeouts = Timeouts::builder().head(head).build().unwrap();
    let (stats, _) = converse(
        config(timeouts, Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            let start = Instant::now();
            p.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Half")
                .await
                .unwrap();
            expect_closing_answer(&mut p, "408", start, head).await;
        },
    )
    .await;
    assert_eq!(stats.client_faults(ClientFault::HeadTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_never_completes_gets_503_at_the_handler_timeout() {
    let handler = Duration::from_secs(20);
    let (_, _) = converse(
        config(Timeouts::default(), handler),
        1 << 16,
        |mut p| async move {
            let start = Instant::now();
            p.write_all(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            expect_closing_answer(&mut p, "503", start, handler).await;
        },
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_request_body_is_cut_off_at_the_body_timeout() {
    let body = Duration::from_secs(3);
    let timeouts = Timeouts::builder().body(body).build().unwrap();
    let (stats, _) = converse(
        config(timeouts, Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(b"POST /sum HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
                .await
                .unwrap();
            let sent = Instant::now();
            expect_closing_answer(&mut p, "408", sent, body).await;
        },
    )
    .await;
    assert_eq!(stats.client_faults(ClientFault::BodyTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_below_the_minimum_rate_is_cut_off_after_the_grace() {
    // 10 bytes every 250 ms: 40 B/s, below 200 B/s, but never 5 s without progress.
    let config = Config::builder()
        .min_body_rate(200)
        .min_body_rate_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let (stats, _) = converse(config, 1 << 16, |mut p| async move {
        p.write_all(b"POST /sum HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            .await
            .unwrap();
        let start = Instant::now();
        let mut buf = vec![0; 4096];
        let mut got = Vec::new();
        loop {
            if p.write_all(&[b'a'; 10]).await.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(250), p.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            if !got.is_empty() || start.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        let at = start.elapsed();
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 408 "), "after {at:?}: {text}");
        // Not before the grace, and well before the 30 s body timeout would have fired.
        assert!(
            at >= Duration::from_secs(2) && at < Duration::from_secs(5),
            "cut off after {at:?}"
        );
    })
    .await;
    assert_eq!(stats.client_faults(ClientFault::BodyTimeout), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_above_the_minimum_rate_is_served_in_full() {
    // 1,000 bytes every 100 ms (10 KB/s) for 3 s, past the grace: above the rate.
    let config = Config::builder()
        .min_body_rate(200)
        .min_body_rate_grace(Duration::from_secs(1))
        .build()
        .unwrap();
    let (stats, _) = converse(config, 1 << 16, |mut p| async move {
        p.write_all(
            b"POST /sum HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        for _ in 0..30 {
            p.write_all(&[b'b'; 1000]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let text = read_to_close(&mut p).await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n30000"), "{text}");
    })
    .await;
    assert_eq!(stats.client_faults(ClientFault::BodyTimeout), 0);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_is_dropped_at_the_write_timeout() {
    let write = Duration::from_secs(4);
    let timeouts = Timeouts::builder().write(write).build().unwrap();
    // A 64 KiB pipe and a 4 MiB answer: the server fills the pipe and then waits on the peer.
    let start = Instant::now();
    let (_, ended) = converse(
        config(timeouts, Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = vec![0; 1024];
            let n = p.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
            // Read no more; hold the pipe open long after the server has given up on it.
            tokio::time::sleep(Duration::from_secs(60)).await;
        },
    )
    .await;
    assert_within_a_tick("write timeout", ended - start, write);
}

/// A streamed body whose pieces come slowly (an event stream): the head and each piece reach
/// the client as they are produced, at the stream's own pace (one every 200 ms here), not
/// when the response ends.
#[tokio::test(start_paused = true)]
async fn streamed_pieces_are_sent_as_they_come() {
    let (_, ended) = converse(Config::default(), 1 << 16, |mut p| async move {
        let start = Instant::now();
        p.write_all(b"GET /trickle HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut seen = String::new();
        let mut buf = vec![0; 4096];
        for k in (0..5).rev() {
            let piece = format!("piece {k}\n");
            while !seen.contains(&piece) {
                let n = p.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before {piece:?}: {seen}");
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            let want = Duration::from_millis(200 * (4 - k));
            assert_eq!(
                start.elapsed(),
                want,
                "{piece:?} after {:?}",
                start.elapsed()
            );
            if k == 4 {
                assert!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen}");
                assert!(seen.contains("Transfer-Encoding: chunked\r\n"), "{seen}");
            }
        }
        seen.push_str(&read_to_close(&mut p).await);
        assert!(seen.ends_with("\r\n0\r\n\r\n"), "{seen}");
    })
    .await;
    let _ = ended;
}

/// A streamed response that stalls, whose client then leaves: the connection watches its
/// transport while the stream is pending, so the peer's close ends it at once, not at the
/// handler timeout.
#[tokio::test(start_paused = true)]
async fn a_stalled_stream_ends_when_its_client_leaves() {
    let start = Instant::now();
    let (_, ended) = converse(
        config(Timeouts::default(), Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(b"GET /stall-stream HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = vec![0; 4096];
            let n = p.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"));
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(p);
        },
    )
    .await;
    // Gone right after the client's close at 2 s, long before the 60 s handler timeout.
    assert_within_a_tick("connection end", ended - start, Duration::from_secs(2));
}

/// `left` small pieces, the first at once, then one every 200 ms.
struct Trickle {
    left: u32,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Trickle {
    fn new(pieces: u32) -> Trickle {
        Trickle {
            left: pieces,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }
}

impl canter_rt::BodyStream for Trickle {
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::io::Result<bytes::Bytes>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        if std::future::Future::poll(self.sleep.as_mut(), cx).is_pending() {
            return std::task::Poll::Pending;
        }
        let next = tokio::time::Instant::now() + Duration::from_millis(200);
        self.sleep.as_mut().reset(next);
        self.left -= 1;
        std::task::Poll::Ready(Some(Ok(bytes::Bytes::from(format!(
            "piece {}\n",
            self.left
        )))))
    }
}

/// Yields one piece, then is pending forever (never wakes the task).
#[derive(Default)]
struct StallAfterOne(bool);

impl canter_rt::BodyStream for StallAfterOne {
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::io::Result<bytes::Bytes>>> {
        if self.0 {
            return std::task::Poll::Pending;
        }
        self.0 = true;
        std::task::Poll::Ready(Some(Ok(bytes::Bytes::from_static(b"first piece"))))
    }
}

/// `serve_connection` hands a connection that opens with the HTTP/2 preface to the HTTP/2
/// actor (Config::http2 is on by default): the server's first frame is its SETTINGS, and a
/// GOAWAY ends the connection.
#[tokio::test(start_paused = true)]
async fn the_http2_preface_gets_an_http2_answer() {
    let (_, _) = converse(Config::default(), 1 << 16, |mut p| async move {
        p.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
        p.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        let mut head = [0u8; 9];
        p.read_exact(&mut head).await.unwrap();
        let (len, kind, stream) = (
            u32::from_be_bytes([0, head[0], head[1], head[2]]),
            head[3],
            u32::from_be_bytes([head[5], head[6], head[7], head[8]]),
        );
        assert_eq!((kind, stream), (4, 0), "first frame {head:?}");
        assert_eq!(len % 6, 0, "SETTINGS payload of {len} bytes");
        // GOAWAY (type 7): last stream 0, NO_ERROR; the server closes.
        p.write_all(&[0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        let mut rest = Vec::new();
        p.read_to_end(&mut rest).await.unwrap();
    })
    .await;
}

/// With HTTP/2 on (the default), input that is not the HTTP/2 preface is HTTP/1.1's to answer,
/// malformed request lines included (h1spec's "Request without HTTP version" and "Invalid
/// prefix of request", h2spec's invalid preface): 400 and a close, never a silent close.
#[tokio::test(start_paused = true)]
async fn a_malformed_first_request_line_gets_400_with_http2_on() {
    for line in [
        &b"GET / \r\n\r\n"[..],
        b"GET /\r\n\r\n",
        b"GET / \r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"Extra lineGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"A B C\r\n\r\n",
        b"A B C D\r\n\r\n",
        b"INVALID CONNECTION PREFACE\r\n\r\n",
    ] {
        let (stats, _) = converse(Config::default(), 1 << 16, |mut p| async move {
            p.write_all(line).await.unwrap();
            let text = read_to_close(&mut p).await;
            assert!(text.starts_with("HTTP/1.1 400 "), "{line:?}: {text}");
            assert!(text.contains("Connection: close\r\n"), "{line:?}: {text}");
        })
        .await;
        assert_eq!(stats.client_faults(ClientFault::BadRequest), 1, "{line:?}");
    }
}

/// A client that closes its connection, or half-closes it, while its request's handler is
/// pending: the handler's future is dropped at that moment (its work cancelled), not run to the
/// end for nobody, and the connection ends then.
#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_cancels_its_pending_handler() {
    for (round, close) in [(1, true), (2, false)] {
        let start = Instant::now();
        let (_, ended) = converse(
            config(Timeouts::default(), Duration::from_secs(60)),
            1 << 16,
            |mut p| async move {
                p.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                until_held(round).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                if close {
                    drop(p);
                } else {
                    // Half-closed: by default also taken to mean the client is gone.
                    p.shutdown().await.unwrap();
                    assert_eq!(read_to_close(&mut p).await, "", "round {round}");
                }
            },
        )
        .await;
        let [started, dropped, finished] = holds();
        assert_eq!(
            (started, dropped, finished),
            (round, round, 0),
            "round {round}"
        );
        assert_eq!(
            ended - start,
            Duration::from_millis(300),
            "round {round}: the connection ends when the client leaves"
        );
    }
}

/// With `half_close` set, a client that half-closes after its request gets the answer, when
/// the handler is done.
#[tokio::test(start_paused = true)]
async fn half_close_config_lets_the_pending_handler_answer() {
    let start = Instant::now();
    let config = config(Timeouts::default(), Duration::from_secs(60))
        .to_builder()
        .half_close(true)
        .build()
        .unwrap();
    let (_, ended) = converse(config, 1 << 16, |mut p| async move {
        p.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        p.shutdown().await.unwrap();
        let answer = read_to_close(&mut p).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nheld"), "{answer}");
    })
    .await;
    assert_eq!(holds(), [1, 1, 1]);
    assert_eq!(
        ended - start,
        HOLD_FOR,
        "answered and closed when the handler finished"
    );
}

/// The next pipelined request, sent while the handler of the one before is pending (and so
/// read while the connection watches its peer), is answered after it, in order.
#[tokio::test(start_paused = true)]
async fn a_request_sent_while_a_handler_is_pending_is_answered_after_it() {
    let start = Instant::now();
    converse(
        config(Timeouts::default(), Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            p.write_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            until_held(1).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            p.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let text = read_to_close(&mut p).await;
            let held = text.find("\r\n\r\nheld").expect(&text);
            let hello = text.find("\r\n\r\nhello").expect(&text);
            assert!(held < hello, "{text}");
            assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
            assert_eq!(
                Instant::now() - start,
                HOLD_FOR,
                "both when the first was done"
            );
        },
    )
    .await;
    assert_eq!(holds(), [1, 1, 1]);
}

/// A chunked request body that arrives in 200 pieces a millisecond apart, every third chunk
/// itself split in the middle of its data, its halves a millisecond apart (tokio's timers count
/// whole milliseconds): all of it is read, the
/// answer comes when the last piece is in, and the connection is kept.
#[tokio::test(start_paused = true)]
async fn a_chunked_body_in_delayed_pieces_is_read_whole() {
    let start = Instant::now();
    converse(
        config(Timeouts::default(), Duration::from_secs(60)),
        1 << 16,
        |mut p| async move {
            let pieces: Vec<Vec<u8>> = (0..200usize)
                .map(|i| vec![b'a' + (i % 26) as u8; (i * 37) % 700 + 1])
                .collect();
            let total: usize = pieces.iter().map(Vec::len).sum();
            p.write_all(b"POST /sum HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            for (i, piece) in pieces.iter().enumerate() {
                let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                chunk.extend_from_slice(piece);
                chunk.extend_from_slice(b"\r\n");
                if i % 3 == 0 {
                    let mid = chunk.len() / 2;
                    p.write_all(&chunk[..mid]).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    p.write_all(&chunk[mid..]).await.unwrap();
                } else {
                    p.write_all(&chunk).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let sent_at = Instant::now();
            p.write_all(b"0\r\n\r\n").await.unwrap();
            let mut buf = vec![0; 4096];
            let mut text = String::new();
            while !text.ends_with(&format!("\r\n\r\n{total}")) {
                let n = p.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed early: {text}");
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            assert!(!text.contains("Connection: close"), "{text}");
            assert_eq!(Instant::now(), sent_at, "answered as the last chunk came");
            // 200 pieces 1 ms apart, 67 of them split 1 ms apart.
            assert_eq!(sent_at - start, Duration::from_millis(200 + 67));
            // Kept: the next request is answered on the same connection.
            p.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let rest = read_to_close(&mut p).await;
            assert!(rest.ends_with("\r\n\r\nhello"), "{rest}");
        },
    )
    .await;
}
