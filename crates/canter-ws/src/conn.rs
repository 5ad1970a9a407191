//! One WebSocket connection's protocol state: frames in, events out, frames to send.
//!
//! ```text
//!            poll(input, out)                         send_*(…, out)
//!  bytes ──► header → limits → unmask → assemble ──► Event::{Text, Binary, Ping, Pong, Close}
//!                                 │
//!             ping → pong in out; close → close echoed in out (once)
//! ```
//!
//! No socket and no clock: the driver hands in what it read and writes out what the engine
//! appended to `out` (pongs and the close reply included). A peer's error is an [`Error`] with
//! the close code to send ([`Error::close_code`]); the driver then sends that close with
//! [`Connection::close`] and stops reading.

use bytes::{Buf, Bytes, BytesMut};

use crate::close;
use crate::deflate::{Agreed, Deflater, Inflater};
use crate::frame::{self, Opcode};
use crate::utf8::Utf8;
use crate::Error;

/// Which end of the connection this is: a client masks what it sends, a server must not, and
/// each refuses what the other end gets wrong (RFC 6455, Section 5.1).
pub enum Role {
    /// The server: every frame it reads must be masked.
    Server,
    /// The client: every frame it reads must be unmasked; `keys` gives the masking key of each
    /// frame it sends (from a strong source of entropy: RFC 6455, Section 10.3).
    Client {
        /// The next masking key.
        keys: Box<dyn FnMut() -> [u8; 4]>,
    },
}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Server => "Server",
            Role::Client { .. } => "Client",
        })
    }
}

/// Size limits on what a peer sends; over one, the connection fails with close code 1009
/// before the payload is read. The defaults are uvicorn's and Bun's message limit (16 MiB), so
/// a message, and what a compressed one inflates to, holds at most that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest frame payload.
    pub max_frame: u64,
    /// The largest message, all its fragments together.
    pub max_message: usize,
    /// The most frames one message may come in.
    pub max_fragments: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: 16 << 20,
            max_message: 16 << 20,
            max_fragments: 1 << 16,
        }
    }
}

/// What the peer sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A complete text message (valid UTF-8).
    Text(Bytes),
    /// A complete binary message.
    Binary(Bytes),
    /// A ping; its pong is already in `out`.
    Ping(Bytes),
    /// A pong.
    Pong(Bytes),
    /// The peer's close, with its code and reason if it gave one; unless this end had closed
    /// first, the reply is already in `out`. Nothing more is read after it.
    Close(Option<(u16, String)>),
}

/// A message being assembled from its fragments.
#[derive(Debug)]
struct Partial {
    text: bool,
    /// Sent with RSV1: its payload is compressed (permessage-deflate).
    compressed: bool,
    data: BytesMut,
    fragments: usize,
    utf8: Utf8,
}

