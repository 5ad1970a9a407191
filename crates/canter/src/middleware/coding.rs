//! The content codings canter speaks (`Content-Encoding`, `Accept-Encoding`): negotiated for
//! precompressed static files with or without the `compression` feature, produced by the
//! [`Compression`](super::Compression) layer with it.

use canter_rt::http::HeaderValue;

/// A content coding (`Content-Encoding`) canter can negotiate and apply.
///
/// ```
/// use canter::middleware::Coding;
///
/// assert_eq!(Coding::Brotli.as_str(), "br");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Coding {
    /// `gzip` (RFC 1952): understood by every client.
    Gzip,
    /// `br` (RFC 7932): understood by browsers since about 2017; as small as zstd, but slower
    /// to produce.
    Brotli,
    /// `zstd` (RFC 8878): the fastest for a given size; browsers since 2024.
    Zstd,
}

impl Coding {
    /// The coding's name in `Content-Encoding` and `Accept-Encoding`.
    ///
    /// ```
    /// use canter::middleware::Coding;
    ///
    /// assert_eq!(Coding::Gzip.as_str(), "gzip");
    /// assert_eq!(Coding::Zstd.as_str(), "zstd");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }

    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    pub(crate) const fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }
}
