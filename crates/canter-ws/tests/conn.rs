//! The engine against RFC 6455's own examples (Section 5.7) and its rules, byte by byte.

#![allow(clippy::unwrap_used, missing_docs)]

use bytes::BytesMut;
use canter_ws::frame::{apply_mask, parse_header, put_header, Opcode};
use canter_ws::handshake::{self, HandshakeError};
use canter_ws::{close, Connection, Error, Event, Limits, Role};

fn server() -> Connection {
    Connection::new(Role::Server, Limits::default())
}

fn client() -> Connection {
    let mut n = 0u32;
    let keys = Box::new(move || {
        n = n.wrapping_add(0x9e37_79b9);
        n.to_be_bytes()
    });
    Connection::new(Role::Client { keys }, Limits::default())
}

/// Every event `bytes` gives, fed in pieces of `step` bytes.
fn events(conn: &mut Connection, bytes: &[u8], step: usize) -> Result<Vec<Event>, Error> {
    let mut input = BytesMut::new();
    let mut out = Vec::new();
    let mut got = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        input.extend_from_slice(piece);
        while let Some(e) = conn.poll(&mut input, &mut out)? {
            got.push(e);
        }
    }
    Ok(got)
}

/// A frame as a peer would send it: masked with `key` when given.
fn frame(fin: bool, opcode: u8, payload: &[u8], key: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::new();
    let op = Opcode::from_bits(opcode).unwrap();
    put_header(&mut out, fin, false, op, payload.len() as u64, key);
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(k) = key {
        apply_mask(&mut out[start..], k, 0);
    }
    out
}

const KEY: Option<[u8; 4]> = Some([0x37, 0xfa, 0x21, 0x3d]);

#[test]
fn the_rfcs_examples_read_the_same_in_any_pieces() {
    for step in [1, 2, 3, 7, 1000] {
        // A single-frame unmasked text message, to a client.
        let e = events(&mut client(), b"\x81\x05\x48\x65\x6c\x6c\x6f", step).unwrap();
        assert_eq!(e, [Event::Text("Hello".into())]);
        // The same, masked, to a server.
        let masked = b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58";
        assert_eq!(
            events(&mut server(), masked, step).unwrap(),
            [Event::Text("Hello".into())]
        );
        // A fragmented unmasked text message.
        let frags = b"\x01\x03\x48\x65\x6c\x80\x02\x6c\x6f";
        assert_eq!(
            events(&mut client(), frags, step).unwrap(),
            [Event::Text("Hello".into())]
        );
        // An unmasked ping, and a masked pong answering it.
        let ping = b"\x89\x05\x48\x65\x6c\x6c\x6f";
        assert_eq!(
            events(&mut client(), ping, step).unwrap(),
            [Event::Ping("Hello".into())]
        );
        let pong = b"\x8a\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58";
        assert_eq!(
            events(&mut server(), pong, step).unwrap(),
            [Event::Pong("Hello".into())]
        );
        // 256 bytes and 64 KiB of binary data, in one unmasked frame each.
        let mut b256 = b"\x82\x7E\x01\x00".to_vec();
        b256.extend(std::iter::repeat_n(7u8, 256));
        let e = events(&mut client(), &b256, step.max(50)).unwrap();
        assert_eq!(e, [Event::Binary(vec![7u8; 256].into())]);
    }
    let mut b64k = b"\x82\x7F\x00\x00\x00\x00\x00\x01\x00\x00".to_vec();
    b64k.extend(std::iter::repeat_n(9u8, 65536));
    let e = events(&mut client(), &b64k, 4096).unwrap();
    assert_eq!(e, [Event::Binary(vec![9u8; 65536].into())]);
}

#[test]
fn what_each_end_sends_is_what_the_other_reads() {
    let (mut c, mut s) = (client(), server());
    let mut wire = Vec::new();
    c.send_text("héllo", &mut wire).unwrap();
    c.send_binary(&[1, 2, 3], &mut wire).unwrap();
    c.send_ping(b"p", &mut wire).unwrap();
    // A client masks: the text is not on the wire as it is.
    assert!(!wire.windows(6).any(|w| w == "héllo".as_bytes()));
    let got = events(&mut s, &wire, 5).unwrap();
    assert_eq!(
        got,
        [
            Event::Text("héllo".into()),
            Event::Binary(vec![1, 2, 3].into()),
            Event::Ping("p".into()),
        ]
    );
    let mut back = Vec::new();
    s.send_text("ok", &mut back).unwrap();
    assert_eq!(back, b"\x81\x02ok", "a server does not mask");
    assert_eq!(
        events(&mut c, &back, 1).unwrap(),
        [Event::Text("ok".into())]
    );
}