impl Partial {
    /// A message whose first frame is `h`.
    fn new(h: &frame::Header) -> Partial {
        Partial {
            text: h.opcode == Opcode::Text,
            compressed: h.rsv1,
            data: BytesMut::new(),
            fragments: 0,
            utf8: Utf8::default(),
        }
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct Connection {
    role: Role,
    limits: Limits,
    /// permessage-deflate, when it was agreed.
    deflate: Option<Deflate>,
    message: Option<Partial>,
    /// Payload bytes of the frame at the front of the input, not yet whole, already unmasked
    /// in place and (for uncompressed text) validated: text fails at its first bad byte, even
    /// inside a frame that is still arriving.
    checked: usize,
    close_sent: bool,
    close_received: bool,
}

/// One end's half of permessage-deflate.
#[derive(Debug)]
struct Deflate {
    deflater: Deflater,
    inflater: Inflater,
    min_size: usize,
    /// This end resets its compressor after each message, with this window: a message
    /// compressed alone under a window no larger is valid here too ([`Connection::accepts_shared`]).
    own_reset: Option<u8>,
}

impl Connection {
    /// A connection for `role` under `limits`.
    pub fn new(role: Role, limits: Limits) -> Connection {
        Connection {
            role,
            limits,
            deflate: None,
            message: None,
            checked: 0,
            close_sent: false,
            close_received: false,
        }
    }

    /// Turns permessage-deflate on, as agreed in the handshake ([`crate::deflate::negotiate`] on
    /// a server, [`crate::deflate::client_agreed`] on a client):
    /// messages of at least the configured size go out compressed, compressed ones are
    /// inflated, never past [`Limits::max_message`].
    pub fn with_deflate(mut self, agreed: Agreed) -> Connection {
        let (own_reset, peer_reset, bits) = match self.role {
            Role::Server => (
                agreed.server_no_context_takeover,
                agreed.client_no_context_takeover,
                agreed.server_window_bits,
            ),
            Role::Client { .. } => (
                agreed.client_no_context_takeover,
                agreed.server_no_context_takeover,
                agreed.client_window_bits,
            ),
        };
        self.deflate = Some(Deflate {
            deflater: Deflater::new(agreed.config.level, bits, own_reset),
            inflater: Inflater::new(peer_reset),
            min_size: agreed.config.min_size,
            own_reset: own_reset.then_some(bits),
        });
        self
    }

    /// Bytes held for the message being assembled: its fragments so far (a frame still
    /// arriving is in the caller's input).
    pub fn assembling(&self) -> usize {
        self.message.as_ref().map_or(0, |m| m.data.len())
    }

    /// Whether this end sent its close.
    pub fn close_sent(&self) -> bool {
        self.close_sent
    }

    /// Whether the peer's close arrived.
    pub fn close_received(&self) -> bool {
        self.close_received
    }

    /// The next event from the front of `input` (what it used is taken off): `Ok(None)` when
    /// more bytes are needed. A ping's pong and the reply to a close go into `out`.
    pub fn poll(
        &mut self,
        input: &mut BytesMut,
        out: &mut Vec<u8>,
    ) -> Result<Option<Event>, Error> {
        loop {
            if self.close_received {
                input.clear();
                return Ok(None);
            }
            let Some(h) = frame::parse_header(input)? else {
                return Ok(None);
            };
            match (&self.role, h.mask) {
                (Role::Server, None) => {
                    return Err(Error::Protocol("unmasked frame from a client"))
                }
                (Role::Client { .. }, Some(_)) => {
                    return Err(Error::Protocol("masked frame from a server"))
                }
                _ => {}
            }
            if h.rsv1 {
                if self.deflate.is_none() {
                    return Err(Error::Protocol("RSV1 set without a negotiated extension"));
                }
                if !matches!(h.opcode, Opcode::Text | Opcode::Binary) {
                    return Err(Error::Protocol(
                        "RSV1 set on a control or continuation frame",
                    ));
                }
            }
            if h.len > self.limits.max_frame {
                return Err(Error::TooBig);
            }
            let data_op = !h.opcode.is_control();
            if data_op {
                let (assembled, fragments) = self
                    .message
                    .as_ref()
                    .map_or((0, 0), |m| (m.data.len(), m.fragments));
                // A message begun by a frame still arriving has no fragment yet.
                match (h.opcode, &self.message) {
                    (Opcode::Continuation, None) => {
                        return Err(Error::Protocol("continuation without a message"))
                    }
                    (Opcode::Text | Opcode::Binary, Some(m)) if m.fragments > 0 => {
                        return Err(Error::Protocol("new message inside a fragmented one"))
                    }
                    _ => {}
                }
                if assembled as u64 + h.len > self.limits.max_message as u64 {
                    return Err(Error::TooBig);
                }
                if fragments + 1 > self.limits.max_fragments {
                    return Err(Error::TooBig);
                }
            }
            // The payload's length was checked against the limits: it fits in memory. Nothing is
            // reserved for it ahead: a 14-byte header must not make the engine allocate
            // megabytes the peer may never send.
            let total = h.header_len + h.len as usize;
            if input.len() < total {
                self.check_partial(&h, input)?;
                return Ok(None);
            }
            input.advance(h.header_len);
            let mut payload = input.split_to(h.len as usize);
            let checked = std::mem::take(&mut self.checked);
            if let Some(key) = h.mask {
                frame::apply_mask(&mut payload[checked..], key, checked);
            }
            match h.opcode {
                Opcode::Ping => {
                    if !self.close_sent {
                        self.put_frame(out, Opcode::Pong, &payload);
                    }
                    return Ok(Some(Event::Ping(payload.freeze())));
                }
                Opcode::Pong => return Ok(Some(Event::Pong(payload.freeze()))),
                Opcode::Close => {
                    let why = close::parse(&payload)?;
                    self.close_received = true;
                    if !self.close_sent {
                        let code = why.as_ref().map_or(close::NORMAL, |(c, _)| *c);
                        self.close(code, "", out);
                    }
                    return Ok(Some(Event::Close(why)));
                }
                Opcode::Text | Opcode::Binary | Opcode::Continuation => {}
            }
            let mut m = match self.message.take() {
                Some(m) => m,
                None => Partial::new(&h),
            };
            if m.text && !m.compressed {
                m.utf8
                    .feed(&payload[checked..])
                    .map_err(|_| Error::InvalidUtf8)?;
            }
            m.fragments += 1;
            if !h.fin {
                m.data.extend_from_slice(&payload);
                self.message = Some(m);
                continue;
            }
            let data = if m.data.is_empty() {
                payload.freeze()
            } else {
                m.data.extend_from_slice(&payload);
                m.data.freeze()
            };
            let data = match (m.compressed, &mut self.deflate) {
                (true, Some(d)) => {
                    let mut inflated = Vec::new();
                    d.inflater
                        .inflate(&data, self.limits.max_message, &mut inflated)?;
                    if m.text {
                        m.utf8.feed(&inflated).map_err(|_| Error::InvalidUtf8)?;
                    }
                    Bytes::from(inflated)
                }
                _ => data,
            };
            if m.text {
                m.utf8.finish().map_err(|_| Error::InvalidUtf8)?;
                return Ok(Some(Event::Text(data)));
            }
            return Ok(Some(Event::Binary(data)));
        }
    }

    /// A data frame at the front of `input` whose payload is not all here: what has arrived
    /// is unmasked in place (once) and, in an uncompressed text message, validated, so bad
    /// UTF-8 fails the connection as soon as it arrives (Autobahn's strict verdict, 6.4.x).
    fn check_partial(&mut self, h: &frame::Header, input: &mut BytesMut) -> Result<(), Error> {
        if h.opcode.is_control() {
            return Ok(());
        }
        let arrived = input.len().saturating_sub(h.header_len);
        if arrived <= self.checked {
            return Ok(());
        }
        let m = self.message.get_or_insert_with(|| Partial::new(h));
        let piece = &mut input[h.header_len + self.checked..h.header_len + arrived];
        if let Some(key) = h.mask {
            frame::apply_mask(piece, key, self.checked);
        }
        self.checked = arrived;
        if m.text && !m.compressed {
            m.utf8.feed(piece).map_err(|_| Error::InvalidUtf8)?;
        }
        Ok(())
    }

    /// Appends a frame encoded elsewhere, once for many connections (a broadcast): checked only
    /// for this end's close. The caller chose a frame this connection may send: unmasked on a
    /// server, compressed only where [`Connection::accepts_shared`] says so.
    pub fn send_encoded(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if self.close_sent {
            return Err(Error::Closed);
        }
        out.extend_from_slice(frame);
        Ok(())
    }

    /// Whether a message compressed alone (its own deflate stream, no context before it) under
    /// a window of `window_bits` may be sent on this connection as it is: permessage-deflate
    /// is on, this end resets its context after each message, and its window is no smaller.
    pub fn accepts_shared(&self, window_bits: u8) -> bool {
        self.deflate
            .as_ref()
            .and_then(|d| d.own_reset)
            .is_some_and(|bits| bits >= window_bits)
    }

    /// Whether this end is a server (frames sent unmasked).
    pub fn is_server(&self) -> bool {
        matches!(self.role, Role::Server)
    }

    /// Appends a text message in one frame.
    pub fn send_text(&mut self, text: &str, out: &mut Vec<u8>) -> Result<(), Error> {
        self.send(Opcode::Text, text.as_bytes(), out)
    }

    /// Appends a binary message in one frame.
    pub fn send_binary(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        self.send(Opcode::Binary, data, out)
    }

    /// Appends a ping (at most 125 bytes).
    pub fn send_ping(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if data.len() > 125 {
            return Err(Error::Protocol("control frame over 125 bytes"));
        }
        self.send(Opcode::Ping, data, out)
    }

    /// Appends a pong (at most 125 bytes): an unsolicited one is a heartbeat (RFC 6455,
    /// Section 5.5.3); the answers to pings are sent by [`Connection::poll`] itself.
    pub fn send_pong(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if data.len() > 125 {
            return Err(Error::Protocol("control frame over 125 bytes"));
        }
        self.send(Opcode::Pong, data, out)
    }

    fn send(&mut self, opcode: Opcode, data: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        if self.close_sent {
            return Err(Error::Closed);
        }
        match &mut self.deflate {
            Some(d) if !opcode.is_control() && data.len() >= d.min_size => {
                let mut compressed = Vec::with_capacity(data.len() / 2 + 16);
                d.deflater.compress(data, &mut compressed);
                self.put(out, opcode, true, &compressed);
            }
            _ => self.put_frame(out, opcode, data),
        }
        Ok(())
    }

    /// Appends this end's close with `code` and `reason` (cut to fit 125 bytes), once; after
    /// it nothing more can be sent. A code that may not travel on the wire is sent as 1000.
    pub fn close(&mut self, code: u16, reason: &str, out: &mut Vec<u8>) {
        if self.close_sent {
            return;
        }
        let code = if close::valid_on_wire(code) {
            code
        } else {
            close::NORMAL
        };
        let mut payload = Vec::with_capacity(2 + reason.len().min(123));
        close::put(&mut payload, code, reason);
        self.put_frame(out, Opcode::Close, &payload);
        self.close_sent = true;
    }

    fn put_frame(&mut self, out: &mut Vec<u8>, opcode: Opcode, data: &[u8]) {
        self.put(out, opcode, false, data);
    }

    fn put(&mut self, out: &mut Vec<u8>, opcode: Opcode, rsv1: bool, data: &[u8]) {
        let mask = match &mut self.role {
            Role::Server => None,
            Role::Client { keys } => Some(keys()),
        };
        frame::put_header(out, true, rsv1, opcode, data.len() as u64, mask);
        let start = out.len();
        out.extend_from_slice(data);
        if let Some(key) = mask {
            frame::apply_mask(&mut out[start..], key, 0);
        }
    }
}
