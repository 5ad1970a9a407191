//! HTTP/2 flow control against a handler that never reads its request body: body bytes the
//! server held for a stream that ends must go back to the connection window.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use canter_rt::{Reply, Request, Response};
use canter_testkit::read_some;
use common::{test_config, TestServer};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads frames until a PING ACK; panics on GOAWAY or a closed connection.
fn until_ping_ack(sock: &mut TcpStream, buf: &mut Vec<u8>, round: u32) {
    loop {
        while buf.len() >= 9 {
            let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            assert_ne!(
                kind,
                7,
                "GOAWAY after {round} reset uploads: {:?}",
                &buf[9..9 + len]
            );
            buf.drain(..9 + len);
            if kind == 6 && flags & 1 != 0 {
                return;
            }
        }
        let mut chunk = [0u8; 16384];
        let n = read_some(sock, &mut chunk).unwrap();
        assert!(n > 0, "connection closed after {round} reset uploads");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn reset_streams_give_back_the_window_of_unread_bodies() {
    // A handler that waits and never reads its body: everything a stream sends stays in its
    // pipe until the stream is reset.
    let server = TestServer::start(test_config(), |_| {
        |_req: Request| -> Reply {
            Reply::future(async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Response::text("late")
            })
        }
    });
    let mut sock = TcpStream::connect(server.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(4, 0, 0, &[]));
    sock.write_all(&hello).unwrap();
    // POST / with :authority x (HPACK static indices, :authority without indexing).
    let block = [0x83, 0x86, 0x84, 0x01, 0x01, b'x'];
    let piece = vec![b'u'; 16 * 1024];
    let mut buf = Vec::new();
    // 8 streams of 192 KiB: 1.5 MiB, more than the 1 MiB connection window.
    for round in 0..8u32 {
        let id = 1 + 2 * round;
        let mut batch = frame(1, 0x4, id, &block);
        for _ in 0..12 {
            batch.extend(frame(0, 0, id, &piece));
        }
        batch.extend(frame(6, 0, 0, &[1; 8])); // PING: the server has taken the data
        sock.write_all(&batch).unwrap();
        until_ping_ack(&mut sock, &mut buf, round);
        sock.write_all(&frame(3, 0, id, &8u32.to_be_bytes()))
            .unwrap(); // RST_STREAM CANCEL
    }
    sock.write_all(&frame(6, 0, 0, &[2; 8])).unwrap();
    until_ping_ack(&mut sock, &mut buf, 8);
}

/// A body that yields a line every 200 ms, five times.
struct Ticks {
    left: u32,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl canter_rt::BodyStream for Ticks {
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::io::Result<bytes::Bytes>>> {
        use std::future::Future;
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        self.left -= 1;
        let next = tokio::time::Instant::now() + Duration::from_millis(200);
        self.sleep.as_mut().reset(next);
        std::task::Poll::Ready(Some(Ok(bytes::Bytes::from_static(b"tick\n"))))
    }
}

#[test]
fn a_slow_response_stream_does_not_keep_the_worker_busy() {
    // One worker. While an HTTP/2 stream waits on its slow body, the worker must go on serving
    // others: a stream whose source said Pending was pulled again and again, spinning the task
    // and starving every other connection of the worker.
    let server = TestServer::start(test_config(), |_| {
        |req: Request| -> Reply {
            if req.path() == "/slow" {
                let ticks = Ticks {
                    left: 5,
                    sleep: Box::pin(tokio::time::sleep(Duration::from_millis(200))),
                };
                return Response::new(canter_rt::http::StatusCode::OK)
                    .with_body(canter_rt::Body::stream(None, ticks))
                    .into();
            }
            Response::text("fast").into()
        }
    });
    let mut h2 = TcpStream::connect(server.addr).unwrap();
    h2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    // GET /slow: :method GET, :scheme http (indexed), :path and :authority as literals.
    let mut block = vec![0x82, 0x86, 0x04, 5];
    block.extend_from_slice(b"/slow");
    block.extend_from_slice(&[0x01, 1, b'x']);
    out.extend(frame(1, 0x4 | 0x1, 1, &block));
    h2.write_all(&out).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // A starved worker never answers: the client's read times out and the test fails.
    let mut c = server.client();
    c.set_read_timeout(Duration::from_secs(3));
    assert_eq!(c.get("/fast").status, 200);
    // And the slow stream completes: its five lines, then END_STREAM.
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.windows(5).filter(|w| w == b"tick\n").count().eq(&5) {
        let n = read_some(&mut h2, &mut chunk).unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&chunk[..n]);
    }
}

/// A WINDOW_UPDATE that reopens a stream whose window ran out is acted on at once. It arrives
/// while the server's output is far above its high-water mark (reading waits then, and the
/// event that announced it is spent); when the output then drains, the server must read it
/// without another event, not at its next timer (the keepalive ping, 30 s, was the only thing
/// that woke it: an echo over WebSocket on HTTP/2 stalled at exactly the client's window).
#[test]
fn a_window_update_that_arrives_while_output_backs_up_is_acted_on_at_once() {
    const WINDOW: u32 = 16 << 20;
    const BODY: usize = 24 << 20;
    // Timers far beyond the test's bound, so that none of them hides a stall.
    let timeouts = common::test_timeouts()
        .idle(Duration::from_secs(120))
        .write(Duration::from_secs(120))
        .build()
        .unwrap();
    let config = common::test_builder().timeouts(timeouts).build().unwrap();
    let server = TestServer::start(config, |_| {
        |_req: Request| -> Reply { Response::text(vec![b'x'; BODY]).into() }
    });
    let mut h2 = TcpStream::connect(server.addr).unwrap();
    h2.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut settings = 4u16.to_be_bytes().to_vec(); // SETTINGS_INITIAL_WINDOW_SIZE
    settings.extend_from_slice(&WINDOW.to_be_bytes());
    out.extend(frame(4, 0, 0, &settings));
    out.extend(frame(8, 0, 0, &(64u32 << 20).to_be_bytes()));
    let mut block = vec![0x82, 0x86, 0x04, 1, b'/', 0x01, 1, b'x'];
    out.extend(frame(1, 0x4 | 0x1, 1, &std::mem::take(&mut block)));
    h2.write_all(&out).unwrap();
    // Read until the server has sent a first part of its window and is held by the socket.
    let (mut buf, mut data, mut updated) = (Vec::new(), 0usize, false);
    let mut chunk = vec![0u8; 1 << 20];
    let start = std::time::Instant::now();
    loop {
        while buf.len() >= 9 {
            let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            assert_ne!(kind, 7, "GOAWAY: {:?}", &buf[9..9 + len]);
            buf.drain(..9 + len);
            if kind == 0 {
                data += len;
                if flags & 1 != 0 {
                    assert_eq!(data, BODY);
                    let took = start.elapsed();
                    assert!(took < Duration::from_secs(20), "the body took {took:?}");
                    return;
                }
            }
        }
        if !updated && data > 0 {
            // The server's output is backed up with most of the window: the update arrives
            // while it cannot read.
            std::thread::sleep(Duration::from_millis(200));
            h2.write_all(&frame(8, 0, 1, &((BODY as u32) - WINDOW).to_be_bytes()))
                .unwrap();
            std::thread::sleep(Duration::from_millis(200));
            updated = true;
        }
        let n = read_some(&mut h2, &mut chunk).unwrap();
        assert!(n > 0, "closed after {data} bytes of data");
        buf.extend_from_slice(&chunk[..n]);
    }
}