#[test]
fn a_ping_is_answered_with_its_data_and_control_frames_may_come_between_fragments() {
    let mut s = server();
    let mut bytes = frame(false, 0x1, b"Hel", KEY);
    bytes.extend(frame(true, 0x9, b"are you there", KEY));
    bytes.extend(frame(true, 0xA, b"", KEY));
    bytes.extend(frame(true, 0x0, b"lo", KEY));
    let mut input = BytesMut::from(&bytes[..]);
    let mut out = Vec::new();
    let mut got = Vec::new();
    while let Some(e) = s.poll(&mut input, &mut out).unwrap() {
        got.push(e);
    }
    assert_eq!(
        got,
        [
            Event::Ping("are you there".into()),
            Event::Pong("".into()),
            Event::Text("Hello".into()),
        ]
    );
    assert_eq!(out, b"\x8a\x0dare you there");
}

#[test]
fn masking_goes_by_role() {
    let unmasked = frame(true, 0x1, b"hi", None);
    assert!(matches!(
        events(&mut server(), &unmasked, 100),
        Err(Error::Protocol(_))
    ));
    let masked = frame(true, 0x1, b"hi", KEY);
    assert!(matches!(
        events(&mut client(), &masked, 100),
        Err(Error::Protocol(_))
    ));
}

#[test]
fn broken_frames_are_protocol_errors_with_code_1002() {
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (b"\xa1\x80\0\0\0\0".to_vec(), "RSV2"),
        (b"\x91\x80\0\0\0\0".to_vec(), "RSV3"),
        (b"\xc1\x80\0\0\0\0".to_vec(), "RSV1 without an extension"),
        (b"\x83\x80\0\0\0\0".to_vec(), "reserved data opcode"),
        (b"\x8b\x80\0\0\0\0".to_vec(), "reserved control opcode"),
        (b"\x09\x80\0\0\0\0".to_vec(), "fragmented ping"),
        (b"\x89\xFE\x00\x7E\0\0\0\0".to_vec(), "ping of 126 bytes"),
        (
            b"\x82\xFE\x00\x7D\0\0\0\0".to_vec(),
            "16-bit length under 126",
        ),
        (
            b"\x82\xFF\0\0\0\0\0\0\xFF\xFF\0\0\0\0".to_vec(),
            "64-bit length under 65536",
        ),
        (
            b"\x82\xFF\x80\0\0\0\0\0\0\x01\0\0\0\0".to_vec(),
            "64-bit length, top bit set",
        ),
        (
            frame(true, 0x0, b"x", KEY),
            "continuation with nothing to continue",
        ),
        (
            [frame(false, 0x1, b"a", KEY), frame(true, 0x2, b"b", KEY)].concat(),
            "new message mid-way",
        ),
        (frame(true, 0x8, b"\x03", KEY), "one-byte close payload"),
        (
            frame(true, 0x8, &999u16.to_be_bytes(), KEY),
            "close code 999",
        ),
        (
            frame(true, 0x8, &1005u16.to_be_bytes(), KEY),
            "close code 1005",
        ),
        (
            frame(true, 0x8, &5000u16.to_be_bytes(), KEY),
            "close code 5000",
        ),
    ];
    for (bytes, what) in bad {
        let e = events(&mut server(), &bytes, 1).expect_err(what);
        assert!(matches!(e, Error::Protocol(_)), "{what}: {e:?}");
        assert_eq!(e.close_code(), 1002, "{what}");
    }
}

