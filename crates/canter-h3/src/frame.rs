//! HTTP/3's frame and stream types, settings identifiers and error codes (RFC 9114 Sections
//! 6.2, 7.2, 8.1 and 11.2; RFC 9204 Section 6).

use crate::varint;

/// DATA (RFC 9114, Section 7.2.1).
pub(crate) const DATA: u64 = 0x0;
/// HEADERS.
pub(crate) const HEADERS: u64 = 0x1;
/// CANCEL_PUSH.
pub(crate) const CANCEL_PUSH: u64 = 0x3;
/// SETTINGS.
pub(crate) const SETTINGS: u64 = 0x4;
/// PUSH_PROMISE.
pub(crate) const PUSH_PROMISE: u64 = 0x5;
/// GOAWAY.
pub(crate) const GOAWAY: u64 = 0x7;
/// MAX_PUSH_ID.
pub(crate) const MAX_PUSH_ID: u64 = 0xd;

/// Frame types HTTP/2 had and HTTP/3 reserves: receiving one is `H3_FRAME_UNEXPECTED`
/// (RFC 9114, Section 7.2.8).
pub(crate) fn is_http2_only(ty: u64) -> bool {
    matches!(ty, 0x2 | 0x6 | 0x8 | 0x9)
}

/// Unidirectional stream types (RFC 9114, Section 6.2; RFC 9204, Section 4.2).
pub(crate) const STREAM_CONTROL: u64 = 0x00;
pub(crate) const STREAM_PUSH: u64 = 0x01;
pub(crate) const STREAM_QPACK_ENCODER: u64 = 0x02;
pub(crate) const STREAM_QPACK_DECODER: u64 = 0x03;

/// Settings identifiers.
pub(crate) const SETTINGS_QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
pub(crate) const SETTINGS_MAX_FIELD_SECTION_SIZE: u64 = 0x06;
pub(crate) const SETTINGS_QPACK_BLOCKED_STREAMS: u64 = 0x07;
/// RFC 9220: extended CONNECT over HTTP/3.
pub(crate) const SETTINGS_ENABLE_CONNECT_PROTOCOL: u64 = 0x08;

/// Identifiers HTTP/2 had: receiving one is `H3_SETTINGS_ERROR` (RFC 9114, Section 7.2.4.1).
pub(crate) fn is_http2_setting(id: u64) -> bool {
    matches!(id, 0x00 | 0x02 | 0x03 | 0x04 | 0x05)
}

/// An HTTP/3 or QPACK error code, as carried by CONNECTION_CLOSE, RESET_STREAM and
/// STOP_SENDING.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u64);

macro_rules! codes {
    ($($(#[$doc:meta])* $name:ident = $v:expr,)*) => {
        impl ErrorCode {
            $($(#[$doc])* pub const $name: ErrorCode = ErrorCode($v);)*
        }
        impl std::fmt::Display for ErrorCode {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.0 {
                    $($v => f.write_str(stringify!($name)),)*
                    other => write!(f, "0x{other:x}"),
                }
            }
        }
    };
}

codes! {
    /// No error: a graceful close.
    H3_NO_ERROR = 0x100,
    /// A protocol error with no more specific code.
    H3_GENERAL_PROTOCOL_ERROR = 0x101,
    /// An internal error.
    H3_INTERNAL_ERROR = 0x102,
    /// A stream the peer may not open, or a second critical stream of one type.
    H3_STREAM_CREATION_ERROR = 0x103,
    /// A control or QPACK stream closed.
    H3_CLOSED_CRITICAL_STREAM = 0x104,
    /// A frame not allowed on its stream or in its place.
    H3_FRAME_UNEXPECTED = 0x105,
    /// A frame whose layout or size is wrong.
    H3_FRAME_ERROR = 0x106,
    /// The peer generates excessive load.
    H3_EXCESSIVE_LOAD = 0x107,
    /// A stream or push ID used wrongly.
    H3_ID_ERROR = 0x108,
    /// A SETTINGS frame with a bad value or a repeated identifier.
    H3_SETTINGS_ERROR = 0x109,
    /// The control stream did not start with SETTINGS.
    H3_MISSING_SETTINGS = 0x10a,
    /// The request was not processed (after GOAWAY).
    H3_REQUEST_REJECTED = 0x10b,
    /// The request or its response is cancelled.
    H3_REQUEST_CANCELLED = 0x10c,
    /// The request stream ended before the request did.
    H3_REQUEST_INCOMPLETE = 0x10d,
    /// A malformed request.
    H3_MESSAGE_ERROR = 0x10e,
    /// A CONNECT tunnel failed.
    H3_CONNECT_ERROR = 0x10f,
    /// Retry over HTTP/1.1.
    H3_VERSION_FALLBACK = 0x110,
    /// A field section could not be decoded.
    QPACK_DECOMPRESSION_FAILED = 0x200,
    /// A bad instruction on the encoder stream.
    QPACK_ENCODER_STREAM_ERROR = 0x201,
    /// A bad instruction on the decoder stream.
    QPACK_DECODER_STREAM_ERROR = 0x202,
}

/// Reads a frame header (type, length) from the front of `buf`: `(type, length, bytes used)`.
#[inline]
pub(crate) fn header(buf: &[u8]) -> Option<(u64, u64, usize)> {
    let (ty, a) = varint::decode(buf)?;
    let (len, b) = varint::decode(&buf[a..])?;
    Some((ty, len, a + b))
}

/// Appends a frame header.
#[inline]
pub(crate) fn put_header(ty: u64, len: u64, dst: &mut Vec<u8>) {
    varint::encode(ty, dst);
    varint::encode(len, dst);
}
