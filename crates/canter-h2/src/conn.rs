//! The server side of one HTTP/2 connection, sans-IO.
//!
//! Stream states (RFC 9113, Section 5.1), as a server sees them: a client opens a stream with
//! HEADERS; there is no push, so no reserved states.
//!
//! ```text
//!                          +--------+
//!                  recv H  |        |
//!             ,------------|  idle  |
//!            /             |        |
//!           v              +--------+
//!      +----------+            |
//!      |          |            | recv H + ES
//!      |   open   |--------.   |
//!      |          |  recv ES \ v
//!      +----------+         +----------+
//!           |               |   half-  |
//!           | send ES       |  closed  |
//!           v               | (remote) |
//!      +----------+         +----------+
//!      |   half-  |             |
//!      |  closed  |   send ES   |
//!      | (local)  |   send R /  |
//!      +----------+   recv R    |
//!           | recv ES /          |
//!           | send R /           |
//!           v  recv R            v
//!      +--------------------------+
//!      |          closed          |
//!      +--------------------------+
//! ```
//!
//! `H`: HEADERS (with its CONTINUATIONs), `ES`: the END_STREAM flag, `R`: RST_STREAM. A stream
//! lives in the connection's map from "open" until "closed"; a closed stream is known by its
//! identifier being at or below the highest one the client used. Frames on streams this side
//! reset are ignored for a while (RFC 9113, Section 5.1, "closed"); frames on streams the peer
//! closed are errors.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use canter_http::ConfigError;

use crate::frame::{self, ErrorCode, Head};
use crate::hpack::{self, Decoder, Encoder, Indexing};

/// Where the connection writes frames: a buffer for what it encodes, and a way to hand over
/// body pieces without copying them (a driver may queue large ones for `writev`).
pub trait Sink {
    /// The buffer frames are encoded into.
    fn buf(&mut self) -> &mut BytesMut;
    /// Appends a piece of DATA payload after what is in [`Sink::buf`].
    fn push(&mut self, data: Bytes);
}

impl Sink for BytesMut {
    fn buf(&mut self) -> &mut BytesMut {
        self
    }
    fn push(&mut self, data: Bytes) {
        self.extend_from_slice(&data);
    }
}

/// Hashes stream identifiers (HTTP/2's and QUIC's): a client's streams are consecutive
/// numbers of one parity, so a multiplication spreads them well (SipHash was a visible cost per
/// frame). Not for keys an attacker chooses freely: a peer's stream IDs are bounded by its
/// stream limit and must increase. Use as `HashMap<u32, V, BuildHasherDefault<StreamIdHasher>>`.
#[derive(Debug, Default)]
pub struct StreamIdHasher(u64);

impl Hasher for StreamIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type StreamMap = HashMap<u32, Stream, BuildHasherDefault<StreamIdHasher>>;

/// What this side advertises and enforces, built with [`Settings::builder`], which checks
/// every value against RFC 9113's ranges (as the runtime's `Config::builder` does); a
/// `Settings` in hand is always a valid one.
///
/// ```
/// let settings = canter_h2::Settings::builder()
///     .max_concurrent_streams(64)
///     .stream_window(1 << 20)
///     .build()?;
/// assert_eq!(settings.max_concurrent_streams(), 64);
/// assert!(canter_h2::Settings::builder().max_frame_size(1000).build().is_err());
/// # Ok::<(), canter_http::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    pub(crate) max_concurrent_streams: u32,
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
    pub(crate) max_frame_size: u32,
    pub(crate) max_header_list: u32,
    pub(crate) header_table_size: u32,
    pub(crate) max_header_block: usize,
    pub(crate) max_continuations: u32,
    pub(crate) reset_budget: u32,
    pub(crate) max_idle_frames: u32,
    pub(crate) connect_protocol: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrent_streams: 128,
            stream_window: 256 * 1024,
            connection_window: 1024 * 1024,
            max_frame_size: frame::DEFAULT_MAX_FRAME,
            max_header_list: 16 * 1024,
            header_table_size: 4096,
            max_header_block: 64 * 1024,
            max_continuations: 64,
            reset_budget: 200,
            max_idle_frames: 10_000,
            connect_protocol: false,
        }
    }
}

impl Settings {
    /// A builder starting from the defaults.
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder(Settings::default())
    }

    /// A builder starting from these settings, to change some of them.
    pub fn to_builder(self) -> SettingsBuilder {
        SettingsBuilder(self)
    }

    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams the client may have open at once (more are
    /// refused with REFUSED_STREAM).
    pub fn max_concurrent_streams(&self) -> u32 {
        self.max_concurrent_streams
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a stream may send ahead of the handler
    /// reading them.
    pub fn stream_window(&self) -> u32 {
        self.stream_window
    }

    /// Request body bytes all streams together may send ahead of the handlers.
    pub fn connection_window(&self) -> u32 {
        self.connection_window
    }

    /// SETTINGS_MAX_FRAME_SIZE: the largest frame payload accepted.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// SETTINGS_MAX_HEADER_LIST_SIZE: the largest decoded header list (name + value + 32 per
    /// field); a larger request is answered 431.
    pub fn max_header_list(&self) -> u32 {
        self.max_header_list
    }

    /// SETTINGS_HEADER_TABLE_SIZE: the HPACK table the client may use.
    pub fn header_table_size(&self) -> u32 {
        self.header_table_size
    }

    /// The largest encoded header block, all its CONTINUATION frames together; beyond it the
    /// connection is closed before the rest is read.
    pub fn max_header_block(&self) -> usize {
        self.max_header_block
    }

    /// The most CONTINUATION frames one header block may have.
    pub fn max_continuations(&self) -> u32 {
        self.max_continuations
    }

    /// Streams the client may get reset (resetting them itself, or making the server reset
    /// them with a stream error) beyond the streams it completed, before it gets GOAWAY
    /// ENHANCE_YOUR_CALM.
    pub fn reset_budget(&self) -> u32 {
        self.reset_budget
    }

    /// Frames that do no work for a request (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, empty
    /// DATA, unknown types) accepted in a row, before GOAWAY ENHANCE_YOUR_CALM.
    pub fn max_idle_frames(&self) -> u32 {
        self.max_idle_frames
    }

    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441): the extended CONNECT, a request with a
    /// `:protocol` pseudo-header (WebSocket over HTTP/2), is accepted. Off by default: without
    /// it such a request is malformed.
    pub fn connect_protocol(&self) -> bool {
        self.connect_protocol
    }

    /// These settings with the extended CONNECT accepted or not ([`Settings::connect_protocol`]).
    pub fn with_connect_protocol(mut self, on: bool) -> Settings {
        self.connect_protocol = on;
        self
    }

    /// These settings with [`Settings::max_header_list`] lowered to `bytes` if it is above
    /// (a server's head limit caps what HTTP/2 advertises); still valid, as nothing is raised.
    pub fn with_header_list_at_most(mut self, bytes: u32) -> Settings {
        self.max_header_list = self.max_header_list.min(bytes.max(1));
        self
    }
}

