//! The request head every protocol hands the application: method, target, version, fields
//! and how the body is delimited. The HTTP/1.1 engine parses it from the bytes of the request
//! line and header section ([`RequestHead::from_parts`]); HTTP/2's driver builds it from a
//! HEADERS frame's decoded fields ([`RequestHead::from_fields`]).

use std::fmt;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use crate::Limits;

/// RFC 9110 token characters (`tchar`), as a byte-class table.
pub static TCHAR: [bool; 256] = alnum_and(b"!#$%&'*+-.^_`|~");

/// A byte-class table: ASCII letters and digits plus the bytes of `extra`.
pub const fn alnum_and(extra: &[u8]) -> [bool; 256] {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = (i as u8).is_ascii_alphanumeric();
        i += 1;
    }
    let mut j = 0;
    while j < extra.len() {
        table[extra[j] as usize] = true;
        j += 1;
    }
    table
}

/// HTTP request method. Common methods are variants; any other valid token is [`Method::Other`]
/// (its text is available through [`RequestHead::method_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `PATCH`
    Patch,
    /// `OPTIONS`
    Options,
    /// `CONNECT`
    Connect,
    /// `TRACE`
    Trace,
    /// Any other method token.
    Other,
}

impl Method {
    /// The method a token names ([`Method::Other`] for an extension method).
    pub fn from_token(token: &str) -> Method {
        // Byte patterns rather than string literals: compared inline, without a call to bcmp.
        match token.as_bytes() {
            [b'G', b'E', b'T'] => Method::Get,
            [b'H', b'E', b'A', b'D'] => Method::Head,
            [b'P', b'O', b'S', b'T'] => Method::Post,
            [b'P', b'U', b'T'] => Method::Put,
            [b'D', b'E', b'L', b'E', b'T', b'E'] => Method::Delete,
            [b'P', b'A', b'T', b'C', b'H'] => Method::Patch,
            [b'O', b'P', b'T', b'I', b'O', b'N', b'S'] => Method::Options,
            [b'C', b'O', b'N', b'N', b'E', b'C', b'T'] => Method::Connect,
            [b'T', b'R', b'A', b'C', b'E'] => Method::Trace,
            _ => Method::Other,
        }
    }
}

/// HTTP version of a request. 1.0 and 1.1 are accepted, a higher 1.x is served as 1.1 (RFC 9110
/// §2.5), and others are answered with 505.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// HTTP/1.0: close after each exchange unless the client asks for keep-alive.
    Http10,
    /// HTTP/1.1: keep-alive unless either side says `Connection: close`.
    Http11,
    /// HTTP/2: the head was decoded from a HEADERS frame (see [`RequestHead::from_fields`]).
    Http2,
    /// HTTP/3: the head was decoded from an HTTP/3 HEADERS frame (QPACK), built like HTTP/2's
    /// and marked with [`RequestHead::with_version`].
    Http3,
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Exactly this many bytes follow the head (0 when neither header is present).
    Length(u64),
    /// A chunked body follows.
    Chunked,
}

/// A range of a head's bytes, as the engines record where its parts are: 16-bit offsets, since
/// a head is at most [`Limits::HEAD_CAP`](crate::Limits::HEAD_CAP) bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// Where it starts.
    pub start: u16,
    /// How many bytes.
    pub len: u16,
}

impl Span {
    /// The span `start..end` of a head (shorter than [`Limits::HEAD_CAP`](crate::Limits::HEAD_CAP)).
    #[inline]
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: start as u16,
            len: (end - start) as u16,
        }
    }

    /// Where `part`, a slice of `base`, lies in it.
    #[inline]
    pub fn of(base: &[u8], part: &[u8]) -> Span {
        // Both slices come from the same buffer: the offset is the difference of the addresses.
        let start = part.as_ptr() as usize - base.as_ptr() as usize;
        Span {
            start: start as u16,
            len: part.len() as u16,
        }
    }

    /// The offset just past the span.
    #[inline]
    pub fn end(&self) -> usize {
        self.start as usize + self.len as usize
    }

    /// The span's bytes in `buf` (none if it lies outside).
    #[inline]
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        buf.get(start..start + self.len as usize)
            .unwrap_or_default()
    }
}

