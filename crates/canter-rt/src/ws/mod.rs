//! WebSocket connections on the runtime: what a handler holds ([`WebSocket`], its halves
//! [`WsSender`] and [`WsReceiver`], [`Message`]); the driver that runs the connection after
//! the upgrade is `ws/driver.rs`.
//!
//! The connection stays one task: after the 101 the HTTP/1.1 driver hands its transport and
//! its link (buffers, write timeout, read budget) to the WebSocket driver, which runs the sans-IO engine
//! ([`canter_ws::Connection`]) and polls the handler's future itself. No channel and no second
//! task sit between the socket and the handler: a message read is put where
//! [`WebSocket::recv`] takes it and the handler is polled again in the same turn; what
//! [`WebSocket::send`] encodes is written when the handler yields. A handler may also hand a
//! half to a task of its own ([`WebSocket::split`]). What such a task sends on a plain TCP
//! connection whose output is all out is written by the worker's flusher task at the end of
//! the worker's turn, one `send` per connection for everything sent to it in that turn, so a
//! broadcast to many connections wakes none of their tasks (the socket's buffer full, a TLS
//! connection, or output still queued: the connection's task is woken and writes it).
//!
//! Bounds, each with its reason:
//! - **Sending** waits while the output holds [`WsConfig::high_water`] bytes or more, until
//!   the peer has taken it down to a quarter of that; a peer that takes nothing for the write
//!   timeout is cut.
//! - **Reading** pauses while [`WsConfig::read_buffer`] bytes of messages wait for the handler.
//! - **Messages and frames** over [`WsConfig::limits`] fail the connection with close code 1009
//!   before their payload is read; protocol errors with 1002, bad UTF-8 with 1007.
//! - **Keepalive**: after [`WsConfig::ping_interval`] without input a ping goes out; without
//!   input for [`WsConfig::ping_timeout`] after it the connection is dropped.
//! - **The close handshake**: after this end's close the peer has [`WsConfig::close_timeout`]
//!   to answer before the connection is dropped.
//! - **Shutdown**: a draining server closes each WebSocket with 1001 (going away).

pub(crate) mod driver;
#[cfg(any(feature = "http2", feature = "http3"))]
pub(crate) mod h2;
pub(crate) mod hub;
pub(crate) mod upgrade;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use canter_ws::deflate::{DeflateConfig, Deflater};
use canter_ws::frame::{self, Opcode};
use canter_ws::{close, Connection, Limits};

/// Text of a WebSocket message: UTF-8, checked once (as it arrived, or when it was made).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Text(Bytes);

impl Text {
    /// Text the engine validated as it arrived.
    pub(crate) fn validated(bytes: Bytes) -> Text {
        Text(bytes)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // SAFETY: a `Text` is made only from a `str`/`String`, from bytes that passed
        // `std::str::from_utf8` (`TryFrom<Bytes>`), or from a message whose UTF-8 the engine
        // validated as it arrived; the bytes are never changed after.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    /// The UTF-8 bytes, without a copy.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text(Bytes::from(s))
    }
}

impl From<&'static str> for Text {
    fn from(s: &'static str) -> Text {
        Text(Bytes::from_static(s.as_bytes()))
    }
}

impl TryFrom<Bytes> for Text {
    type Error = std::str::Utf8Error;
    fn try_from(b: Bytes) -> Result<Text, Self::Error> {
        std::str::from_utf8(&b)?;
        Ok(Text(b))
    }
}

/// Shared frames at least this large are queued by reference; smaller ones are copied.
pub(crate) const SHARE_MIN: usize = 16 * 1024;

