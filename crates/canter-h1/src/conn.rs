//! The server side of one HTTP/1.1 connection as a state machine.
//!
//! ```text
//!            bytes                       poll_request ─► RequestHead
//!   driver ──────────► read buffer ──►   poll_body    ─► BodyEvent::{Data, NeedMore, End}
//!                                        start_response / data_prefix / data_suffix / finish
//!   driver ◄────────── write buffer ◄──  (status line, headers, chunk framing)
//! ```
//!
//! Receiving: `Idle` (between requests) → `Head` (some head bytes seen) → `Body` → `Done`.
//! Sending: `Idle` → `Length` | `Chunked` | `Close` | `NoBody` → `Idle` after [`Conn::finish`].
//! Exchanges are strictly sequential: the driver parses the next pipelined request only after
//! the previous response was finished, which keeps responses in request order by construction.
//! Any [`Error`] moves the receive side to `Closed`: the caller answers it with
//! [`Conn::error_response`] and closes.

use std::time::Instant;

use bytes::BytesMut;
use http::{HeaderName, HeaderValue};

use crate::head::HostCache;

use canter_http::{BodyKind, Limits, Method, RequestHead, Timeouts, Version};

use crate::{head, BodyDecoder, BodyEvent, Error};

/// The length of a response body as the handler declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// Exactly this many bytes (sent with Content-Length).
    Known(u64),
    /// Unknown in advance: chunked for HTTP/1.1 clients, close-delimited for HTTP/1.0.
    Unknown,
}

/// What the driver should do after [`Conn::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Read the next request on this connection.
    KeepAlive,
    /// Flush what is buffered, then close.
    Close,
}

/// A response body exceeded or fell short of its declared Content-Length: a bug in the handler.
/// The connection must be closed, since the client can no longer find the next response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthMismatch;

#[derive(Debug)]
enum Recv {
    Idle,
    Head,
    Body(BodyDecoder),
    Done,
    Closed,
    /// The connection closes after an exchange that left its request body unread: the rest of
    /// the body may still be on its way.
    Abandoned,
}

/// Whether the connection outlives the current exchange, and if not, who said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    Alive,
    /// The request asked for the close (`Connection: close`, or HTTP/1.0 without keep-alive).
    ClientCloses,
    /// This side decided it (an error, a drain, a framing that ends with the connection).
    Closes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    Idle,
    Length(u64),
    Chunked,
    Close,
    NoBody,
}

/// One server connection's HTTP/1.1 state. See the module docs for the call order.
#[derive(Debug)]
pub struct Conn {
    limits: Limits,
    host_cache: HostCache,
    timeouts: Timeouts,
    recv: Recv,
    send: Send,
    keep: Keep,
    head_request: bool,
    version: Version,
    continue_pending: bool,
    /// The current request asks to upgrade to h2c ([`RequestHead::h2c_upgrade`]).
    h2c_upgrade: bool,
    since: Instant,
}

