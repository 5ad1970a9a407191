//! permessage-deflate (RFC 7692): the negotiation, its examples, and the bounded inflater.

#![allow(clippy::unwrap_used, missing_docs)]

use bytes::BytesMut;
use canter_ws::deflate::{negotiate, DeflateConfig, Deflater};
use canter_ws::frame::{apply_mask, put_header, Opcode};
use canter_ws::{Connection, Error, Event, Limits, Role};

fn offers(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn agreed(offer: &str) -> canter_ws::deflate::Agreed {
    negotiate(&offers(&[offer]), DeflateConfig::default())
        .unwrap()
        .0
}

fn client(offer: &str) -> Connection {
    let keys = Box::new(|| [1, 2, 3, 4]);
    Connection::new(Role::Client { keys }, Limits::default()).with_deflate(agreed(offer))
}

fn server_with(offer: &str, limits: Limits) -> Connection {
    Connection::new(Role::Server, limits).with_deflate(agreed(offer))
}

fn events(conn: &mut Connection, bytes: &[u8]) -> Result<Vec<Event>, Error> {
    let mut input = BytesMut::from(bytes);
    let mut out = Vec::new();
    let mut got = Vec::new();
    while let Some(e) = conn.poll(&mut input, &mut out)? {
        got.push(e);
    }
    Ok(got)
}

/// A masked frame, as a client sends it, with RSV1 as given.
fn masked(fin: bool, rsv1: bool, opcode: Opcode, payload: &[u8]) -> Vec<u8> {
    let key = [9, 8, 7, 6];
    let mut out = Vec::new();
    put_header(&mut out, fin, rsv1, opcode, payload.len() as u64, Some(key));
    let start = out.len();
    out.extend_from_slice(payload);
    apply_mask(&mut out[start..], key, 0);
    out
}

#[test]
fn the_server_takes_the_first_offer_it_can_honour() {
    let cfg = DeflateConfig::default();
    let (_, header) = negotiate(&offers(&["permessage-deflate"]), cfg).unwrap();
    assert_eq!(header, "permessage-deflate");
    let (a, header) = negotiate(
        &offers(&["permessage-deflate; client_max_window_bits"]),
        cfg,
    )
    .unwrap();
    assert_eq!(
        (header.as_str(), a.server_window_bits),
        ("permessage-deflate", 15)
    );
    let (a, header) = negotiate(
        &offers(&["permessage-deflate; server_max_window_bits=10; server_no_context_takeover"]),
        cfg,
    )
    .unwrap();
    assert_eq!(
        header,
        "permessage-deflate; server_no_context_takeover; server_max_window_bits=10"
    );
    assert!(a.server_no_context_takeover);
    // Declined: an unknown, repeated or out-of-range parameter; 8 bits for the server's
    // window. The next acceptable offer wins.
    for bad in [
        "permessage-deflate; foo",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; server_max_window_bits=8",
        "permessage-deflate; server_no_context_takeover=1",
        "x-webkit-deflate-frame",
    ] {
        assert_eq!(negotiate(&offers(&[bad]), cfg), None, "{bad}");
        let fallback = negotiate(&offers(&[bad, "permessage-deflate"]), cfg).unwrap();
        assert_eq!(fallback.1, "permessage-deflate", "after {bad}");
    }
    // What the server asks of clients by its own configuration.
    let strict = DeflateConfig {
        client_no_context_takeover: true,
        ..cfg
    };
    let (_, header) = negotiate(&offers(&["permessage-deflate"]), strict).unwrap();
    assert_eq!(header, "permessage-deflate; client_no_context_takeover");
}

#[test]
fn the_rfcs_examples_inflate() {
    // RFC 7692, Section 7.2.3.1: "Hello" in one compressed frame, and in two fragments.
    let mut c = client("permessage-deflate");
    let one = b"\xc1\x07\xf2\x48\xcd\xc9\xc9\x07\x00";
    assert_eq!(events(&mut c, one).unwrap(), [Event::Text("Hello".into())]);
    let mut c = client("permessage-deflate");
    let two = b"\x41\x03\xf2\x48\xcd\x80\x04\xc9\xc9\x07\x00";
    assert_eq!(events(&mut c, two).unwrap(), [Event::Text("Hello".into())]);
    // Section 7.2.3.2: the second "Hello" refers back into the first (context takeover).
    let mut c = client("permessage-deflate");
    let both = b"\xc1\x07\xf2\x48\xcd\xc9\xc9\x07\x00\xc1\x05\xf2\x00\x11\x00\x00";
    assert_eq!(
        events(&mut c, both).unwrap(),
        [Event::Text("Hello".into()), Event::Text("Hello".into())]
    );
}

#[test]
fn large_messages_go_compressed_and_small_ones_as_they_are() {
    let offer = "permessage-deflate; client_max_window_bits";
    let (mut s, mut c) = (server_with(offer, Limits::default()), client(offer));
    let json: String = (0..100)
        .map(|i| format!("{{\"id\":{i},\"name\":\"item {i}\",\"tags\":[\"a\",\"b\"]}},"))
        .collect();
    let mut wire = Vec::new();
    c.send_text(&json, &mut wire).unwrap();
    assert_eq!(wire[0] & 0x40, 0x40, "RSV1 on a compressed message");
    assert!(
        wire.len() < json.len() / 3,
        "{} bytes for {}",
        wire.len(),
        json.len()
    );
    let small = wire.len();
    c.send_text("hi", &mut wire).unwrap();
    assert_eq!(wire[small] & 0x40, 0, "below the threshold: not compressed");
    // Again, so that the second copy is sent against the first's context.
    let again = wire.len();
    c.send_text(&json, &mut wire).unwrap();
    assert!(wire.len() - again < small / 2, "context taken over");
    let got = events(&mut s, &wire).unwrap();
    assert_eq!(
        got,
        [
            Event::Text(json.clone().into()),
            Event::Text("hi".into()),
            Event::Text(json.into())
        ]
    );
}

#[test]
fn a_bomb_is_a_1009_at_the_message_limit() {
    let limits = Limits {
        max_message: 64 * 1024,
        ..Limits::default()
    };
    let mut s = server_with("permessage-deflate", limits);
    let mut bomb = Vec::new();
    Deflater::new(9, 15, false).compress(&vec![0u8; 16 << 20], &mut bomb);
    assert!(
        bomb.len() < 64 * 1024,
        "the compressed bomb fits the limit: {}",
        bomb.len()
    );
    let e = events(&mut s, &masked(true, true, Opcode::Binary, &bomb)).unwrap_err();
    assert_eq!((e, e.close_code()), (Error::TooBig, 1009));
    // Exactly at the limit is fine.
    let mut s = server_with("permessage-deflate", limits);
    let mut fits = Vec::new();
    Deflater::new(9, 15, false).compress(&vec![1u8; 64 * 1024], &mut fits);
    let got = events(&mut s, &masked(true, true, Opcode::Binary, &fits)).unwrap();
    assert_eq!(got, [Event::Binary(vec![1u8; 64 * 1024].into())]);
}

#[test]
fn misused_rsv1_and_bad_compressed_text_are_refused() {
    let mut s = server_with("permessage-deflate", Limits::default());
    let e = events(&mut s, &masked(true, true, Opcode::Ping, b"x")).unwrap_err();
    assert_eq!(e.close_code(), 1002, "RSV1 on a ping");
    let mut s = server_with("permessage-deflate", Limits::default());
    let cont = [
        masked(false, false, Opcode::Binary, b"a"),
        masked(true, true, Opcode::Continuation, b"b"),
    ]
    .concat();
    assert_eq!(
        events(&mut s, &cont).unwrap_err().close_code(),
        1002,
        "RSV1 on a continuation"
    );
    let mut s = server_with("permessage-deflate", Limits::default());
    let garbage = masked(true, true, Opcode::Binary, b"\xff\xff\xff\xff");
    assert_eq!(
        events(&mut s, &garbage).unwrap_err().close_code(),
        1002,
        "not deflate"
    );
    let mut s = server_with("permessage-deflate", Limits::default());
    let mut latin1 = Vec::new();
    Deflater::new(6, 15, false).compress(b"caf\xe9", &mut latin1);
    let e = events(&mut s, &masked(true, true, Opcode::Text, &latin1)).unwrap_err();
    assert_eq!(e.close_code(), 1007, "compressed text that is not UTF-8");
}

#[test]
fn a_client_reads_the_servers_answer_and_both_ends_talk_compressed() {
    use canter_ws::deflate::{client_agreed, client_offer};
    let cfg = DeflateConfig {
        min_size: 16,
        ..DeflateConfig::default()
    };
    assert_eq!(
        client_offer(cfg),
        "permessage-deflate; client_max_window_bits"
    );
    // A server that wants small windows and no context on the client's side.
    let server_cfg = DeflateConfig {
        client_no_context_takeover: true,
        ..cfg
    };
    let offer = format!("{}; server_max_window_bits=10", client_offer(cfg));
    let (on_server, answer) = negotiate(&[offer], server_cfg).unwrap();
    assert_eq!(
        answer,
        "permessage-deflate; client_no_context_takeover; server_max_window_bits=10"
    );
    let on_client = client_agreed(&answer, cfg).unwrap();
    assert!(on_client.client_no_context_takeover);
    assert_eq!(on_client.server_window_bits, 10);
    let mut s = Connection::new(Role::Server, Limits::default()).with_deflate(on_server);
    let keys = Box::new(|| [5, 6, 7, 8]);
    let mut c = Connection::new(Role::Client { keys }, Limits::default()).with_deflate(on_client);
    let text = "the same words, the same words, the same words again";
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        c.send_text(text, &mut to_server).unwrap();
        s.send_text(text, &mut to_client).unwrap();
    }
    assert_eq!(to_server[0] & 0x40, 0x40);
    assert_eq!(to_client[0] & 0x40, 0x40);
    let want = vec![Event::Text(text.into()); 3];
    assert_eq!(events(&mut s, &to_server).unwrap(), want);
    assert_eq!(events(&mut c, &to_client).unwrap(), want);
    // Answers a client must refuse: what it did not offer, repeated, or out of range.
    for bad in [
        "x-webkit-deflate-frame",
        "permessage-deflate; foo",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; client_max_window_bits=8",
        "permessage-deflate; client_max_window_bits",
    ] {
        let e = client_agreed(bad, cfg).unwrap_err();
        assert_eq!(e.close_code(), 1002, "{bad}");
    }
    let small = client_agreed("permessage-deflate; client_max_window_bits=9", cfg).unwrap();
    assert_eq!(small.client_window_bits, 9);
}

#[test]
fn messages_that_end_their_stream_each_inflate_and_nothing_may_follow_the_end() {
    use flate2::{Compress, Compression, FlushCompress};
    // Each message compressed to a final block (BFINAL set, no sync-flush tail), as RFC 7692
    // Section 7.2.3.3 allows a sender to do: the next message is a new stream.
    let finished = |text: &[u8]| {
        let mut c = Compress::new(Compression::default(), false);
        let mut out = Vec::with_capacity(text.len() + 64);
        c.compress_vec(text, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    };
    let mut s = server_with("permessage-deflate", Limits::default());
    let bytes = [
        masked(true, true, Opcode::Text, &finished(b"first")),
        masked(true, true, Opcode::Text, &finished(b"second")),
    ]
    .concat();
    assert_eq!(
        events(&mut s, &bytes).unwrap(),
        [Event::Text("first".into()), Event::Text("second".into())]
    );
    // Compressed bytes after the final block are refused.
    let mut s = server_with("permessage-deflate", Limits::default());
    let mut trailing = finished(b"done");
    trailing.extend_from_slice(b"\x01\x02\x03");
    let e = events(&mut s, &masked(true, true, Opcode::Text, &trailing)).unwrap_err();
    assert_eq!(e.close_code(), 1002);
}
