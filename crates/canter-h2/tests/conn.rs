//! The connection engine against a scripted client: flow control, trailers, limits and the
//! protections against abusive peers.

#![allow(clippy::unwrap_used, missing_docs)]

use bytes::{Buf, Bytes, BytesMut};
use canter_h2::hpack::{Encoder, Indexing};
use canter_h2::{ConnError, Connection, ErrorCode, Event, Settings, PREFACE};

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;

const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A scripted client around a server-side engine.
struct Client {
    server: Connection,
    out: BytesMut,
    input: BytesMut,
    enc: Encoder,
}

impl Client {
    fn new(settings: Settings) -> Client {
        Client::with_peer_settings(settings, &[])
    }

    fn with_peer_settings(settings: Settings, peer: &[(u16, u32)]) -> Client {
        let mut out = BytesMut::new();
        let server = Connection::new(settings, &mut out);
        let mut c = Client {
            server,
            out,
            input: BytesMut::new(),
            enc: Encoder::new(4096),
        };
        let mut s = Vec::new();
        for (id, v) in peer {
            s.extend_from_slice(&id.to_be_bytes());
            s.extend_from_slice(&v.to_be_bytes());
        }
        let mut first = PREFACE.to_vec();
        first.extend(frame(SETTINGS, 0, 0, &s));
        c.send(&first).unwrap();
        c.frames(); // the server's SETTINGS, WINDOW_UPDATE and SETTINGS ACK
        c
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        self.input.extend_from_slice(bytes);
        self.server.recv(&mut self.input, &mut self.out)
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        self.enc.begin(&mut b);
        for (n, v) in fields {
            self.enc
                .field(n.as_bytes(), v.as_bytes(), Indexing::Yes, &mut b);
        }
        b
    }

    fn get(&mut self, stream: u32, end_stream: bool) -> Vec<u8> {
        let b = self.block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "x"),
        ]);
        let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
        frame(HEADERS, flags, stream, &b)
    }

    fn post(&mut self, stream: u32, len: Option<usize>) -> Vec<u8> {
        let n = len.map(|n| n.to_string());
        let mut fields = vec![
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/up"),
            (":authority", "x"),
        ];
        if let Some(n) = &n {
            fields.push(("content-length", n));
        }
        let b = self.block(&fields);
        frame(HEADERS, END_HEADERS, stream, &b)
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.server.poll_event()).collect()
    }

    /// Frames the server wrote since the last call.
    fn frames(&mut self) -> Vec<Frame> {
        let mut v = Vec::new();
        while self.out.len() >= 9 {
            let len =
                (self.out[0] as usize) << 16 | (self.out[1] as usize) << 8 | self.out[2] as usize;
            let f = Frame {
                kind: self.out[3],
                flags: self.out[4],
                stream: u32::from_be_bytes([self.out[5], self.out[6], self.out[7], self.out[8]]),
                payload: self.out[9..9 + len].to_vec(),
            };
            self.out.advance(9 + len);
            v.push(f);
        }
        v
    }

    fn respond(&mut self, stream: u32, body: &'static [u8]) {
        self.server
            .send_headers(
                stream,
                200,
                [(&b"content-type"[..], &b"text/plain"[..])],
                body.is_empty(),
                &mut self.out,
            )
            .unwrap();
        if !body.is_empty() {
            self.server
                .send_data(stream, Bytes::from_static(body), true)
                .unwrap();
        }
        self.server.flush(&mut self.out);
    }
}

fn goaway_code(frames: &[Frame]) -> Option<u32> {
    frames
        .iter()
        .find(|f| f.kind == GOAWAY)
        .map(|f| u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]]))
}

fn rst_codes(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames
        .iter()
        .filter(|f| f.kind == RST_STREAM)
        .map(|f| {
            (
                f.stream,
                u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]]),
            )
        })
        .collect()
}

fn window_update(stream: u32, inc: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &inc.to_be_bytes())
}

