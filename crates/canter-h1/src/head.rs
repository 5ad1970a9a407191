//! The request head: parsing the request line and header section, and the framing rules of
//! RFC 9112 §6 that decide how the body is delimited.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};

use crate::{Error, Limits};

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
    fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            "CONNECT" => Method::Connect,
            "TRACE" => Method::Trace,
            _ => Method::Other,
        }
    }
}

/// HTTP version of a request. Only 1.0 and 1.1 are accepted; others are answered with 505.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// HTTP/1.0: close after each exchange unless the client asks for keep-alive.
    Http10,
    /// HTTP/1.1: keep-alive unless either side says `Connection: close`.
    Http11,
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Exactly this many bytes follow the head (0 when neither header is present).
    Length(u64),
    /// A chunked body follows.
    Chunked,
}

#[derive(Debug, Clone, Copy, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn of(base: &[u8], part: &[u8]) -> Span {
        // Both slices come from the same buffer: the offset is the difference of the addresses.
        let start = part.as_ptr() as usize - base.as_ptr() as usize;
        Span {
            start: start as u32,
            len: part.len() as u32,
        }
    }

    fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        buf.get(start..start + self.len as usize)
            .unwrap_or_default()
    }
}

/// A parsed request head. It owns the bytes it was parsed from (a zero-copy slice of the read
/// buffer) and answers every question about them without further allocation.
#[derive(Debug, Clone)]
pub struct RequestHead {
    buf: Bytes,
    method: Method,
    method_span: Span,
    target: Span,
    path: Span,
    version: Version,
    headers: Vec<(Span, Span)>,
    body: BodyKind,
    keep_alive: bool,
    expect_continue: bool,
}

impl RequestHead {
    /// The request method.
    pub fn method(&self) -> Method {
        self.method
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
        ascii(self.path.get(&self.buf))
    }

    /// The path without the query (still percent-encoded).
    pub fn path(&self) -> &str {
        let pq = self.path_and_query();
        match pq.find('?') {
            Some(i) => &pq[..i],
            None => pq,
        }
    }

    /// The query string without the `?`, if any.
    pub fn query(&self) -> Option<&str> {
        let pq = self.path_and_query();
        pq.find('?').map(|i| &pq[i + 1..])
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
        self.expect_continue
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

    /// The raw bytes of the head, request line to the final empty line.
    pub fn raw(&self) -> &Bytes {
        &self.buf
    }
}

/// Bytes validated as ASCII by the parser; an empty string if that invariant were ever broken.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Parses one request head from the front of `buf`. On success the head's bytes are split off
/// `buf` (zero-copy); `Ok(None)` means more bytes are needed.
pub(crate) fn parse(buf: &mut BytesMut, limits: &Limits) -> Result<Option<RequestHead>, Error> {
    let mut storage =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; Limits::HEADER_COUNT_CAP];
    let max_headers = limits.max_headers.min(Limits::HEADER_COUNT_CAP);
    let mut req = httparse::Request::new(&mut []);
    let status = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut storage[..max_headers],
    );
    let len = match status {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return partial(buf, limits),
        Err(e) => return Err(map_httparse(e, buf)),
    };
    if len > limits.max_head {
        return Err(Error::HeadersTooLarge);
    }
    let base: &[u8] = buf;
    check_line_endings(&base[..len])?;

    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(Error::Malformed("incomplete request line"));
    };
    if target.len() > limits.max_target {
        return Err(Error::UriTooLong);
    }
    let version = if minor == 1 {
        Version::Http11
    } else {
        Version::Http10
    };
    let path = origin_part(method, target)?;

    let mut framing = Framing::default();
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        framing.field(h.name, h.value)?;
        headers.push((Span::of(base, h.name.as_bytes()), Span::of(base, h.value)));
    }
    let (body, keep_alive) = framing.finish(version, limits)?;
    let head = RequestHead {
        method: Method::from_token(method),
        method_span: Span::of(base, method.as_bytes()),
        target: Span::of(base, target.as_bytes()),
        path: Span::of(base, path.as_bytes()),
        version,
        headers,
        body,
        keep_alive,
        expect_continue: framing.expect_continue && version == Version::Http11,
        buf: Bytes::new(),
    };
    Ok(Some(RequestHead {
        buf: buf.split_to(len).freeze(),
        ..head
    }))
}

/// An incomplete head: decide whether waiting for more bytes could ever succeed.
fn partial(buf: &[u8], limits: &Limits) -> Result<Option<RequestHead>, Error> {
    // Request line still open and already longer than any acceptable one: the target is too long.
    let line_max = limits.max_target + 64;
    if buf.len() > line_max && !buf[..line_max].contains(&b'\n') {
        return Err(Error::UriTooLong);
    }
    if buf.len() >= limits.max_head {
        return Err(Error::HeadersTooLarge);
    }
    Ok(None)
}

fn map_httparse(e: httparse::Error, buf: &[u8]) -> Error {
    match e {
        httparse::Error::HeaderName => Error::Malformed("invalid header name"),
        httparse::Error::HeaderValue => Error::Malformed("invalid header value"),
        httparse::Error::NewLine => Error::Malformed("invalid line ending"),
        httparse::Error::Token => Error::Malformed("invalid method or request target"),
        httparse::Error::TooManyHeaders => Error::HeadersTooLarge,
        httparse::Error::Version if is_other_version(buf) => Error::VersionNotSupported,
        _ => Error::Malformed("invalid request line"),
    }
}