/// A message encoded once for many connections (a broadcast): the server's frame, and, if asked
/// for, the same message compressed alone (its own deflate stream), which goes to the
/// connections whose permessage-deflate resets the server's context per message
/// (`server_no_context_takeover`) under a window no smaller; the others get the plain frame.
/// Cloning shares the bytes.
///
/// ```
/// use canter_rt::ws::Prepared;
///
/// let tick = Prepared::text("{\"price\": 101.25}");
/// let news = Prepared::text(&"{\"headline\": \"…\"}".repeat(100)).compressed(6);
/// # let _ = (tick, news);
/// ```
#[derive(Clone)]
pub struct Prepared {
    plain: Bytes,
    compressed: Option<(u8, Bytes)>,
    text: bool,
    payload: Bytes,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("text", &self.text)
            .field("len", &self.payload.len())
            .field(
                "compressed",
                &self.compressed.as_ref().map(|(_, c)| c.len()),
            )
            .finish()
    }
}

impl Prepared {
    /// A text message.
    pub fn text(text: &str) -> Prepared {
        Prepared::frame(true, Bytes::copy_from_slice(text.as_bytes()))
    }

    /// A binary message.
    pub fn binary(data: impl Into<Bytes>) -> Prepared {
        Prepared::frame(false, data.into())
    }

    fn frame(text: bool, payload: Bytes) -> Prepared {
        let opcode = if text { Opcode::Text } else { Opcode::Binary };
        let mut plain = Vec::with_capacity(payload.len() + 10);
        frame::put_header(&mut plain, true, false, opcode, payload.len() as u64, None);
        plain.extend_from_slice(&payload);
        Prepared {
            plain: plain.into(),
            compressed: None,
            text,
            payload,
        }
    }

    /// Adds the compressed form (deflate at `level`, 0–9, with a 32 KiB window).
    pub fn compressed(mut self, level: u32) -> Prepared {
        const BITS: u8 = 15;
        let mut body = Vec::with_capacity(self.payload.len() / 2 + 16);
        Deflater::new(level, BITS, true).compress(&self.payload, &mut body);
        let opcode = if self.text {
            Opcode::Text
        } else {
            Opcode::Binary
        };
        let mut frame = Vec::with_capacity(body.len() + 10);
        frame::put_header(&mut frame, true, true, opcode, body.len() as u64, None);
        frame.extend_from_slice(&body);
        self.compressed = Some((BITS, frame.into()));
        self
    }

    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }
}

/// A close frame's contents: its code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// The status code (RFC 6455, Section 7.4).
    pub code: u16,
    /// The reason, at most 123 bytes of UTF-8 (cut to fit when sent).
    pub reason: String,
}

/// A WebSocket message. [`WebSocket::recv`] yields `Text`, `Binary` and, once, `Close`: pings
/// are answered by the connection and pongs taken by it, so an echo loop never echoes them.
/// All five can be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message.
    Text(Text),
    /// A binary message.
    Binary(Bytes),
    /// A ping, at most 125 bytes.
    Ping(Bytes),
    /// A pong, at most 125 bytes.
    Pong(Bytes),
    /// The close: received, the peer's (its code and reason, if it gave any); sent, this end's
    /// (`None` is 1000, normal closure).
    Close(Option<CloseFrame>),
}

impl Message {
    /// The payload's length in bytes (0 for a close).
    pub fn len(&self) -> usize {
        match self {
            Message::Text(t) => t.0.len(),
            Message::Binary(b) | Message::Ping(b) | Message::Pong(b) => b.len(),
            Message::Close(_) => 0,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<String> for Message {
    fn from(s: String) -> Message {
        Message::Text(s.into())
    }
}

impl From<&'static str> for Message {
    fn from(s: &'static str) -> Message {
        Message::Text(s.into())
    }
}

impl From<Bytes> for Message {
    fn from(b: Bytes) -> Message {
        Message::Binary(b)
    }
}

impl From<Vec<u8>> for Message {
    fn from(b: Vec<u8>) -> Message {
        Message::Binary(b.into())
    }
}

/// Why a WebSocket operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WsError {
    /// The connection is closed, or this end sent its close: nothing more can be sent.
    Closed,
    /// The peer broke the protocol; the connection was closed with the code the error calls
    /// for (1002, 1007 or 1009).
    Protocol(canter_ws::Error),
    /// The connection ended without a close handshake: the peer vanished, reset, stopped
    /// reading past the write timeout, or stopped answering pings.
    Abnormal,
    /// A ping or pong over 125 bytes.
    ControlTooLong,
}

impl fmt::Display for WsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WsError::Closed => f.write_str("the WebSocket is closed"),
            WsError::Protocol(e) => write!(f, "the peer broke the protocol: {e}"),
            WsError::Abnormal => f.write_str("the connection ended without a close handshake"),
            WsError::ControlTooLong => f.write_str("a ping or pong payload is over 125 bytes"),
        }
    }
}

