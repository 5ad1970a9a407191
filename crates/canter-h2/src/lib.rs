//! Sans-IO HTTP/2 server protocol engine (RFC 9113, RFC 7541).
//!
//! No sockets and no clock: the driver appends received bytes to a buffer and hands it to
//! [`Connection::recv`], takes [`Event`]s (requests, body pieces, resets), and sends responses
//! with [`Connection::send_headers`] and [`Connection::send_data`]; the frames to write land in
//! a [`Sink`]. Flow control, the stream state machine, HPACK and the protections against
//! abusive clients live here; what a request means is the driver's business.
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use canter_h2::{Connection, Event, Settings};
//!
//! let mut out = BytesMut::new();
//! let mut conn = Connection::new(Settings::default(), &mut out);
//! // A client: preface, empty SETTINGS, then HEADERS for GET / (HPACK static indices 2, 4, 6,
//! // and :authority as a literal).
//! let mut input = BytesMut::new();
//! input.extend_from_slice(canter_h2::PREFACE);
//! input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
//! let block = [0x82, 0x84, 0x86, 0x41, 0x01, b'x'];
//! input.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x5, 0, 0, 0, 1]);
//! input.extend_from_slice(&block);
//! conn.recv(&mut input, &mut out).unwrap();
//! let Some(Event::Request { stream, head, end_stream }) = conn.poll_event() else { panic!() };
//! assert_eq!((stream, head.method(), head.path(), end_stream), (1, &b"GET"[..], &b"/"[..], true));
//!
//! conn.send_headers(stream, 200, [(&b"content-type"[..], &b"text/plain"[..])], false, &mut out).unwrap();
//! conn.send_data(stream, Bytes::from_static(b"hi"), true).unwrap();
//! conn.flush(&mut out);
//! assert_eq!(conn.open_streams(), 0);
//! ```

mod conn;
mod frame;
pub mod hpack;
pub mod huffman;
mod huffman_table;

pub use conn::{
    ConnError, Connection, Event, HeaderCheck, RequestHead, SendError, Settings, SettingsBuilder,
    Sink, StreamIdHasher,
};
pub use frame::{ErrorCode, DEFAULT_MAX_FRAME, DEFAULT_WINDOW, MAX_STREAM_ID, PREFACE};
