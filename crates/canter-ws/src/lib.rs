//! Sans-IO WebSocket engine (RFC 6455).
//!
//! No sockets and no clock, like canter-h1 and canter-h2: [`Connection::poll`] takes the bytes
//! a driver read and gives back whole messages and control frames, validated as RFC 6455 asks
//! (masking by role, reserved bits and opcodes, control frame rules, fragmentation, UTF-8 of
//! text checked as it arrives, close codes), under size [`Limits`]; the `send_*` methods and
//! [`Connection::close`] append frames to an output buffer. [`handshake`] checks an upgrade
//! request and computes `Sec-WebSocket-Accept`; [`deflate`] negotiates permessage-deflate (RFC
//! 7692), which [`Connection::with_deflate`] turns on.
//!
//! ```
//! use bytes::BytesMut;
//! use canter_ws::{Connection, Event, Limits, Role};
//!
//! let mut server = Connection::new(Role::Server, Limits::default());
//! // A masked "Hello" from a client (RFC 6455, Section 5.7).
//! let mut input = BytesMut::from(&b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"[..]);
//! let mut out = Vec::new();
//! let event = server.poll(&mut input, &mut out)?;
//! assert_eq!(event, Some(Event::Text("Hello".into())));
//! server.send_text("Hello", &mut out)?;
//! assert_eq!(out, b"\x81\x05Hello");
//! # Ok::<(), canter_ws::Error>(())
//! ```

pub mod close;
mod conn;
pub mod deflate;
pub mod frame;
pub mod handshake;
mod utf8;

pub use conn::{Connection, Event, Limits, Role};
pub use utf8::{InvalidUtf8, Utf8};

/// Why the connection fails; [`Error::close_code`] is the code to close it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The peer broke the protocol (1002), as the text says.
    Protocol(&'static str),
    /// A text message or close reason that is not UTF-8 (1007).
    InvalidUtf8,
    /// A frame or message over the limits (1009).
    TooBig,
    /// The server has no room for the message now (1013, try again later): the memory its
    /// messages still being assembled may hold is in use.
    Busy,
    /// This end already sent its close: nothing more can be sent.
    Closed,
}

impl Error {
    /// The close code this error calls for.
    pub fn close_code(&self) -> u16 {
        match self {
            Error::Protocol(_) => close::PROTOCOL_ERROR,
            Error::InvalidUtf8 => close::INVALID_PAYLOAD,
            Error::TooBig => close::TOO_BIG,
            Error::Busy => close::TRY_AGAIN_LATER,
            Error::Closed => close::NORMAL,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Protocol(what) => write!(f, "protocol error: {what}"),
            Error::InvalidUtf8 => f.write_str("text is not UTF-8"),
            Error::TooBig => f.write_str("frame or message over the limit"),
            Error::Busy => f.write_str("no memory for more messages being assembled now"),
            Error::Closed => f.write_str("the close was sent already"),
        }
    }
}

impl std::error::Error for Error {}
