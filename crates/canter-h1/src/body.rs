//! Request body decoding: Content-Length and chunked (RFC 9112 §7.1), incremental and zero-copy
//! for data.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{BadBody, Error};
use canter_http::{Limits, TCHAR};

/// One step of body decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyEvent {
    /// A piece of the body (never empty).
    Data(Bytes),
    /// The buffer holds no further complete piece: read more and call again.
    NeedMore,
    /// The body is complete (trailers, if any, were validated and consumed).
    End,
}

/// Incremental decoder for one request body.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    kind: Kind,
    received: u64,
    max_body: u64,
    max_chunk_ext: usize,
    max_trailers: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Length { remaining: u64 },
    Chunked(Chunk),
    Done,
}

/// States of the chunked framing. Data bytes are sliced in bulk; framing is read byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading hex digits of a chunk size (`digits` so far).
    Size { size: u64, digits: u8 },
    /// In `; ext` after the size; `len` bytes consumed so far.
    Ext { size: u64, len: usize },
    /// Saw CR after the size line, expecting LF.
    SizeLf { size: u64 },
    /// Inside chunk data.
    Data { remaining: u64 },
    /// After chunk data, expecting CR.
    DataCr,
    /// After chunk data's CR, expecting LF.
    DataLf,
    /// In the trailer section: `line` bytes on the current line, `total` in the section,
    /// `colon` once the field name has ended.
    Trailer {
        line: usize,
        total: usize,
        colon: bool,
    },
    /// Saw CR in the trailer section, expecting LF.
    TrailerLf { line: usize, total: usize },
}

/// At most 16 hex digits: a chunk size must fit in a u64.
const MAX_SIZE_DIGITS: u8 = 16;

impl BodyDecoder {
    /// A decoder for a body of exactly `len` bytes.
    pub fn length(len: u64, limits: &Limits) -> BodyDecoder {
        let kind = if len == 0 {
            Kind::Done
        } else {
            Kind::Length { remaining: len }
        };
        BodyDecoder::new(kind, limits)
    }

    /// A decoder for a chunked body.
    pub fn chunked(limits: &Limits) -> BodyDecoder {
        BodyDecoder::new(Kind::Chunked(Chunk::Size { size: 0, digits: 0 }), limits)
    }

    fn new(kind: Kind, limits: &Limits) -> BodyDecoder {
        BodyDecoder {
            kind,
            received: 0,
            max_body: limits.max_body(),
            max_chunk_ext: limits.max_chunk_ext(),
            max_trailers: limits.max_trailers(),
        }
    }