impl std::error::Error for WsError {}

/// A WebSocket connection's settings; [`WsConfig::default`] suits most, each field says its
/// default.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WsConfig {
    /// Frame, message and fragment limits (16 MiB frames, 16 MiB messages, 65,536 fragments).
    pub limits: Limits,
    /// Bytes that all WebSocket connections of a worker may hold at once in messages still
    /// being assembled (frames still arriving and the fragments so far; 64 MiB). A message
    /// that would take the worker past it fails its connection with 1013 (try again later):
    /// many large messages at once cost this much memory at most, never more.
    pub worker_budget: usize,
    /// Output bytes at or above which [`WebSocket::send`] waits (64 KiB).
    pub high_water: usize,
    /// Bytes of received messages held for the handler before reading pauses (64 KiB; one
    /// message is always taken whole, whatever its size under the limit).
    pub read_buffer: usize,
    /// permessage-deflate, if offered by the client (`None`: declined). On by default, with
    /// [`DeflateConfig::default`].
    pub deflate: Option<DeflateConfig>,
    /// Input-less time after which a ping goes out (`None`: never; default 30 s).
    pub ping_interval: Option<Duration>,
    /// Time after that ping within which some input must arrive (default 20 s).
    pub ping_timeout: Duration,
    /// Time the peer has to answer this end's close (default 5 s).
    pub close_timeout: Duration,
}

impl Default for WsConfig {
    fn default() -> Self {
        WsConfig {
            limits: Limits::default(),
            worker_budget: 64 << 20,
            high_water: 64 * 1024,
            read_buffer: 64 * 1024,
            deflate: Some(DeflateConfig::default()),
            ping_interval: Some(Duration::from_secs(30)),
            ping_timeout: Duration::from_secs(20),
            close_timeout: Duration::from_secs(5),
        }
    }
}

/// An accepted upgrade, carried by a 101 response's [`crate::Body::Upgrade`] to the protocol
/// driver, which switches the connection to WebSocket once the 101 is written. Made by
/// [`crate::WsUpgrade::on_upgrade`]; one pointer, so that it costs every other response
/// nothing.
pub struct Upgrade(pub(crate) Box<Accepted>);

/// The handler that runs on the socket after the switch.
pub(crate) type OnUpgrade = Box<dyn FnOnce(WebSocket) -> Pin<Box<dyn Future<Output = ()>>>>;

/// What the switch needs: the engine as negotiated, the settings, the handshake's answers and
/// the handler.
pub(crate) struct Accepted {
    pub(crate) engine: Connection,
    pub(crate) config: WsConfig,
    pub(crate) info: Rc<Info>,
    pub(crate) handler: OnUpgrade,
}

impl fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upgrade")
            .field("protocol", &self.0.info.protocol)
            .field("extensions", &self.0.info.extensions)
            .finish_non_exhaustive()
    }
}

/// What the handshake agreed.
#[derive(Debug, Default)]
pub(crate) struct Info {
    pub(crate) protocol: Option<String>,
    pub(crate) extensions: Option<String>,
    pub(crate) peer: Option<SocketAddr>,
}

