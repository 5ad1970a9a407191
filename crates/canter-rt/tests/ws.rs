//! WebSocket over HTTP/1.1 on real sockets (127.0.0.1): the upgrade and its refusals, echo of
//! text and binary (fragmented, pipelined behind the upgrade, compressed), pings, both close
//! handshakes, protocol errors closed with their codes, backpressure on a peer that stops
//! reading, sends from another task, and the close a draining server sends. The client is
//! canter-ws's engine in the client role over a blocking socket.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use canter_rt::ws::{CloseFrame, Message, WebSocket};
use canter_rt::{Reply, Request, Response, WsUpgrade};
use canter_testkit::read_some;
use canter_ws::deflate::{self, DeflateConfig};
use canter_ws::{Connection, Event, Limits};
use common::ws_client::{client_role, has_field, raw_handshake, upgrade_request, Client, KEY};
use common::{test_config, TestServer};

/// The service: `/echo` echoes, `/closer` closes first with 4000, `/flood` sends 64 KiB
/// messages counting them in `SENT`, anything else 404.
fn app(sent: Arc<AtomicUsize>) -> impl Fn(Request) -> Reply {
    move |req: Request| -> Reply {
        let path = req.path().to_owned();
        let ws = match WsUpgrade::from_request(&req) {
            Ok(ws) => ws.protocols(["chat", "superchat"]),
            Err(refused) => return Response::from(refused).into(),
        };
        match path.as_str() {
            "/echo" => ws.on_upgrade(echo).into(),
            "/closer" => ws
                .on_upgrade(|socket: WebSocket| async move {
                    socket.send("bye").await.unwrap();
                    socket.close(4000, "done").unwrap();
                    // The peer's answer to the close comes as a message, then the end.
                    while socket.recv().await.is_some() {}
                })
                .into(),
            "/flood" => {
                let sent = sent.clone();
                ws.on_upgrade(move |socket: WebSocket| async move {
                    let block = bytes::Bytes::from(vec![7u8; 64 * 1024]);
                    while socket.send(block.clone()).await.is_ok() {
                        sent.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .into()
            }
            "/from-task" => ws.on_upgrade(from_task).into(),
            _ => Response::text("not found\n")
                .with_status(canter_rt::http::StatusCode::NOT_FOUND)
                .into(),
        }
    }
}

async fn echo(socket: WebSocket) {
    while let Some(Ok(msg)) = socket.recv().await {
        if matches!(msg, Message::Close(_)) {
            break;
        }
        if socket.send(msg).await.is_err() {
            break;
        }
    }
}

/// A task of the handler's sends 2,000 numbered 4 KiB messages, then closes with 4000: sends
/// from outside the connection's task, written by the worker's flusher while the socket takes
/// them and by the connection's task once it is full.
async fn from_task(socket: WebSocket) {
    let (tx, rx) = socket.split();
    tokio::task::spawn_local(async move {
        for i in 0u32..2000 {
            let mut m = vec![0u8; 4096];
            m[..4].copy_from_slice(&i.to_be_bytes());
            if tx.send(m).await.is_err() {
                return;
            }
        }
        let close = CloseFrame {
            code: 4000,
            reason: "done".into(),
        };
        let _ = tx.send(Message::Close(Some(close))).await;
    });
    while rx.recv().await.is_some() {}
}

fn start() -> (TestServer, Arc<AtomicUsize>) {
    let sent = Arc::new(AtomicUsize::new(0));
    let s = sent.clone();
    (
        TestServer::start(test_config(), move |_| app(s.clone())),
        sent,
    )
}

#[test]
fn echoes_text_and_binary_and_closes_on_the_clients_close() {
    let (server, _) = start();
    let mut c = Client::open(
        server.addr,
        "/echo",
        "Sec-WebSocket-Protocol: superchat, chat\r\n",
    );
    assert!(
        has_field(&c.head, "sec-websocket-protocol", "superchat"),
        "{}",
        c.head
    );
    c.write(|ws, out| ws.send_text("héllo", out).unwrap());
    assert_eq!(c.next(), Some(Event::Text("héllo".into())));
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    c.write(|ws, out| ws.send_binary(&blob, out).unwrap());
    assert_eq!(c.next(), Some(Event::Binary(blob.into())));
    // A ping is answered with its payload, not handed to the handler (the echo would repeat it).
    c.write(|ws, out| ws.send_ping(b"are you there", out).unwrap());
    assert_eq!(c.next(), Some(Event::Pong("are you there".into())));
    c.write(|ws, out| ws.close(1000, "bye", out));
    assert_eq!(c.next(), Some(Event::Close(Some((1000, String::new())))));
    c.expect_end();
}

#[test]
fn a_fragmented_message_with_a_ping_between_its_frames_is_echoed_whole() {
    let (server, _) = start();
    let mut c = Client::open(server.addr, "/echo", "");
    // Hand-made frames: "Hel" (text, not final), a ping, "lo" (continuation, final); masked
    // with the zero key, which leaves the payload as it is.
    let mut frames = Vec::new();
    frames.extend_from_slice(b"\x01\x83\0\0\0\0Hel");
    frames.extend_from_slice(b"\x89\x80\0\0\0\0");
    frames.extend_from_slice(b"\x80\x82\0\0\0\0lo");
    c.tcp.write_all(&frames).unwrap();
    assert_eq!(c.next(), Some(Event::Pong("".into())));
    assert_eq!(c.next(), Some(Event::Text("Hello".into())));
}

#[test]
fn frames_sent_right_behind_the_upgrade_request_are_the_websockets_first_input() {
    let (server, _) = start();
    let mut early = Vec::new();
    let mut ws = Connection::new(client_role(), Limits::default());
    ws.send_text("early bird", &mut early).unwrap();
    let mut c = Client::open_with(server.addr, &upgrade_request("/echo", ""), &early);
    assert_eq!(c.next(), Some(Event::Text("early bird".into())));
}

#[test]
fn permessage_deflate_is_agreed_and_compressed_messages_echo() {
    let (server, _) = start();
    let offer = deflate::client_offer(DeflateConfig::default());
    let mut c = Client::open(
        server.addr,
        "/echo",
        &format!("Sec-WebSocket-Extensions: {offer}\r\n"),
    );
    assert!(
        c.head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions: permessage-deflate"),
        "{}",
        c.head
    );
    let json = "{\"symbol\":\"ACME\",\"bid\":101.25,\"offer\":101.5}".repeat(100);
    for _ in 0..3 {
        c.write(|ws, out| ws.send_text(&json, out).unwrap());
        assert_eq!(c.next(), Some(Event::Text(json.clone().into())));
    }
}

#[test]
fn the_server_closes_first_and_the_connection_ends_after_the_answer() {
    let (server, _) = start();
    let mut c = Client::open(server.addr, "/closer", "");
    assert_eq!(c.next(), Some(Event::Text("bye".into())));
    // The engine answers the server's close itself.
    assert_eq!(c.next(), Some(Event::Close(Some((4000, "done".into())))));
    c.expect_end();
}

#[test]
fn protocol_errors_close_with_their_codes() {
    let (server, _) = start();
    // An unmasked frame from a client: 1002.
    let mut c = Client::open(server.addr, "/echo", "");
    c.tcp.write_all(b"\x81\x02hi").unwrap();
    assert_eq!(c.next(), Some(Event::Close(Some((1002, String::new())))));
    c.expect_end();
    // Text that is not UTF-8: 1007.
    let mut c = Client::open(server.addr, "/echo", "");
    c.tcp.write_all(b"\x81\x82\0\0\0\0\xc3\x28").unwrap();
    assert_eq!(c.next(), Some(Event::Close(Some((1007, String::new())))));
    c.expect_end();
    // A frame over the limit, refused from its header: 1009.
    let mut c = Client::open(server.addr, "/echo", "");
    c.tcp
        .write_all(b"\x82\xff\0\0\0\x01\0\0\0\0\0\0\0\0")
        .unwrap();
    assert_eq!(c.next(), Some(Event::Close(Some((1009, String::new())))));
    c.expect_end();
}

#[test]
fn bad_upgrade_requests_are_refused_with_their_status() {
    let (server, _) = start();
    let (_t, head, _) = raw_handshake(
        server.addr,
        "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    let (_t, head, _) = raw_handshake(
        server.addr,
        &format!(
            "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 8\r\n\r\n"
        ),
    );
    assert!(head.starts_with("HTTP/1.1 426 "), "{head}");
    assert!(has_field(&head, "sec-websocket-version", "13"), "{head}");
    // A refused upgrade leaves an ordinary HTTP/1.1 connection: the next request is served.
    let (mut t, head, _) = raw_handshake(
        server.addr,
        "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\r\n",
    );
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    t.write_all(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = read_some(&mut t, &mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        text.contains("HTTP/1.1 400 ") || text.contains("HTTP/1.1 404 "),
        "{text}"
    );
}

#[test]
fn a_peer_that_stops_reading_holds_the_sender_at_the_high_water_mark() {
    let (server, sent) = start();
    let mut c = Client::open(server.addr, "/flood", "");
    // Not reading: what the handler could send is bounded by the kernel's buffers and the
    // connection's high-water mark, not by memory.
    std::thread::sleep(Duration::from_millis(500));
    let stuck = sent.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let later = sent.load(Ordering::SeqCst);
    assert_eq!(stuck, later, "the sender went on while nobody read");
    assert!(
        stuck < 400,
        "{stuck} messages of 64 KiB queued for a peer that reads nothing"
    );
    // Reading again lets it go on.
    for _ in 0..stuck + 20 {
        match c.next() {
            Some(Event::Binary(b)) => assert_eq!(b.len(), 64 * 1024),
            other => panic!("{other:?}"),
        }
    }
    assert!(sent.load(Ordering::SeqCst) > stuck);
}

#[test]
fn sends_from_another_task_arrive_in_order_through_a_full_socket_and_close_after() {
    let (server, _) = start();
    let mut c = Client::open(server.addr, "/from-task", "");
    // Not reading for a while: the socket's buffers fill, and the rest waits in the connection.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0u32..2000 {
        match c.next() {
            Some(Event::Binary(b)) => {
                assert_eq!(b.len(), 4096);
                assert_eq!(u32::from_be_bytes([b[0], b[1], b[2], b[3]]), i);
            }
            other => panic!("message {i}: {other:?}"),
        }
    }
    assert_eq!(c.next(), Some(Event::Close(Some((4000, "done".into())))));
    c.expect_end();
}

#[test]
fn a_second_server_on_the_same_thread_writes_sends_from_other_tasks() {
    // Each server's worker runs on this one thread in turn (`serve_inline`, as the Python
    // front end runs its worker): the second must have a flusher of its own.
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        for _ in 0..2 {
            let server = canter_rt::Server::bind(test_config()).unwrap();
            tx.send((server.local_addr(), server.shutdown_handle()))
                .unwrap();
            let sent = Arc::new(AtomicUsize::new(0));
            server.serve_inline(move |_| app(sent.clone())).unwrap();
        }
    });
    for round in 0..2 {
        let (addr, shutdown) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut c = Client::open(addr, "/from-task", "");
        for i in 0u32..3 {
            match c.next() {
                Some(Event::Binary(b)) => {
                    assert_eq!(u32::from_be_bytes([b[0], b[1], b[2], b[3]]), i)
                }
                other => panic!("server {round}, message {i}: {other:?}"),
            }
        }
        drop(c);
        shutdown.shutdown();
    }
    worker.join().unwrap();
}

#[test]
fn a_draining_server_closes_websockets_with_going_away() {
    let (server, _) = start();
    let mut c = Client::open(server.addr, "/echo", "");
    c.write(|ws, out| ws.send_text("x", out).unwrap());
    assert_eq!(c.next(), Some(Event::Text("x".into())));
    server.begin_shutdown();
    match c.next() {
        Some(Event::Close(Some((1001, _)))) => {}
        other => panic!("{other:?}"),
    }
    c.expect_end();
}
