//! HTTP/2 flow control against a handler that never reads its request body: body bytes the
//! server held for a stream that ends must go back to the connection window.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use canter_rt::{Reply, Request, Response};
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
        let n = sock.read(&mut chunk).unwrap();
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
