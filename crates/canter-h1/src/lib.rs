//! Sans-IO HTTP/1.1 server protocol engine.
//!
//! No sockets and no clock: the driver appends received bytes to a buffer, asks the
//! [`Conn`] for the next [`RequestHead`](canter_http::RequestHead) and body pieces, and gets response bytes written into
//! its output buffer. Time comes in as `now` arguments; [`Conn::deadline`] says when the
//! current phase (idle, head, body) times out.
//!
//! Parsing is strict (RFC 9112): bare LF line endings, conflicting Content-Length,
//! Transfer-Encoding with Content-Length, a final coding other than chunked, a missing or
//! repeated Host in HTTP/1.1, obs-fold and control bytes are rejected, each [`Error`] carrying
//! the status to answer with.
//!
//! ```
//! use bytes::BytesMut;
//! use canter_h1::{BodyLen, Conn, Next};
//! use canter_http::{Limits, Timeouts};
//! use std::time::Instant;
//!
//! let now = Instant::now();
//! let mut conn = Conn::new(Limits::default(), Timeouts::default(), now);
//! let mut input = BytesMut::from(&b"GET /hi HTTP/1.1\r\nHost: x\r\n\r\n"[..]);
//! let head = conn.poll_request(&mut input, now).unwrap().unwrap();
//! assert_eq!(head.path(), "/hi");
//!
//! let mut out = BytesMut::new();
//! let date = b"Sun, 22 Nov 2026 12:00:00 GMT";
//! conn.start_response(200, [], BodyLen::Known(2), date, b"canter", &mut out);
//! conn.data_prefix(2, &mut out).unwrap();
//! out.extend_from_slice(b"hi");
//! assert_eq!(conn.finish(&mut out, now), Ok(Next::KeepAlive));
//! assert!(out.starts_with(b"HTTP/1.1 200 OK\r\nServer: canter\r\nDate: "));
//! ```

mod body;
mod conn;
mod error;
mod head;

pub use body::{BodyDecoder, BodyEvent};
pub use conn::{reason, BodyLen, Conn, Discard, LengthMismatch, Next, Preamble, OK_LINE};
pub use error::{BadBody, Error, Malformed};
