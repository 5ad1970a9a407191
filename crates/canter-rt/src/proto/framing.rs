//! Framing helpers for protocols on the connection actor: 4-byte big-endian length prefixes and
//! lines, each with a maximum frame size, and [`Framed`], a [`Protocol`] that hands a
//! [`FrameHandler`] one frame at a time with backpressure included.
//!
//! ```no_run
//! use bytes::Bytes;
//! use canter_rt::framing::{FrameHandler, Framed, LengthPrefixed};
//! use canter_rt::proto::Conn;
//! use canter_rt::{Config, Server};
//!
//! /// Sends every frame back, framed the same way.
//! struct Echo;
//!
//! impl FrameHandler for Echo {
//!     fn on_frame(&mut self, conn: &mut Conn<'_>, frame: Bytes) {
//!         let _ = conn.send(LengthPrefixed::frame(&frame));
//!     }
//! }
//!
//! Server::bind(Config::default())?
//!     .serve_protocol(|_worker| |_peer| Framed::new(LengthPrefixed::new(1 << 20), Echo))?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::proto::{Close, Conn, Protocol};

/// A frame longer than the decoder's maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTooLarge {
    /// The frame's length, or (for a line with no end yet) the bytes seen so far.
    pub len: usize,
    /// The maximum.
    pub max: usize,
}

impl fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "frame of {} bytes over the {}-byte limit",
            self.len, self.max
        )
    }
}

impl std::error::Error for FrameTooLarge {}

/// Splits a byte stream into frames.
pub trait Decoder: 'static {
    /// Takes the next complete frame off the front of `input` (`Ok(None)`: not complete yet,
    /// `input` untouched).
    fn decode(&mut self, input: &mut BytesMut) -> Result<Option<Bytes>, FrameTooLarge>;
}

/// Frames of a 4-byte big-endian length followed by that many bytes.
#[derive(Debug, Clone, Copy)]
pub struct LengthPrefixed {
    max: usize,
}

impl LengthPrefixed {
    /// Frames of at most `max` bytes (the prefix not counted).
    pub fn new(max: usize) -> LengthPrefixed {
        LengthPrefixed { max }
    }

    /// `payload` with its length prefix, ready to send.
    ///
    /// # Panics
    /// If `payload` is 4 GiB or longer (a length the prefix cannot say).
    pub fn frame(payload: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(4 + payload.len());
        LengthPrefixed::encode(payload, &mut out);
        out.freeze()
    }

    /// Appends `payload` with its length prefix to `out`.
    ///
    /// # Panics
    /// If `payload` is 4 GiB or longer.
    pub fn encode(payload: &[u8], out: &mut BytesMut) {
        let len = u32::try_from(payload.len()).expect("frame under 4 GiB");
        out.reserve(4 + payload.len());
        out.put_u32(len);
        out.put_slice(payload);
    }
}

impl Decoder for LengthPrefixed {
    fn decode(&mut self, input: &mut BytesMut) -> Result<Option<Bytes>, FrameTooLarge> {
        let Some(prefix) = input.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        if len > self.max {
            return Err(FrameTooLarge { len, max: self.max });
        }
        if input.len() < 4 + len {
            return Ok(None);
        }
        input.advance(4);
        Ok(Some(input.split_to(len).freeze()))
    }
}

/// Frames ended by `\n` (a `\r` before it is dropped too); the frame excludes the line end.
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    max: usize,
    /// Bytes of the current partial line already searched.
    scanned: usize,
}

impl Lines {
    /// Lines of at most `max` bytes, line end excluded.
    pub fn new(max: usize) -> Lines {
        Lines { max, scanned: 0 }
    }
}

impl Decoder for Lines {
    fn decode(&mut self, input: &mut BytesMut) -> Result<Option<Bytes>, FrameTooLarge> {
        // Search only what is new: a line dribbled byte by byte costs linear work.
        let from = self.scanned.min(input.len());
        let Some(at) = input[from..].iter().position(|&b| b == b'\n') else {
            self.scanned = input.len();
            // The line end may still come: allow one byte for it (and one for a CR).
            if input.len() > self.max + 1 {
                return Err(FrameTooLarge {
                    len: input.len(),
                    max: self.max,
                });
            }
            return Ok(None);
        };
        self.scanned = 0;
        let end = from + at;
        let mut line = input.split_to(end + 1);
        line.truncate(end);
        if line.last() == Some(&b'\r') {
            line.truncate(end - 1);
        }
        if line.len() > self.max {
            return Err(FrameTooLarge {
                len: line.len(),
                max: self.max,
            });
        }
        Ok(Some(line.freeze()))
    }
}