#[test]
fn text_that_is_not_utf8_fails_at_its_first_bad_fragment_with_1007() {
    // The bad byte in the first fragment: refused before the message ends.
    let first = frame(false, 0x1, b"ok \xff", KEY);
    let e = events(&mut server(), &first, 100).unwrap_err();
    assert_eq!((e, e.close_code()), (Error::InvalidUtf8, 1007));
    // A character split between fragments is fine.
    let euro = "€".as_bytes();
    let split = [
        frame(false, 0x1, &euro[..1], KEY),
        frame(true, 0x0, &euro[1..], KEY),
    ]
    .concat();
    assert_eq!(
        events(&mut server(), &split, 1).unwrap(),
        [Event::Text("€".into())]
    );
    // A message that ends inside a character.
    let cut = frame(true, 0x1, &euro[..2], KEY);
    assert_eq!(
        events(&mut server(), &cut, 100).unwrap_err(),
        Error::InvalidUtf8
    );
    // A close reason that is not UTF-8.
    let reason = frame(true, 0x8, b"\x03\xe8\xff", KEY);
    assert_eq!(
        events(&mut server(), &reason, 100).unwrap_err(),
        Error::InvalidUtf8
    );
    // Binary data is not text.
    let binary = frame(true, 0x2, b"\xff\xfe", KEY);
    assert_eq!(
        events(&mut server(), &binary, 100).unwrap(),
        [Event::Binary(vec![0xff, 0xfe].into())]
    );
}

#[test]
fn limits_are_enforced_from_the_header_with_1009() {
    let limits = Limits {
        max_frame: 1000,
        max_message: 1500,
        max_fragments: 3,
    };
    let mut s = Connection::new(Role::Server, limits);
    // Only the header of a frame over the limit: refused without its payload.
    let mut header = Vec::new();
    put_header(&mut header, true, false, Opcode::Binary, 1001, KEY);
    let e = events(&mut s, &header, 100).unwrap_err();
    assert_eq!((e, e.close_code()), (Error::TooBig, 1009));
    // A message over the limit across fragments, each under it.
    let mut s = Connection::new(Role::Server, limits);
    let two = [
        frame(false, 0x2, &[0; 800], KEY),
        frame(true, 0x0, &[0; 800], KEY),
    ]
    .concat();
    assert_eq!(events(&mut s, &two, 100).unwrap_err(), Error::TooBig);
    // Too many fragments.
    let mut s = Connection::new(Role::Server, limits);
    let many = [
        frame(false, 0x2, b"a", KEY),
        frame(false, 0x0, b"b", KEY),
        frame(false, 0x0, b"c", KEY),
        frame(true, 0x0, b"d", KEY),
    ]
    .concat();
    assert_eq!(events(&mut s, &many, 100).unwrap_err(), Error::TooBig);
}

#[test]
fn the_close_handshake_is_answered_once_and_ends_the_conversation() {
    // The peer closes first: the reply echoes its code, once; nothing more is read.
    let mut s = server();
    let mut bytes = frame(
        true,
        0x8,
        &[&1001u16.to_be_bytes()[..], b"bye"].concat(),
        KEY,
    );
    bytes.extend(frame(true, 0x1, b"late", KEY));
    let mut input = BytesMut::from(&bytes[..]);
    let mut out = Vec::new();
    let e = s.poll(&mut input, &mut out).unwrap();
    assert_eq!(e, Some(Event::Close(Some((1001, "bye".into())))));
    assert_eq!(out, b"\x88\x02\x03\xe9");
    assert_eq!(s.poll(&mut input, &mut out).unwrap(), None);
    assert!(s.close_sent() && s.close_received());
    assert_eq!(s.send_text("x", &mut out), Err(Error::Closed));
    // This end closes first: the peer's reply is not answered again, and pings after our
    // close get no pong.
    let mut s = server();
    let mut out = Vec::new();
    s.close(close::GOING_AWAY, "shutting down", &mut out);
    assert_eq!(&out[..4], b"\x88\x0f\x03\xe9");
    out.clear();
    let bytes = [frame(true, 0x9, b"p", KEY), frame(true, 0x8, b"", KEY)].concat();
    let got = events(&mut s, &bytes, 1).unwrap();
    assert_eq!(got, [Event::Ping("p".into()), Event::Close(None)]);
    // A long reason is cut to fit a control frame, at a character boundary.
    let mut s = server();
    let mut out = Vec::new();
    s.close(1000, &"é".repeat(100), &mut out);
    assert_eq!(out[1] as usize, out.len() - 2);
    assert!(out.len() - 2 <= 125);
    assert!(std::str::from_utf8(&out[4..]).is_ok());
}