/// The state the connection's driver (`ws/driver.rs`) and the handler's halves share (one
/// thread).
pub(crate) struct State {
    pub(crate) engine: Connection,
    /// Frames shared with other connections (a broadcast's, at least [`SHARE_MIN`] bytes),
    /// queued as they are, and their bytes; they go out before `out`, which was moved here
    /// whenever one was queued, so the order of sends holds.
    pub(crate) pieces: VecDeque<Bytes>,
    pub(crate) pieces_bytes: usize,
    /// Frames encoded by sends, not yet moved to the connection's output.
    pub(crate) out: Vec<u8>,
    /// What the connection's output held after its last write.
    pub(crate) queued: usize,
    pub(crate) high_water: usize,
    /// Received messages the handler has not taken, and their bytes.
    pub(crate) inbound: VecDeque<Message>,
    pub(crate) inbound_bytes: usize,
    pub(crate) read_buffer: usize,
    /// An error for the next `recv`, once.
    pub(crate) failure: Option<WsError>,
    /// The connection is over: sends fail, `recv` ends after what is left.
    pub(crate) ended: bool,
    /// The driver is polling the handler: a send or a take needs no wake-up of it.
    pub(crate) in_driver: bool,
    pub(crate) driver: Option<Waker>,
    pub(crate) recv_waiter: Option<Waker>,
    pub(crate) send_waiter: Option<Waker>,
    /// The socket, for the worker's flusher to write sends from other tasks to (plain TCP,
    /// once the driver's first output is out); cleared when the connection ends, before its
    /// transport is closed.
    pub(crate) direct: Option<RawFd>,
    /// In the worker's list for its flusher.
    pub(crate) corked: bool,
}

impl State {
    /// The output was all written: emptied, and freed when it had grown past [`OUT_KEEP`].
    pub(crate) fn out_written(&mut self) {
        self.out.clear();
        if self.out.capacity() > OUT_KEEP {
            self.out = Vec::new();
        }
    }

    pub(crate) fn wake_driver(&mut self) {
        if !self.in_driver {
            if let Some(w) = self.driver.take() {
                w.wake();
            }
        }
    }

    /// After a send: the driver polling the handler writes it when the handler yields; a send
    /// from another task goes to the worker's flusher when the connection can take it
    /// directly (see the module's documentation), else wakes the driver. A close always wakes
    /// the driver, which times the peer's answer.
    fn kick(state: &Rc<RefCell<State>>, close: bool) {
        let mut s = state.borrow_mut();
        if s.in_driver {
            return;
        }
        if !close && s.direct.is_some() && s.queued == 0 && s.pieces.is_empty() {
            if !s.corked {
                s.corked = true;
                drop(s);
                cork(state);
            }
            return;
        }
        if let Some(w) = s.driver.take() {
            w.wake();
        }
    }

    /// The flusher's write of a corked connection's output: straight to its socket when
    /// nothing is queued before it; whatever the socket does not take (full, or an error the
    /// driver will find) is left for the driver, which is woken.
    fn flush_corked(&mut self) {
        self.corked = false;
        if self.out.is_empty() {
            return;
        }
        if let (Some(fd), false, 0, true) =
            (self.direct, self.ended, self.queued, self.pieces.is_empty())
        {
            match send_now(fd, &self.out) {
                Ok(n) if n == self.out.len() => {
                    self.out_written();
                    if let Some(w) = self.send_waiter.take() {
                        w.wake();
                    }
                    return;
                }
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(_) => {}
            }
        }
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }

    fn room(&self) -> bool {
        self.out.len() + self.pieces_bytes + self.queued < self.high_water
    }

