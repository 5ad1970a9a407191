//! The server against the cases of Autobahn|Testsuite, family by family, each asserting what
//! the suite's strict verdict asks, case by case and without a server process (the original
//! suite also runs whole against `canter serve`: crates/canter-cli/tests/autobahn.rs). The
//! client sends raw frames where a case breaks the protocol. Families: 1
//! framing, 2 pings and pongs, 3 reserved bits, 4 opcodes, 5 fragmentation, 6 UTF-8, 7 close
//! handling, 9 limits and sizes, 12 and 13 compression.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::Duration;

use canter_rt::ws::{Message, WebSocket, WsConfig};
use canter_rt::{Reply, Request, Response, WsUpgrade};
use canter_ws::deflate::{self, DeflateConfig};
use canter_ws::{Connection, Event, Limits};
use common::ws_client::{client_role, raw_frame, upgrade_request, Client};
use common::{test_config, TestServer};

const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;
const FIN: u8 = 0x80;

/// The echo Autobahn expects: every message back as it came.
fn echo_server() -> TestServer {
    TestServer::start(test_config(), |_| {
        |req: Request| -> Reply {
            let mut config = WsConfig::default();
            config.limits.max_message = 32 << 20;
            match WsUpgrade::from_request(&req) {
                Ok(ws) => ws
                    .config(config)
                    .on_upgrade(|socket: WebSocket| async move {
                        while let Some(Ok(msg)) = socket.recv().await {
                            if matches!(msg, Message::Close(_)) || socket.send(msg).await.is_err() {
                                break;
                            }
                        }
                    })
                    .into(),
                Err(refused) => Response::from(refused).into(),
            }
        }
    })
}

fn open(server: &TestServer) -> Client {
    let c = Client::open(server.addr, "/", "");
    c.tcp
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    c
}

/// Case family 1: text and binary messages of every length class (7-bit, 16-bit, 64-bit
/// lengths at their edges) echoed exactly, whole or written in small chops.
#[test]
fn family_1_framing() {
    let server = echo_server();
    let mut c = open(&server);
    for len in [0usize, 1, 125, 126, 127, 128, 65535, 65536, 65537] {
        let text = "*".repeat(len);
        c.write(|ws, out| ws.send_text(&text, out).unwrap());
        assert_eq!(
            c.next(),
            Some(Event::Text(text.clone().into())),
            "text {len}"
        );
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        c.write(|ws, out| ws.send_binary(&data, out).unwrap());
        assert_eq!(c.next(), Some(Event::Binary(data.into())), "binary {len}");
    }
    // 1.1.8 / 1.2.8: a 65,535-byte message written in chops of 997 bytes.
    let text = "x".repeat(65535);
    let mut bytes = Vec::new();
    c.ws.send_text(&text, &mut bytes).unwrap();
    for chop in bytes.chunks(997) {
        c.send_raw(chop);
    }
    assert_eq!(c.next(), Some(Event::Text(text.into())));
}

/// Family 2: pings answered with their payload (empty, binary, 125 bytes, written in chops, ten
/// in a row in order); a ping of 126 bytes fails the connection (1002); pongs nobody asked
/// for are taken silently.
#[test]
fn family_2_pings_and_pongs() {
    let server = echo_server();
    let mut c = open(&server);
    c.send_raw(&raw_frame(FIN | PING, b""));
    assert_eq!(c.next(), Some(Event::Pong("".into())));
    let binary: Vec<u8> = (0..125u8).map(|b| b ^ 0xfe).collect();
    c.send_raw(&raw_frame(FIN | PING, &binary));
    assert_eq!(c.next(), Some(Event::Pong(binary.clone().into())));
    for chop in raw_frame(FIN | PING, &binary).chunks(1) {
        c.send_raw(chop);
    }
    assert_eq!(c.next(), Some(Event::Pong(binary.into())));
    // 2.7, 2.8: unsolicited pongs, then a text that must be the next thing echoed.
    c.send_raw(&raw_frame(FIN | PONG, b""));
    c.send_raw(&raw_frame(FIN | PONG, b"unsolicited"));
    c.send_raw(&raw_frame(FIN | TEXT, b"after pongs"));
    assert_eq!(c.next(), Some(Event::Text("after pongs".into())));
    // 2.10: ten pings, ten pongs, in order.
    for i in 0..10u8 {
        c.send_raw(&raw_frame(FIN | PING, &[i; 16]));
    }
    for i in 0..10u8 {
        assert_eq!(c.next(), Some(Event::Pong(vec![i; 16].into())));
    }
    // 2.5: a ping over 125 bytes.
    c.send_raw(&raw_frame(FIN | PING, &[0u8; 126]));
    assert_eq!(c.expect_close(), 1002);
}