/// Where the path-and-query of the target is.
#[derive(Debug, Clone)]
pub enum PathAndQuery {
    /// A slice of the head (origin-form, `*`, authority-form, or absolute-form with a path).
    Span(Span),
    /// Absolute-form with an empty path (`http://h` or `http://h?q`): "/" plus the query, which
    /// is not a slice of the head.
    Owned(Box<str>),
}

/// A parsed request head. It owns the bytes it was parsed from (a zero-copy slice of the read
/// buffer) and answers every question about them without further allocation.
#[derive(Debug, Clone)]
pub struct RequestHead {
    buf: Bytes,
    method: Method,
    method_span: Span,
    target: Span,
    path: PathAndQuery,
    /// Length of the path within `path`: where its query starts (or its whole length).
    path_len: u16,
    version: Version,
    /// Inline for the usual handful of fields: parsing a typical request allocates nothing.
    headers: SmallVec<[(Span, Span); 12]>,
    body: BodyKind,
    keep_alive: bool,
    /// `EXPECT_CONTINUE` and `H2C_UPGRADE`: one byte, so that the head keeps the size it is
    /// moved at (a larger head was moved by `memcpy` calls: +58 instructions per request).
    flags: u8,
}

const EXPECT_CONTINUE: u8 = 1;
const H2C_UPGRADE: u8 = 2;

impl RequestHead {
    /// The request method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The method as an `http::Method`, the type handlers and the HTTP/2 side share.
    #[inline(always)]
    pub fn http_method(&self) -> http::Method {
        match self.method {
            Method::Get => http::Method::GET,
            Method::Head => http::Method::HEAD,
            Method::Post => http::Method::POST,
            Method::Put => http::Method::PUT,
            Method::Delete => http::Method::DELETE,
            Method::Patch => http::Method::PATCH,
            Method::Options => http::Method::OPTIONS,
            Method::Connect => http::Method::CONNECT,
            Method::Trace => http::Method::TRACE,
            Method::Other => self.other_method(),
        }
    }

    /// An extension method: the parser validated the token, which `http` accepts as it is.
    #[cold]
    #[inline(never)]
    fn other_method(&self) -> http::Method {
        http::Method::from_bytes(self.method_str().as_bytes()).unwrap_or(http::Method::GET)
    }

    /// The request method as sent (a validated token).
    pub fn method_str(&self) -> &str {
        ascii(self.method_span.get(&self.buf))
    }

    /// The request target exactly as sent (origin-form, absolute-form, authority-form or `*`).
    pub fn target(&self) -> &str {
        ascii(self.target.get(&self.buf))
    }

    /// The path and query of the target; for absolute-form targets the scheme and authority are
    /// stripped (`http://h/a?b` gives `/a?b`).
    pub fn path_and_query(&self) -> &str {
        match &self.path {
            PathAndQuery::Span(span) => ascii(span.get(&self.buf)),
            PathAndQuery::Owned(pq) => pq,
        }
    }

    /// The path without the query (still percent-encoded).
    pub fn path(&self) -> &str {
        let pq = self.path_and_query();
        pq.get(..self.path_len as usize).unwrap_or(pq)
    }

