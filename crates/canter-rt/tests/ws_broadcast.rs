//! Broadcast with `WsHub` over real sockets on two workers: every subscriber on either worker
//! gets each published message once, in order; a large frame is shared and a compressed one
//! goes to the connections that agreed to per-message contexts; a subscriber that stops
//! reading is skipped rather than waited on, and closed connections leave.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use canter_rt::ws::{Message, Prepared, WebSocket};
use canter_rt::{Reply, Request, Response, WsHub, WsUpgrade};
use canter_ws::deflate::{self, DeflateConfig};
use canter_ws::{Connection, Event, Limits};
use common::ws_client::{client_role, upgrade_request, Client};
use common::{test_builder, TestServer};

/// `/sub` subscribes (and reads until the client closes); `/pub?<text>` publishes the query as
/// text, `/pub-big` a 100 KiB binary message, `/pub-deflate` 4 KiB of JSON with its compressed
/// form; `/stats` answers `delivered skipped dropped`.
fn server() -> TestServer {
    let hub = WsHub::new();
    let config = test_builder().workers(2).build().unwrap();
    TestServer::start(config, move |_| {
        let hub = hub.clone();
        move |req: Request| -> Reply {
            match req.path() {
                "/sub" => match WsUpgrade::from_request(&req) {
                    Ok(ws) => {
                        let hub = hub.clone();
                        ws.on_upgrade(move |socket: WebSocket| async move {
                            let (tx, rx) = socket.split();
                            hub.subscribe(tx.clone());
                            // Tells the client it is in: what is published from now on is its.
                            let _ = tx.send("subscribed").await;
                            read_to_close(&rx).await;
                        })
                        .into()
                    }
                    Err(refused) => Response::from(refused).into(),
                },
                "/pub" => {
                    hub.publish(&Prepared::text(req.query().unwrap_or("")));
                    Response::text("ok").into()
                }
                "/pub-big" => {
                    hub.publish(&Prepared::binary(vec![0xabu8; 100 * 1024]));
                    Response::text("ok").into()
                }
                "/pub-deflate" => {
                    let json = "{\"symbol\":\"ACME\",\"bid\":101.25,\"offer\":101.5}".repeat(100);
                    hub.publish(&Prepared::text(&json).compressed(6));
                    Response::text("ok").into()
                }
                "/stats" => Response::text(format!(
                    "{} {} {}",
                    hub.delivered(),
                    hub.skipped(),
                    hub.dropped()
                ))
                .into(),
                _ => Response::new(canter_rt::http::StatusCode::NOT_FOUND).into(),
            }
        }
    })
}

/// Reads until the client closes.
async fn read_to_close(rx: &canter_rt::ws::WsReceiver) {
    while let Some(Ok(msg)) = rx.recv().await {
        if matches!(msg, Message::Close(_)) {
            break;
        }
    }
}

fn get(server: &TestServer, path: &str) -> String {
    let mut c = server.client();
    c.get(path).text().to_owned()
}

/// Waits until the hub has delivered `n` messages in all.
fn wait_delivered(server: &TestServer, n: u64) -> Vec<u64> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stats: Vec<u64> = get(server, "/stats")
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        if stats[0] >= n || Instant::now() > until {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_subscriber_on_every_worker_gets_each_message_once_in_order() {
    let server = server();
    let mut clients: Vec<Client> = (0..60).map(|_| subscribe(&server, "")).collect();
    for i in 0..20 {
        assert_eq!(get(&server, &format!("/pub?m{i}")), "ok");
    }
    assert_eq!(get(&server, "/pub-big"), "ok");
    for c in &mut clients {
        for i in 0..20 {
            assert_eq!(c.next(), Some(Event::Text(format!("m{i}").into())));
        }
        match c.next() {
            Some(Event::Binary(b)) => {
                assert!(b.len() == 100 * 1024 && b.iter().all(|&x| x == 0xab))
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A subscriber, once the server said it is in.
fn subscribe(server: &TestServer, extra: &str) -> Client {
    let mut c = Client::open_with(server.addr, &upgrade_request("/sub", extra), b"");
    if let Some(answer) = c.head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case("sec-websocket-extensions")
            .then(|| v.trim().to_owned())
    }) {
        let agreed = deflate::client_agreed(&answer, DeflateConfig::default()).unwrap();
        c.ws = Connection::new(client_role(), Limits::default()).with_deflate(agreed);
    }
    assert_eq!(c.next(), Some(Event::Text("subscribed".into())));
    c
}

#[test]
fn a_compressed_broadcast_reaches_each_connection_in_a_form_it_agreed_to() {
    let server = server();
    // One client with per-message contexts (the compressed frame is shared with it), one with
    // context takeover (it gets the plain frame), one without the extension.
    let offers = [
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        "permessage-deflate",
        "",
    ];
    let mut clients: Vec<Client> = offers
        .iter()
        .map(|offer| {
            let extra = if offer.is_empty() {
                String::new()
            } else {
                format!("Sec-WebSocket-Extensions: {offer}\r\n")
            };
            subscribe(&server, &extra)
        })
        .collect();
    assert_eq!(get(&server, "/pub-deflate"), "ok");
    let json = "{\"symbol\":\"ACME\",\"bid\":101.25,\"offer\":101.5}".repeat(100);
    for c in &mut clients {
        // Raw: was the frame compressed (RSV1)?
        let mut chunk = vec![0u8; 8192];
        let mut raw = Vec::new();
        while raw.len() < 2
            || canter_ws::frame::parse_header(&raw)
                .unwrap()
                .is_none_or(|h| raw.len() < h.header_len + h.len as usize)
        {
            let n = std::io::Read::read(&mut c.tcp, &mut chunk).unwrap();
            assert!(n > 0);
            raw.extend_from_slice(&chunk[..n]);
        }
        let h = canter_ws::frame::parse_header(&raw).unwrap().unwrap();
        let shared_compressed = h.rsv1;
        c.input.extend_from_slice(&raw);
        assert_eq!(c.next(), Some(Event::Text(json.clone().into())));
        let offered = c
            .head
            .to_ascii_lowercase()
            .contains("server_no_context_takeover");
        assert_eq!(shared_compressed, offered, "{}", c.head);
    }
}

#[test]
fn a_subscriber_that_does_not_read_is_skipped_and_closed_ones_leave() {
    let server = server();
    let mut reader = subscribe(&server, "");
    let stalled = subscribe(&server, "");
    let closing = subscribe(&server, "");
    drop(closing);
    // 300 messages of 100 KiB: far past what the stalled one's socket buffers and high-water
    // mark hold, while the reader takes all of them.
    for i in 0..300 {
        assert_eq!(get(&server, "/pub-big"), "ok");
        match reader.next() {
            Some(Event::Binary(b)) => assert_eq!(b.len(), 100 * 1024, "message {i}"),
            other => panic!("{other:?}"),
        }
    }
    let stats = wait_delivered(&server, 300);
    assert!(
        stats[1] > 0,
        "the stalled subscriber was never skipped: {stats:?}"
    );
    drop(stalled);
}
