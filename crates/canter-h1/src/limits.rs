//! Configurable limits and timeouts of the protocol engine.

use std::time::Duration;

/// Size limits applied while parsing requests. Exceeding one yields the matching [`crate::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum size of the request line plus header section, in bytes (431 beyond it). At most
    /// [`Limits::HEAD_CAP`].
    pub max_head: usize,
    /// Maximum number of header fields (431 beyond it). At most [`Limits::HEADER_COUNT_CAP`].
    pub max_headers: usize,
    /// Maximum length of the request target, in bytes (414 beyond it).
    pub max_target: usize,
    /// Maximum request body size, in bytes (413 beyond it; checked before reading when the
    /// length is declared).
    pub max_body: u64,
    /// Maximum length of one chunk's extensions, in bytes (400 beyond it).
    pub max_chunk_ext: usize,
    /// Maximum size of the trailer section of a chunked body, in bytes (431 beyond it).
    pub max_trailers: usize,
}

impl Limits {
    /// Hard upper bound on [`Limits::max_head`] (64 KiB − 1): offsets into a head are 16-bit.
    pub const HEAD_CAP: usize = u16::MAX as usize;

    /// Hard upper bound on [`Limits::max_headers`]: the parser's scratch space is fixed.
    pub const HEADER_COUNT_CAP: usize = 256;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 16 * 1024,
            max_headers: 100,
            max_target: 8 * 1024,
            max_body: 16 * 1024 * 1024,
            max_chunk_ext: 1024,
            max_trailers: 8 * 1024,
        }
    }
}

/// Timeouts enforced by the connection. The engine never reads a clock: the driver passes the
/// current time in and asks [`crate::Conn::deadline`] when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a keep-alive connection may sit between requests.
    pub idle: Duration,
    /// How long a client may take to send a complete request head, from its first byte.
    pub head: Duration,
    /// How long a request body may go without progress.
    pub body: Duration,
    /// How long a response may wait for the peer to accept more bytes.
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            idle: Duration::from_secs(60),
            head: Duration::from_secs(10),
            body: Duration::from_secs(30),
            write: Duration::from_secs(30),
        }
    }
}