#[test]
fn server_settings_announce_the_limits() {
    let mut out = BytesMut::new();
    let _ = Connection::new(Settings::default(), &mut out);
    let mut c = Client {
        server: Connection::new(Settings::default(), &mut BytesMut::new()),
        out,
        input: BytesMut::new(),
        enc: Encoder::new(4096),
    };
    let frames = c.frames();
    assert_eq!(frames[0].kind, SETTINGS);
    let settings: Vec<(u16, u32)> = frames[0]
        .payload
        .chunks(6)
        .map(|s| {
            (
                u16::from_be_bytes([s[0], s[1]]),
                u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
            )
        })
        .collect();
    assert!(settings.contains(&(3, 128)), "{settings:?}"); // MAX_CONCURRENT_STREAMS
    assert!(settings.contains(&(4, 256 * 1024))); // INITIAL_WINDOW_SIZE
    assert!(settings.contains(&(6, 16 * 1024))); // MAX_HEADER_LIST_SIZE
    assert!(settings.contains(&(2, 0))); // ENABLE_PUSH
                                         // The connection window is raised to 1 MiB at once.
    assert_eq!(frames[1].kind, WINDOW_UPDATE);
    assert_eq!(frames[1].payload, (1024 * 1024 - 65_535u32).to_be_bytes());
}

#[test]
fn a_request_and_its_response() {
    let mut c = Client::new(Settings::default());
    let f = c.get(1, true);
    c.send(&f).unwrap();
    let ev = c.events();
    let [Event::Request {
        stream: 1,
        head,
        end_stream: true,
    }] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(head.method(), b"GET");
    assert_eq!(head.authority(), Some(&b"x"[..]));
    c.respond(1, b"hello");
    let frames = c.frames();
    assert_eq!(frames.len(), 2);
    assert_eq!(
        (frames[0].kind, frames[0].flags, frames[0].stream),
        (HEADERS, END_HEADERS, 1)
    );
    assert_eq!((frames[1].kind, frames[1].flags), (DATA, END_STREAM));
    assert_eq!(frames[1].payload, b"hello");
    assert_eq!(c.server.open_streams(), 0);
}

#[test]
fn request_body_windows_open_as_the_handler_consumes() {
    let mut c = Client::new(Settings::builder().stream_window(1000).build().unwrap());
    let h = c.post(1, None);
    c.send(&h).unwrap();
    let d = frame(DATA, 0, 1, &[7u8; 600]);
    c.send(&d).unwrap();
    let d = frame(DATA, 0, 1, &[7u8; 300]);
    c.send(&d).unwrap();
    let ev = c.events();
    assert!(
        matches!(ev[1], Event::Data { stream: 1, ref data, end_stream: false } if data.len() == 600)
    );
    // Nothing is given back until the handler consumes; then half a window or more is.
    assert!(c.frames().is_empty());
    c.server.consume(1, 400, &mut c.out);
    assert!(c.frames().iter().all(|f| f.stream != 1));
    c.server.consume(1, 200, &mut c.out);
    let frames = c.frames();
    assert!(
        frames
            .iter()
            .any(|f| f.kind == WINDOW_UPDATE && f.stream == 1 && f.payload == 600u32.to_be_bytes()),
        "{frames:?}"
    );
    // 100 left of the first window, 600 given back: 700 more fit, one byte past is an error.
    let d = frame(DATA, 0, 1, &[7u8; 700]);
    c.send(&d).unwrap();
    assert!(c.frames().is_empty());
    let d = frame(DATA, 0, 1, &[7u8; 1]);
    c.send(&d).unwrap();
    assert_eq!(
        rst_codes(&c.frames()),
        vec![(1, ErrorCode::FLOW_CONTROL_ERROR.0)]
    );
}

#[test]
fn content_length_must_match_the_data() {
    let mut c = Client::new(Settings::default());
    let h = c.post(1, Some(3));
    c.send(&h).unwrap();
    let d = frame(DATA, END_STREAM, 1, b"ab");
    c.send(&d).unwrap();
    assert_eq!(
        rst_codes(&c.frames()),
        vec![(1, ErrorCode::PROTOCOL_ERROR.0)]
    );
    let ev = c.events();
    assert!(
        matches!(ev.last(), Some(Event::Reset { stream: 1, .. })),
        "{ev:?}"
    );
}

