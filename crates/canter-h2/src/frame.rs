//! Frame layout (RFC 9113, Section 4 and 6): the 9-byte header, frame types, flags, error codes
//! and the writers of the frames the server sends.

use bytes::{BufMut, BytesMut};

/// The client connection preface (RFC 9113, Section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Size of a frame header.
pub const HEADER_LEN: usize = 9;

/// The largest stream identifier (31 bits).
pub const MAX_STREAM_ID: u32 = (1 << 31) - 1;

/// The largest flow-control window (RFC 9113, Section 6.9.1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// The default and minimum SETTINGS_MAX_FRAME_SIZE.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;

/// The initial flow-control window of a connection and of every stream before SETTINGS.
pub const DEFAULT_WINDOW: u32 = 65_535;

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const PRIORITY: u8 = 0x2;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PUSH_PROMISE: u8 = 0x5;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY_FLAG: u8 = 0x20;

pub(crate) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(crate) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(crate) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(crate) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub(crate) const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
/// RFC 8441: the server accepts the extended CONNECT (`:protocol`).
pub(crate) const SETTINGS_ENABLE_CONNECT_PROTOCOL: u16 = 0x8;

/// An HTTP/2 error code (RFC 9113, Section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// Graceful shutdown, or a stream no longer needed.
    pub const NO_ERROR: ErrorCode = ErrorCode(0x0);
    /// A protocol violation without a more specific code.
    pub const PROTOCOL_ERROR: ErrorCode = ErrorCode(0x1);
    /// An unexpected internal error.
    pub const INTERNAL_ERROR: ErrorCode = ErrorCode(0x2);
    /// The peer broke flow control.
    pub const FLOW_CONTROL_ERROR: ErrorCode = ErrorCode(0x3);
    /// A SETTINGS frame was not acknowledged in time.
    pub const SETTINGS_TIMEOUT: ErrorCode = ErrorCode(0x4);
    /// A frame arrived on a half-closed or closed stream.
    pub const STREAM_CLOSED: ErrorCode = ErrorCode(0x5);
    /// A frame with an invalid size.
    pub const FRAME_SIZE_ERROR: ErrorCode = ErrorCode(0x6);
    /// The stream was refused before any processing: safe to retry.
    pub const REFUSED_STREAM: ErrorCode = ErrorCode(0x7);
    /// The stream is no longer needed.
    pub const CANCEL: ErrorCode = ErrorCode(0x8);
    /// The header compression context cannot be kept.
    pub const COMPRESSION_ERROR: ErrorCode = ErrorCode(0x9);
    /// A CONNECT tunnel failed.
    pub const CONNECT_ERROR: ErrorCode = ErrorCode(0xa);
    /// The peer is generating excessive load.
    pub const ENHANCE_YOUR_CALM: ErrorCode = ErrorCode(0xb);
    /// The transport does not meet security requirements.
    pub const INADEQUATE_SECURITY: ErrorCode = ErrorCode(0xc);
    /// Use HTTP/1.1 for this request.
    pub const HTTP_1_1_REQUIRED: ErrorCode = ErrorCode(0xd);

    /// The code's name, or "UNKNOWN".
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("UNKNOWN")
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) len: usize,
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
}

impl Head {
    #[inline]
    pub(crate) fn parse(b: &[u8; HEADER_LEN]) -> Head {
        Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_STREAM_ID,
        }
    }
}

/// Appends a frame header.
#[inline]
pub(crate) fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    out.put_slice(&[l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]);
}

pub(crate) fn put_settings(out: &mut BytesMut, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub(crate) fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment);
}

pub(crate) fn put_rst(out: &mut BytesMut, stream: u32, code: ErrorCode) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(code.0);
}

pub(crate) fn put_goaway(out: &mut BytesMut, last_stream: u32, code: ErrorCode, debug: &[u8]) {
    put_head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.put_u32(last_stream);
    out.put_u32(code.0);
    out.put_slice(debug);
}
