//! Protocol errors. Every error caused by the peer carries the status to answer with.

use std::fmt;

/// Why a request could not be accepted.
///
/// All variants are the peer's fault (the request violates RFC 9112/9110 or a configured limit);
/// [`Error::status`] gives the HTTP status code to answer with. After any of them the connection
/// can no longer be trusted to stay in sync and is closed once the error response is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The request head is malformed (bad token, bad line ending, bad header syntax).
    Malformed(&'static str),
    /// The header section exceeds the size or count limit (431).
    HeadersTooLarge,
    /// The request target exceeds its length limit (414).
    UriTooLong,
    /// The declared or received body exceeds the body limit (413).
    BodyTooLarge,
    /// The HTTP version is well-formed but not 1.0 or 1.1 (505).
    VersionNotSupported,
    /// A transfer coding other than `chunked` was requested (501).
    UnsupportedTransferCoding,
    /// An `Expect` value other than `100-continue` (417).
    ExpectationFailed,
    /// Framing of the body is invalid (bad chunk size, bad CRLF, bad trailer).
    BadBody(&'static str),
}

impl Error {
    /// The HTTP status code to answer with.
    pub fn status(&self) -> u16 {
        match self {
            Error::Malformed(_) | Error::BadBody(_) => 400,
            Error::HeadersTooLarge => 431,
            Error::UriTooLong => 414,
            Error::BodyTooLarge => 413,
            Error::VersionNotSupported => 505,
            Error::UnsupportedTransferCoding => 501,
            Error::ExpectationFailed => 417,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed(why) => write!(f, "malformed request: {why}"),
            Error::HeadersTooLarge => f.write_str("request header section too large"),
            Error::UriTooLong => f.write_str("request target too long"),
            Error::BodyTooLarge => f.write_str("request body too large"),
            Error::VersionNotSupported => f.write_str("HTTP version not supported"),
            Error::UnsupportedTransferCoding => f.write_str("unsupported transfer coding"),
            Error::ExpectationFailed => f.write_str("unsupported expectation"),
            Error::BadBody(why) => write!(f, "malformed request body: {why}"),
        }
    }
}

impl std::error::Error for Error {}