    /// Whether the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.kind == Kind::Done
    }

    /// Bytes still expected for a Content-Length body; `None` for chunked bodies.
    pub fn remaining(&self) -> Option<u64> {
        match self.kind {
            Kind::Length { remaining } => Some(remaining),
            Kind::Done => Some(0),
            Kind::Chunked(_) => None,
        }
    }

    /// Tightens the body and chunk-extension limits for the rest of this body (a route's
    /// limits, stricter than the server's). Never loosens them.
    pub fn restrict(&mut self, max_body: u64, max_chunk_ext: usize) {
        self.max_body = self.max_body.min(max_body);
        self.max_chunk_ext = self.max_chunk_ext.min(max_chunk_ext);
    }

    /// Body bytes decoded so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Decodes the next piece from the front of `buf`, consuming what it uses.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<BodyEvent, Error> {
        match self.kind {
            Kind::Done => Ok(BodyEvent::End),
            Kind::Length { remaining } => {
                if buf.is_empty() {
                    return Ok(BodyEvent::NeedMore);
                }
                let n = remaining.min(buf.len() as u64);
                let rest = remaining - n;
                self.kind = if rest == 0 {
                    Kind::Done
                } else {
                    Kind::Length { remaining: rest }
                };
                self.received += n;
                Ok(BodyEvent::Data(buf.split_to(n as usize).freeze()))
            }
            Kind::Chunked(state) => self.decode_chunked(state, buf),
        }
    }

    fn decode_chunked(&mut self, mut state: Chunk, buf: &mut BytesMut) -> Result<BodyEvent, Error> {
        loop {
            if let Chunk::Data { remaining } = state {
                if buf.is_empty() {
                    self.kind = Kind::Chunked(state);
                    return Ok(BodyEvent::NeedMore);
                }
                let n = remaining.min(buf.len() as u64);
                self.received += n;
                let rest = remaining - n;
                self.kind = Kind::Chunked(if rest == 0 {
                    Chunk::DataCr
                } else {
                    Chunk::Data { remaining: rest }
                });
                return Ok(BodyEvent::Data(buf.split_to(n as usize).freeze()));
            }
            let mut used = 0;
            loop {
                let Some(&b) = buf.get(used) else {
                    buf.advance(used);
                    self.kind = Kind::Chunked(state);
                    return Ok(BodyEvent::NeedMore);
                };
                used += 1;
                match self.step(state, b)? {
                    Some(next) => state = next,
                    None => {
                        buf.advance(used);
                        self.kind = Kind::Done;
                        return Ok(BodyEvent::End);
                    }
                }
                if let Chunk::Data { .. } = state {
                    buf.advance(used);
                    break;
                }
            }
        }
    }

    /// One framing byte. `Ok(None)` means the body (with its trailers) is complete.
    fn step(&self, state: Chunk, b: u8) -> Result<Option<Chunk>, Error> {
        Ok(Some(match state {
            Chunk::Size { size, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    if digits >= MAX_SIZE_DIGITS {
                        return Err(Error::BadBody(BadBody::ChunkSizeTooLong));
                    }
                    let v = (b as char).to_digit(16).unwrap_or(0) as u64;
                    Chunk::Size {
                        size: (size << 4) | v,
                        digits: digits + 1,
                    }
                }
                _ if digits == 0 => return Err(Error::BadBody(BadBody::ChunkSizeNotHex)),
                b'\r' => Chunk::SizeLf { size },
                b';' | b' ' | b'\t' => Chunk::Ext { size, len: 1 },
                _ => return Err(Error::BadBody(BadBody::AfterChunkSize)),
            },
            Chunk::Ext { size, len } => match b {
                b'\r' => Chunk::SizeLf { size },
                b'\n' => return Err(Error::BadBody(BadBody::BareLfInChunkLine)),
                b'\t' | b' '..=b'~' | 0x80..=0xff if len < self.max_chunk_ext => {
                    Chunk::Ext { size, len: len + 1 }
                }
                _ if len >= self.max_chunk_ext => {
                    return Err(Error::BadBody(BadBody::ChunkExtensionTooLong))
                }
                _ => return Err(Error::BadBody(BadBody::ChunkExtensionByte)),
            },
            Chunk::SizeLf { size } => match b {
                b'\n' if size == 0 => Chunk::Trailer {
                    line: 0,
                    total: 0,
                    colon: false,
                },
                b'\n' => {
                    if self.received.saturating_add(size) > self.max_body {
                        return Err(Error::BodyTooLarge);
                    }
                    Chunk::Data { remaining: size }
                }
                _ => return Err(Error::BadBody(BadBody::LfAfterChunkSize)),
            },
            Chunk::Data { .. } => state,
            Chunk::DataCr => match b {
                b'\r' => Chunk::DataLf,
                _ => return Err(Error::BadBody(BadBody::ChunkDataTooLong)),
            },
            Chunk::DataLf => match b {
                b'\n' => Chunk::Size { size: 0, digits: 0 },
                _ => return Err(Error::BadBody(BadBody::LfAfterChunkData)),
            },
            Chunk::Trailer { line, total, colon } => {
                // The CRLF that ends the body is not part of the trailer section (RFC 9112 §7.1),
                // so it is not counted: an empty section fits even `max_trailers == 0`.
                let ends_body = line == 0 && b == b'\r';
                if total >= self.max_trailers && !ends_body {
                    return Err(Error::HeadersTooLarge);
                }
                let next = Chunk::Trailer {
                    line: line + 1,
                    total: total + 1,
                    colon,
                };
                match b {
                    b'\r' if line > 0 && !colon => {
                        return Err(Error::BadBody(BadBody::TrailerWithoutColon))
                    }
                    b'\r' => Chunk::TrailerLf {
                        line,
                        total: total + 1,
                    },
                    b'\n' => return Err(Error::BadBody(BadBody::BareLfInTrailer)),
                    b':' if !colon && line == 0 => {
                        return Err(Error::BadBody(BadBody::EmptyTrailerName))
                    }
                    b':' if !colon => Chunk::Trailer {
                        line: line + 1,
                        total: total + 1,
                        colon: true,
                    },
                    _ if !colon && is_tchar(b) => next,
                    b'\t' | b' '..=b'~' | 0x80..=0xff if colon => next,
                    _ => return Err(Error::BadBody(BadBody::TrailerByte)),
                }
            }
            Chunk::TrailerLf { line, total } => match b {
                b'\n' if line == 0 => return Ok(None),
                b'\n' if total >= self.max_trailers => return Err(Error::HeadersTooLarge),
                b'\n' => Chunk::Trailer {
                    line: 0,
                    total: total + 1,
                    colon: false,
                },
                _ => return Err(Error::BadBody(BadBody::LfInTrailer)),
            },
        }))
    }
}

/// RFC 9110 token characters.
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}
