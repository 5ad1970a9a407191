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
    Malformed(Malformed),
    /// The header section exceeds the size or count limit (431).
    HeadersTooLarge,
    /// The request target exceeds its length limit (414).
    UriTooLong,
    /// The declared or received body exceeds the body limit (413).
    BodyTooLarge,
    /// The HTTP version is well-formed but not 1.x (505; 1.2 and up are served as 1.1).
    VersionNotSupported,
    /// A transfer coding other than `chunked` was requested (501).
    UnsupportedTransferCoding,
    /// An `Expect` value other than `100-continue` (417).
    ExpectationFailed,
    /// Framing of the body is invalid (bad chunk size, bad CRLF, bad trailer).
    BadBody(BadBody),
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

/// An enum of reasons, each variant documented by (and displayed as) its message.
macro_rules! reasons {
    ($(#[$m:meta])* $name:ident { $($v:ident => $msg:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum $name {
            $(#[doc = $msg] $v,)*
        }

        impl $name {
            /// What is wrong, in words (for logs).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $msg,)*
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reasons! {
    /// What is wrong with a malformed request head ([`Error::Malformed`]).
    Malformed {
        BareLf => "bare LF line ending",
        LineEnding => "invalid line ending",
        TargetByte => "invalid byte in request target",
        Version => "invalid HTTP version",
        HeaderValue => "invalid header value",
        Method => "invalid method",
        HeaderName => "invalid header name",
        RequestLine => "invalid request line",
        ConnectTarget => "CONNECT target is not host:port",
        Target => "invalid request target",
        AbsoluteAuthority => "invalid authority in absolute-form target",
        ConflictingContentLength => "more than one Content-Length field",
        ChunkedTwice => "chunked applied more than once",
        Host => "invalid Host",
        HostMissing => "HTTP/1.1 request needs exactly one Host",
        HostRepeated => "more than one Host",
        LengthAndChunked => "both Transfer-Encoding and Content-Length",
        TransferEncodingInHttp10 => "Transfer-Encoding in an HTTP/1.0 request",
        FinalCodingNotChunked => "final transfer coding is not chunked",
        ContentLength => "invalid Content-Length",
    }
}

reasons! {
    /// What is wrong with the framing of a request body ([`Error::BadBody`]).
    BadBody {
        ChunkSizeTooLong => "chunk size too long",
        ChunkSizeNotHex => "chunk size is not hex",
        AfterChunkSize => "invalid byte after chunk size",
        BareLfInChunkLine => "bare LF in chunk line",
        ChunkExtensionTooLong => "chunk extension too long",
        ChunkExtensionByte => "invalid byte in chunk extension",
        LfAfterChunkSize => "expected LF after chunk size",
        ChunkDataTooLong => "chunk data longer than its size",
        LfAfterChunkData => "expected LF after chunk data",
        TrailerWithoutColon => "trailer field without a colon",
        BareLfInTrailer => "bare LF in trailer section",
        EmptyTrailerName => "empty trailer field name",
        TrailerByte => "invalid byte in trailer",
        LfInTrailer => "expected LF in trailer section",
    }
}