/// Builds [`Settings`]; [`SettingsBuilder::build`] checks every value and names the first one
/// out of its range.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct SettingsBuilder(Settings);

impl SettingsBuilder {
    /// See [`Settings::max_concurrent_streams`]; at least 1.
    pub fn max_concurrent_streams(mut self, streams: u32) -> Self {
        self.0.max_concurrent_streams = streams;
        self
    }

    /// See [`Settings::stream_window`]; at most 2^31 − 1.
    pub fn stream_window(mut self, bytes: u32) -> Self {
        self.0.stream_window = bytes;
        self
    }

    /// See [`Settings::connection_window`]; 65,535 to 2^31 − 1 (the window every connection
    /// starts with is 65,535; it can only be raised).
    pub fn connection_window(mut self, bytes: u32) -> Self {
        self.0.connection_window = bytes;
        self
    }

    /// See [`Settings::max_frame_size`]; 16,384 to 2^24 − 1 (RFC 9113, Section 6.5.2).
    pub fn max_frame_size(mut self, bytes: u32) -> Self {
        self.0.max_frame_size = bytes;
        self
    }

    /// See [`Settings::max_header_list`]; at least 1.
    pub fn max_header_list(mut self, bytes: u32) -> Self {
        self.0.max_header_list = bytes;
        self
    }

    /// See [`Settings::header_table_size`]; any value (0: no dynamic table).
    pub fn header_table_size(mut self, bytes: u32) -> Self {
        self.0.header_table_size = bytes;
        self
    }

    /// See [`Settings::max_header_block`]; at least one frame's worth, 16,384.
    pub fn max_header_block(mut self, bytes: usize) -> Self {
        self.0.max_header_block = bytes;
        self
    }

    /// See [`Settings::max_continuations`]; any value (0: a header block must fit in its
    /// HEADERS frame).
    pub fn max_continuations(mut self, frames: u32) -> Self {
        self.0.max_continuations = frames;
        self
    }

    /// See [`Settings::reset_budget`]; any value.
    pub fn reset_budget(mut self, streams: u32) -> Self {
        self.0.reset_budget = streams;
        self
    }

    /// See [`Settings::max_idle_frames`]; at least 1.
    pub fn max_idle_frames(mut self, frames: u32) -> Self {
        self.0.max_idle_frames = frames;
        self
    }

    /// The settings, or the first one out of its range.
    pub fn build(self) -> Result<Settings, ConfigError> {
        let s = self.0;
        let max_window = frame::MAX_WINDOW as u32;
        check(
            s.max_concurrent_streams >= 1,
            "max_concurrent_streams",
            "must be at least 1",
        )?;
        check(
            s.stream_window <= max_window,
            "stream_window",
            "must be at most 2147483647 bytes",
        )?;
        check(
            (frame::DEFAULT_WINDOW..=max_window).contains(&s.connection_window),
            "connection_window",
            "must be 65535 to 2147483647 bytes",
        )?;
        check(
            (frame::DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&s.max_frame_size),
            "max_frame_size",
            "must be 16384 to 16777215 bytes",
        )?;
        check(
            s.max_header_list >= 1,
            "max_header_list",
            "must be at least 1 byte",
        )?;
        check(
            s.max_header_block >= frame::DEFAULT_MAX_FRAME as usize,
            "max_header_block",
            "must be at least 16384 bytes",
        )?;
        check(
            s.max_idle_frames >= 1,
            "max_idle_frames",
            "must be at least 1",
        )?;
        Ok(s)
    }
}

fn check(ok: bool, setting: &'static str, problem: &'static str) -> Result<(), ConfigError> {
    match ok {
        true => Ok(()),
        false => Err(ConfigError::new(setting, problem)),
    }
}

/// A request's header section, decoded and validated (RFC 9113, Section 8.3.1).
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    buf: Vec<u8>,
    method: (u32, u32),
    scheme: (u32, u32),
    authority: Option<(u32, u32)>,
    path: (u32, u32),
    /// RFC 8441's `:protocol`, on an extended CONNECT.
    protocol: Option<(u32, u32)>,
    fields: Vec<((u32, u32), (u32, u32))>,
    content_length: Option<u64>,
}

impl RequestHead {
    fn get(&self, (s, e): (u32, u32)) -> &[u8] {
        &self.buf[s as usize..e as usize]
    }
    /// `:method`.
    pub fn method(&self) -> &[u8] {
        self.get(self.method)
    }
    /// `:scheme` (empty for CONNECT).
    pub fn scheme(&self) -> &[u8] {
        self.get(self.scheme)
    }
    /// `:authority`, if sent.
    pub fn authority(&self) -> Option<&[u8]> {
        self.authority.map(|r| self.get(r))
    }
    /// `:path` (empty for CONNECT).
    pub fn path(&self) -> &[u8] {
        self.get(self.path)
    }
    /// `:protocol` of an extended CONNECT (RFC 8441), e.g. `websocket`: the stream becomes a
    /// tunnel for that protocol once answered 2xx.
    pub fn protocol(&self) -> Option<&[u8]> {
        self.protocol.map(|r| self.get(r))
    }
    /// The regular fields, in order; names are lowercase.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.fields.iter().map(|&(n, v)| (self.get(n), self.get(v)))
    }
    /// The declared content-length, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    fn push(&mut self, s: &[u8]) -> (u32, u32) {
        let start = self.buf.len() as u32;
        self.buf.extend_from_slice(s);
        (start, self.buf.len() as u32)
    }
}

/// What the connection tells its driver.
#[derive(Debug)]
pub enum Event {
    /// A new request on `stream`; `end_stream` when it has no body.
    Request {
        /// The stream.
        stream: u32,
        /// The validated header section.
        head: RequestHead,
        /// No body follows.
        end_stream: bool,
    },
    /// A piece of a request body. Hand its length back with [`Connection::consume`] once the
    /// handler took it, so the client may send more.
    Data {
        /// The stream.
        stream: u32,
        /// The bytes.
        data: Bytes,
        /// The last piece.
        end_stream: bool,
    },
    /// The request's trailer section (its end).
    Trailers {
        /// The stream.
        stream: u32,
        /// The trailer fields (no pseudo-headers).
        head: RequestHead,
    },
    /// The stream ended without completing: the client reset it, or it broke the protocol and
    /// was reset. Drop its handler.
    Reset {
        /// The stream.
        stream: u32,
        /// Why.
        code: ErrorCode,
    },
    /// The request cannot be served as sent: answer it with this status (431 for a header list
    /// over the limit) and no body.
    Reject {
        /// The stream.
        stream: u32,
        /// The status to answer with.
        status: u16,
    },
    /// The client is going away: finish the streams up to `last_stream`, start no new one.
    GoAway {
        /// The last stream the client will process.
        last_stream: u32,
        /// Why.
        code: ErrorCode,
    },
}