    fn encode_prepared(&mut self, p: &Prepared) -> Result<(), WsError> {
        if self.ended || self.engine.close_sent() {
            return Err(WsError::Closed);
        }
        let frame = match &p.compressed {
            Some((bits, frame)) if self.engine.accepts_shared(*bits) => frame,
            _ => &p.plain,
        };
        if frame.len() < SHARE_MIN {
            // Small: copied, as the connection's output would copy it anyway.
            self.engine
                .send_encoded(frame, &mut self.out)
                .map_err(|_| WsError::Closed)?;
        } else {
            if !self.out.is_empty() {
                let before = Bytes::from(std::mem::take(&mut self.out));
                self.pieces_bytes += before.len();
                self.pieces.push_back(before);
            }
            self.pieces_bytes += frame.len();
            self.pieces.push_back(frame.clone());
        }
        Ok(())
    }

    fn encode(&mut self, msg: Message) -> Result<(), WsError> {
        if self.ended || self.engine.close_sent() {
            return Err(WsError::Closed);
        }
        let out = &mut self.out;
        let done = match &msg {
            Message::Text(t) => self.engine.send_text(t.as_str(), out),
            Message::Binary(b) => self.engine.send_binary(b, out),
            Message::Ping(b) => self.engine.send_ping(b, out),
            Message::Pong(b) => self.engine.send_pong(b, out),
            Message::Close(why) => {
                let (code, reason) = why
                    .as_ref()
                    .map_or((close::NORMAL, ""), |c| (c.code, c.reason.as_str()));
                self.engine.close(code, reason, out);
                Ok(())
            }
        };
        done.map_err(|e| match e {
            canter_ws::Error::Closed => WsError::Closed,
            _ => WsError::ControlTooLong,
        })
    }
}

/// Output a connection keeps allocated between sends (more is freed once written).
pub(crate) const OUT_KEEP: usize = 32 * 1024;

thread_local! {
    /// This worker's connections whose output its flusher writes at the end of the turn.
    static CORKED: RefCell<Corked> = RefCell::new(Corked::default());
}

#[derive(Default)]
struct Corked {
    states: Vec<Rc<RefCell<State>>>,
    /// The flusher task's waker; `None` until the worker has one.
    flusher: Option<Waker>,
    started: bool,
}

/// Starts the worker's flusher task (once per worker thread). Called by a driver on the
/// worker's event loop before it lets the flusher write its connection.
pub(crate) fn start_flusher() {
    let start = CORKED.with(|c| !std::mem::replace(&mut c.borrow_mut().started, true));
    if start {
        tokio::task::spawn_local(flusher());
    }
}

/// Puts a connection into the flusher's list, waking the flusher for the first one.
fn cork(state: &Rc<RefCell<State>>) {
    let orphan = CORKED.with(|c| {
        let mut c = c.borrow_mut();
        match &c.flusher {
            Some(w) => {
                if c.states.is_empty() {
                    w.wake_by_ref();
                }
                c.states.push(state.clone());
                false
            }
            None => true,
        }
    });
    if orphan {
        // No flusher polled yet on this thread: the driver writes it.
        let mut s = state.borrow_mut();
        s.corked = false;
        if let Some(w) = s.driver.take() {
            w.wake();
        }
    }
}

/// The worker's flusher: each turn, the output of every connection corked since the last.
async fn flusher() {
    /// The flusher gone (its event loop dropped), the thread may run another event loop later
    /// (a server run on the caller's thread, started again): that one starts its own.
    struct Gone;
    impl Drop for Gone {
        fn drop(&mut self) {
            let old = CORKED.try_with(|c| c.try_borrow_mut().map(|mut c| std::mem::take(&mut *c)));
            drop(old);
        }
    }
    let _gone = Gone;
    let mut batch: Vec<Rc<RefCell<State>>> = Vec::new();
    poll_fn(|cx| {
        CORKED.with(|c| {
            let mut c = c.borrow_mut();
            std::mem::swap(&mut c.states, &mut batch);
            if !c.flusher.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                c.flusher = Some(cx.waker().clone());
            }
        });
        for state in batch.drain(..) {
            state.borrow_mut().flush_corked();
        }
        Poll::<()>::Pending
    })
    .await
}