#[test]
fn masking_in_pieces_matches_masking_at_once() {
    let key = [0xde, 0xad, 0xbe, 0xef];
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let mut whole = data.clone();
    apply_mask(&mut whole, key, 0);
    let naive: Vec<u8> = data
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ key[i % 4])
        .collect();
    assert_eq!(whole, naive);
    for cut in [1, 3, 5, 8, 13, 999] {
        let mut pieces = data.clone();
        let (a, b) = pieces.split_at_mut(cut);
        apply_mask(a, key, 0);
        apply_mask(b, key, cut);
        assert_eq!(pieces, naive, "cut at {cut}");
    }
}

#[test]
fn headers_round_trip_at_every_length_form() {
    for len in [0u64, 125, 126, 65535, 65536, 1 << 40] {
        for mask in [None, KEY] {
            let mut out = Vec::new();
            put_header(&mut out, true, false, Opcode::Binary, len, mask);
            let h = parse_header(&out).unwrap().unwrap();
            assert_eq!((h.len, h.mask, h.header_len), (len, mask, out.len()));
            // One byte short is "more needed", never an error.
            assert_eq!(parse_header(&out[..out.len() - 1]).unwrap(), None);
        }
    }
}

#[test]
fn the_handshake_key_and_request_checks() {
    // RFC 6455, Section 1.3.
    assert_eq!(
        handshake::accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let base: Vec<(&str, &[u8])> = vec![
        ("Host", b"server.example.com"),
        ("Upgrade", b"websocket"),
        ("Connection", b"keep-alive, Upgrade"),
        ("Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Protocol", b"chat, superchat"),
        (
            "Sec-WebSocket-Extensions",
            b"permessage-deflate; client_max_window_bits",
        ),
        ("Sec-WebSocket-Version", b"13"),
    ];
    let ok = handshake::check("GET", base.iter().copied()).unwrap();
    assert_eq!(ok.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(ok.protocols, ["chat", "superchat"]);
    assert_eq!(
        ok.extensions,
        ["permessage-deflate; client_max_window_bits"]
    );
    let without = |name: &'static str| base.iter().copied().filter(move |(n, _)| *n != name);
    let with = |name: &'static str, value: &'static [u8]| {
        base.iter()
            .copied()
            .filter(move |(n, _)| *n != name)
            .chain([(name, value)])
    };
    assert_eq!(
        handshake::check("POST", base.iter().copied()),
        Err(HandshakeError::Method)
    );
    assert_eq!(
        handshake::check("GET", without("Upgrade")),
        Err(HandshakeError::NotUpgrade)
    );
    assert_eq!(
        handshake::check("GET", without("Connection")),
        Err(HandshakeError::NotUpgrade)
    );
    let v8 = handshake::check("GET", with("Sec-WebSocket-Version", b"8")).unwrap_err();
    assert_eq!((v8, v8.status()), (HandshakeError::Version, 426));
    assert_eq!(
        handshake::check("GET", without("Sec-WebSocket-Key")),
        Err(HandshakeError::Key)
    );
    assert_eq!(
        handshake::check("GET", with("Sec-WebSocket-Key", b"c2hvcnQ=")),
        Err(HandshakeError::Key),
        "a key of 5 bytes"
    );
    let twice = base
        .iter()
        .copied()
        .chain([("sec-websocket-key", &b"AAAAAAAAAAAAAAAAAAAAAA=="[..])]);
    assert_eq!(handshake::check("GET", twice), Err(HandshakeError::Key));
}

#[test]
fn a_frame_announced_is_not_allocated_before_it_arrives() {
    let mut s = server();
    let mut header = Vec::new();
    put_header(&mut header, true, false, Opcode::Binary, 10 << 20, KEY);
    let mut input = BytesMut::from(&header[..]);
    let mut out = Vec::new();
    assert_eq!(s.poll(&mut input, &mut out).unwrap(), None);
    assert!(
        input.capacity() < 4096,
        "reserved {} bytes",
        input.capacity()
    );
}