/// A connection error: the connection wrote GOAWAY with `code` and must be closed once that is
/// sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnError {
    /// The code sent in GOAWAY.
    pub code: ErrorCode,
    /// What happened, for the log.
    pub reason: &'static str,
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.reason, self.code)
    }
}

impl std::error::Error for ConnError {}

/// Why a send was not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The stream is gone (reset, or its response already ended).
    StreamGone,
}

type Res<T> = Result<T, ConnError>;

fn conn_err<T>(code: ErrorCode, reason: &'static str) -> Res<T> {
    Err(ConnError { code, reason })
}

#[derive(Debug)]
struct Stream {
    /// The client may still send (no END_STREAM received).
    recv_open: bool,
    /// This side may still send (no END_STREAM queued).
    send_open: bool,
    send_window: i64,
    /// Bytes the client may still send before a WINDOW_UPDATE.
    recv_window: i64,
    /// Body bytes the handler consumed that were not yet returned to the client's window.
    unacked: u32,
    content_length: Option<u64>,
    received: u64,
    /// Response body pieces waiting for window.
    queue: VecDeque<Bytes>,
    queued: usize,
    /// END_STREAM goes out after the queue.
    end_queued: bool,
    /// Trailers go out after the queue (encoded then, to keep HPACK in order).
    trailers: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Listed in `Connection::ready`.
    in_ready: bool,
}

impl Stream {
    fn new(
        send_window: i64,
        recv_window: u32,
        recv_open: bool,
        content_length: Option<u64>,
    ) -> Stream {
        Stream {
            recv_open,
            send_open: true,
            send_window,
            recv_window: recv_window as i64,
            unacked: 0,
            content_length,
            received: 0,
            queue: VecDeque::new(),
            queued: 0,
            end_queued: false,
            trailers: None,
            in_ready: false,
        }
    }
}

/// A header block being received across CONTINUATION frames.
#[derive(Debug)]
struct Partial {
    stream: u32,
    block: Vec<u8>,
    end_stream: bool,
    frames: u32,
    /// The HEADERS frame made the stream depend on itself.
    self_dependent: bool,
}

/// The server side of an HTTP/2 connection.
#[derive(Debug)]
pub struct Connection {
    settings: Settings,
    preface_done: bool,
    settings_seen: bool,
    streams: StreamMap,
    /// The highest stream identifier the client used.
    last_peer_stream: u32,
    /// Streams this side reset recently: their late frames are ignored.
    reset_by_us: VecDeque<u32>,
    partial: Option<Partial>,
    decoder: Decoder,
    encoder: Encoder,
    scratch: Vec<u8>,
    /// The client's settings that shape what this side sends.
    peer_initial_window: i64,
    peer_max_frame: usize,
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    /// Streams with queued data and window to send it, in turn.
    ready: VecDeque<u32>,
    events: VecDeque<Event>,
    /// Set once GOAWAY went out: the last stream that will be served.
    goaway_sent: Option<u32>,
    goaway_received: bool,
    failed: bool,
    resets: u64,
    completed: u64,
    idle_frames: u32,
    queued_total: usize,
}

/// How many recently reset streams are remembered.
const RESET_MEMORY: usize = 128;

impl Connection {
    /// A new connection; writes this side's SETTINGS (and the connection window's first
    /// update) to `out`.
    pub fn new(settings: Settings, out: &mut impl Sink) -> Connection {
        // `Settings::builder` checked every value against the protocol's ranges.
        let s = settings;
        let buf = out.buf();
        let all = [
            (
                frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                s.max_concurrent_streams,
            ),
            (frame::SETTINGS_INITIAL_WINDOW_SIZE, s.stream_window),
            (frame::SETTINGS_MAX_FRAME_SIZE, s.max_frame_size),
            (frame::SETTINGS_MAX_HEADER_LIST_SIZE, s.max_header_list),
            (frame::SETTINGS_HEADER_TABLE_SIZE, s.header_table_size),
            (frame::SETTINGS_ENABLE_PUSH, 0),
            (frame::SETTINGS_ENABLE_CONNECT_PROTOCOL, 1),
        ];
        // The last is sent only when the extended CONNECT is on.
        let n = all.len() - usize::from(!s.connect_protocol);
        frame::put_settings(buf, &all[..n]);
        if s.connection_window > frame::DEFAULT_WINDOW {
            frame::put_window_update(buf, 0, s.connection_window - frame::DEFAULT_WINDOW);
        }
        Connection {
            settings: s,
            preface_done: false,
            settings_seen: false,
            streams: StreamMap::default(),
            last_peer_stream: 0,
            reset_by_us: VecDeque::new(),
            partial: None,
            decoder: Decoder::new(s.header_table_size as usize),
            encoder: Encoder::new(4096),
            scratch: Vec::new(),
            peer_initial_window: frame::DEFAULT_WINDOW as i64,
            peer_max_frame: frame::DEFAULT_MAX_FRAME as usize,
            send_window: frame::DEFAULT_WINDOW as i64,
            recv_window: s.connection_window as i64,
            recv_unacked: 0,
            ready: VecDeque::new(),
            events: VecDeque::new(),
            goaway_sent: None,
            goaway_received: false,
            failed: false,
            resets: 0,
            completed: 0,
            idle_frames: 0,
            queued_total: 0,
        }
    }

    /// A connection upgraded from HTTP/1.1 (`Upgrade: h2c`, RFC 7540, Section 3.2):
    /// `peer_settings` is the decoded `HTTP2-Settings` payload, applied as if it came in a
    /// SETTINGS frame (the 101 response acknowledges it), and stream 1 is the upgraded request,
    /// half-closed (remote): answer it on stream 1. The client still sends the preface.
    pub fn upgrade(
        settings: Settings,
        peer_settings: &[u8],
        out: &mut impl Sink,
    ) -> Res<Connection> {
        if !peer_settings.len().is_multiple_of(6) {
            return conn_err(
                ErrorCode::PROTOCOL_ERROR,
                "HTTP2-Settings not a SETTINGS payload",
            );
        }
        let mut c = Connection::new(settings, out);
        c.apply_settings(peer_settings)?;
        let stream = Stream::new(
            c.peer_initial_window,
            c.settings.stream_window,
            false,
            Some(0),
        );
        c.streams.insert(1, stream);
        c.last_peer_stream = 1;
        Ok(c)
    }

    /// The settings in force on this side.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The next event, if any.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Streams open (not yet closed both ways).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Response body bytes queued for lack of flow-control window, over all streams.
    pub fn queued(&self) -> usize {
        self.queued_total
    }

    /// Response body bytes queued on `stream`.
    pub fn stream_queued(&self, stream: u32) -> usize {
        self.streams.get(&stream).map_or(0, |s| s.queued)
    }

    /// Whether `stream` still takes response data (it was not reset, its end not sent).
    pub fn can_send(&self, stream: u32) -> bool {
        self.streams
            .get(&stream)
            .is_some_and(|s| s.send_open && !s.end_queued)
    }