#[test]
fn trailers_both_ways() {
    let mut c = Client::new(Settings::default());
    let h = c.post(1, None);
    c.send(&h).unwrap();
    let d = frame(DATA, 0, 1, b"body");
    c.send(&d).unwrap();
    let t = c.block(&[("x-checksum", "abc")]);
    c.send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &t))
        .unwrap();
    let ev = c.events();
    let Some(Event::Trailers { stream: 1, head }) = ev.last() else {
        panic!("{ev:?}")
    };
    assert_eq!(
        head.fields().collect::<Vec<_>>(),
        vec![(&b"x-checksum"[..], &b"abc"[..])]
    );
    // Response trailers go after the data.
    c.server
        .send_headers(1, 200, [], false, &mut c.out)
        .unwrap();
    c.server
        .send_data(1, Bytes::from_static(b"ok"), false)
        .unwrap();
    c.server
        .send_trailers(1, vec![(b"grpc-status".to_vec(), b"0".to_vec())])
        .unwrap();
    c.server.flush(&mut c.out);
    let frames = c.frames();
    let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.kind, f.flags)).collect();
    assert_eq!(
        kinds,
        vec![
            (HEADERS, END_HEADERS),
            (DATA, 0),
            (HEADERS, END_HEADERS | END_STREAM)
        ]
    );
    assert_eq!(c.server.open_streams(), 0);
}

#[test]
fn pseudo_header_in_trailers_is_a_stream_error() {
    let mut c = Client::new(Settings::default());
    let h = c.post(1, None);
    c.send(&h).unwrap();
    let t = c.block(&[(":path", "/x")]);
    c.send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &t))
        .unwrap();
    assert_eq!(
        rst_codes(&c.frames()),
        vec![(1, ErrorCode::PROTOCOL_ERROR.0)]
    );
}

#[test]
fn malformed_requests_are_reset_not_delivered() {
    let cases: &[&[(&str, &str)]] = &[
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("Upper", "x"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("connection", "close"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("te", "gzip"),
        ],
        &[(":method", "GET"), (":scheme", "http")],
        &[(":method", "GET"), (":scheme", "http"), (":path", "")],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":path", "/"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":status", "200"),
        ],
        &[
            (":method", "GET"),
            ("x", "y"),
            (":scheme", "http"),
            (":path", "/"),
        ],
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("x", " padded"),
        ],
    ];
    for (i, fields) in cases.iter().enumerate() {
        let mut c = Client::new(Settings::default());
        let b = c.block(fields);
        c.send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &b))
            .unwrap();
        assert_eq!(
            rst_codes(&c.frames()),
            vec![(1, ErrorCode::PROTOCOL_ERROR.0)],
            "case {i}"
        );
        assert!(c.events().is_empty(), "case {i}");
    }
}

#[test]
fn too_many_concurrent_streams_are_refused() {
    let mut c = Client::new(
        Settings::builder()
            .max_concurrent_streams(2)
            .build()
            .unwrap(),
    );
    for id in [1, 3, 5] {
        let f = c.get(id, false);
        c.send(&f).unwrap();
    }
    assert_eq!(
        rst_codes(&c.frames()),
        vec![(5, ErrorCode::REFUSED_STREAM.0)]
    );
    assert_eq!(c.events().len(), 2);
}

#[test]
fn frames_larger_than_advertised_close_the_connection() {
    let mut c = Client::new(Settings::default());
    let mut f = frame(DATA, 0, 1, &[]);
    // Announce 16,385 bytes: refused on the header alone.
    f[0] = 0;
    f[1] = 0x40;
    f[2] = 0x01;
    let e = c.send(&f).unwrap_err();
    assert_eq!(e.code, ErrorCode::FRAME_SIZE_ERROR);
    assert_eq!(
        goaway_code(&c.frames()),
        Some(ErrorCode::FRAME_SIZE_ERROR.0)
    );
}

#[test]
fn the_last_stream_identifier_works_and_nothing_follows_it() {
    let mut c = Client::new(Settings::default());
    let max = canter_h2::MAX_STREAM_ID;
    let f = c.get(max, true);
    c.send(&f).unwrap();
    assert!(matches!(c.events()[..], [Event::Request { stream, .. }] if stream == max));
    c.respond(max, b"last");
    assert!(c.frames().iter().any(|f| f.kind == DATA && f.stream == max));
    // Any further stream would have to go backwards.
    let f = c.get(1, true);
    let e = c.send(&f).unwrap_err();
    assert_eq!(e.code, ErrorCode::STREAM_CLOSED);
}