/// One nonblocking `send` of `buf` to `fd`, `EINTR` retried.
fn send_now(fd: RawFd, buf: &[u8]) -> std::io::Result<usize> {
    crate::core::syscall::retry(|| {
        // SAFETY: `fd` is an open socket: `State::direct` holds it only while the connection's
        // transport is open (cleared by `Session::end`, which runs before the transport is
        // closed, on this same thread); the pointer and length describe `buf`, readable for
        // the call's duration.
        unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        }
    })
}

/// A WebSocket connection as its handler holds it.
///
/// ```no_run
/// use canter_rt::ws::{Message, WebSocket};
///
/// async fn echo(ws: WebSocket) {
///     while let Some(Ok(msg)) = ws.recv().await {
///         if let Message::Close(_) = msg {
///             break;
///         }
///         if ws.send(msg).await.is_err() {
///             break;
///         }
///     }
/// }
/// # let _ = echo;
/// ```
pub struct WebSocket {
    pub(crate) state: Rc<RefCell<State>>,
    pub(crate) info: Rc<Info>,
}

impl fmt::Debug for WebSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebSocket")
            .field("protocol", &self.info.protocol)
            .finish_non_exhaustive()
    }
}

impl WebSocket {
    /// The next message: text, binary, or the peer's close (after which `None`). An error
    /// (the peer broke the protocol, or vanished) comes once, then `None`.
    pub async fn recv(&self) -> Option<Result<Message, WsError>> {
        recv(&self.state).await
    }

    /// Sends a message, waiting while the output is at its high-water mark (the peer is
    /// slow). Fails once the connection is closed or this end's close was sent.
    pub async fn send(&self, msg: impl Into<Message>) -> Result<(), WsError> {
        send(&self.state, msg.into()).await
    }

    /// Sends without waiting: for a sender that must not wait on one slow peer (a broadcast).
    /// At the high-water mark the message is handed back.
    pub fn try_send(&self, msg: impl Into<Message>) -> Result<(), TrySendError> {
        try_send(&self.state, msg.into())
    }

    /// Sends a message encoded once for many connections, waiting as [`WebSocket::send`] does.
    pub async fn send_prepared(&self, msg: &Prepared) -> Result<(), WsError> {
        wait_room(&self.state).await?;
        self.state.borrow_mut().encode_prepared(msg)?;
        State::kick(&self.state, false);
        Ok(())
    }

    /// Sends this end's close with `code` and `reason` (once; later sends fail). The
    /// connection ends when the peer answers, or after the close timeout.
    pub fn close(&self, code: u16, reason: &str) -> Result<(), WsError> {
        self.state
            .borrow_mut()
            .encode(Message::Close(Some(CloseFrame {
                code,
                reason: reason.to_owned(),
            })))?;
        State::kick(&self.state, true);
        Ok(())
    }

    /// The subprotocol the handshake chose (`Sec-WebSocket-Protocol`), if any.
    pub fn protocol(&self) -> Option<&str> {
        self.info.protocol.as_deref()
    }

    /// The extensions the handshake agreed (`Sec-WebSocket-Extensions` as answered), if any.
    pub fn extensions(&self) -> Option<&str> {
        self.info.extensions.as_deref()
    }

    /// The peer's address (the client's, behind a PROXY protocol header).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.info.peer
    }

    /// Whether the connection has ended (closed, failed or dropped).
    pub fn is_closed(&self) -> bool {
        self.state.borrow().ended
    }

    /// Splits into a sending and a receiving half, which may live in different tasks of the
    /// worker (e.g. a task forwarding a broadcast while the handler reads).
    pub fn split(self) -> (WsSender, WsReceiver) {
        (
            WsSender {
                state: self.state.clone(),
            },
            WsReceiver { state: self.state },
        )
    }
}