/// Family 3: a reserved bit set without an extension that defines it fails the connection
/// (1002), on data and control frames alike; what came before it is still echoed.
#[test]
fn family_3_reserved_bits() {
    let server = echo_server();
    for (first, echoed_before) in [
        (FIN | 0x40 | TEXT, false),   // 3.1 RSV1 (no extension agreed)
        (FIN | 0x20 | TEXT, true),    // 3.2 RSV2 after a valid message
        (FIN | 0x10 | TEXT, true),    // 3.3 RSV3
        (FIN | 0x30 | BINARY, false), // 3.5
        (FIN | 0x70 | PING, false),   // 3.6
        (FIN | 0x70 | CLOSE, false),  // 3.7
    ] {
        let mut c = open(&server);
        if echoed_before {
            c.send_raw(&raw_frame(FIN | TEXT, b"hello"));
            assert_eq!(c.next(), Some(Event::Text("hello".into())));
        }
        c.send_raw(&raw_frame(first, b"x"));
        assert_eq!(c.expect_close(), 1002, "first byte {first:#x}");
    }
}

/// Family 4: reserved opcodes (3–7 non-control, 11–15 control) fail the connection (1002),
/// alone or after a valid message.
#[test]
fn family_4_opcodes() {
    let server = echo_server();
    for op in [3u8, 4, 5, 6, 7, 11, 12, 13, 14, 15] {
        let mut c = open(&server);
        c.send_raw(&raw_frame(FIN | TEXT, b"before"));
        assert_eq!(c.next(), Some(Event::Text("before".into())));
        c.send_raw(&raw_frame(FIN | op, b"payload"));
        assert_eq!(c.expect_close(), 1002, "opcode {op}");
    }
}

/// Family 5: fragmented messages echoed whole, with pings between their fragments answered at
/// once; fragmented control frames, continuations without a message and a new message inside
/// a fragmented one fail the connection (1002).
#[test]
fn family_5_fragmentation() {
    let server = echo_server();
    let mut c = open(&server);
    // 5.3, 5.6: two and three fragments, a ping between.
    c.send_raw(&raw_frame(TEXT, b"frag"));
    c.send_raw(&raw_frame(FIN, b"ment"));
    assert_eq!(c.next(), Some(Event::Text("fragment".into())));
    c.send_raw(&raw_frame(BINARY, b"a"));
    c.send_raw(&raw_frame(FIN | PING, b"between"));
    c.send_raw(&raw_frame(0, b"b"));
    c.send_raw(&raw_frame(FIN, b"c"));
    assert_eq!(c.next(), Some(Event::Pong("between".into())));
    assert_eq!(c.next(), Some(Event::Binary("abc".into())));
    // 5.19-like: many one-byte fragments with pings.
    let mut bytes = raw_frame(TEXT, b"0");
    for i in 1..100u8 {
        bytes.extend(raw_frame(FIN | PING, &[i]));
        bytes.extend(raw_frame(if i == 99 { FIN } else { 0 }, b"1"));
    }
    c.send_raw(&bytes);
    for i in 1..100u8 {
        assert_eq!(c.next(), Some(Event::Pong(vec![i].into())));
    }
    assert_eq!(
        c.next(),
        Some(Event::Text(format!("0{}", "1".repeat(99)).into()))
    );
    for (case, frames) in [
        (
            "5.1 fragmented ping",
            vec![raw_frame(PING, b"a"), raw_frame(FIN, b"b")],
        ),
        (
            "5.2 fragmented pong",
            vec![raw_frame(PONG, b"a"), raw_frame(FIN, b"b")],
        ),
        ("5.9 continuation first", vec![raw_frame(FIN, b"x")]),
        (
            "5.15 new message inside",
            vec![raw_frame(TEXT, b"a"), raw_frame(FIN | TEXT, b"b")],
        ),
    ] {
        let mut c = open(&server);
        for f in frames {
            c.send_raw(&f);
        }
        assert_eq!(c.expect_close(), 1002, "{case}");
    }
}