    /// The query string without the `?`, if any.
    pub fn query(&self) -> Option<&str> {
        self.path_and_query().get(self.path_len as usize + 1..)
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// How the body is delimited.
    pub fn body_kind(&self) -> BodyKind {
        self.body
    }

    /// Whether the connection may carry another request after this one.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Whether the client sent `Expect: 100-continue`.
    pub fn expect_continue(&self) -> bool {
        self.flags & EXPECT_CONTINUE != 0
    }

    /// Whether the request asks to upgrade to HTTP/2 over cleartext (RFC 7540, Section 3.2):
    /// HTTP/1.1 with `Upgrade: h2c`, `Connection: Upgrade` and an `HTTP2-Settings` field.
    pub fn h2c_upgrade(&self) -> bool {
        self.flags & H2C_UPGRADE != 0
    }

    /// The first value of the header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// All header fields in order, names as sent.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.headers
            .iter()
            .map(|(n, v)| (ascii(n.get(&self.buf)), v.get(&self.buf)))
    }

    /// The raw bytes of the head, request line to the final empty line (including any empty
    /// lines before the request line, which RFC 9112 §2.2 says to ignore).
    pub fn raw(&self) -> &Bytes {
        &self.buf
    }

    /// The same head carried by another protocol version: a head built with
    /// [`RequestHead::from_fields`] for HTTP/3, whose header section has HTTP/2's rules.
    pub fn with_version(mut self, version: Version) -> RequestHead {
        self.version = version;
        self
    }
}

/// Text of a span the parser validated as ASCII: the method and field names are tokens and the
/// target was checked byte by byte (`origin_part`).
impl RequestHead {
    /// A head built from a request whose protocol sends its parts apart, as HTTP/2 does: `:method`, `:path` and `:authority` (given
    /// as a `host` field, first), then the regular fields (lowercase names, checked by the
    /// HTTP/2 layer). Several `cookie` fields are joined with `"; "` (RFC 9113, Section 8.2.3).
    /// `content_length` is the declared length, `end_stream` whether the request has no body.
    ///
    /// Fails on a method that is not a token, a path that is not visible ASCII starting with
    /// `/` (or `*`), a field with a name that is not a token or a value with control bytes,
    /// or more than 64 KiB in all ([`FieldsError`] says which).
    pub fn from_fields<'a>(
        method: &[u8],
        path: &[u8],
        authority: Option<&[u8]>,
        fields: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
        content_length: Option<u64>,
        end_stream: bool,
    ) -> Result<RequestHead, FieldsError> {
        if method.is_empty() || !method.iter().all(|&b| TCHAR[b as usize]) {
            return Err(FieldsError::Method);
        }
        if !(path.first() == Some(&b'/') || path == b"*")
            || !path.iter().all(|&b| (0x21..0x7f).contains(&b) && b != b'#')
        {
            return Err(FieldsError::Target);
        }
        let mut buf = BytesMut::with_capacity(
            method.len()
                + path.len()
                + authority.map_or(0, <[u8]>::len)
                + fields
                    .clone()
                    .map(|(n, v)| n.len() + v.len() + 2)
                    .sum::<usize>(),
        );
        let method_span = Span::new(0, method.len());
        buf.extend_from_slice(method);
        let target = Span::new(buf.len(), buf.len() + path.len());
        buf.extend_from_slice(path);
        let mut headers: SmallVec<[(Span, Span); 12]> = SmallVec::new();
        let mut push = |buf: &mut BytesMut, n: &[u8], v: &[u8]| -> Result<(), FieldsError> {
            if n.is_empty() || !n.iter().all(|&b| TCHAR[b as usize]) {
                return Err(FieldsError::HeaderName);
            }
            if v.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(FieldsError::HeaderValue);
            }
            let ns = Span::new(buf.len(), buf.len() + n.len());
            buf.extend_from_slice(n);
            let vs = Span::new(buf.len(), buf.len() + v.len());
            buf.extend_from_slice(v);
            if buf.len() > Limits::HEAD_CAP {
                return Err(FieldsError::TooLarge);
            }
            headers.push((ns, vs));
            Ok(())
        };
        if let Some(host) = authority {
            push(&mut buf, b"host", host)?;
        }
        let mut cookies = 0;
        for (n, v) in fields.clone() {
            if n == b"cookie" {
                cookies += 1;
                continue;
            }
            if n == b"host" && authority.is_some() {
                continue;
            }
            push(&mut buf, n, v)?;
        }
        if cookies > 0 {
            let mut joined = Vec::new();
            for (_, v) in fields.filter(|(n, _)| *n == b"cookie") {
                if !joined.is_empty() {
                    joined.extend_from_slice(b"; ");
                }
                joined.extend_from_slice(v);
            }
            push(&mut buf, b"cookie", &joined)?;
        }
        let path_len = path.iter().position(|&b| b == b'?').unwrap_or(path.len()) as u16;
        let body = match (end_stream, content_length) {
            (true, _) => BodyKind::Length(0),
            (false, Some(n)) => BodyKind::Length(n),
            (false, None) => BodyKind::Chunked,
        };
        Ok(RequestHead {
            buf: buf.freeze(),
            method: Method::from_token(ascii_checked(method)),
            method_span,
            target,
            path: PathAndQuery::Span(target),
            path_len,
            version: Version::Http2,
            headers,
            body,
            keep_alive: true,
            flags: 0,
        })
    }
}

