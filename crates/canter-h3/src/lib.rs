//! Sans-IO HTTP/3 server protocol engine (RFC 9114) with QPACK (RFC 9204).
//!
//! No sockets, no clock and no QUIC: the driver owns a QUIC connection (canter's runtime
//! drives `quinn-proto`), hands [`Connection::recv`] the bytes of each stream the client opened
//! as they arrive, takes [`Event`]s (requests, body pieces, trailers, stream errors) and writes
//! what [`Connection::headers`], [`Connection::data_head`] and [`Connection::control_preamble`]
//! produce on its own streams. QPACK runs without a dynamic table (this side advertises a
//! capacity of 0), so no stream ever waits for another.
//!
//! ```
//! use bytes::Bytes;
//! use canter_h3::{Connection, Event, Settings};
//!
//! let mut conn = Connection::new(Settings::default());
//! // A client's request on stream 0: a HEADERS frame (type 1) whose QPACK section is
//! // GET (static 17), https (23), :path / (1) and :authority "x" (a literal, name 0), then FIN.
//! let section = [0x00, 0x00, 0xd1, 0xd7, 0xc1, 0x50, 0x01, b'x'];
//! let mut frame = vec![0x01, section.len() as u8];
//! frame.extend_from_slice(&section);
//! conn.recv(0, Bytes::from(frame), true).unwrap();
//! let Some(Event::Request { stream, head, end_stream }) = conn.poll_event() else { panic!() };
//! assert_eq!((stream, head.method(), head.path(), end_stream), (0, &b"GET"[..], &b"/"[..], true));
//!
//! // The answer: HEADERS, then a DATA frame's header and its payload, then the stream's FIN.
//! let mut out = Vec::new();
//! conn.headers(200, [(&b"content-type"[..], &b"text/plain"[..])], &mut out);
//! conn.data_head(2, &mut out);
//! out.extend_from_slice(b"hi");
//! assert_eq!(out[0], 0x01);
//! ```

mod conn;
mod frame;
pub mod qpack;
pub mod varint;

pub use canter_h2::{RequestHead, StreamIdHasher};
pub use conn::{ConnError, Connection, Event, PeerSettings, Settings};
pub use frame::ErrorCode;