/// Family 6: valid UTF-8 (multi-byte characters cut across fragments anywhere) echoed;
/// invalid UTF-8 (overlong forms, surrogates, past U+10FFFF, cut short) fails the connection
/// with 1007, and fails it fast: at the frame that brings the bad byte, and inside a frame
/// that is still arriving (the strict verdict of 6.4.x).
#[test]
fn family_6_utf8() {
    let server = echo_server();
    let mut c = open(&server);
    let text = "κόσμε Hello-µ@ßöäüàá-UTF-8!! 😀 \u{10FFFF}";
    let bytes = text.as_bytes();
    for cut in 1..bytes.len() {
        c.send_raw(&raw_frame(TEXT, &bytes[..cut]));
        c.send_raw(&raw_frame(FIN, &bytes[cut..]));
        assert_eq!(c.next(), Some(Event::Text(text.into())), "cut at {cut}");
    }
    for bad in [
        &b"\xc0\xaf"[..],    // overlong '/'
        b"\xe0\x80\xaf",     // overlong, three bytes
        b"\xed\xa0\x80",     // a surrogate
        b"\xf4\x90\x80\x80", // past U+10FFFF
        b"\xfe",             // never valid
        b"ok\xce",           // cut short at the message's end
    ] {
        let mut c = open(&server);
        c.send_raw(&raw_frame(FIN | TEXT, bad));
        assert_eq!(c.expect_close(), 1007, "{bad:?}");
    }
    // 6.4.1: the second fragment is bad; the third is never sent.
    let mut c = open(&server);
    c.send_raw(&raw_frame(TEXT, "κόσμε".as_bytes()));
    c.send_raw(&raw_frame(0, b"\xed\xa0\x80edited"));
    assert_eq!(c.expect_close(), 1007);
    // 6.4.3: one frame announced at 1,000 bytes; its first 10 arrive, with a bad byte: the
    // close comes without the rest.
    let mut c = open(&server);
    let mut frame = raw_frame(FIN | TEXT, &[b'a'; 1000]);
    // Re-mask the bad byte at payload offset 5 (key [0x37, 0xfa, 0x21, 0x3d], header 8 bytes).
    frame[8 + 5] = 0xff ^ 0xfa;
    c.send_raw(&frame[..8 + 10]);
    assert_eq!(c.expect_close(), 1007);
}

/// Family 7: the close handshake: a close is answered with the code it gave (1000 for one
/// without a code); nothing is echoed after it; a one-byte payload, an invalid code or a reason that is
/// not UTF-8 fail with 1002 / 1007; every code that may travel is accepted.
#[test]
fn family_7_close_handling() {
    let server = echo_server();
    // 7.1.1, 7.1.6: text, close, then text after the close: only the first is echoed.
    let mut c = open(&server);
    c.send_raw(&raw_frame(FIN | TEXT, b"last"));
    c.send_raw(&raw_frame(FIN | CLOSE, &1000u16.to_be_bytes()));
    c.send_raw(&raw_frame(FIN | TEXT, b"after close"));
    assert_eq!(c.next(), Some(Event::Text("last".into())));
    assert_eq!(c.expect_close(), 1000);
    // 7.3.1: an empty close; 7.3.5: a reason of 123 bytes.
    let mut c = open(&server);
    c.send_raw(&raw_frame(FIN | CLOSE, b""));
    // A close without a code is answered with 1000 (the suite takes 1000 or none).
    assert_eq!(c.expect_close(), 1000);
    let mut c = open(&server);
    let mut payload = 1000u16.to_be_bytes().to_vec();
    payload.extend([b'r'; 123]);
    c.send_raw(&raw_frame(FIN | CLOSE, &payload));
    assert_eq!(c.expect_close(), 1000);
    for (case, payload, want) in [
        ("7.3.2 one byte", vec![0x03], 1002),
        ("7.3.6 126 bytes", vec![0x03; 126], 1002),
        (
            "7.5.1 reason not UTF-8",
            [
                &1000u16.to_be_bytes()[..],
                b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80",
            ]
            .concat(),
            1007,
        ),
    ] {
        let mut c = open(&server);
        c.send_raw(&raw_frame(FIN | CLOSE, &payload));
        assert_eq!(c.expect_close(), want, "{case}");
    }
    // 1012–1014 were registered after RFC 6455 (service restart, try again later, bad
    // gateway); the suite's later versions accept them too.
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999,
        4000, 4999,
    ] {
        let mut c = open(&server);
        c.send_raw(&raw_frame(FIN | CLOSE, &code.to_be_bytes()));
        assert_eq!(c.expect_close(), code, "7.7 code {code}");
    }
    for code in [
        0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
    ] {
        let mut c = open(&server);
        c.send_raw(&raw_frame(FIN | CLOSE, &code.to_be_bytes()));
        assert_eq!(c.expect_close(), 1002, "7.9 code {code}");
    }
}