/// The sending half of a [`WebSocket`].
#[derive(Clone)]
pub struct WsSender {
    state: Rc<RefCell<State>>,
}

impl fmt::Debug for WsSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WsSender").finish_non_exhaustive()
    }
}

impl WsSender {
    /// As [`WebSocket::send`].
    pub async fn send(&self, msg: impl Into<Message>) -> Result<(), WsError> {
        send(&self.state, msg.into()).await
    }

    /// As [`WebSocket::try_send`].
    pub fn try_send(&self, msg: impl Into<Message>) -> Result<(), TrySendError> {
        try_send(&self.state, msg.into())
    }

    /// As [`WebSocket::send_prepared`].
    pub async fn send_prepared(&self, msg: &Prepared) -> Result<(), WsError> {
        wait_room(&self.state).await?;
        self.state.borrow_mut().encode_prepared(msg)?;
        State::kick(&self.state, false);
        Ok(())
    }

    /// Sends a prepared message without waiting: `Ok(false)` when the output is at its
    /// high-water mark (the message is not sent; a broadcast skips a slow peer).
    pub fn try_send_prepared(&self, msg: &Prepared) -> Result<bool, WsError> {
        let mut s = self.state.borrow_mut();
        if !s.ended && !s.room() {
            return Ok(false);
        }
        s.encode_prepared(msg)?;
        drop(s);
        State::kick(&self.state, false);
        Ok(true)
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.state.borrow().ended
    }
}

/// The receiving half of a [`WebSocket`].
pub struct WsReceiver {
    state: Rc<RefCell<State>>,
}

impl fmt::Debug for WsReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WsReceiver").finish_non_exhaustive()
    }
}

impl WsReceiver {
    /// As [`WebSocket::recv`].
    pub async fn recv(&self) -> Option<Result<Message, WsError>> {
        recv(&self.state).await
    }
}

async fn recv(state: &RefCell<State>) -> Option<Result<Message, WsError>> {
    poll_fn(|cx| {
        let mut s = state.borrow_mut();
        if let Some(msg) = s.inbound.pop_front() {
            let was_full = s.inbound_bytes >= s.read_buffer;
            s.inbound_bytes -= msg.len();
            if was_full && s.inbound_bytes < s.read_buffer {
                s.wake_driver();
            }
            return Poll::Ready(Some(Ok(msg)));
        }
        if let Some(e) = s.failure.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if s.ended || s.engine.close_received() {
            return Poll::Ready(None);
        }
        if !s
            .recv_waiter
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            s.recv_waiter = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}

/// Why [`WebSocket::try_send`] did not send.
#[derive(Debug)]
pub enum TrySendError {
    /// The output is at its high-water mark: the message, handed back.
    Full(Message),
    /// As [`WebSocket::send`]'s errors.
    Failed(WsError),
}

fn try_send(state: &Rc<RefCell<State>>, msg: Message) -> Result<(), TrySendError> {
    let mut s = state.borrow_mut();
    if !s.ended && !s.room() {
        return Err(TrySendError::Full(msg));
    }
    let close = matches!(msg, Message::Close(_));
    s.encode(msg).map_err(TrySendError::Failed)?;
    drop(s);
    State::kick(state, close);
    Ok(())
}

async fn send(state: &Rc<RefCell<State>>, msg: Message) -> Result<(), WsError> {
    wait_room(state).await?;
    let close = matches!(msg, Message::Close(_));
    state.borrow_mut().encode(msg)?;
    State::kick(state, close);
    Ok(())
}

/// Waits until the output is below its high-water mark; fails once the connection ended.
async fn wait_room(state: &RefCell<State>) -> Result<(), WsError> {
    poll_fn(|cx| {
        let mut s = state.borrow_mut();
        if s.ended {
            return Poll::Ready(Err(WsError::Closed));
        }
        if s.room() {
            return Poll::Ready(Ok(()));
        }
        if !s
            .send_waiter
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            s.send_waiter = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}