    /// Whether the connection is done: GOAWAY sent (or received) and no stream left, or a
    /// connection error.
    pub fn is_finished(&self) -> bool {
        self.failed
            || ((self.goaway_sent.is_some() || self.goaway_received) && self.streams.is_empty())
    }

    /// The largest number of bytes the connection wants buffered before it can parse a frame.
    pub fn max_frame_buffer(&self) -> usize {
        self.settings.max_frame_size as usize + frame::HEADER_LEN
    }

    /// Parses every complete frame in `input`, queueing events and writing the frames this side
    /// answers with (SETTINGS ACK, PING ACK, WINDOW_UPDATE, RST_STREAM) to `out`. Partial
    /// frames stay in `input`. On a connection error GOAWAY is written and the error returned.
    pub fn recv(&mut self, input: &mut BytesMut, out: &mut impl Sink) -> Res<()> {
        if self.failed {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "connection already failed");
        }
        match self.recv_frames(input, out) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.failed = true;
                let last = self.last_peer_stream;
                frame::put_goaway(out.buf(), last, e.code, e.reason.as_bytes());
                Err(e)
            }
        }
    }

    fn recv_frames(&mut self, input: &mut BytesMut, out: &mut impl Sink) -> Res<()> {
        if !self.preface_done {
            let n = input.len().min(frame::PREFACE.len());
            if input[..n] != frame::PREFACE[..n] {
                return conn_err(ErrorCode::PROTOCOL_ERROR, "invalid connection preface");
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            input.advance(frame::PREFACE.len());
            self.preface_done = true;
        }
        while input.len() >= frame::HEADER_LEN {
            let head =
                Head::parse(
                    input[..frame::HEADER_LEN]
                        .try_into()
                        .map_err(|_| ConnError {
                            code: ErrorCode::INTERNAL_ERROR,
                            reason: "frame header",
                        })?,
                );
            if head.len > self.settings.max_frame_size as usize {
                return conn_err(
                    ErrorCode::FRAME_SIZE_ERROR,
                    "frame larger than SETTINGS_MAX_FRAME_SIZE",
                );
            }
            if !self.settings_seen && head.kind != frame::SETTINGS {
                return conn_err(ErrorCode::PROTOCOL_ERROR, "first frame is not SETTINGS");
            }
            // A header block in progress admits only its CONTINUATION frames.
            if let Some(p) = &self.partial {
                if head.kind != frame::CONTINUATION || head.stream != p.stream {
                    return conn_err(ErrorCode::PROTOCOL_ERROR, "header block interrupted");
                }
            }
            let total = frame::HEADER_LEN + head.len;
            if input.len() < total {
                // For a CONTINUATION flood, fail on the frame header: the payload need not
                // arrive first.
                if head.kind == frame::CONTINUATION {
                    self.check_block_growth(head.len)?;
                }
                return Ok(());
            }
            if head.kind == frame::DATA {
                input.advance(frame::HEADER_LEN);
                let payload = input.split_to(head.len).freeze();
                self.on_data(head, payload, out)?;
            } else {
                let result = self.on_frame(head, &input[frame::HEADER_LEN..total], out);
                input.advance(total);
                result?;
            }
        }
        Ok(())
    }

    fn check_block_growth(&self, more: usize) -> Res<()> {
        if let Some(p) = &self.partial {
            if p.block.len() + more > self.settings.max_header_block
                || p.frames + 1 > self.settings.max_continuations
            {
                return conn_err(ErrorCode::ENHANCE_YOUR_CALM, "header block too large");
            }
        }
        Ok(())
    }

    fn idle_frame(&mut self) -> Res<()> {
        self.idle_frames += 1;
        if self.idle_frames > self.settings.max_idle_frames {
            return conn_err(
                ErrorCode::ENHANCE_YOUR_CALM,
                "too many frames without requests",
            );
        }
        Ok(())
    }

    fn on_frame(&mut self, head: Head, payload: &[u8], out: &mut impl Sink) -> Res<()> {
        match head.kind {
            frame::HEADERS => self.on_headers(head, payload, out),
            frame::CONTINUATION => self.on_continuation(head, payload, out),
            frame::PRIORITY => {
                if head.stream == 0 {
                    return conn_err(ErrorCode::PROTOCOL_ERROR, "PRIORITY on stream 0");
                }
                if head.len != 5 {
                    self.reset_stream(head.stream, ErrorCode::FRAME_SIZE_ERROR, out);
                    return self.count_reset();
                }
                let dep = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & frame::MAX_STREAM_ID;
                if dep == head.stream {
                    self.reset_stream(head.stream, ErrorCode::PROTOCOL_ERROR, out);
                    return self.count_reset();
                }
                self.idle_frame()
            }
            frame::RST_STREAM => self.on_rst(head, payload),
            frame::SETTINGS => self.on_settings(head, payload, out),
            frame::PUSH_PROMISE => {
                conn_err(ErrorCode::PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            }
            frame::PING => {
                if head.stream != 0 {
                    return conn_err(ErrorCode::PROTOCOL_ERROR, "PING on a stream");
                }
                if head.len != 8 {
                    return conn_err(ErrorCode::FRAME_SIZE_ERROR, "PING payload not 8 bytes");
                }
                if head.flags & frame::ACK == 0 {
                    let buf = out.buf();
                    frame::put_head(buf, 8, frame::PING, frame::ACK, 0);
                    buf.put_slice(payload);
                }
                self.idle_frame()
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return conn_err(ErrorCode::PROTOCOL_ERROR, "GOAWAY on a stream");
                }
                if head.len < 8 {
                    return conn_err(ErrorCode::FRAME_SIZE_ERROR, "GOAWAY too short");
                }
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & frame::MAX_STREAM_ID;
                let code = ErrorCode(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
                self.goaway_received = true;
                self.events.push_back(Event::GoAway {
                    last_stream: last,
                    code,
                });
                Ok(())
            }
            frame::WINDOW_UPDATE => self.on_window_update(head, payload, out),
            // Unknown frame types are ignored (RFC 9113, Section 4.1).
            _ => self.idle_frame(),
        }
    }

    fn on_settings(&mut self, head: Head, payload: &[u8], out: &mut impl Sink) -> Res<()> {
        if head.stream != 0 {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "SETTINGS on a stream");
        }
        if head.flags & frame::ACK != 0 {
            if head.len != 0 {
                return conn_err(ErrorCode::FRAME_SIZE_ERROR, "SETTINGS ACK with a payload");
            }
            return self.idle_frame();
        }
        if !head.len.is_multiple_of(6) {
            return conn_err(
                ErrorCode::FRAME_SIZE_ERROR,
                "SETTINGS length not a multiple of 6",
            );
        }
        self.settings_seen = true;
        self.apply_settings(payload)?;
        frame::put_head(out.buf(), 0, frame::SETTINGS, frame::ACK, 0);
        self.idle_frame()
    }

    /// Applies the client's settings (a SETTINGS payload, or the HTTP2-Settings of an upgrade).
    fn apply_settings(&mut self, payload: &[u8]) -> Res<()> {
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                frame::SETTINGS_HEADER_TABLE_SIZE => self.encoder.set_max_table(value as usize),
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return conn_err(ErrorCode::PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1");
                }
                frame::SETTINGS_ENABLE_CONNECT_PROTOCOL if value > 1 => {
                    return conn_err(
                        ErrorCode::PROTOCOL_ERROR,
                        "SETTINGS_ENABLE_CONNECT_PROTOCOL not 0 or 1",
                    );
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if value as i64 > frame::MAX_WINDOW {
                        return conn_err(
                            ErrorCode::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        );
                    }
                    let delta = value as i64 - self.peer_initial_window;
                    self.peer_initial_window = value as i64;
                    for (&id, s) in self.streams.iter_mut() {
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return conn_err(
                                ErrorCode::FLOW_CONTROL_ERROR,
                                "stream window above 2^31-1",
                            );
                        }
                        if delta > 0 && s.send_window > 0 && s.queued > 0 && !s.in_ready {
                            s.in_ready = true;
                            self.ready.push_back(id);
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..(1 << 24)).contains(&value) {
                        return conn_err(
                            ErrorCode::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        );
                    }
                    self.peer_max_frame = value as usize;
                }
                // MAX_CONCURRENT_STREAMS limits pushes, which this side never makes;
                // MAX_HEADER_LIST_SIZE is advisory; unknown settings are ignored.
                _ => {}
            }
        }
        Ok(())
    }

    fn on_window_update(&mut self, head: Head, payload: &[u8], out: &mut impl Sink) -> Res<()> {
        if head.len != 4 {
            return conn_err(
                ErrorCode::FRAME_SIZE_ERROR,
                "WINDOW_UPDATE payload not 4 bytes",
            );
        }
        let inc = (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
            & frame::MAX_STREAM_ID) as i64;
        if self.ready.is_empty() {
            self.idle_frame()?;
        }
        if head.stream == 0 {
            if inc == 0 {
                return conn_err(ErrorCode::PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
            }
            self.send_window += inc;
            if self.send_window > frame::MAX_WINDOW {
                return conn_err(
                    ErrorCode::FLOW_CONTROL_ERROR,
                    "connection window above 2^31-1",
                );
            }
            return Ok(());
        }
        if head.stream > self.last_peer_stream {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream");
        }
        let Some(s) = self.streams.get_mut(&head.stream) else {
            // A closed stream: may be late, ignored.
            return Ok(());
        };
        if inc == 0 {
            self.reset_stream(head.stream, ErrorCode::PROTOCOL_ERROR, out);
            return self.count_reset();
        }
        s.send_window += inc;
        if s.send_window > frame::MAX_WINDOW {
            self.reset_stream(head.stream, ErrorCode::FLOW_CONTROL_ERROR, out);
            return self.count_reset();
        }
        if s.queued > 0 && s.send_window > 0 && !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(head.stream);
        }
        Ok(())
    }

    fn on_rst(&mut self, head: Head, payload: &[u8]) -> Res<()> {
        if head.stream == 0 {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "RST_STREAM on stream 0");
        }
        if head.len != 4 {
            return conn_err(
                ErrorCode::FRAME_SIZE_ERROR,
                "RST_STREAM payload not 4 bytes",
            );
        }
        if head.stream > self.last_peer_stream {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "RST_STREAM on an idle stream");
        }
        let code = ErrorCode(u32::from_be_bytes([
            payload[0], payload[1], payload[2], payload[3],
        ]));
        if let Some(s) = self.streams.remove(&head.stream) {
            self.queued_total -= s.queued;
            self.events.push_back(Event::Reset {
                stream: head.stream,
                code,
            });
            // Cancelling a request before its response counts against the budget; ending
            // an upload the response no longer needs does not.
            if s.send_open {
                self.count_reset()?;
            }
        }
        Ok(())
    }

    /// Counts a reset the client caused; over the budget the connection fails (rapid reset,
    /// CVE-2023-44487; server-provoked resets, CVE-2025-8671).
    fn count_reset(&mut self) -> Res<()> {
        self.resets += 1;
        if self.resets > self.settings.reset_budget as u64 + self.completed {
            return conn_err(ErrorCode::ENHANCE_YOUR_CALM, "too many reset streams");
        }
        Ok(())
    }

    /// A stream error: RST_STREAM to the client, the stream forgotten, the driver told.
    fn reset_stream(&mut self, stream: u32, code: ErrorCode, out: &mut impl Sink) {
        frame::put_rst(out.buf(), stream, code);
        self.remember_reset(stream);
        if let Some(s) = self.streams.remove(&stream) {
            self.queued_total -= s.queued;
            // The driver gives back the connection window of body bytes it still held.
            self.events.push_back(Event::Reset { stream, code });
        }
    }

    fn remember_reset(&mut self, stream: u32) {
        if self.reset_by_us.len() == RESET_MEMORY {
            self.reset_by_us.pop_front();
        }
        self.reset_by_us.push_back(stream);
    }

    fn on_headers(&mut self, head: Head, payload: &[u8], out: &mut impl Sink) -> Res<()> {
        if head.stream == 0 {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "HEADERS on stream 0");
        }
        if head.stream.is_multiple_of(2) {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "HEADERS on an even stream");
        }
        let mut body = strip_padding(head, payload)?;
        if head.flags & frame::PRIORITY_FLAG != 0 {
            if body.len() < 5 {
                return conn_err(ErrorCode::FRAME_SIZE_ERROR, "HEADERS priority truncated");
            }
            let dep =
                u32::from_be_bytes([body[0], body[1], body[2], body[3]]) & frame::MAX_STREAM_ID;
            body = &body[5..];
            // A stream depending on itself is a stream error, found once the block is decoded
            // (the HPACK state must stay in step).
            return self.start_block(head, body, dep == head.stream, out);
        }
        self.start_block(head, body, false, out)
    }

    fn start_block(
        &mut self,
        head: Head,
        fragment: &[u8],
        self_dependent: bool,
        out: &mut impl Sink,
    ) -> Res<()> {
        if fragment.len() > self.settings.max_header_block {
            return conn_err(ErrorCode::ENHANCE_YOUR_CALM, "header block too large");
        }
        let end_stream = head.flags & frame::END_STREAM != 0;
        if head.flags & frame::END_HEADERS != 0 {
            // The common case: the whole block in one frame, decoded where it lies.
            return self.end_block(head.stream, fragment, end_stream, self_dependent, out);
        }
        self.partial = Some(Partial {
            stream: head.stream,
            block: fragment.to_vec(),
            end_stream,
            frames: 0,
            self_dependent,
        });
        Ok(())
    }

    fn on_continuation(&mut self, head: Head, payload: &[u8], out: &mut impl Sink) -> Res<()> {
        let Some(mut p) = self.partial.take() else {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "CONTINUATION without HEADERS");
        };
        p.frames += 1;
        if p.block.len() + payload.len() > self.settings.max_header_block
            || p.frames > self.settings.max_continuations
        {
            return conn_err(ErrorCode::ENHANCE_YOUR_CALM, "header block too large");
        }
        p.block.extend_from_slice(payload);
        if head.flags & frame::END_HEADERS != 0 {
            self.end_block(p.stream, &p.block, p.end_stream, p.self_dependent, out)
        } else {
            self.partial = Some(p);
            Ok(())
        }
    }

    /// A complete header block: decode it (always, for HPACK), then act on it.
    fn end_block(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        self_dependent: bool,
        out: &mut impl Sink,
    ) -> Res<()> {
        let existing = self.streams.contains_key(&id);
        let trailers = existing;
        let mut v = HeaderCheck::new(trailers, block.len(), self.settings.connect_protocol);
        let decoded = self
            .decoder
            .decode(block, self.settings.max_header_list as usize, |n, val| {
                v.field(n, val)
            })
            .map_err(|e| ConnError {
                code: ErrorCode::COMPRESSION_ERROR,
                reason: match e {
                    hpack::DecodeError::Truncated => "header block truncated",
                    hpack::DecodeError::IntegerOverflow => "HPACK integer overflow",
                    hpack::DecodeError::BadIndex => "HPACK index out of range",
                    hpack::DecodeError::BadHuffman => "invalid Huffman string",
                    _ => "invalid HPACK table size update",
                },
            })?;
        if existing {
            let Some(s) = self.streams.get_mut(&id) else {
                return Ok(());
            };
            if !s.recv_open {
                self.reset_stream(id, ErrorCode::STREAM_CLOSED, out);
                return self.count_reset();
            }
            // Trailers: they end the body.
            if !end_stream {
                self.reset_stream(id, ErrorCode::PROTOCOL_ERROR, out);
                return self.count_reset();
            }
            if v.error.is_some() || decoded.over_limit || self_dependent {
                self.reset_stream(id, ErrorCode::PROTOCOL_ERROR, out);
                return self.count_reset();
            }
            if s.content_length.is_some_and(|cl| cl != s.received) {
                self.reset_stream(id, ErrorCode::PROTOCOL_ERROR, out);
                return self.count_reset();
            }
            s.recv_open = false;
            self.events.push_back(Event::Trailers {
                stream: id,
                head: v.head,
            });
            self.maybe_close(id);
            return Ok(());
        }
        if id <= self.last_peer_stream {
            if self.reset_by_us.contains(&id) {
                return Ok(());
            }
            return conn_err(ErrorCode::STREAM_CLOSED, "HEADERS on a closed stream");
        }
        self.last_peer_stream = id;
        if let Some(last) = self.goaway_sent {
            if id > last {
                // Past our GOAWAY: ignored (RFC 9113, Section 6.8).
                return Ok(());
            }
        }
        if self.streams.len() >= self.settings.max_concurrent_streams as usize {
            frame::put_rst(out.buf(), id, ErrorCode::REFUSED_STREAM);
            self.remember_reset(id);
            return self.count_reset();
        }
        let head_ok = v.error.is_none() && !self_dependent && v.finish_request();
        let mut stream = Stream::new(
            self.peer_initial_window,
            self.settings.stream_window,
            !end_stream,
            v.head.content_length,
        );
        if !head_ok {
            stream.recv_open = false;
            self.streams.insert(id, stream);
            self.reset_stream(id, ErrorCode::PROTOCOL_ERROR, out);
            // The driver never saw the stream.
            self.events.pop_back();
            return self.count_reset();
        }
        if end_stream && stream.content_length.is_some_and(|cl| cl != 0) {
            self.streams.insert(id, stream);
            self.reset_stream(id, ErrorCode::PROTOCOL_ERROR, out);
            self.events.pop_back();
            return self.count_reset();
        }
        self.streams.insert(id, stream);
        self.idle_frames = 0;
        if decoded.over_limit {
            self.events.push_back(Event::Reject {
                stream: id,
                status: 431,
            });
            return Ok(());
        }
        self.events.push_back(Event::Request {
            stream: id,
            head: v.head,
            end_stream,
        });
        Ok(())
    }

    fn on_data(&mut self, head: Head, payload: Bytes, out: &mut impl Sink) -> Res<()> {
        if head.stream == 0 {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "DATA on stream 0");
        }
        let flow_len = head.len as i64;
        // The whole frame, padding included, counts against the windows.
        self.recv_window -= flow_len;
        if self.recv_window < 0 {
            return conn_err(
                ErrorCode::FLOW_CONTROL_ERROR,
                "DATA beyond the connection window",
            );
        }
        let body_len = strip_padding(head, &payload)?.len();
        let start = usize::from(head.flags & frame::PADDED != 0);
        let end = start + body_len;
        let end_stream = head.flags & frame::END_STREAM != 0;
        if head.stream > self.last_peer_stream {
            return conn_err(ErrorCode::PROTOCOL_ERROR, "DATA on an idle stream");
        }
        let Some(s) = self.streams.get_mut(&head.stream) else {
            // Not for any stream: give the window back at once.
            self.release_connection(head.len as u32, out);
            if self.reset_by_us.contains(&head.stream) {
                return Ok(());
            }
            return conn_err(ErrorCode::STREAM_CLOSED, "DATA on a closed stream");
        };
        if !s.recv_open {
            self.release_connection(head.len as u32, out);
            self.reset_stream(head.stream, ErrorCode::STREAM_CLOSED, out);
            return self.count_reset();
        }
        s.recv_window -= flow_len;
        if s.recv_window < 0 {
            self.release_connection(head.len as u32, out);
            self.reset_stream(head.stream, ErrorCode::FLOW_CONTROL_ERROR, out);
            return self.count_reset();
        }
        let data_len = end - start;
        s.received += data_len as u64;
        if s.content_length
            .is_some_and(|cl| s.received > cl || (end_stream && s.received != cl))
        {
            self.release_connection(head.len as u32, out);
            self.reset_stream(head.stream, ErrorCode::PROTOCOL_ERROR, out);
            return self.count_reset();
        }
        // Padding is consumed at once; the data when the handler takes it.
        let padding = (head.len - data_len) as u32;
        if padding > 0 {
            s.unacked += padding;
        }
        if end_stream {
            s.recv_open = false;
        }
        if data_len == 0 && !end_stream {
            self.idle_frame()?;
        } else {
            self.idle_frames = 0;
        }
        let id = head.stream;
        self.events.push_back(Event::Data {
            stream: id,
            data: payload.slice(start..end),
            end_stream,
        });
        if padding > 0 {
            self.release_connection(padding, out);
        }
        if end_stream {
            self.maybe_close(id);
        }
        Ok(())
    }

    fn release_connection(&mut self, n: u32, out: &mut impl Sink) {
        self.recv_unacked += n;
        if self.recv_unacked >= self.settings.connection_window / 2 {
            frame::put_window_update(out.buf(), 0, self.recv_unacked);
            self.recv_window += self.recv_unacked as i64;
            self.recv_unacked = 0;
        }
    }

    /// The handler took `n` bytes of `stream`'s body: open the windows again (a WINDOW_UPDATE
    /// once half of a window is consumed).
    pub fn consume(&mut self, stream: u32, n: usize, out: &mut impl Sink) {
        if n == 0 {
            return;
        }
        self.release_connection(n as u32, out);
        let half = self.settings.stream_window / 2;
        if let Some(s) = self.streams.get_mut(&stream) {
            s.unacked += n as u32;
            if s.recv_open && s.unacked >= half {
                frame::put_window_update(out.buf(), stream, s.unacked);
                s.recv_window += s.unacked as i64;
                s.unacked = 0;
            }
        }
    }

    /// Forgets a stream closed both ways.
    fn maybe_close(&mut self, id: u32) {
        if let Some(s) = self.streams.get(&id) {
            if !s.recv_open && !s.send_open {
                self.streams.remove(&id);
            }
        }
    }

    /// Sends the response head on `stream`: `:status` and `fields` (lowercase names, no
    /// connection-specific fields). With `end_stream` the response has no body.
    pub fn send_headers<'a>(
        &mut self,
        stream: u32,
        status: u16,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        end_stream: bool,
        out: &mut impl Sink,
    ) -> Result<(), SendError> {
        let Some(s) = self.streams.get_mut(&stream) else {
            return Err(SendError::StreamGone);
        };
        if !s.send_open {
            return Err(SendError::StreamGone);
        }
        let mut block = std::mem::take(&mut self.scratch);
        block.clear();
        self.encoder.begin(&mut block);
        self.encoder.status(status, &mut block);
        for (n, v) in fields {
            let indexing = match n {
                b"set-cookie" | b"authorization" | b"cookie" => Indexing::Never,
                _ => Indexing::Yes,
            };
            self.encoder.field(n, v, indexing, &mut block);
        }
        let flags = if end_stream { frame::END_STREAM } else { 0 };
        write_block(
            out.buf(),
            frame::HEADERS,
            flags,
            stream,
            &block,
            self.peer_max_frame,
        );
        self.scratch = block;
        if end_stream {
            self.end_sent(stream);
        }
        Ok(())
    }

    /// Queues response body bytes on `stream`; they leave as the windows allow, in
    /// [`Connection::flush`]. `end_stream` ends the response after them.
    pub fn send_data(
        &mut self,
        stream: u32,
        data: Bytes,
        end_stream: bool,
    ) -> Result<(), SendError> {
        let Some(s) = self.streams.get_mut(&stream) else {
            return Err(SendError::StreamGone);
        };
        if !s.send_open || s.end_queued {
            return Err(SendError::StreamGone);
        }
        self.queued_total += data.len();
        s.queued += data.len();
        if !data.is_empty() {
            s.queue.push_back(data);
        }
        s.end_queued = end_stream;
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(stream);
        }
        Ok(())
    }

    /// Queues trailers ending the response on `stream`, after its queued data.
    pub fn send_trailers(
        &mut self,
        stream: u32,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), SendError> {
        let Some(s) = self.streams.get_mut(&stream) else {
            return Err(SendError::StreamGone);
        };
        if !s.send_open || s.end_queued {
            return Err(SendError::StreamGone);
        }
        s.trailers = Some(fields);
        s.end_queued = true;
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(stream);
        }
        Ok(())
    }

    /// Resets `stream` from this side (its handler failed, or it is no longer wanted).
    pub fn reset(&mut self, stream: u32, code: ErrorCode, out: &mut impl Sink) {
        if self.streams.contains_key(&stream) {
            frame::put_rst(out.buf(), stream, code);
            self.remember_reset(stream);
            if let Some(s) = self.streams.remove(&stream) {
                self.queued_total -= s.queued;
            }
        }
    }

    fn end_sent(&mut self, stream: u32) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        s.send_open = false;
        self.completed += 1;
        // A response complete before its request stays half-closed (local): the rest of the
        // body is read and discarded, and frames that break the stream's rules still get
        // their errors. (RFC 9113, Section 8.1 allows RST_STREAM(NO_ERROR) instead; then late
        // frames could no longer be told from errors.)
        if !s.recv_open {
            self.streams.remove(&stream);
        }
    }

    /// Writes queued response data as the windows allow, streams taking turns frame by frame.
    pub fn flush(&mut self, out: &mut impl Sink) {
        let mut turns = self.ready.len();
        while let Some(id) = self.ready.pop_front() {
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            let window = s.send_window.min(self.send_window).max(0) as usize;
            let n = s.queued.min(window).min(self.peer_max_frame);
            let last = n == s.queued && s.end_queued && s.trailers.is_none();
            if n > 0 || (s.queued == 0 && s.end_queued && s.trailers.is_none()) {
                frame::put_head(
                    out.buf(),
                    n,
                    frame::DATA,
                    if last { frame::END_STREAM } else { 0 },
                    id,
                );
                let mut left = n;
                while left > 0 {
                    let Some(front) = s.queue.front_mut() else {
                        break;
                    };
                    if front.len() <= left {
                        left -= front.len();
                        let piece = s.queue.pop_front().unwrap_or_default();
                        out.push(piece);
                    } else {
                        out.push(front.split_to(left));
                        left = 0;
                    }
                }
                s.queued -= n;
                self.queued_total -= n;
                s.send_window -= n as i64;
                self.send_window -= n as i64;
            }
            if s.queued == 0 && s.trailers.is_some() {
                let fields = s.trailers.take().unwrap_or_default();
                let mut block = std::mem::take(&mut self.scratch);
                block.clear();
                self.encoder.begin(&mut block);
                for (n, v) in &fields {
                    self.encoder.field(n, v, Indexing::No, &mut block);
                }
                write_block(
                    out.buf(),
                    frame::HEADERS,
                    frame::END_STREAM,
                    id,
                    &block,
                    self.peer_max_frame,
                );
                self.scratch = block;
                s.in_ready = false;
                self.end_sent(id);
            } else if s.queued == 0 && s.end_queued {
                s.in_ready = false;
                self.end_sent(id);
            } else if s.queued > 0 && s.send_window > 0 && self.send_window > 0 {
                self.ready.push_back(id);
            } else {
                s.in_ready = false;
                if s.queued > 0 && s.send_window > 0 {
                    // Blocked on the connection window: keep its turn.
                    s.in_ready = true;
                    self.ready.push_front(id);
                    break;
                }
            }
            turns = turns.saturating_sub(1);
            if self.send_window <= 0 && turns == 0 {
                break;
            }
        }
    }

    /// Starts a graceful shutdown: GOAWAY with the last stream seen; streams up to it are
    /// finished, newer ones ignored. [`Connection::is_finished`] tells when to close.
    pub fn go_away(&mut self, out: &mut impl Sink) {
        if self.goaway_sent.is_none() && !self.failed {
            frame::put_goaway(out.buf(), self.last_peer_stream, ErrorCode::NO_ERROR, b"");
            self.goaway_sent = Some(self.last_peer_stream);
        }
    }

    /// Fails the connection from this side (a timeout, a protocol violation the driver found):
    /// GOAWAY with `code`.
    pub fn abort(
        &mut self,
        code: ErrorCode,
        reason: &'static str,
        out: &mut impl Sink,
    ) -> ConnError {
        if !self.failed {
            self.failed = true;
            frame::put_goaway(out.buf(), self.last_peer_stream, code, reason.as_bytes());
        }
        ConnError { code, reason }
    }
}

