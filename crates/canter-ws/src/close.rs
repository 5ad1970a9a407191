//! Close codes (RFC 6455, Section 7.4) and the close frame's payload.

use crate::Error;

/// Normal closure.
pub const NORMAL: u16 = 1000;
/// The endpoint is going away (a server shutting down, a page left).
pub const GOING_AWAY: u16 = 1001;
/// A protocol error.
pub const PROTOCOL_ERROR: u16 = 1002;
/// A data type the endpoint cannot accept.
pub const UNSUPPORTED: u16 = 1003;
/// A text message that is not UTF-8.
pub const INVALID_PAYLOAD: u16 = 1007;
/// A message that violates the endpoint's policy.
pub const POLICY: u16 = 1008;
/// A message too big to process.
pub const TOO_BIG: u16 = 1009;
/// The client expected an extension the server did not agree.
pub const MANDATORY_EXTENSION: u16 = 1010;
/// The server met an unexpected condition.
pub const INTERNAL_ERROR: u16 = 1011;
/// The server is overloaded: try again later.
pub const TRY_AGAIN_LATER: u16 = 1013;

/// Whether `code` may travel in a close frame: the codes RFC 6455 and its registry define for
/// the wire (1000–1003, 1007–1014), and those left to libraries and applications (3000–4999).
/// 1004, 1005, 1006 and 1015 are reserved for reporting and never sent.
pub fn valid_on_wire(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// A close frame's payload: empty, or a code and a UTF-8 reason.
pub fn parse(payload: &[u8]) -> Result<Option<(u16, String)>, Error> {
    match payload {
        [] => Ok(None),
        [_] => Err(Error::Protocol("close frame with a one-byte payload")),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !valid_on_wire(code) {
                return Err(Error::Protocol("close code not allowed on the wire"));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| Error::InvalidUtf8)?;
            Ok(Some((code, reason.to_owned())))
        }
    }
}

/// Appends a close frame's payload: `code` and as much of `reason` as fits the 125 bytes of
/// a control frame, cut at a character boundary.
pub fn put(out: &mut Vec<u8>, code: u16, reason: &str) {
    out.extend_from_slice(&code.to_be_bytes());
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&reason.as_bytes()[..end]);
}
