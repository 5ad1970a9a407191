//! Incremental HTTP/1.x response parser used on the hot path.
//!
//! The parser never allocates: the head is parsed with `httparse` into a
//! stack array of headers, bodies are skipped without being buffered.

use std::mem::MaybeUninit;

/// Maximum number of response headers accepted.
const MAX_HEADERS: usize = 64;
/// Maximum length of a chunk extension / trailer line.
const MAX_LINE: usize = 64 * 1024;

/// Why a response could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Invalid status line or header block.
    Head(String),
    /// Invalid `Content-Length`.
    ContentLength,
    /// Invalid chunked framing.
    Chunked,
    /// Protocol switch (101) or other unsupported framing.
    Unsupported,
    /// The connection closed in the middle of a response.
    Truncated,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Head(e) => write!(f, "bad response head: {e}"),
            ParseError::ContentLength => f.write_str("bad Content-Length"),
            ParseError::Chunked => f.write_str("bad chunked encoding"),
            ParseError::Unsupported => f.write_str("unsupported response framing"),
            ParseError::Truncated => f.write_str("connection closed mid-response"),
        }
    }
}

/// Result of feeding bytes to the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// All of the given bytes that could be used were consumed (`consumed`
    /// may be less than the input length only when a head is incomplete; the
    /// caller must keep the rest and feed it again with more data).
    NeedMore {
        /// Bytes consumed from the front of the input.
        consumed: usize,
    },
    /// A full response was parsed.
    Complete {
        /// Bytes consumed from the front of the input.
        consumed: usize,
        /// Status code of the response.
        status: u16,
        /// Whether the server will close the connection after this response.
        close: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading hex digits of a chunk size.
    Size { size: u64, digits: bool },
    /// Skipping a chunk extension up to CR.
    Ext { size: u64, len: usize },
    /// Expecting LF after the size line.
    SizeLf { size: u64 },
    /// Skipping chunk data.
    Data(u64),
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// Reading a trailer line (`len` bytes so far).
    Trailer { len: usize },
    /// Expecting LF after a trailer line.
    TrailerLf { len: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

/// Incremental parser for a sequence of responses on one connection.
#[derive(Debug, Clone)]
pub struct ResponseParser {
    state: State,
    head_only: bool,
    status: u16,
    close: bool,
}

impl ResponseParser {
    /// Creates a parser. `head_only` is true when the requests are `HEAD`
    /// (responses then carry no body whatever their headers say).
    pub fn new(head_only: bool) -> Self {
        ResponseParser {
            state: State::Head,
            head_only,
            status: 0,
            close: false,
        }
    }

    /// Resets the parser for a new connection.
    pub fn reset(&mut self) {
        self.state = State::Head;
        self.status = 0;
        self.close = false;
    }

    /// True if the parser is between responses.
    pub fn is_idle(&self) -> bool {
        self.state == State::Head
    }

    /// Feeds bytes; see [`Event`]. Stops after at most one complete response.
    pub fn feed(&mut self, buf: &[u8]) -> Result<Event, ParseError> {
        let mut pos = 0usize;
        loop {
            match self.state {
                State::Head => {
                    if pos == buf.len() {
                        return Ok(Event::NeedMore { consumed: pos });
                    }
                    match self.parse_head(&buf[pos..])? {
                        None => return Ok(Event::NeedMore { consumed: pos }),
                        Some(n) => pos += n,
                    }
                    if self.state == State::Head {
                        // Either an interim 1xx (continue with the next head)
                        // or a response without a body.
                        if self.status >= 200 {
                            return Ok(self.complete(pos));
                        }
                    }
                }
                State::Length(remaining) => {
                    let avail = (buf.len() - pos) as u64;
                    if avail < remaining {
                        self.state = State::Length(remaining - avail);
                        return Ok(Event::NeedMore {
                            consumed: buf.len(),
                        });
                    }
                    pos += remaining as usize;
                    self.state = State::Head;
                    return Ok(self.complete(pos));
                }
                State::UntilClose => {
                    return Ok(Event::NeedMore {
                        consumed: buf.len(),
                    })
                }
                State::Chunked(c) => {
                    let (n, next) = step_chunked(c, &buf[pos..])?;
                    pos += n;
                    match next {
                        Some(c) => {
                            self.state = State::Chunked(c);
                            if pos == buf.len() {
                                return Ok(Event::NeedMore { consumed: pos });
                            }
                        }
                        None => {
                            self.state = State::Head;
                            return Ok(self.complete(pos));
                        }
                    }
                }
            }
        }
    }

    /// Signals end of stream. Returns `Ok(Some(..))` if this completes a
    /// close-delimited response, `Ok(None)` on a clean close between
    /// responses, and an error when a response was cut short.
    pub fn eof(&mut self, buffered: usize) -> Result<Option<Event>, ParseError> {
        match self.state {
            State::UntilClose => {
                self.state = State::Head;
                Ok(Some(self.complete(0)))
            }
            State::Head if buffered == 0 => Ok(None),
            _ => Err(ParseError::Truncated),
        }
    }

    fn complete(&self, consumed: usize) -> Event {
        Event::Complete {
            consumed,
            status: self.status,
            close: self.close,
        }
    }

    /// Parses a head; returns bytes consumed or None if incomplete. Sets the
    /// next state.
    fn parse_head(&mut self, buf: &[u8]) -> Result<Option<usize>, ParseError> {
        // Uninitialised header storage: no 2 KiB memset per response.
        let mut headers: [MaybeUninit<httparse::Header<'_>>; MAX_HEADERS] =
            [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let n = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            buf,
            &mut headers,
        ) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(ParseError::Head(e.to_string())),
        };
        let status = res.code.unwrap_or(0);
        let version = res.version.unwrap_or(1);
        let mut close = version == 0;
        let mut content_length: Option<u64> = None;
        let mut chunked = false;
        for h in res.headers.iter() {
            let name = h.name.as_bytes();
            // Compare lengths first: most headers are none of these three.
            if name.len() == 14 && name.eq_ignore_ascii_case(b"content-length") {
                let v = parse_content_length(h.value)?;
                if content_length.is_some_and(|old| old != v) {
                    return Err(ParseError::ContentLength);
                }
                content_length = Some(v);
            } else if name.len() == 17 && name.eq_ignore_ascii_case(b"transfer-encoding") {
                // Chunked only counts if it is the final coding.
                let last = h.value.rsplit(|&b| b == b',').next().unwrap_or(b"");
                chunked = trim(last).eq_ignore_ascii_case(b"chunked");
            } else if name.len() == 10 && name.eq_ignore_ascii_case(b"connection") {
                for tok in h.value.split(|&b| b == b',') {
                    let tok = trim(tok);
                    if tok.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if tok.eq_ignore_ascii_case(b"keep-alive") && version == 0 {
                        close = false;
                    }
                }
            }
        }
        self.status = status;
        self.close = close;
        self.state = if status == 101 {
            return Err(ParseError::Unsupported);
        } else if (100..200).contains(&status) || self.head_only || status == 204 || status == 304 {
            State::Head
        } else if chunked {
            State::Chunked(Chunk::Size {
                size: 0,
                digits: false,
            })
        } else if let Some(len) = content_length {
            if len == 0 {
                State::Head
            } else {
                State::Length(len)
            }
        } else {
            self.close = true;
            State::UntilClose
        };
        Ok(Some(n))
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn parse_content_length(v: &[u8]) -> Result<u64, ParseError> {
    let v = trim(v);
    if v.is_empty() || v.len() > 18 {
        return Err(ParseError::ContentLength);
    }
    let mut n = 0u64;
    for &b in v {
        if !b.is_ascii_digit() {
            return Err(ParseError::ContentLength);
        }
        n = n * 10 + u64::from(b - b'0');
    }
    Ok(n)
}

/// Advances the chunked decoder over `buf`. Returns bytes consumed and the
/// next state (None when the body, including trailers, is complete).
fn step_chunked(mut c: Chunk, buf: &[u8]) -> Result<(usize, Option<Chunk>), ParseError> {
    let mut i = 0usize;
    while i < buf.len() {
        if let Chunk::Data(rem) = c {
            let take = rem.min((buf.len() - i) as u64);
            i += take as usize;
            c = if take == rem {
                Chunk::DataCr
            } else {
                Chunk::Data(rem - take)
            };
            continue;
        }
        let b = buf[i];
        i += 1;
        c = match c {
            Chunk::Size { size, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if size > (u64::MAX >> 8) {
                        return Err(ParseError::Chunked);
                    }
                    let d = (b as char).to_digit(16).unwrap_or(0);
                    Chunk::Size {
                        size: size * 16 + u64::from(d),
                        digits: true,
                    }
                }
                b';' | b' ' | b'\t' if digits => Chunk::Ext { size, len: 0 },
                b'\r' if digits => Chunk::SizeLf { size },
                _ => return Err(ParseError::Chunked),
            },
            Chunk::Ext { size, len } => {
                if b == b'\r' {
                    Chunk::SizeLf { size }
                } else if len >= MAX_LINE {
                    return Err(ParseError::Chunked);
                } else {
                    Chunk::Ext { size, len: len + 1 }
                }
            }
            Chunk::SizeLf { size } => {
                if b != b'\n' {
                    return Err(ParseError::Chunked);
                }
                if size == 0 {
                    Chunk::Trailer { len: 0 }
                } else {
                    Chunk::Data(size)
                }
            }
            Chunk::Data(_) => return Err(ParseError::Chunked),
            Chunk::DataCr => {
                if b != b'\r' {
                    return Err(ParseError::Chunked);
                }
                Chunk::DataLf
            }
            Chunk::DataLf => {
                if b != b'\n' {
                    return Err(ParseError::Chunked);
                }
                Chunk::Size {
                    size: 0,
                    digits: false,
                }
            }
            Chunk::Trailer { len } => {
                if b == b'\r' {
                    Chunk::TrailerLf { len }
                } else if len >= MAX_LINE {
                    return Err(ParseError::Chunked);
                } else {
                    Chunk::Trailer { len: len + 1 }
                }
            }
            Chunk::TrailerLf { len } => {
                if b != b'\n' {
                    return Err(ParseError::Chunked);
                }
                if len == 0 {
                    return Ok((i, None));
                }
                Chunk::Trailer { len: 0 }
            }
        };
    }
    Ok((i, Some(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces cut at `cuts`, emulating the connection's
    /// read buffer (unconsumed bytes are kept and re-fed). Returns the
    /// completed (status, close) pairs.
    fn run_split(input: &[u8], cuts: &[usize], head_only: bool) -> Vec<(u16, bool)> {
        let mut p = ResponseParser::new(head_only);
        let mut out = Vec::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut last = 0;
        let mut bounds: Vec<usize> = cuts.to_vec();
        bounds.push(input.len());
        for &b in &bounds {
            buf.extend_from_slice(&input[last..b]);
            last = b;
            loop {
                match p.feed(&buf).expect("parse") {
                    Event::NeedMore { consumed } => {
                        buf.drain(..consumed);
                        break;
                    }
                    Event::Complete {
                        consumed,
                        status,
                        close,
                    } => {
                        buf.drain(..consumed);
                        out.push((status, close));
                        if buf.is_empty() {
                            break;
                        }
                    }
                }
            }
        }
        if let Some(Event::Complete { status, close, .. }) = p.eof(buf.len()).expect("eof") {
            out.push((status, close));
        }
        out
    }

    fn check_all_splits(input: &[u8], expect: &[(u16, bool)], head_only: bool) {
        assert_eq!(run_split(input, &[], head_only), expect, "whole");
        for i in 0..=input.len() {
            assert_eq!(run_split(input, &[i], head_only), expect, "split at {i}");
        }
        // Byte-at-a-time.
        let all: Vec<usize> = (1..input.len()).collect();
        assert_eq!(run_split(input, &all, head_only), expect, "bytewise");
    }

    #[test]
    fn content_length_pipelined() {
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nServer: x\r\n\r\nHello, World!\
HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n\
HTTP/1.1 201 Created\r\nContent-Length:  3 \r\n\r\nabc";
        check_all_splits(input, &[(200, false), (404, false), (201, false)], false);
    }

    #[test]
    fn chunked_with_ext_and_trailers() {
        let input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\nHello\r\n1a;name=val\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\n\
HTTP/1.1 500 Oops\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n";
        check_all_splits(input, &[(200, false), (500, false)], false);
    }

    #[test]
    fn connection_close_and_http10() {
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        check_all_splits(input, &[(200, true)], false);
        let input = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
        check_all_splits(input, &[(200, true)], false);
        let input = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: Keep-Alive\r\n\r\nok";
        check_all_splits(input, &[(200, false)], false);
        // No framing: body runs until close.
        let input = b"HTTP/1.1 200 OK\r\n\r\nsome body bytes";
        check_all_splits(input, &[(200, true)], false);
    }

    #[test]
    fn bodyless_responses() {
        let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n\
HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n";
        check_all_splits(input, &[(204, false), (304, false)], false);
        let input = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHTTP/1.1 200 OK\r\n\r\n";
        check_all_splits(input, &[(200, false), (200, false)], true);
    }

    #[test]
    fn errors() {
        let mut p = ResponseParser::new(false);
        assert!(p.feed(b"HTTX/1.1 200 OK\r\n\r\n").is_err());
        let mut p = ResponseParser::new(false);
        assert_eq!(
            p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n"),
            Err(ParseError::ContentLength)
        );
        let mut p = ResponseParser::new(false);
        assert_eq!(
            p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            Err(ParseError::ContentLength)
        );
        let mut p = ResponseParser::new(false);
        assert_eq!(
            p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            Err(ParseError::Chunked)
        );
        let mut p = ResponseParser::new(false);
        assert!(matches!(
            p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"),
            Ok(Event::NeedMore { consumed: 40 })
        ));
        assert_eq!(p.eof(0), Err(ParseError::Truncated));
        let mut p = ResponseParser::new(false);
        assert_eq!(p.eof(0), Ok(None));
        assert_eq!(p.eof(3), Err(ParseError::Truncated));
    }
}