/// Writes a header block as HEADERS (or the frame kind given) and CONTINUATION frames of at
/// most `max_frame` bytes each.
fn write_block(
    out: &mut BytesMut,
    kind: u8,
    flags: u8,
    stream: u32,
    block: &[u8],
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let single = block.len() <= max_frame;
    let end_headers = if single { frame::END_HEADERS } else { 0 };
    frame::put_head(out, first.len(), kind, flags | end_headers, stream);
    out.put_slice(first);
    let mut rest = chunks.peekable();
    while let Some(c) = rest.next() {
        let end = if rest.peek().is_none() {
            frame::END_HEADERS
        } else {
            0
        };
        frame::put_head(out, c.len(), frame::CONTINUATION, end, stream);
        out.put_slice(c);
    }
}

/// The payload without its padding (and pad length byte).
fn strip_padding(head: Head, payload: &[u8]) -> Res<&[u8]> {
    if head.flags & frame::PADDED == 0 || (head.kind != frame::DATA && head.kind != frame::HEADERS)
    {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return conn_err(
            ErrorCode::FRAME_SIZE_ERROR,
            "padded frame without pad length",
        );
    };
    if pad as usize >= payload.len() {
        return conn_err(ErrorCode::PROTOCOL_ERROR, "padding longer than the frame");
    }
    Ok(&rest[..rest.len() - pad as usize])
}