/// What a [`Framed`] protocol does with its frames.
pub trait FrameHandler: 'static {
    /// The connection is up.
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// One complete frame. It is called only while [`Conn::send`] would accept, so the first
    /// send of each frame is never refused.
    fn on_frame(&mut self, conn: &mut Conn<'_>, frame: bytes::Bytes);

    /// The peer closed its side; the default closes ours.
    fn on_eof(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    /// [`Conn::start_tls`] completed.
    fn on_tls(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The timer expired.
    fn on_timer(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The connection is gone.
    fn on_close(&mut self, why: &Close) {
        let _ = why;
    }
}

/// A protocol of frames: decodes with `D`, hands each frame to `H`. Stops decoding (and
/// reading) while the output is at its high-water mark and resumes when the peer catches up;
/// an oversized frame closes the connection with an error logged.
#[derive(Debug)]
pub struct Framed<D, H> {
    decoder: D,
    handler: H,
    /// Reading was stopped for backpressure (not by the handler).
    held: bool,
}

impl<D: Decoder, H: FrameHandler> Framed<D, H> {
    /// Frames decoded by `decoder`, handled by `handler`.
    pub fn new(decoder: D, handler: H) -> Framed<D, H> {
        Framed {
            decoder,
            handler,
            held: false,
        }
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// The handler, to change.
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }
}

impl<D: Decoder, H: FrameHandler> Protocol for Framed<D, H> {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.handler.on_open(conn);
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        // Stop at an upgrade command: what follows it came before the handshake.
        while !conn.is_closing() && !conn.is_muted() && !conn.is_upgrading() {
            if !conn.can_send() {
                // Hold the rest until the peer has read what is queued.
                self.held = true;
                conn.mute();
                conn.notify_writable();
                return;
            }
            match self.decoder.decode(input) {
                Ok(Some(frame)) => self.handler.on_frame(conn, frame),
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(peer = %conn.peer_addr(), error = %e, "oversized frame; closing the connection");
                    input.clear();
                    conn.close();
                    return;
                }
            }
        }
    }

    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        if std::mem::take(&mut self.held) {
            conn.unmute();
        }
    }

    fn on_eof(&mut self, conn: &mut Conn<'_>) {
        self.handler.on_eof(conn);
    }

    fn on_tls(&mut self, conn: &mut Conn<'_>) {
        self.handler.on_tls(conn);
    }

    fn on_timer(&mut self, conn: &mut Conn<'_>) {
        self.handler.on_timer(conn);
    }

    fn on_close(&mut self, why: &Close) {
        self.handler.on_close(why);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Feeds `wire` to `decoder` in pieces of `step` bytes, collecting frames until an error.
    fn feed(
        decoder: &mut impl Decoder,
        wire: &[u8],
        step: usize,
    ) -> (Vec<Bytes>, Option<FrameTooLarge>) {
        let mut input = BytesMut::new();
        let mut frames = Vec::new();
        for piece in wire.chunks(step) {
            input.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut input) {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(e) => return (frames, Some(e)),
                }
            }
        }
        (frames, None)
    }

    #[test]
    fn length_prefixed_whole_and_byte_by_byte() {
        let mut wire = BytesMut::new();
        for p in [&b"one"[..], b"", b"three three"] {
            LengthPrefixed::encode(p, &mut wire);
        }
        for step in [1, 2, 3, 5, wire.len()] {
            let (frames, err) = feed(&mut LengthPrefixed::new(64), &wire, step);
            assert_eq!(err, None);
            assert_eq!(frames, [&b"one"[..], b"", b"three three"], "step {step}");
        }
    }

    #[test]
    fn length_prefixed_refuses_oversized_before_the_payload() {
        // Only the prefix has arrived: the limit applies at once, not after buffering 1 GiB.
        let (frames, err) = feed(&mut LengthPrefixed::new(10), &(1u32 << 30).to_be_bytes(), 1);
        assert!(frames.is_empty());
        assert_eq!(
            err,
            Some(FrameTooLarge {
                len: 1 << 30,
                max: 10
            })
        );
        let (frames, err) = feed(
            &mut LengthPrefixed::new(10),
            &LengthPrefixed::frame(&[0; 10]),
            3,
        );
        assert_eq!((frames.len(), err), (1, None));
    }

    #[test]
    fn lines_crlf_lf_and_byte_by_byte() {
        let wire = b"a\r\nbb\n\n\r\nccc\n";
        for step in 1..=wire.len() {
            let (frames, err) = feed(&mut Lines::new(8), wire, step);
            assert_eq!(err, None);
            assert_eq!(frames, [&b"a"[..], b"bb", b"", b"", b"ccc"], "step {step}");
        }
    }

    #[test]
    fn lines_over_the_limit() {
        // Exactly at the limit, with CRLF: fine.
        let (frames, err) = feed(&mut Lines::new(4), b"abcd\r\n", 1);
        assert_eq!((frames.len(), err), (1, None));
        // Over it, line end present or not yet: refused, without waiting for the end.
        let (_, err) = feed(&mut Lines::new(4), b"abcde\n", 6);
        assert_eq!(err, Some(FrameTooLarge { len: 5, max: 4 }));
        let (_, err) = feed(&mut Lines::new(4), b"abcdefgh", 1);
        assert!(err.is_some());
    }
}