/// Family 9: large messages (1 MiB to 16 MiB text and binary, whole and in 64 KiB fragments)
/// and many small ones in a row, echoed intact.
#[test]
fn family_9_limits_and_sizes() {
    let server = echo_server();
    let mut c = open(&server);
    for len in [1 << 20, 4 << 20, 16 << 20] {
        let text = "t".repeat(len);
        c.write(|ws, out| ws.send_text(&text, out).unwrap());
        assert_eq!(c.next(), Some(Event::Text(text.into())), "text {len}");
    }
    let data: Vec<u8> = (0..(8 << 20)).map(|i: usize| (i % 253) as u8).collect();
    let mut bytes = Vec::new();
    for (i, piece) in data.chunks(64 << 10).enumerate() {
        let first = if i == 0 { BINARY } else { 0 };
        let fin = if (i + 1) * (64 << 10) >= data.len() {
            FIN
        } else {
            0
        };
        bytes.extend(raw_frame(first | fin, piece));
    }
    c.send_raw(&bytes);
    assert_eq!(c.next(), Some(Event::Binary(data.into())));
    let mut bytes = Vec::new();
    for i in 0..10_000u32 {
        bytes.extend(raw_frame(FIN | BINARY, &i.to_be_bytes()));
    }
    c.send_raw(&bytes);
    for i in 0..10_000u32 {
        assert_eq!(
            c.next(),
            Some(Event::Binary(i.to_be_bytes().to_vec().into()))
        );
    }
}

/// Families 12 and 13: permessage-deflate with the offers Autobahn makes (no parameters,
/// client_no_context_takeover, client_max_window_bits, server_max_window_bits 9 to 15,
/// server_no_context_takeover): the answer agrees to something the client offered, and
/// messages of every size class go both ways through it intact.
#[test]
fn families_12_and_13_compression() {
    let server = echo_server();
    for offer in [
        "permessage-deflate",
        "permessage-deflate; client_no_context_takeover",
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; server_max_window_bits=9",
        "permessage-deflate; server_max_window_bits=12; client_max_window_bits",
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; server_max_window_bits=15; client_max_window_bits=9",
    ] {
        let request = upgrade_request("/", &format!("Sec-WebSocket-Extensions: {offer}\r\n"));
        let mut c = Client::open_with(server.addr, &request, b"");
        let answer = c
            .head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("sec-websocket-extensions")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("no extension agreed to {offer:?}: {}", c.head));
        // Our client reads the answer as the offer it made allows.
        let wanted = DeflateConfig {
            client_no_context_takeover: offer.contains("client_no_context_takeover"),
            ..DeflateConfig::default()
        };
        let agreed = deflate::client_agreed(&answer, wanted)
            .unwrap_or_else(|e| panic!("{offer:?} answered {answer:?}: {e}"));
        c.ws = Connection::new(client_role(), Limits::default()).with_deflate(agreed);
        for len in [16usize, 64, 256, 1024, 4096, 65536, 262_144] {
            for round in 0..3 {
                let text: String = (0..len)
                    .map(|i| char::from(b'a' + ((i / 7 + round) % 26) as u8))
                    .collect();
                c.write(|ws, out| ws.send_text(&text, out).unwrap());
                assert_eq!(c.next(), Some(Event::Text(text.into())), "{offer:?} {len}");
                let data: Vec<u8> = (0..len).map(|i| ((i * 31) % 7) as u8).collect();
                c.write(|ws, out| ws.send_binary(&data, out).unwrap());
                assert_eq!(
                    c.next(),
                    Some(Event::Binary(data.into())),
                    "{offer:?} {len}"
                );
            }
        }
    }
}