#[test]
fn rapid_reset_gets_enhance_your_calm() {
    let mut c = Client::new(Settings::default());
    let mut id = 1;
    let result = loop {
        let h = c.get(id, false);
        let mut batch = h;
        batch.extend(frame(RST_STREAM, 0, id, &ErrorCode::CANCEL.0.to_be_bytes()));
        if let Err(e) = c.send(&batch) {
            break Some((e, id));
        }
        c.events();
        id += 2;
        if id > 2001 {
            break None;
        }
    };
    let (e, id) = result.expect("no limit on resets");
    assert_eq!(e.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(id, 2 * 201 - 1, "the 201st reset trips the budget");
    assert_eq!(
        goaway_code(&c.frames()),
        Some(ErrorCode::ENHANCE_YOUR_CALM.0)
    );
}

#[test]
fn completed_streams_refill_the_reset_budget() {
    // A browser that cancels some requests and completes others is never cut off.
    let mut c = Client::new(Settings::builder().reset_budget(10).build().unwrap());
    for i in 0..500u32 {
        let id = 1 + 4 * i;
        let f = c.get(id, true);
        c.send(&f).unwrap();
        c.events();
        c.respond(id, b"ok");
        let h = c.get(id + 2, false);
        let mut batch = h;
        batch.extend(frame(
            RST_STREAM,
            0,
            id + 2,
            &ErrorCode::CANCEL.0.to_be_bytes(),
        ));
        c.send(&batch).unwrap();
        c.events();
        c.frames();
    }
}

#[test]
fn server_provoked_resets_count_too() {
    // MadeYouReset: frames that make the server reset the stream (here WINDOW_UPDATE of 0).
    let mut c = Client::new(Settings::builder().reset_budget(20).build().unwrap());
    let mut tripped = None;
    for i in 0..100u32 {
        let id = 1 + 2 * i;
        let mut batch = c.get(id, false);
        batch.extend(window_update(id, 0));
        if let Err(e) = c.send(&batch) {
            tripped = Some((e, i));
            break;
        }
        c.events();
    }
    let (e, i) = tripped.expect("no limit on provoked resets");
    assert_eq!(e.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(i, 20);
}

#[test]
fn continuation_flood_is_cut_before_the_payload_arrives() {
    let mut c = Client::new(Settings::default());
    let h = c.get(1, true);
    // The same block without END_HEADERS, then CONTINUATION frames of junk that never end.
    let mut first = h.clone();
    first[4] = END_STREAM;
    c.send(&first).unwrap();
    let piece = vec![0x82u8; 16_000];
    let mut sent = 0;
    let err = loop {
        let f = frame(CONTINUATION, 0, 1, &piece);
        // Only the frame header at first: a flood must be refused without buffering it.
        if let Err(e) = c.send(&f[..9]) {
            break e;
        }
        c.send(&f[9..]).unwrap();
        sent += 1;
        assert!(sent < 10, "64 KiB block limit not enforced");
    };
    assert_eq!(err.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(sent, 4);
    assert_eq!(
        goaway_code(&c.frames()),
        Some(ErrorCode::ENHANCE_YOUR_CALM.0)
    );
}

#[test]
fn many_small_continuations_are_bounded_by_count() {
    let mut c = Client::new(Settings::default());
    let mut first = c.get(1, true);
    first[4] = END_STREAM;
    c.send(&first).unwrap();
    let mut n = 0;
    let err = loop {
        match c.send(&frame(CONTINUATION, 0, 1, &[])) {
            Err(e) => break e,
            Ok(()) => n += 1,
        }
        assert!(n < 1000);
    };
    assert_eq!(err.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(n, 64);
}

#[test]
fn hpack_bomb_is_answered_431_and_the_connection_goes_on() {
    let mut c = Client::new(Settings::default());
    // Insert one 4 KB field, then reference it 100 times: 400 KB decoded from ~4.2 KB.
    // :method GET, :scheme http, :path / (static), then x-big with incremental indexing and a
    // 4000-byte value (length 127 + 3873 as an HPACK integer).
    let mut b = vec![0x82, 0x86, 0x84, 0x40, 0x05];
    b.extend_from_slice(b"x-big");
    b.extend_from_slice(&[0x7f, 0xa1, 0x1e]);
    b.extend(std::iter::repeat_n(b'z', 4000));
    b.extend(std::iter::repeat_n(0xbe, 100));
    c.send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &b))
        .unwrap();
    let ev = c.events();
    assert!(
        matches!(
            ev[..],
            [Event::Reject {
                stream: 1,
                status: 431
            }]
        ),
        "{ev:?}"
    );
    c.server.send_headers(1, 431, [], true, &mut c.out).unwrap();
    c.frames();
    // The tables are still in step: the next request decodes, reusing the big entry's index.
    let f = c.get(3, true);
    c.send(&f).unwrap();
    assert!(matches!(c.events()[..], [Event::Request { stream: 3, .. }]));
}

#[test]
fn control_frame_floods_get_enhance_your_calm() {
    let floods: [(&str, Vec<u8>); 5] = [
        ("PING", frame(PING, 0, 0, &[0; 8])),
        ("SETTINGS", frame(SETTINGS, 0, 0, &[])),
        ("WINDOW_UPDATE", window_update(0, 1)),
        ("PRIORITY", frame(PRIORITY, 0, 3, &[0, 0, 0, 0, 16])),
        ("unknown", frame(0x42, 0, 0, b"x")),
    ];
    for (name, f) in floods {
        let mut c = Client::new(Settings::builder().max_idle_frames(1000).build().unwrap());
        let mut batch = Vec::new();
        for _ in 0..999 {
            batch.extend_from_slice(&f);
        }
        c.send(&batch).unwrap_or_else(|e| panic!("{name}: {e}"));
        c.frames();
        // A request resets the count.
        let g = c.get(1, true);
        c.send(&g).unwrap();
        c.send(&batch).unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = c.send(&f).and_then(|()| c.send(&f)).unwrap_err();
        assert_eq!(e.code, ErrorCode::ENHANCE_YOUR_CALM, "{name}");
    }
}

#[test]
fn empty_data_flood_gets_enhance_your_calm() {
    let mut c = Client::new(Settings::builder().max_idle_frames(500).build().unwrap());
    let h = c.post(1, None);
    c.send(&h).unwrap();
    let mut batch = Vec::new();
    for _ in 0..600 {
        batch.extend(frame(DATA, 0, 1, &[]));
    }
    let e = c.send(&batch).unwrap_err();
    assert_eq!(e.code, ErrorCode::ENHANCE_YOUR_CALM);
}

#[test]
fn a_zero_window_holds_data_queued_and_sends_none() {
    let mut c = Client::with_peer_settings(Settings::default(), &[(4, 0)]);
    for id in [1u32, 3, 5] {
        let f = c.get(id, true);
        c.send(&f).unwrap();
        c.server
            .send_headers(id, 200, [], false, &mut c.out)
            .unwrap();
        c.server
            .send_data(id, Bytes::from(vec![b'a'; 100_000]), true)
            .unwrap();
    }
    c.server.flush(&mut c.out);
    assert!(c.frames().iter().all(|f| f.kind != DATA));
    assert_eq!(c.server.queued(), 300_000);
    // Windows opened: the streams take turns, frame by frame, within the connection window.
    c.send(&window_update(1, 20_000)).unwrap();
    c.send(&window_update(3, 20_000)).unwrap();
    c.server.flush(&mut c.out);
    let data: Vec<(u32, usize)> = c
        .frames()
        .iter()
        .filter(|f| f.kind == DATA)
        .map(|f| (f.stream, f.payload.len()))
        .collect();
    assert_eq!(data, vec![(1, 16_384), (3, 16_384), (1, 3_616), (3, 3_616)]);
    assert_eq!(c.server.queued(), 260_000);
}

#[test]
fn reset_streams_free_their_queued_data() {
    let mut c = Client::with_peer_settings(Settings::default(), &[(4, 0)]);
    let f = c.get(1, true);
    c.send(&f).unwrap();
    c.server
        .send_headers(1, 200, [], false, &mut c.out)
        .unwrap();
    c.server
        .send_data(1, Bytes::from(vec![b'a'; 50_000]), true)
        .unwrap();
    assert_eq!(c.server.queued(), 50_000);
    c.send(&frame(RST_STREAM, 0, 1, &ErrorCode::CANCEL.0.to_be_bytes()))
        .unwrap();
    assert_eq!(c.server.queued(), 0);
    assert_eq!(c.server.open_streams(), 0);
}

#[test]
fn graceful_goaway_finishes_open_streams_and_ignores_new_ones() {
    let mut c = Client::new(Settings::default());
    let f = c.get(1, true);
    c.send(&f).unwrap();
    c.events();
    c.server.go_away(&mut c.out);
    assert_eq!(goaway_code(&c.frames()), Some(0));
    let f = c.get(3, true);
    c.send(&f).unwrap();
    assert!(c.events().is_empty(), "a stream past GOAWAY was started");
    assert!(!c.server.is_finished());
    c.respond(1, b"done");
    assert!(c.server.is_finished());
}

#[test]
fn padded_and_prioritized_frames_are_accepted() {
    let mut c = Client::new(Settings::default());
    let b = c.block(&[(":method", "POST"), (":scheme", "http"), (":path", "/")]);
    // HEADERS with PADDED and PRIORITY flags: pad length, dependency, weight, block, padding.
    let mut payload = vec![3u8, 0, 0, 0, 0, 16];
    payload.extend_from_slice(&b);
    payload.extend_from_slice(&[0, 0, 0]);
    c.send(&frame(HEADERS, END_HEADERS | 0x8 | 0x20, 1, &payload))
        .unwrap();
    c.send(&frame(PRIORITY, 0, 1, &[0, 0, 0, 0, 200])).unwrap();
    let mut d = vec![2u8];
    d.extend_from_slice(b"xyz");
    d.extend_from_slice(&[0, 0]);
    c.send(&frame(DATA, END_STREAM | 0x8, 1, &d)).unwrap();
    let ev = c.events();
    assert!(matches!(
        ev[0],
        Event::Request {
            stream: 1,
            end_stream: false,
            ..
        }
    ));
    assert!(
        matches!(ev[1], Event::Data { stream: 1, ref data, end_stream: true } if &data[..] == b"xyz")
    );
}

#[test]
fn random_frames_never_panic() {
    // Frames with random types, flags, streams and payloads (and a valid header block now and
    // then, so streams exist to be hit): every outcome is an event, a frame or an error.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..3_000 {
        let mut c = Client::new(Settings::default());
        for _ in 0..20 {
            let r = next();
            let kind = (r % 11) as u8;
            let flags = (r >> 8) as u8;
            let stream = ((r >> 16) % 8) as u32;
            let len = ((r >> 24) % 24) as usize;
            let mut payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if kind == HEADERS && r % 3 == 0 {
                payload = c.block(&[(":method", "POST"), (":scheme", "http"), (":path", "/")]);
            }
            if c.send(&frame(kind, flags, stream, &payload)).is_err() {
                break;
            }
            for ev in c.events() {
                if let Event::Request { stream, .. } = ev {
                    let _ = c.server.send_headers(stream, 200, [], false, &mut c.out);
                    let _ = c.server.send_data(stream, Bytes::from_static(b"x"), true);
                }
            }
            c.server.flush(&mut c.out);
            c.frames();
        }
    }
}

#[test]
fn settings_out_of_the_protocols_ranges_are_refused_by_name() {
    let b = Settings::builder;
    for (built, setting) in [
        (b().max_frame_size(16_383).build(), "max_frame_size"),
        (b().max_frame_size(1 << 24).build(), "max_frame_size"),
        (b().stream_window(1 << 31).build(), "stream_window"),
        (b().connection_window(65_534).build(), "connection_window"),
        (b().connection_window(1 << 31).build(), "connection_window"),
        (
            b().max_concurrent_streams(0).build(),
            "max_concurrent_streams",
        ),
        (b().max_header_list(0).build(), "max_header_list"),
        (b().max_header_block(16_383).build(), "max_header_block"),
        (b().max_idle_frames(0).build(), "max_idle_frames"),
    ] {
        let err = built.expect_err(setting);
        assert_eq!(err.setting(), setting);
        assert!(err.to_string().contains(setting), "{err}");
    }
    // The edges of each range are valid, and a builder round-trips.
    let edges = b()
        .max_frame_size((1 << 24) - 1)
        .stream_window((1 << 31) - 1)
        .connection_window(65_535)
        .max_concurrent_streams(1)
        .build()
        .unwrap();
    assert_eq!(edges.max_frame_size(), (1 << 24) - 1);
    assert_eq!(edges.to_builder().build(), Ok(edges));
    assert_eq!(b().build(), Ok(Settings::default()));
    // A server's head limit lowers what it advertises, never raises it.
    assert_eq!(edges.with_header_list_at_most(100).max_header_list(), 100);
    assert_eq!(
        edges.with_header_list_at_most(u32::MAX).max_header_list(),
        edges.max_header_list()
    );
}

/// The SETTINGS the server sent first, as (id, value) pairs.
fn first_settings(settings: Settings) -> Vec<(u16, u32)> {
    let mut out = BytesMut::new();
    let _ = Connection::new(settings, &mut out);
    let mut c = Client {
        server: Connection::new(Settings::default(), &mut BytesMut::new()),
        out,
        input: BytesMut::new(),
        enc: Encoder::new(4096),
    };
    c.frames()[0]
        .payload
        .chunks(6)
        .map(|s| {
            (
                u16::from_be_bytes([s[0], s[1]]),
                u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
            )
        })
        .collect()
}

fn extended_connect(
    path: Option<&'static str>,
    method: &'static str,
) -> Vec<(&'static str, &'static str)> {
    let mut fields = vec![
        (":method", method),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":authority", "x"),
    ];
    if let Some(p) = path {
        fields.push((":path", p));
    }
    fields.push(("sec-websocket-version", "13"));
    fields
}