/// Checks a header list as it is decoded (RFC 9113, Section 8.2 and 8.3) and gathers it into a
/// [`RequestHead`]. HTTP/3 has the same rules (RFC 9114, Section 4.2 and 4.3), so its engine
/// uses this too: feed [`HeaderCheck::field`] every decoded field in order, then ask
/// [`HeaderCheck::error`] and [`HeaderCheck::is_request`].
#[derive(Debug)]
pub struct HeaderCheck {
    head: RequestHead,
    /// `:protocol` is accepted (SETTINGS_ENABLE_CONNECT_PROTOCOL was sent).
    connect_protocol: bool,
    trailers: bool,
    regular_seen: bool,
    has_method: bool,
    has_scheme: bool,
    has_path: bool,
    error: Option<&'static str>,
}

impl HeaderCheck {
    /// A check of a request's header section (or, with `trailers`, of its trailer section,
    /// where pseudo-headers are malformed); `block_len`, the encoded size, sizes the buffer;
    /// with `connect_protocol`, RFC 8441's `:protocol` is accepted.
    pub fn new(trailers: bool, block_len: usize, connect_protocol: bool) -> HeaderCheck {
        HeaderCheck {
            connect_protocol,
            head: RequestHead {
                // Decoded fields are rarely more than twice their encoding.
                buf: Vec::with_capacity(block_len * 2 + 64),
                fields: Vec::with_capacity(8),
                ..RequestHead::default()
            },
            trailers,
            regular_seen: false,
            has_method: false,
            has_scheme: false,
            has_path: false,
            error: None,
        }
    }