/// `bytes` as text; only called on bytes already checked to be ASCII tokens.
fn ascii_checked(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("")
}

fn ascii(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: every span passed here covers bytes validated as ASCII before the head was made
    // (`from_fields` checks them; `from_parts`'s caller promises it), and ASCII is valid UTF-8.
    // The head's bytes are immutable (`Bytes`) once it is made.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// What an engine found in a request head, to make a [`RequestHead`] of with
/// [`RequestHead::from_parts`].
#[derive(Debug)]
pub struct HeadParts {
    /// The head's bytes, request line to the final empty line.
    pub buf: Bytes,
    /// The method.
    pub method: Method,
    /// Where the method's token is.
    pub method_span: Span,
    /// Where the request target is.
    pub target: Span,
    /// Where the path-and-query of the target is.
    pub path: PathAndQuery,
    /// Length of the path within `path`: where its query starts (or its whole length).
    pub path_len: u16,
    /// The version.
    pub version: Version,
    /// Each field's name and value.
    pub headers: SmallVec<[(Span, Span); 12]>,
    /// How the body is delimited.
    pub body: BodyKind,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    /// The request asks to upgrade to HTTP/2 over cleartext.
    pub h2c_upgrade: bool,
}

impl RequestHead {
    /// The head an engine parsed.
    ///
    /// # Safety
    ///
    /// Every span lies within `parts.buf`, and the bytes under the method span, the target, a
    /// `PathAndQuery::Span` and every field name are ASCII: the accessors return them as `&str`
    /// without looking again (the HTTP/1.1 engine validated each byte as it scanned it).
    #[inline]
    pub unsafe fn from_parts(parts: HeadParts) -> RequestHead {
        RequestHead {
            buf: parts.buf,
            method: parts.method,
            method_span: parts.method_span,
            target: parts.target,
            path: parts.path,
            path_len: parts.path_len,
            version: parts.version,
            headers: parts.headers,
            body: parts.body,
            keep_alive: parts.keep_alive,
            flags: (if parts.expect_continue {
                EXPECT_CONTINUE
            } else {
                0
            }) | (if parts.h2c_upgrade { H2C_UPGRADE } else { 0 }),
        }
    }
}

/// Why [`RequestHead::from_fields`] refused a request: each is answered with [`FieldsError::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldsError {
    /// The method is not a token.
    Method,
    /// The path is not visible ASCII starting with `/` (or `*`).
    Target,
    /// A field name is not a token.
    HeaderName,
    /// A field value holds control bytes.
    HeaderValue,
    /// The fields come to more than 64 KiB.
    TooLarge,
}

impl FieldsError {
    /// The status to answer with: 431 for [`FieldsError::TooLarge`], 400 otherwise.
    pub fn status(&self) -> u16 {
        match self {
            FieldsError::TooLarge => 431,
            _ => 400,
        }
    }
}