#[test]
fn the_extended_connect_is_announced_and_accepted_only_when_on() {
    // RFC 8441, Section 3: SETTINGS_ENABLE_CONNECT_PROTOCOL (0x8) = 1 when on, absent when off.
    assert!(!first_settings(Settings::default())
        .iter()
        .any(|(id, _)| *id == 8));
    let on = Settings::default().with_connect_protocol(true);
    assert!(first_settings(on).contains(&(8, 1)));
    // On: a CONNECT with :protocol, :scheme and :path is a request, its :protocol kept.
    let mut c = Client::new(on);
    let b = c.block(&extended_connect(Some("/chat"), "CONNECT"));
    c.send(&frame(HEADERS, END_HEADERS, 1, &b)).unwrap();
    let ev = c.events();
    let [Event::Request {
        stream: 1,
        head,
        end_stream: false,
    }] = &ev[..]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(head.method(), b"CONNECT");
    assert_eq!(head.protocol(), Some(&b"websocket"[..]));
    assert_eq!(head.path(), b"/chat");
    // Malformed, reset: :protocol while off, without :path, or on a method other than CONNECT.
    for (settings, fields) in [
        (
            Settings::default(),
            extended_connect(Some("/chat"), "CONNECT"),
        ),
        (on, extended_connect(None, "CONNECT")),
        (on, extended_connect(Some("/chat"), "GET")),
    ] {
        let mut c = Client::new(settings);
        let b = c.block(&fields);
        c.send(&frame(HEADERS, END_HEADERS, 1, &b)).unwrap();
        assert_eq!(
            rst_codes(&c.frames()),
            vec![(1, ErrorCode::PROTOCOL_ERROR.0)],
            "{fields:?}"
        );
        assert!(c.events().is_empty());
    }
}