/// Whether the request line ends in a well-formed `HTTP/d.d` (a version we do not speak, so 505
/// rather than 400).
fn is_other_version(buf: &[u8]) -> bool {
    let line_end = buf
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(buf.len());
    let line = &buf[..line_end];
    let version = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
    matches!(version, [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
        if major.is_ascii_digit() && minor.is_ascii_digit())
}

/// RFC 9112 §2.2 allows a recipient to accept a bare LF as a line terminator. We do not: a
/// lone LF is a classic request-smuggling lever between servers that disagree, so it is a 400.
fn check_line_endings(head: &[u8]) -> Result<(), Error> {
    let mut prev = 0u8;
    for &b in head {
        if b == b'\n' && prev != b'\r' {
            return Err(Error::Malformed("bare LF line ending"));
        }
        prev = b;
    }
    Ok(())
}

/// The origin-form part of a target: the target itself for origin-form, the path after the
/// authority for absolute-form, `*` or the authority for the special forms.
fn origin_part<'a>(method: &str, target: &'a str) -> Result<&'a str, Error> {
    if target.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err(Error::Malformed("invalid byte in request target"));
    }
    if target.starts_with('/') {
        return Ok(target);
    }
    if target == "*" && method == "OPTIONS" {
        return Ok(target);
    }
    if method == "CONNECT" {
        return Ok(target);
    }
    let lower_scheme = target.get(..8).map(|s| s.to_ascii_lowercase());
    let rest = match lower_scheme.as_deref() {
        Some(s) if s.starts_with("http://") => &target[7..],
        Some("https://") => &target[8..],
        _ => return Err(Error::Malformed("invalid request target")),
    };
    let path_start = rest.find(['/', '?']).unwrap_or(rest.len());
    if path_start == 0 {
        return Err(Error::Malformed("absolute-form target without authority"));
    }
    let path = &rest[path_start..];
    // An empty path in absolute-form means "/" (RFC 9112 §3.2.2); expose the literal "/" then.
    Ok(if path.is_empty() || path.starts_with('?') {
        "/"
    } else {
        path
    })
}

/// Accumulates the header fields that decide framing and connection management.
#[derive(Default)]
struct Framing {
    content_length: Option<u64>,
    transfer_encoding: bool,
    chunked_last: bool,
    chunked_seen: bool,
    other_coding: bool,
    hosts: u32,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
}

impl Framing {
    fn field(&mut self, name: &str, value: &[u8]) -> Result<(), Error> {
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_content_length(value)?;
            if self.content_length.is_some_and(|prev| prev != n) {
                return Err(Error::Malformed("conflicting Content-Length values"));
            }
            self.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            self.transfer_encoding = true;
            for coding in list(value) {
                let chunked = coding.eq_ignore_ascii_case(b"chunked");
                if chunked && self.chunked_seen {
                    return Err(Error::Malformed("chunked applied more than once"));
                }
                self.chunked_seen |= chunked;
                self.other_coding |= !chunked;
                self.chunked_last = chunked;
            }
        } else if name.eq_ignore_ascii_case("host") {
            self.hosts += 1;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in list(value) {
                self.close |= token.eq_ignore_ascii_case(b"close");
                self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("expect") {
            if !trim(value).eq_ignore_ascii_case(b"100-continue") {
                return Err(Error::ExpectationFailed);
            }
            self.expect_continue = true;
        }
        Ok(())
    }

    fn finish(&self, version: Version, limits: &Limits) -> Result<(BodyKind, bool), Error> {
        if version == Version::Http11 && self.hosts != 1 {
            return Err(Error::Malformed("HTTP/1.1 request needs exactly one Host"));
        }
        if self.hosts > 1 {
            return Err(Error::Malformed("more than one Host"));
        }
        let body = if self.transfer_encoding {
            if self.content_length.is_some() {
                return Err(Error::Malformed(
                    "both Transfer-Encoding and Content-Length",
                ));
            }
            if version == Version::Http10 {
                return Err(Error::Malformed("Transfer-Encoding in an HTTP/1.0 request"));
            }
            if !self.chunked_last {
                return Err(Error::Malformed("final transfer coding is not chunked"));
            }
            if self.other_coding {
                return Err(Error::UnsupportedTransferCoding);
            }
            BodyKind::Chunked
        } else {
            let n = self.content_length.unwrap_or(0);
            if n > limits.max_body {
                return Err(Error::BodyTooLarge);
            }
            BodyKind::Length(n)
        };
        let keep_alive = match version {
            Version::Http11 => !self.close,
            Version::Http10 => self.keep_alive && !self.close,
        };
        Ok((body, keep_alive))
    }
}

/// Content-Length = 1*DIGIT, bounded so the value fits in a u64.
fn parse_content_length(value: &[u8]) -> Result<u64, Error> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(Error::Malformed("invalid Content-Length"));
    }
    Ok(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Elements of a comma-separated list with optional whitespace; empty elements are skipped.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|e| !e.is_empty())
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &v[start..end]
}