impl Conn {
    /// A new connection, accepted at `now`.
    pub fn new(limits: Limits, timeouts: Timeouts, now: Instant) -> Conn {
        Conn {
            limits,
            host_cache: HostCache::default(),
            timeouts,
            recv: Recv::Idle,
            send: Send::Idle,
            keep: Keep::Alive,
            head_request: false,
            version: Version::Http11,
            continue_pending: false,
            h2c_upgrade: false,
            since: now,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    // ---- inputs ---------------------------------------------------------------------------

    /// Parses the next request head from `buf`. `Ok(None)`: need more bytes (or the receive side
    /// is not waiting for a head). On success the head's bytes are removed from `buf`; body
    /// bytes stay there for [`Conn::poll_body`].
    #[inline(always)]
    pub fn poll_request(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
    ) -> Result<Option<RequestHead>, Error> {
        if !matches!(self.recv, Recv::Idle | Recv::Head) || self.send != Send::Idle {
            return Ok(None);
        }
        if buf.is_empty() {
            return Ok(None);
        }
        match head::parse(buf, &self.limits, &mut self.host_cache) {
            Ok(Some(head)) => {
                self.recv = match head.body_kind() {
                    BodyKind::Length(0) => Recv::Done,
                    BodyKind::Length(n) => Recv::Body(BodyDecoder::length(n, &self.limits)),
                    BodyKind::Chunked => Recv::Body(BodyDecoder::chunked(&self.limits)),
                };
                self.keep = if head.keep_alive() {
                    Keep::Alive
                } else {
                    Keep::ClientCloses
                };
                self.head_request = head.method() == Method::Head;
                self.version = head.version();
                self.continue_pending =
                    head.expect_continue() && matches!(self.recv, Recv::Body(_));
                self.h2c_upgrade = head.h2c_upgrade();
                self.since = now;
                Ok(Some(head))
            }
            Ok(None) => {
                if let Recv::Idle = self.recv {
                    self.recv = Recv::Head;
                    self.since = now;
                }
                Ok(None)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Whether the request last returned by [`Conn::poll_request`] asks to upgrade to HTTP/2
    /// over cleartext ([`RequestHead::h2c_upgrade`]), asked without touching the head.
    #[inline]
    pub fn h2c_upgrade_requested(&self) -> bool {
        self.h2c_upgrade
    }

    /// Decodes the next piece of the current request's body from `buf`.
    pub fn poll_body(&mut self, buf: &mut BytesMut, now: Instant) -> Result<BodyEvent, Error> {
        let Recv::Body(decoder) = &mut self.recv else {
            return Ok(BodyEvent::End);
        };
        match decoder.decode(buf) {
            Ok(BodyEvent::Data(data)) => {
                // The client is sending the body without waiting for 100 Continue (RFC 9110
                // §10.1.1 lets it): the interim response is no longer needed, and answering
                // after reading the whole body leaves the stream in sync.
                self.continue_pending = false;
                self.since = now;
                if decoder.is_done() {
                    self.recv = Recv::Done;
                }
                Ok(BodyEvent::Data(data))
            }
            Ok(BodyEvent::End) => {
                self.continue_pending = false;
                self.recv = Recv::Done;
                Ok(BodyEvent::End)
            }
            Ok(BodyEvent::NeedMore) => Ok(BodyEvent::NeedMore),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        self.recv = Recv::Closed;
        self.close();
        e
    }

    // ---- getters --------------------------------------------------------------------------

    /// Whether the current request's body has been read completely (true when it had none).
    pub fn body_done(&self) -> bool {
        !matches!(self.recv, Recv::Body(_))
    }

    /// Tightens the limits for the rest of the current request body (see
    /// [`BodyDecoder::restrict`]); no effect when there is no body left to read.
    pub fn restrict_body(&mut self, max_body: u64, max_chunk_ext: usize) {
        if let Recv::Body(decoder) = &mut self.recv {
            decoder.restrict(max_body, max_chunk_ext);
        }
    }

    /// Bytes of the current body still to come when its length is known.
    pub fn body_remaining(&self) -> Option<u64> {
        match &self.recv {
            Recv::Body(d) => d.remaining(),
            _ => Some(0),
        }
    }

    /// Whether the receive side is between requests with nothing buffered of the next one.
    pub fn is_idle(&self) -> bool {
        matches!(self.recv, Recv::Idle) && self.send == Send::Idle
    }

    /// Whether the current request itself asked for the connection to close after it
    /// (`Connection: close`, or HTTP/1.0 without keep-alive): a client that does sends nothing
    /// more on the connection (RFC 9112, Section 9.6).
    pub fn close_requested(&self) -> bool {
        self.keep == Keep::ClientCloses
    }

    /// Whether the last exchange ended with its request body not read to its end
    /// ([`Conn::finish`] closes such a connection): the rest of it may still be arriving.
    pub fn body_abandoned(&self) -> bool {
        matches!(self.recv, Recv::Abandoned)
    }

    /// Whether the connection will be kept open after the current exchange.
    pub fn keep_alive(&self) -> bool {
        self.keep == Keep::Alive
    }

    /// When the current phase times out: idle, head or body timeout. `None` while the request is
    /// with the handler or the response is being sent (the driver applies its write timeout).
    pub fn deadline(&self) -> Option<Instant> {
        let t = match self.recv {
            Recv::Idle if self.send == Send::Idle => self.timeouts.idle(),
            Recv::Head => self.timeouts.head(),
            Recv::Body(_) => self.timeouts.body(),
            _ => return None,
        };
        // A timeout too large to add ("never") means no deadline.
        self.since.checked_add(t)
    }

    // ---- mutators: the response -----------------------------------------------------------

    /// Writes `100 Continue` if the client asked for it and it was not sent yet. Call it when
    /// the handler first asks for body bytes.
    pub fn write_continue(&mut self, out: &mut BytesMut) {
        if std::mem::take(&mut self.continue_pending) {
            out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
    }

    /// Marks the connection to close after this exchange (e.g. graceful shutdown, or a body the
    /// driver will not read).
    pub fn set_close(&mut self) {
        self.close();
    }

    /// The connection closes after this exchange; a close the client asked for stays its own.
    #[inline]
    fn close(&mut self) {
        if self.keep == Keep::Alive {
            self.keep = Keep::Closes;
        }
    }

    /// Writes the status line and header section. `date` is the preformatted IMF-fixdate of the
    /// current second, `server` the Server header value; `headers` are the handler's fields,
    /// each checked (a name that is not a token or a value with CR, LF or another control byte
    /// is dropped: no response splitting). Returns whether body bytes should be written (false
    /// for HEAD, 204 and 304).
    pub fn start_response<'h>(
        &mut self,
        status: u16,
        headers: impl IntoIterator<Item = (&'h [u8], &'h [u8])>,
        len: BodyLen,
        date: &[u8],
        server: &[u8],
        out: &mut BytesMut,
    ) -> bool {
        let parts = Lines::Parts { date, server };
        self.encode_head::<true>(status, None, headers, len, parts, out)
    }

    /// The fast form of [`Conn::start_response`], for fields whose validity their types carry:
    /// the status line of a 200 with the Server and Date fields come preformatted as a
    /// [`Preamble`] (written whole for a 200, without its first line otherwise);
    /// `content_type` is the value of a Content-Type field and `headers` are further fields, as
    /// `http::HeaderName`/`http::HeaderValue` (whose constructors refuse a name that is not a
    /// token and a value with CR, LF or another control byte). Nothing is checked per byte, and
    /// nothing needs to be: no argument can split the response.
    pub fn start_response_prevalidated<'h>(
        &mut self,
        status: u16,
        content_type: Option<&HeaderValue>,
        headers: impl IntoIterator<Item = (&'h HeaderName, &'h HeaderValue)>,
        len: BodyLen,
        preamble: &Preamble,
        out: &mut BytesMut,
    ) -> bool {
        let fields = headers
            .into_iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()));
        self.encode_head::<false>(
            status,
            content_type.map(HeaderValue::as_bytes),
            fields,
            len,
            Lines::Ready(preamble.as_bytes()),
            out,
        )
    }

    /// Few and mostly fixed-size copies: the status line and the Server and Date fields come as
    /// one preformatted block, Content-Length as one piece.
    fn encode_head<'h, const CHECK: bool>(
        &mut self,
        status: u16,
        content_type: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'h [u8], &'h [u8])>,
        len: BodyLen,
        preamble: Lines<'_>,
        out: &mut BytesMut,
    ) -> bool {
        if std::mem::take(&mut self.continue_pending) {
            // The handler answered without reading the body the client is holding back: the
            // client may or may not send it now, so the stream cannot be trusted after this.
            self.close();
        }
        let no_body = status == 204 || status == 304 || (100..200).contains(&status);
        let mut w = HeadWriter::new(out, 256);
        match preamble {
            Lines::Ready(block) => {
                debug_assert!(
                    block.starts_with(OK_LINE),
                    "preamble without its status line"
                );
                if status == 200 {
                    w.put(block);
                } else {
                    put_status_line(status, &mut w);
                    w.put(block.get(OK_LINE.len()..).unwrap_or_default());
                }
            }
            Lines::Parts { date, server } => {
                put_status_line(status, &mut w);
                w.put(b"Server: ");
                w.put(server);
                w.put(b"\r\nDate: ");
                w.put(date);
                w.put(b"\r\n");
            }
        }
        self.send = match len {
            _ if no_body => Send::NoBody,
            BodyLen::Known(n) => {
                put_content_length(n, &mut w);
                if self.head_request {
                    Send::NoBody
                } else {
                    Send::Length(n)
                }
            }
            BodyLen::Unknown if self.head_request => Send::NoBody,
            BodyLen::Unknown if self.version == Version::Http11 => {
                w.put(b"Transfer-Encoding: chunked\r\n");
                Send::Chunked
            }
            BodyLen::Unknown => {
                self.close();
                Send::Close
            }
        };
        if self.keep != Keep::Alive {
            w.put(b"Connection: close\r\n");
        } else if self.version == Version::Http10 {
            w.put(b"Connection: keep-alive\r\n");
        }
        if let Some(value) = content_type {
            if !CHECK || valid_field(b"content-type", value) {
                w.put(b"Content-Type: ");
                w.put(value);
                w.put(b"\r\n");
            }
        }
        for (name, value) in headers {
            if !CHECK || valid_field(name, value) {
                w.put_name(name);
                w.put(b": ");
                w.put(value);
                w.put(b"\r\n");
            }
        }
        w.put(b"\r\n");
        w.finish();
        !matches!(self.send, Send::NoBody)
    }

    /// Frames `len` body bytes that the caller writes right after this call (chunk size line for
    /// chunked responses). Returns `Ok(false)` when the body is suppressed (HEAD, 204, 304) and
    /// the bytes must not be written.
    pub fn data_prefix(&mut self, len: usize, out: &mut BytesMut) -> Result<bool, LengthMismatch> {
        match &mut self.send {
            Send::NoBody | Send::Idle => Ok(false),
            Send::Length(remaining) => {
                let len = len as u64;
                if len > *remaining {
                    self.close();
                    return Err(LengthMismatch);
                }
                *remaining -= len;
                Ok(true)
            }
            Send::Chunked => {
                if len > 0 {
                    let mut hex = [0u8; 16];
                    out.extend_from_slice(hex_len(len, &mut hex));
                    out.extend_from_slice(b"\r\n");
                }
                Ok(true)
            }
            Send::Close => Ok(true),
        }
    }

    /// Ends the framing of body bytes written after [`Conn::data_prefix`].
    pub fn data_suffix(&mut self, len: usize, out: &mut BytesMut) {
        if self.send == Send::Chunked && len > 0 {
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The most of a request body the handler left unread that a connection reads and drops to
    /// stay open; a larger (or longer) remainder closes the connection after the response.
    pub const DISCARD_MAX: u64 = 64 * 1024;

    /// Nothing will read the rest of the request body: decides, before the response head goes
    /// out (so that it can say `Connection: close`), whether the connection survives it. A known
    /// remainder above [`Conn::DISCARD_MAX`] closes it. A chunked remainder has no size to judge
    /// by, so what `buf` already holds of it is dropped now: if the body ends there (a small
    /// upload that came with its head) the connection is kept, as for a Content-Length body of
    /// the same size, and if more than `DISCARD_MAX` is seen it closes. A chunked body still
    /// arriving is left to [`Conn::discard_unread`] after the response.
    #[cold]
    pub fn judge_unread_body(&mut self, buf: &mut BytesMut, now: Instant) {
        match self.body_remaining() {
            Some(n) if n > Self::DISCARD_MAX => self.set_close(),
            Some(_) => {}
            None => {
                // Over, too long (closes), broken (closes), or still arriving (read later).
                let _ = self.drop_body(buf, now, &mut 0);
            }
        }
    }

    /// After the response, drops what `buf` holds of a request body the handler left unread,
    /// so that the connection can take the next request. [`Discard::NeedMore`]: the body goes on
    /// beyond `buf`; the driver sends the response (see [`Conn::end_body`]), reads more input
    /// and calls again with the same `dropped` count. [`Discard::Settled`]: the body is over, or
    /// the connection is to close (above [`Conn::DISCARD_MAX`] dropped or declared, a broken
    /// body, or `Connection: close` already decided).
    pub fn discard_unread(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
        dropped: &mut u64,
    ) -> Discard {
        if self.body_done() || self.keep != Keep::Alive {
            return Discard::Settled;
        }
        if self.body_remaining().is_some_and(|n| n > Self::DISCARD_MAX) {
            self.set_close();
            return Discard::Settled;
        }
        self.drop_body(buf, now, dropped)
    }

    /// Decodes and drops body bytes from `buf` while they stay within
    /// [`Conn::DISCARD_MAX`] in all; closes the connection past that or on a broken body.
    fn drop_body(&mut self, buf: &mut BytesMut, now: Instant, dropped: &mut u64) -> Discard {
        loop {
            match self.poll_body(buf, now) {
                Ok(BodyEvent::Data(d)) => {
                    *dropped += d.len() as u64;
                    if *dropped > Self::DISCARD_MAX {
                        self.set_close();
                        return Discard::Settled;
                    }
                }
                Ok(BodyEvent::End) => return Discard::Settled,
                Ok(BodyEvent::NeedMore) => return Discard::NeedMore,
                Err(_) => {
                    self.set_close();
                    return Discard::Settled;
                }
            }
        }
    }

    /// Ends a complete response body now, before [`Conn::finish`]: writes the last chunk of a
    /// chunked body (nothing for other framings). For a driver that sends the response and then
    /// waits on the request body the handler left unread: the client may hold back the rest of
    /// its upload until it has the whole response.
    pub fn end_body(&mut self, out: &mut BytesMut) {
        if self.send == Send::Chunked {
            out.extend_from_slice(b"0\r\n\r\n");
            self.send = Send::NoBody;
        }
    }

    /// Completes the response and decides what comes next. A body still unread at this point
    /// forces a close: the driver drains small leftovers with [`Conn::poll_body`] before calling
    /// this if it wants to keep the connection.
    pub fn finish(&mut self, out: &mut BytesMut, now: Instant) -> Result<Next, LengthMismatch> {
        let send = std::mem::replace(&mut self.send, Send::Idle);
        // The exchange is over: a later rejection must not take it for a HEAD.
        self.head_request = false;
        let mut result = Ok(());
        match send {
            Send::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
            Send::Length(n) if n > 0 => {
                self.close();
                result = Err(LengthMismatch);
            }
            Send::Close => self.close(),
            _ => {}
        }
        let next = match self.recv {
            Recv::Done if self.keep == Keep::Alive => {
                self.recv = Recv::Idle;
                self.since = now;
                Next::KeepAlive
            }
            _ => {
                self.recv = match self.recv {
                    Recv::Body(_) => Recv::Abandoned,
                    _ => Recv::Closed,
                };
                self.close();
                Next::Close
            }
        };
        result.map(|()| next)
    }

    /// Writes a complete error response for `err` (status, a one-line text body,
    /// `Connection: close`) and closes the receive side.
    pub fn error_response(&mut self, err: &Error, date: &[u8], server: &[u8], out: &mut BytesMut) {
        self.reject(err.status(), date, server, out);
    }

    /// Writes a complete response with `status`, its reason phrase as a text body and
    /// `Connection: close`, and closes the receive side. For conditions the driver detects
    /// (408 on a head timeout, 503 when overloaded). When the current request is a HEAD (e.g. its
    /// body was malformed), the text body is left out (RFC 9110 §9.3.2).
    pub fn reject(&mut self, status: u16, date: &[u8], server: &[u8], out: &mut BytesMut) {
        self.recv = Recv::Closed;
        self.close();
        self.send = Send::Idle;
        self.continue_pending = false;
        let reason = reason(status);
        let ct: &[u8] = b"text/plain; charset=utf-8";
        let with_body = self.start_response(
            status,
            [(&b"Content-Type"[..], ct)],
            BodyLen::Known(reason.len() as u64 + 1),
            date,
            server,
            out,
        );
        if with_body {
            out.extend_from_slice(reason.as_bytes());
            out.extend_from_slice(b"\n");
        }
        self.send = Send::Idle;
    }
}

/// What [`Conn::discard_unread`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// Nothing more to read for this body: it is over, or the connection is to close.
    Settled,
    /// The body goes on beyond the input given: read more and call again.
    NeedMore,
}

/// The Server and Date fields: preformatted, or to be formatted.
enum Lines<'a> {
    Ready(&'a [u8]),
    Parts { date: &'a [u8], server: &'a [u8] },
}

/// The preformatted opening of a 200 response, `HTTP/1.1 200 OK\r\nServer: …\r\nDate: …\r\n`,
/// for [`Conn::start_response_prevalidated`]: a driver keeps one and refreshes its date once a
/// second. Its Server value is checked when it is made and its date when it is set, so the
/// block can be written into every response without looking at it again.
#[derive(Debug, Clone)]
pub struct Preamble {
    block: Vec<u8>,
    /// Where the date starts in `block`.
    date_at: usize,
}

impl Preamble {
    /// The longest Server value.
    pub const MAX_SERVER: usize = 64;

    /// The block for `server` (1 to [`Preamble::MAX_SERVER`] visible ASCII characters or
    /// spaces), with `date` (an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`).
    pub fn new(server: &str, date: &[u8; 29]) -> Result<Preamble, canter_http::ConfigError> {
        let printable = |s: &[u8]| s.iter().all(|b| (0x20..0x7f).contains(b));
        if server.is_empty() || server.len() > Self::MAX_SERVER || !printable(server.as_bytes()) {
            return Err(canter_http::ConfigError::new(
                "server_name",
                format!(
                    "{server:?} must be 1 to {} printable ASCII characters",
                    Self::MAX_SERVER
                ),
            ));
        }
        let mut block = Vec::with_capacity(OK_LINE.len() + server.len() + 50);
        block.extend_from_slice(OK_LINE);
        block.extend_from_slice(b"Server: ");
        block.extend_from_slice(server.as_bytes());
        block.extend_from_slice(b"\r\nDate: ");
        let date_at = block.len();
        block.extend_from_slice(&[b' '; 29]);
        block.extend_from_slice(b"\r\n");
        let mut preamble = Preamble { block, date_at };
        preamble.set_date(date)?;
        Ok(preamble)
    }

    /// The block with one more field, `name: value`, after the date: a field every response
    /// of a connection carries (`Alt-Svc` over TLS) is then written with the block, at no cost
    /// per response. `name` must be a token and `value` printable ASCII, spaces or tabs.
    pub fn with_field(
        mut self,
        name: &str,
        value: &[u8],
    ) -> Result<Preamble, canter_http::ConfigError> {
        if !valid_field(name.as_bytes(), value) || value.iter().any(|&b| b >= 0x80) {
            return Err(canter_http::ConfigError::new(
                "preamble field",
                format!("{name:?} must be a token and its value printable ASCII"),
            ));
        }
        self.block.extend_from_slice(name.as_bytes());
        self.block.extend_from_slice(b": ");
        self.block.extend_from_slice(value);
        self.block.extend_from_slice(b"\r\n");
        Ok(self)
    }

    /// Replaces the date (refused, and the old one kept, unless it is printable ASCII).
    pub fn set_date(&mut self, date: &[u8; 29]) -> Result<(), canter_http::ConfigError> {
        if !date.iter().all(|b| (0x20..0x7f).contains(b)) {
            return Err(canter_http::ConfigError::new(
                "date",
                "must be printable ASCII",
            ));
        }
        self.block[self.date_at..self.date_at + 29].copy_from_slice(date);
        Ok(())
    }

    /// The whole block.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.block
    }
}

/// Response header fields come from the framework's validated types; this is the last line of
/// defence against response splitting if a caller passes raw bytes.
fn valid_field(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty()
        && name.iter().all(|&b| crate::body::is_tchar(b))
        && value
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn hex_len(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

/// The whole status line (without CRLF) of the most common statuses, copied in one go.
/// The first line of the preformatted block [`Conn::start_response_prevalidated`] takes.
pub const OK_LINE: &[u8] = b"HTTP/1.1 200 OK\r\n";

fn put_status_line(status: u16, w: &mut HeadWriter<'_>) {
    match status_line(status) {
        Some(line) => w.put(line),
        None => {
            w.put(b"HTTP/1.1 ");
            put_status(status, w);
        }
    }
    w.put(b"\r\n");
}

/// `Content-Length: n\r\n`. Lengths below 10,000 (every small response) are appended from
/// constant pieces: assembling the line on the stack and copying it out cost a store-forwarding
/// stall per response (narrow stores read back by a wide load), several times the work itself.
fn put_content_length(n: u64, w: &mut HeadWriter<'_>) {
    w.put(b"Content-Length: ");
    match n {
        0..=9 => w.put(&[b'0' + n as u8]),
        10..=99 => w.put(&DIGIT_PAIRS[n as usize]),
        100..=999 => {
            w.put(&[b'0' + (n / 100) as u8]);
            w.put(&DIGIT_PAIRS[(n % 100) as usize]);
        }
        1000..=9999 => {
            w.put(&DIGIT_PAIRS[(n / 100) as usize]);
            w.put(&DIGIT_PAIRS[(n % 100) as usize]);
        }
        _ => put_digits(n, w),
    }
    w.put(b"\r\n");
}

/// The decimal digits of `n`, assembled on the stack from the right and appended in one copy.
fn put_digits(n: u64, w: &mut HeadWriter<'_>) {
    // Room for u64::MAX (20 digits).
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    // Two digits per division.
    while n >= 100 {
        let pair = (n % 100) as usize;
        n /= 100;
        at -= 2;
        digits[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair]);
    }
    if n >= 10 {
        at -= 2;
        digits[at..at + 2].copy_from_slice(&DIGIT_PAIRS[n as usize]);
    } else {
        at -= 1;
        digits[at] = b'0' + n as u8;
    }
    w.put(&digits[at..]);
}

/// "00" to "99".
static DIGIT_PAIRS: [[u8; 2]; 100] = {
    let mut pairs = [[0u8; 2]; 100];
    let mut i = 0;
    while i < 100 {
        pairs[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    pairs
};

fn status_line(status: u16) -> Option<&'static [u8]> {
    Some(match status {
        200 => b"HTTP/1.1 200 OK",
        201 => b"HTTP/1.1 201 Created",
        204 => b"HTTP/1.1 204 No Content",
        304 => b"HTTP/1.1 304 Not Modified",
        400 => b"HTTP/1.1 400 Bad Request",
        404 => b"HTTP/1.1 404 Not Found",
        _ => return None,
    })
}

fn put_status(status: u16, w: &mut HeadWriter<'_>) {
    let status = if (100..1000).contains(&status) {
        status
    } else {
        500
    };
    w.put(itoa::Buffer::new().format(status).as_bytes());
    w.put(b" ");
    w.put(reason(status).as_bytes());
}

/// Appends a response head to a buffer: the pieces go into capacity reserved up front, and the
/// buffer's length is set once, by [`HeadWriter::finish`]. With `extend_from_slice` per piece,
/// each piece checked the capacity and stored the length, and the next piece's address waited
/// for that store to be loaded back.
struct HeadWriter<'a> {
    out: &'a mut BytesMut,
    /// Where the next piece goes; every byte of `out` before it has been written.
    at: usize,
}

impl<'a> HeadWriter<'a> {
    /// A writer appending to `out`, with room for `reserve` bytes before it has to grow it.
    #[inline(always)]
    fn new(out: &'a mut BytesMut, reserve: usize) -> HeadWriter<'a> {
        out.reserve(reserve);
        let at = out.len();
        HeadWriter { out, at }
    }

    #[inline(always)]
    fn put(&mut self, piece: &[u8]) {
        let end = self.at + piece.len();
        if end > self.out.capacity() {
            self.grow(piece.len());
        }
        // SAFETY: `at + piece.len()` is within the capacity (checked above; `grow` makes room),
        // so the destination is inside the buffer's allocation, and it cannot overlap `piece`,
        // which the caller lends while the buffer is borrowed mutably here.
        unsafe {
            std::ptr::copy_nonoverlapping(
                piece.as_ptr(),
                self.out.as_mut_ptr().add(self.at),
                piece.len(),
            );
        }
        self.at += piece.len();
    }

    /// A field name in the one case every field of the head is written in: each word
    /// capitalized (`Content-Type`, `Last-Modified`, `X-Request-Id`), and the few names whose
    /// usual spelling is not that (`ETag`, `WWW-Authenticate`) as they are usually spelled.
    /// Names are case-insensitive (RFC 9110 §5.1); this is for the people and tools that read
    /// them, as nginx writes its own.
    #[inline]
    fn put_name(&mut self, name: &[u8]) {
        if let Some(known) = irregular_name(name) {
            self.put(known);
            return;
        }
        let start = self.at;
        self.put(name);
        // SAFETY: `start..self.at` was written by `put` just now: initialized bytes inside the
        // buffer's allocation, borrowed mutably through `self.out`.
        let written =
            unsafe { std::slice::from_raw_parts_mut(self.out.as_mut_ptr().add(start), name.len()) };
        let mut word_start = true;
        for b in written {
            if word_start {
                b.make_ascii_uppercase();
            } else {
                b.make_ascii_lowercase();
            }
            word_start = *b == b'-';
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        // SAFETY: every byte before `at` has been written (the invariant of `at`), and `at` is
        // within the capacity.
        unsafe { self.out.set_len(self.at) };
        self.out.reserve(n.max(256));
    }

    /// Makes the written pieces part of the buffer.
    #[inline(always)]
    fn finish(self) {
        // SAFETY: as in `grow`.
        unsafe { self.out.set_len(self.at) };
    }
}

/// The usual spelling of the field names that capitalizing each word gets wrong.
#[inline]
fn irregular_name(name: &[u8]) -> Option<&'static [u8]> {
    let known: &'static [u8] = match name.len() {
        2 => b"TE",
        3 => b"DNT",
        4 => b"ETag",
        11 => b"Content-MD5",
        16 if name.first().is_some_and(|b| b.eq_ignore_ascii_case(&b'w')) => b"WWW-Authenticate",
        16 => b"X-XSS-Protection",
        _ => return None,
    };
    name.eq_ignore_ascii_case(known).then_some(known)
}

/// The reason phrase of a status code ("" for unknown codes, which RFC 9112 allows).
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that has parsed the head at the start of `input`, and what is left of it.
    fn after_head(input: &str) -> (Conn, BytesMut, Instant) {
        let now = Instant::now();
        let mut conn = Conn::new(Limits::default(), Timeouts::default(), now);
        let mut buf = BytesMut::from(input.as_bytes());
        let head = conn
            .poll_request(&mut buf, now)
            .expect("valid")
            .expect("whole");
        drop(head);
        (conn, buf, now)
    }

    /// The keep-or-close rule for a body the handler left unread, decided without a socket:
    /// before the head (`judge_unread_body`) and after it (`discard_unread`).
    #[test]
    fn an_unread_body_keeps_the_connection_only_when_small() {
        let big = (Conn::DISCARD_MAX + 1).to_string();
        // Declared above the bound: closes before anything is read.
        let (mut c, mut buf, now) = after_head(&format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {big}\r\n\r\nabc"
        ));
        c.judge_unread_body(&mut buf, now);
        assert!(!c.keep_alive());
        assert_eq!(c.discard_unread(&mut buf, now, &mut 0), Discard::Settled);

        // Small and all there, with the next request behind it: dropped, kept, the next
        // request untouched.
        let (mut c, mut buf, now) = after_head(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n",
        );
        c.judge_unread_body(&mut buf, now);
        assert!(c.keep_alive());
        assert_eq!(c.discard_unread(&mut buf, now, &mut 0), Discard::Settled);
        assert!(c.keep_alive() && c.body_done());
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");

        // Small but still arriving: more is read after the response, then kept.
        let (mut c, mut buf, now) =
            after_head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789");
        c.judge_unread_body(&mut buf, now);
        assert!(c.keep_alive());
        let mut dropped = 0;
        assert_eq!(
            c.discard_unread(&mut buf, now, &mut dropped),
            Discard::NeedMore
        );
        buf.extend_from_slice(&[b'x'; 990]);
        assert_eq!(
            c.discard_unread(&mut buf, now, &mut dropped),
            Discard::Settled
        );
        assert_eq!(dropped, 1000);
        assert!(c.keep_alive() && c.body_done());

        // Chunked and complete in the buffer: dropped before the head goes out, kept.
        let (mut c, mut buf, now) = after_head(
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        );
        c.judge_unread_body(&mut buf, now);
        assert!(c.keep_alive() && c.body_done());

        // Chunked and still arriving: kept while it stays small.
        let (mut c, mut buf, now) =
            after_head("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
        c.judge_unread_body(&mut buf, now);
        assert!(c.keep_alive() && !c.body_done());
        let mut dropped = 0;
        assert_eq!(
            c.discard_unread(&mut buf, now, &mut dropped),
            Discard::NeedMore
        );
        buf.extend_from_slice(b"lo\r\n0\r\n\r\n");
        assert_eq!(
            c.discard_unread(&mut buf, now, &mut dropped),
            Discard::Settled
        );
        assert!(c.keep_alive() && c.body_done());

        // Chunked, and more than the bound already buffered: closes.
        let chunk = format!("{:x}\r\n{}\r\n", 8192, "c".repeat(8192));
        let (mut c, mut buf, now) = after_head(&format!(
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}",
            chunk.repeat(9)
        ));
        c.judge_unread_body(&mut buf, now);
        assert!(!c.keep_alive());

        // Chunked and broken: closes.
        let (mut c, mut buf, now) =
            after_head("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        c.judge_unread_body(&mut buf, now);
        assert!(!c.keep_alive());
    }

    /// What a driver needs to close well: whether the client asked for the close itself, and
    /// whether the exchange ended with its body unread (so more of it may still arrive).
    #[test]
    fn the_close_says_whether_the_client_asked_and_what_it_left_unread() {
        let date = b"Sun, 22 Nov 2026 12:00:00 GMT";
        let answer = |c: &mut Conn, now| {
            let mut out = BytesMut::new();
            c.start_response(200, [], BodyLen::Known(0), date, b"s", &mut out);
            c.finish(&mut out, now).expect("complete")
        };
        for (request, asked) in [
            (
                "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                true,
            ),
            ("GET / HTTP/1.0\r\n\r\n", true),
            ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", false),
            ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", false),
        ] {
            let (mut c, _, now) = after_head(request);
            assert_eq!(c.close_requested(), asked, "{request:?}");
            let next = answer(&mut c, now);
            assert_eq!(next == Next::Close, asked, "{request:?}");
            assert!(!c.body_abandoned(), "{request:?}");
        }
        // The server closing (an error, a drain) is not the client asking.
        let (mut c, _, _) = after_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        c.set_close();
        assert!(!c.close_requested());

        // A body left unread: the close follows, and the driver learns the body was given up.
        let (mut c, _, now) = after_head(
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\nab",
        );
        assert_eq!(answer(&mut c, now), Next::Close);
        assert!(c.body_done() && c.body_abandoned());
        // Read to its end: nothing was given up.
        let (mut c, mut buf, now) = after_head(
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nab",
        );
        while !c.body_done() {
            c.poll_body(&mut buf, now).expect("valid body");
        }
        assert_eq!(answer(&mut c, now), Next::Close);
        assert!(!c.body_abandoned());
    }

    #[test]
    fn prevalidated_head_uses_the_block_whole_only_for_200() {
        let date = b"Sun, 22 Nov 2026 12:00:00 GMT";
        let block = Preamble::new("s", date).expect("valid");
        let lines = "Server: s\r\nDate: Sun, 22 Nov 2026 12:00:00 GMT\r\n";
        let now = Instant::now();
        for (status, first) in [
            (200, "HTTP/1.1 200 OK\r\n"),
            (404, "HTTP/1.1 404 Not Found\r\n"),
            (422, "HTTP/1.1 422 Unprocessable Content\r\n"),
        ] {
            let expected = format!("{first}{lines}");
            let mut conn = Conn::new(Limits::default(), Timeouts::default(), now);
            let mut out = BytesMut::new();
            let (name, value) = (
                HeaderName::from_static("x-a"),
                HeaderValue::from_static("1"),
            );
            let body = conn.start_response_prevalidated(
                status,
                Some(&HeaderValue::from_static("text/plain")),
                [(&name, &value)],
                BodyLen::Known(2),
                &block,
                &mut out,
            );
            assert!(body);
            let tail = "Content-Length: 2\r\nContent-Type: text/plain\r\nX-A: 1\r\n\r\n";
            assert_eq!(String::from_utf8_lossy(&out), format!("{expected}{tail}"));
        }
    }

    /// A Server value that could split a response or does not fit is refused when the block is
    /// made, and a date with a control byte when it is set (the old date stays).
    #[test]
    fn preamble_checks_what_goes_into_it() {
        let date = *b"Sun, 22 Nov 2026 12:00:00 GMT";
        let too_long = "s".repeat(Preamble::MAX_SERVER + 1);
        for bad in ["", "a\r\nX-Injected: 1", "caf\u{e9}", too_long.as_str()] {
            let err = Preamble::new(bad, &date).expect_err(bad);
            assert_eq!(err.setting(), "server_name");
        }
        let mut block = Preamble::new("edge/2.1 (test)", &date).expect("valid");
        let mut bad_date = *b"Mon, 23 Nov 2026 12:00:00 GMT";
        bad_date[5] = b'\n';
        assert!(block.set_date(&bad_date).is_err());
        block
            .set_date(b"Mon, 23 Nov 2026 12:00:01 GMT")
            .expect("valid");
        assert_eq!(
            block.as_bytes(),
            b"HTTP/1.1 200 OK\r\nServer: edge/2.1 (test)\r\nDate: Mon, 23 Nov 2026 12:00:01 GMT\r\n"
        );
    }

    /// A field added to the block follows the date, which can still be replaced; a name that
    /// is not a token or a value with a control byte or non-ASCII is refused.
    #[test]
    fn preamble_takes_a_field_after_the_date() {
        let date = *b"Sun, 22 Nov 2026 12:00:00 GMT";
        let base = Preamble::new("s", &date).expect("valid");
        let mut block = base
            .clone()
            .with_field("Alt-Svc", b"h3=\":443\"; ma=86400")
            .expect("valid");
        block
            .set_date(b"Mon, 23 Nov 2026 12:00:01 GMT")
            .expect("valid");
        assert_eq!(
            block.as_bytes(),
            &b"HTTP/1.1 200 OK\r\nServer: s\r\nDate: Mon, 23 Nov 2026 12:00:01 GMT\r\nAlt-Svc: h3=\":443\"; ma=86400\r\n"[..]
        );
        for (name, value) in [
            ("Alt Svc", &b"x"[..]),
            ("", b"x"),
            ("X-A", b"1\r\nX-Injected: 1"),
            ("X-A", "caf\u{e9}".as_bytes()),
        ] {
            assert!(
                base.clone().with_field(name, value).is_err(),
                "{name:?} {value:?}"
            );
        }
    }

    /// Every field name goes out in one case: each word capitalized, whatever case it came in,
    /// and the irregular ones as usually spelled.
    #[test]
    fn field_names_are_written_in_one_case() {
        for (given, written) in [
            ("etag", "ETag"),
            ("ETAG", "ETag"),
            ("last-modified", "Last-Modified"),
            ("accept-ranges", "Accept-Ranges"),
            ("x-request-id", "X-Request-Id"),
            ("X-REQUEST-ID", "X-Request-Id"),
            ("www-authenticate", "WWW-Authenticate"),
            ("x-xss-protection", "X-XSS-Protection"),
            ("content-md5", "Content-MD5"),
            ("te", "TE"),
            ("dnt", "DNT"),
            ("vary", "Vary"),
            ("x", "X"),
            ("a-", "A-"),
            ("-a", "-A"),
            ("x--y", "X--Y"),
            ("abcdefghijklmnop", "Abcdefghijklmnop"),
            ("x_y-1z", "X_y-1z"),
        ] {
            let mut out = BytesMut::new();
            let mut w = HeadWriter::new(&mut out, 0);
            w.put(b"p");
            w.put_name(given.as_bytes());
            w.finish();
            assert_eq!(
                String::from_utf8_lossy(&out),
                format!("p{written}"),
                "{given}"
            );
        }
    }

    /// Heads longer than the capacity reserved up front, appended after what the buffer
    /// already holds (the responses before them in a pipelined batch): the writer grows the
    /// buffer mid-head and keeps every byte.
    #[test]
    fn heads_that_outgrow_the_reservation() {
        let now = Instant::now();
        for (before, value_len) in [(0, 200), (100, 300), (4_000, 5_000), (8_191, 70_000)] {
            let mut conn = Conn::new(Limits::default(), Timeouts::default(), now);
            let mut out = BytesMut::with_capacity(before + 1);
            out.extend_from_slice(&b"p".repeat(before));
            let value = "v".repeat(value_len);
            let server = "s".repeat(value_len / 3);
            let fields = [
                (&b"x-long"[..], value.as_bytes()),
                (&b"x-short"[..], &b"1"[..]),
            ];
            let date = b"Sun, 22 Nov 2026 12:00:00 GMT";
            let body = conn.start_response(
                201,
                fields,
                BodyLen::Known(12_345),
                date,
                server.as_bytes(),
                &mut out,
            );
            assert!(body);
            let expected = format!(
                "{}HTTP/1.1 201 Created\r\nServer: {server}\r\nDate: {}\r\n\
                 Content-Length: 12345\r\nX-Long: {value}\r\nX-Short: 1\r\n\r\n",
                "p".repeat(before),
                String::from_utf8_lossy(date),
            );
            assert_eq!(out.len(), expected.len(), "{before} + {value_len}");
            assert!(out[..] == *expected.as_bytes(), "{before} + {value_len}");
        }
    }

    #[test]
    fn content_length_line() {
        for (n, line) in [
            (0, "Content-Length: 0\r\n"),
            (7, "Content-Length: 7\r\n"),
            (10, "Content-Length: 10\r\n"),
            (13, "Content-Length: 13\r\n"),
            (99, "Content-Length: 99\r\n"),
            (100, "Content-Length: 100\r\n"),
            (4_096, "Content-Length: 4096\r\n"),
            (10_007, "Content-Length: 10007\r\n"),
            (1_000_000, "Content-Length: 1000000\r\n"),
            (u64::MAX, "Content-Length: 18446744073709551615\r\n"),
        ] {
            let mut out = BytesMut::new();
            let mut w = HeadWriter::new(&mut out, 0);
            put_content_length(n, &mut w);
            w.finish();
            assert_eq!(&out[..], line.as_bytes());
        }
        // Every length up to 100,000 against the standard formatting.
        for n in 0..100_000u64 {
            let mut out = BytesMut::new();
            let mut w = HeadWriter::new(&mut out, 0);
            put_content_length(n, &mut w);
            w.finish();
            assert_eq!(out, format!("Content-Length: {n}\r\n").as_bytes(), "{n}");
        }
    }
}