    fn fail(&mut self, why: &'static str) {
        if self.error.is_none() {
            self.error = Some(why);
        }
    }

    /// Takes the next decoded field; a malformed one is remembered as [`HeaderCheck::error`].
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
            return self.fail("control character in a field value");
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.trailers || self.regular_seen {
                return self.fail("pseudo-header out of place");
            }
            let r = self.head.push(value);
            let seen = match pseudo {
                b"method" => {
                    self.head.method = r;
                    std::mem::replace(&mut self.has_method, true)
                }
                b"scheme" => {
                    self.head.scheme = r;
                    std::mem::replace(&mut self.has_scheme, true)
                }
                b"path" => {
                    self.head.path = r;
                    std::mem::replace(&mut self.has_path, true)
                }
                b"authority" => self.head.authority.replace(r).is_some(),
                b"protocol" if self.connect_protocol => self.head.protocol.replace(r).is_some(),
                _ => return self.fail("unknown pseudo-header"),
            };
            if seen {
                self.fail("repeated pseudo-header");
            }
            return;
        }
        self.regular_seen = true;
        if name.is_empty() || !name.iter().all(|&b| is_lower_token(b)) {
            return self.fail("invalid field name");
        }
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => {
                return self.fail("connection-specific field");
            }
            b"te" if value != b"trailers" => return self.fail("TE other than trailers"),
            b"content-length" if !self.trailers => {
                let Some(n) = parse_u64(value) else {
                    return self.fail("invalid content-length");
                };
                if self.head.content_length.is_some_and(|m| m != n) {
                    return self.fail("conflicting content-length");
                }
                self.head.content_length = Some(n);
            }
            _ => {}
        }
        if value.first().is_some_and(|b| *b == b' ' || *b == b'\t')
            || value.last().is_some_and(|b| *b == b' ' || *b == b'\t')
        {
            return self.fail("whitespace around a field value");
        }
        let n = self.head.push(name);
        let v = self.head.push(value);
        self.head.fields.push((n, v));
    }

    /// Why the section is malformed (the first problem seen), if it is.
    pub fn error(&self) -> Option<&'static str> {
        self.error
    }

    /// The fields gathered so far.
    pub fn into_head(self) -> RequestHead {
        self.head
    }

    /// Whether the pseudo-headers make a request.
    pub fn is_request(&self) -> bool {
        self.finish_request()
    }

    /// Whether the pseudo-headers make a request.
    fn finish_request(&self) -> bool {
        if !self.has_method {
            return false;
        }
        if self.head.protocol.is_some() {
            // RFC 8441, Section 4: an extended CONNECT has all of them, and a path.
            return self.head.method() == b"CONNECT"
                && self.head.authority.is_some()
                && self.has_scheme
                && self.head.path().first() == Some(&b'/');
        }
        if self.head.method() == b"CONNECT" {
            return self.head.authority.is_some() && !self.has_scheme && !self.has_path;
        }
        let path = self.head.path();
        self.has_scheme
            && self.has_path
            && (path.first() == Some(&b'/') || (path == b"*" && self.head.method() == b"OPTIONS"))
    }
}

fn is_lower_token(b: u8) -> bool {
    matches!(b,
        b'a'..=b'z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+'
        | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + (b - b'0') as u64)
    })
}