#[test]
fn a_client_setting_enable_connect_protocol_above_one_is_a_connection_error() {
    let mut out = BytesMut::new();
    let mut server = Connection::new(Settings::default(), &mut out);
    let mut first = PREFACE.to_vec();
    let mut s = Vec::new();
    s.extend_from_slice(&8u16.to_be_bytes());
    s.extend_from_slice(&2u32.to_be_bytes());
    first.extend(frame(SETTINGS, 0, 0, &s));
    let mut input = BytesMut::from(&first[..]);
    assert!(server.recv(&mut input, &mut out).is_err());
}

/// The stream ID hasher spreads consecutive IDs of one parity (HTTP/2's odd `u32`s, QUIC's
/// client-initiated bidirectional `u64`s, 4 apart) over a hash table's top bits.
#[test]
fn stream_id_hasher_spreads_consecutive_ids() {
    use std::hash::Hasher;
    let top = |f: &dyn Fn(&mut canter_h2::StreamIdHasher)| {
        let mut h = canter_h2::StreamIdHasher::default();
        f(&mut h);
        h.finish() >> 54
    };
    let h2: std::collections::HashSet<u64> = (1u32..2000)
        .step_by(2)
        .map(|id| top(&|h| h.write_u32(id)))
        .collect();
    assert!(h2.len() > 500, "{}", h2.len());
    let h3: std::collections::HashSet<u64> = (0u64..4000)
        .step_by(4)
        .map(|id| top(&|h| h.write_u64(id)))
        .collect();
    assert!(h3.len() > 500, "{}", h3.len());
}