impl fmt::Display for FieldsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldsError::Method => "method is not a token",
            FieldsError::Target => "path is not an origin-form target",
            FieldsError::HeaderName => "header name is not a token",
            FieldsError::HeaderValue => "header value holds a control byte",
            FieldsError::TooLarge => "header fields too large",
        })
    }
}

impl std::error::Error for FieldsError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(
        list: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone {
        list.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()))
    }

    #[test]
    fn a_head_from_fields_reads_as_a_parsed_one() {
        let list = [
            ("cookie", "a=1"),
            ("accept", "*/*"),
            ("cookie", "b=2"),
            ("host", "x"),
        ];
        let head = RequestHead::from_fields(
            b"GET",
            b"/p/q?x=1",
            Some(b"example.com"),
            fields(&list),
            None,
            true,
        )
        .expect("valid");
        assert_eq!(head.method(), Method::Get);
        assert_eq!(head.version(), Version::Http2);
        assert_eq!((head.path(), head.query()), ("/p/q", Some("x=1")));
        // :authority is the host (first), a host field beside it is dropped, cookies are joined.
        let got: Vec<_> = head
            .headers()
            .map(|(n, v)| (n, String::from_utf8_lossy(v).into_owned()))
            .collect();
        assert_eq!(
            got,
            [
                ("host", "example.com".into()),
                ("accept", "*/*".into()),
                ("cookie", "a=1; b=2".into())
            ]
        );
        assert_eq!(head.body_kind(), BodyKind::Length(0));
        let streaming =
            RequestHead::from_fields(b"POST", b"/", None, fields(&[]), None, false).expect("valid");
        assert_eq!(streaming.body_kind(), BodyKind::Chunked);
        let sized = RequestHead::from_fields(b"POST", b"/", None, fields(&[]), Some(5), false)
            .expect("valid");
        assert_eq!(sized.body_kind(), BodyKind::Length(5));
        let other = RequestHead::from_fields(b"PROPFIND", b"*", None, fields(&[]), None, true)
            .expect("valid");
        assert_eq!(
            (other.method(), other.method_str()),
            (Method::Other, "PROPFIND")
        );
    }

    #[test]
    fn what_no_parser_would_accept_is_refused_with_its_status() {
        let none = fields(&[]);
        let cases = [
            (
                RequestHead::from_fields(b"G ET", b"/", None, none.clone(), None, true),
                FieldsError::Method,
            ),
            (
                RequestHead::from_fields(b"", b"/", None, none.clone(), None, true),
                FieldsError::Method,
            ),
            (
                RequestHead::from_fields(b"GET", b"p", None, none.clone(), None, true),
                FieldsError::Target,
            ),
            (
                RequestHead::from_fields(b"GET", b"/a b", None, none.clone(), None, true),
                FieldsError::Target,
            ),
            (
                RequestHead::from_fields(b"GET", b"/#f", None, none.clone(), None, true),
                FieldsError::Target,
            ),
            (
                RequestHead::from_fields(b"GET", b"/", None, fields(&[("a b", "1")]), None, true),
                FieldsError::HeaderName,
            ),
            (
                RequestHead::from_fields(
                    b"GET",
                    b"/",
                    None,
                    fields(&[("a", "1\r\n2")]),
                    None,
                    true,
                ),
                FieldsError::HeaderValue,
            ),
        ];
        for (built, want) in cases {
            assert_eq!(built.expect_err("refused"), want);
            assert_eq!(want.status(), 400);
        }
        let big = "v".repeat(40_000);
        let list = [("a", big.as_str()), ("b", big.as_str())];
        let e = RequestHead::from_fields(b"GET", b"/", None, fields(&list), None, true)
            .expect_err("too large");
        assert_eq!((e, e.status()), (FieldsError::TooLarge, 431));
        assert_eq!(e.to_string(), "header fields too large");
    }
}
