//! The HTTP/3 state of one connection, server role: what arrives on each QUIC stream, in
//! order, and what to write in answer.
//!
//! The driver owns the QUIC connection. It hands this engine the bytes of every
//! client-initiated stream as they arrive ([`Connection::recv`], with the stream's FIN), tells it
//! of streams the client reset ([`Connection::stream_reset`]), and takes [`Event`]s. It writes
//! the engine's output on its own streams: [`Connection::control_preamble`] on the control stream
//! it opens, [`Connection::headers`], [`Connection::data_head`] and [`Connection::trailers`] on
//! request streams, [`Connection::go_away`] on the control stream again. A [`ConnError`] ends the
//! connection with its code (CONNECTION_CLOSE); an [`Event::StreamError`] resets one stream.
//!
//! A request stream goes through these phases (RFC 9114, Section 4.1):
//!
//! ```text
//!   Head ──HEADERS──▶ Body ──HEADERS (trailers)──▶ Trailers ──FIN──▶ gone
//!                      │ DATA*                                     ▲
//!                      └───────────────FIN─────────────────────────┘
//!   any phase ──malformed / rejected──▶ Ignored (input discarded)
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;

use bytes::{Buf, Bytes};
use canter_h2::{HeaderCheck, RequestHead, StreamIdHasher};

use crate::frame::{self, ErrorCode};
use crate::qpack;
use crate::varint;

/// The largest SETTINGS frame accepted (a handful of pairs is normal; GREASE adds a few).
const MAX_SETTINGS: u64 = 4096;

/// The most request streams that may stand open below the highest one seen before their first
/// byte arrives. QUIC delivers streams in any order, and its stream limit (the driver's
/// `max_concurrent_bidi_streams`, 100 in canter's) already keeps a client below this; the
/// bound holds the engine's memory to a few KiB with any driver. Past it: H3_EXCESSIVE_LOAD.
const MAX_UNSEEN_REQUESTS: usize = 1024;

/// What this side advertises, and the limits it holds the client to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    max_field_section_size: u64,
    connect_protocol: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_field_section_size: 16 * 1024,
            connect_protocol: false,
        }
    }
}

impl Settings {
    /// The decoded size of a request's header section (name + value + 32 per field) above
    /// which it is answered 431 (`SETTINGS_MAX_FIELD_SECTION_SIZE`; default 16 KiB).
    pub fn with_max_field_section_size(mut self, bytes: u64) -> Settings {
        self.max_field_section_size = bytes.min(varint::MAX);
        self
    }

    /// Accept extended CONNECT (RFC 9220: WebSocket over HTTP/3), advertised with
    /// `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
    pub fn with_connect_protocol(mut self, on: bool) -> Settings {
        self.connect_protocol = on;
        self
    }

    /// The header section limit.
    pub fn max_field_section_size(&self) -> u64 {
        self.max_field_section_size
    }
}

/// What the client's SETTINGS said (RFC 9114, Section 7.2.4.1; RFC 9204, Section 5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerSettings {
    /// `SETTINGS_MAX_FIELD_SECTION_SIZE`, if sent (unlimited otherwise).
    pub max_field_section_size: Option<u64>,
    /// `SETTINGS_QPACK_MAX_TABLE_CAPACITY` (0 unless sent): this encoder never uses it.
    pub qpack_max_table_capacity: u64,
    /// `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
    pub connect_protocol: bool,
}

/// A connection error: close the QUIC connection with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnError {
    /// The code for CONNECTION_CLOSE.
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

fn conn_err<T>(code: ErrorCode, reason: &'static str) -> Result<T, ConnError> {
    Err(ConnError { code, reason })
}

/// What the connection tells its driver.
#[derive(Debug)]
pub enum Event {
    /// A request on `stream`; `end_stream` when the stream ended with its header section.
    Request {
        /// The stream.
        stream: u64,
        /// The validated header section.
        head: RequestHead,
        /// No body follows.
        end_stream: bool,
    },
    /// A piece of a request body (empty with `end_stream` when the FIN came alone).
    Data {
        /// The stream.
        stream: u64,
        /// The bytes.
        data: Bytes,
        /// The last piece.
        end_stream: bool,
    },
    /// The request's trailer section: its body is complete.
    Trailers {
        /// The stream.
        stream: u64,
        /// The trailer fields.
        head: RequestHead,
    },
    /// Answer this request with `status` and no body (431: a header section over the limit);
    /// the rest of its stream is discarded.
    Reject {
        /// The stream.
        stream: u64,
        /// The status.
        status: u16,
    },
    /// The stream is malformed or refused: reset it (RESET_STREAM and STOP_SENDING) with
    /// `code`. Its handler, if any, is dropped.
    StreamError {
        /// The stream.
        stream: u64,
        /// The code.
        code: ErrorCode,
        /// What happened, for the log.
        reason: &'static str,
    },
    /// A client-initiated unidirectional stream of a type this side does not know (or a
    /// push stream, which a client may not open): STOP_SENDING with `code`; it is discarded.
    StopSending {
        /// The stream.
        stream: u64,
        /// The code.
        code: ErrorCode,
    },
    /// The client sent its SETTINGS.
    Settings(PeerSettings),
    /// The client is going away (GOAWAY): finish what is open, expect nothing new.
    GoAway {
        /// The push ID the frame carried.
        id: u64,
    },
}

/// Where a frame reader stands on one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Between frames (a partial header may be in the buffer).
    Header,
    /// Inside a DATA frame's payload (`data`) or a skipped one.
    Payload { left: u64, data: bool },
    /// Gathering a whole frame's payload into the buffer.
    Collect { ty: u64, len: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Body,
    Trailers,
    Ignored,
}

#[derive(Debug)]
struct ReqStream {
    phase: Phase,
    reading: Reading,
    buf: Vec<u8>,
    content_length: Option<u64>,
    received: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UniKind {
    /// The stream type is not read yet.
    Unknown,
    Control,
    QpackEncoder,
    QpackDecoder,
    Ignored,
}

#[derive(Debug)]
struct UniStream {
    kind: UniKind,
    reading: Reading,
    buf: Vec<u8>,
}

/// The HTTP/3 state of one server connection; see the module doc for how a driver uses it.
#[derive(Debug)]
pub struct Connection {
    settings: Settings,
    peer: Option<PeerSettings>,
    control: Option<u64>,
    encoder_stream: Option<u64>,
    decoder_stream: Option<u64>,
    requests: HashMap<u64, ReqStream, BuildHasherDefault<StreamIdHasher>>,
    uni: HashMap<u64, UniStream, BuildHasherDefault<StreamIdHasher>>,
    events: VecDeque<Event>,
    /// The highest request stream seen.
    last_request: Option<u64>,
    /// Request streams below `last_request` whose first byte has not arrived yet: QUIC opened
    /// them when a higher one arrived, and their requests are still to come.
    unseen: HashSet<u64, BuildHasherDefault<StreamIdHasher>>,
    /// The first stream ID our GOAWAY refused.
    goaway: Option<u64>,
    encoder: qpack::Encoder,
}

/// Client-initiated bidirectional: a request stream.
fn is_request_stream(id: u64) -> bool {
    id & 0x3 == 0
}

/// Client-initiated unidirectional.
fn is_client_uni(id: u64) -> bool {
    id & 0x3 == 0x2
}

impl Connection {
    /// A connection that will advertise `settings`.
    pub fn new(settings: Settings) -> Connection {
        Connection {
            settings,
            peer: None,
            control: None,
            encoder_stream: None,
            decoder_stream: None,
            requests: HashMap::default(),
            uni: HashMap::default(),
            events: VecDeque::new(),
            last_request: None,
            unseen: HashSet::default(),
            goaway: None,
            encoder: qpack::Encoder::new(),
        }
    }

    /// The settings this side advertises.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The client's settings, once its SETTINGS frame arrived.
    pub fn peer_settings(&self) -> Option<&PeerSettings> {
        self.peer.as_ref()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Request streams with something still to arrive.
    pub fn open_requests(&self) -> usize {
        self.requests.len()
    }

    /// Whether GOAWAY was sent.
    pub fn going_away(&self) -> bool {
        self.goaway.is_some()
    }

    /// What to write on the control stream this side opens, first: its stream type and the
    /// SETTINGS frame (QPACK table capacity 0 and no blocked streams, so the client encodes
    /// with the static table and literals only).
    pub fn control_preamble(&self, dst: &mut Vec<u8>) {
        varint::encode(frame::STREAM_CONTROL, dst);
        let mut payload = Vec::with_capacity(16);
        for (id, v) in [
            (frame::SETTINGS_QPACK_MAX_TABLE_CAPACITY, 0),
            (frame::SETTINGS_QPACK_BLOCKED_STREAMS, 0),
            (
                frame::SETTINGS_MAX_FIELD_SECTION_SIZE,
                self.settings.max_field_section_size,
            ),
        ] {
            varint::encode(id, &mut payload);
            varint::encode(v, &mut payload);
        }
        if self.settings.connect_protocol {
            varint::encode(frame::SETTINGS_ENABLE_CONNECT_PROTOCOL, &mut payload);
            varint::encode(1, &mut payload);
        }
        frame::put_header(frame::SETTINGS, payload.len() as u64, dst);
        dst.extend_from_slice(&payload);
    }

    /// Appends a HEADERS frame with a response's `status` and `fields` (lowercase names; no
    /// connection-specific fields: the caller filters them).
    pub fn headers<'a>(
        &mut self,
        status: u16,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        dst: &mut Vec<u8>,
    ) {
        let at = open_frame(frame::HEADERS, dst);
        self.encoder.begin(dst);
        self.encoder.status(status, dst);
        for (n, v) in fields {
            self.encoder.field(n, v, dst);
        }
        close_frame(at, dst);
    }

    /// Appends a HEADERS frame with trailer `fields`.
    pub fn trailers<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        dst: &mut Vec<u8>,
    ) {
        let at = open_frame(frame::HEADERS, dst);
        self.encoder.begin(dst);
        for (n, v) in fields {
            self.encoder.field(n, v, dst);
        }
        close_frame(at, dst);
    }

    /// Appends the header of a DATA frame of `len` bytes (the payload follows as is).
    pub fn data_head(&self, len: u64, dst: &mut Vec<u8>) {
        frame::put_header(frame::DATA, len, dst);
    }

    /// Appends GOAWAY for the control stream: requests on streams from the next one not yet
    /// seen are refused from now on (RFC 9114, Section 5.2). Sending it again with no new
    /// request in between writes the same ID.
    pub fn go_away(&mut self, dst: &mut Vec<u8>) {
        let id = self.last_request.map_or(0, |s| s + 4);
        let id = self.goaway.map_or(id, |g| g.min(id));
        self.goaway = Some(id);
        frame::put_header(frame::GOAWAY, varint::len(id) as u64, dst);
        varint::encode(id, dst);
    }

    /// The client reset `stream` (RESET_STREAM): the engine forgets it; a critical stream
    /// reset is a connection error.
    pub fn stream_reset(&mut self, stream: u64) -> Result<(), ConnError> {
        if self.is_critical(stream) {
            return conn_err(
                ErrorCode::H3_CLOSED_CRITICAL_STREAM,
                "control or QPACK stream reset",
            );
        }
        self.requests.remove(&stream);
        self.unseen.remove(&stream);
        self.uni.remove(&stream);
        Ok(())
    }

    /// The driver stopped reading `stream` (it reset it, or answered without its body): its
    /// state goes.
    pub fn forget(&mut self, stream: u64) {
        self.requests.remove(&stream);
        self.unseen.remove(&stream);
    }

    fn is_critical(&self, stream: u64) -> bool {
        [self.control, self.encoder_stream, self.decoder_stream].contains(&Some(stream))
    }

    /// Takes the next bytes of client-initiated `stream`; `fin` when they are its last.
    pub fn recv(&mut self, stream: u64, data: Bytes, fin: bool) -> Result<(), ConnError> {
        if is_request_stream(stream) {
            self.recv_request(stream, data, fin)
        } else if is_client_uni(stream) {
            self.recv_uni(stream, data, fin)
        } else {
            // Server-initiated streams carry nothing from the client here.
            Ok(())
        }
    }

    fn recv_request(&mut self, id: u64, mut input: Bytes, fin: bool) -> Result<(), ConnError> {
        if !self.requests.contains_key(&id) {
            match self.last_request {
                Some(l) if id <= l => {
                    if !self.unseen.remove(&id) {
                        // Data for a request already finished or reset: late, discarded.
                        return Ok(());
                    }
                }
                _ => self.opened_up_to(id)?,
            }
            let mut st = ReqStream {
                phase: Phase::Head,
                reading: Reading::Header,
                buf: Vec::new(),
                content_length: None,
                received: 0,
            };
            if self.goaway.is_some_and(|g| id >= g) {
                st.phase = Phase::Ignored;
                self.events.push_back(Event::StreamError {
                    stream: id,
                    code: ErrorCode::H3_REQUEST_REJECTED,
                    reason: "request after GOAWAY",
                });
            }
            self.requests.insert(id, st);
        }
        let Some(mut st) = self.requests.remove(&id) else {
            return Ok(());
        };
        let keep = self.request_input(id, &mut st, &mut input, fin)?;
        if keep {
            self.requests.insert(id, st);
        }
        Ok(())
    }

    /// `id` is the highest request stream so far: the ones between the last highest and it
    /// are open too (RFC 9000, Section 2.1), their first bytes still to come.
    fn opened_up_to(&mut self, id: u64) -> Result<(), ConnError> {
        let from = self.last_request.map_or(0, |l| l + 4);
        let skipped = (id - from) / 4;
        if self.unseen.len() as u64 + skipped > MAX_UNSEEN_REQUESTS as u64 {
            return conn_err(
                ErrorCode::H3_EXCESSIVE_LOAD,
                "too many request streams opened ahead of their first bytes",
            );
        }
        self.unseen.extend((from..id).step_by(4));
        self.last_request = Some(id);
        Ok(())
    }

    /// Runs a request stream's frames; false once the stream is done with.
    fn request_input(
        &mut self,
        id: u64,
        st: &mut ReqStream,
        input: &mut Bytes,
        fin: bool,
    ) -> Result<bool, ConnError> {
        loop {
            if st.phase == Phase::Ignored {
                return Ok(!fin);
            }
            match st.reading {
                Reading::Header => {
                    let Some((ty, len)) = next_header(&mut st.buf, input) else {
                        break;
                    };
                    self.request_frame(id, st, ty, len)?;
                }
                Reading::Payload { left, data } => {
                    if input.is_empty() {
                        break;
                    }
                    let n = left.min(input.len() as u64) as usize;
                    let piece = input.split_to(n);
                    st.reading = if left == n as u64 {
                        Reading::Header
                    } else {
                        Reading::Payload {
                            left: left - n as u64,
                            data,
                        }
                    };
                    if data {
                        self.events.push_back(Event::Data {
                            stream: id,
                            data: piece,
                            end_stream: false,
                        });
                    }
                }
                Reading::Collect { ty, len } if st.buf.is_empty() && input.len() >= len => {
                    // The whole frame is in this piece (the usual case): no copy.
                    st.reading = Reading::Header;
                    let payload = input.split_to(len);
                    let ends = fin && input.is_empty();
                    if ty == frame::HEADERS {
                        self.request_headers(id, st, &payload, ends)?;
                    }
                }
                Reading::Collect { ty, len } => {
                    let n = (len - st.buf.len()).min(input.len());
                    st.buf.extend_from_slice(&input[..n]);
                    input.advance(n);
                    if st.buf.len() < len {
                        break;
                    }
                    st.reading = Reading::Header;
                    let payload = std::mem::take(&mut st.buf);
                    let ends = fin && input.is_empty();
                    if ty == frame::HEADERS {
                        self.request_headers(id, st, &payload, ends)?;
                    }
                }
            }
        }
        if !fin {
            return Ok(true);
        }
        // The stream ended cleanly: a frame cut short is a connection error (Section 7.1).
        if st.reading != Reading::Header || !st.buf.is_empty() {
            return conn_err(ErrorCode::H3_FRAME_ERROR, "frame truncated by FIN");
        }
        match st.phase {
            Phase::Head => self.events.push_back(Event::StreamError {
                stream: id,
                code: ErrorCode::H3_REQUEST_INCOMPLETE,
                reason: "request stream ended before its header section",
            }),
            Phase::Body => {
                if st.content_length.is_some_and(|cl| cl != st.received) {
                    self.events.push_back(Event::StreamError {
                        stream: id,
                        code: ErrorCode::H3_MESSAGE_ERROR,
                        reason: "body shorter than content-length",
                    });
                } else {
                    self.events.push_back(Event::Data {
                        stream: id,
                        data: Bytes::new(),
                        end_stream: true,
                    });
                }
            }
            Phase::Trailers | Phase::Ignored => {}
        }
        Ok(false)
    }

    fn request_frame(
        &mut self,
        id: u64,
        st: &mut ReqStream,
        ty: u64,
        len: u64,
    ) -> Result<(), ConnError> {
        match ty {
            frame::DATA => {
                if st.phase != Phase::Body {
                    return conn_err(
                        ErrorCode::H3_FRAME_UNEXPECTED,
                        "DATA before HEADERS or after trailers",
                    );
                }
                st.received += len;
                if st.content_length.is_some_and(|cl| st.received > cl) {
                    self.stream_error(
                        id,
                        st,
                        ErrorCode::H3_MESSAGE_ERROR,
                        "body longer than content-length",
                    );
                    return Ok(());
                }
                st.reading = if len == 0 {
                    Reading::Header
                } else {
                    Reading::Payload {
                        left: len,
                        data: true,
                    }
                };
            }
            frame::HEADERS => {
                if st.phase == Phase::Trailers {
                    return conn_err(ErrorCode::H3_FRAME_UNEXPECTED, "HEADERS after trailers");
                }
                // A field line's encoding is never longer than its decoded size (name + value
                // + 32), so a frame over the limit holds a section over it.
                if len > self.settings.max_field_section_size {
                    if st.phase == Phase::Head {
                        st.phase = Phase::Ignored;
                        self.events.push_back(Event::Reject {
                            stream: id,
                            status: 431,
                        });
                    } else {
                        self.stream_error(
                            id,
                            st,
                            ErrorCode::H3_EXCESSIVE_LOAD,
                            "trailer section over the limit",
                        );
                    }
                    return Ok(());
                }
                st.reading = Reading::Collect {
                    ty,
                    len: len as usize,
                };
            }
            frame::CANCEL_PUSH
            | frame::SETTINGS
            | frame::GOAWAY
            | frame::MAX_PUSH_ID
            | frame::PUSH_PROMISE => {
                return conn_err(
                    ErrorCode::H3_FRAME_UNEXPECTED,
                    "control frame on a request stream",
                );
            }
            t if frame::is_http2_only(t) => {
                return conn_err(ErrorCode::H3_FRAME_UNEXPECTED, "HTTP/2 frame type");
            }
            _ => {
                // Unknown and reserved types are skipped (Section 9).
                st.reading = if len == 0 {
                    Reading::Header
                } else {
                    Reading::Payload {
                        left: len,
                        data: false,
                    }
                };
            }
        }
        Ok(())
    }

    fn stream_error(&mut self, id: u64, st: &mut ReqStream, code: ErrorCode, reason: &'static str) {
        st.phase = Phase::Ignored;
        st.buf = Vec::new();
        self.events.push_back(Event::StreamError {
            stream: id,
            code,
            reason,
        });
    }

    fn request_headers(
        &mut self,
        id: u64,
        st: &mut ReqStream,
        block: &[u8],
        ends: bool,
    ) -> Result<(), ConnError> {
        let trailers = st.phase == Phase::Body;
        let mut check = HeaderCheck::new(trailers, block.len(), self.settings.connect_protocol);
        let limit = usize::try_from(self.settings.max_field_section_size).unwrap_or(usize::MAX);
        let decoded =
            qpack::decode(block, limit, |n, v| check.field(n, v)).map_err(|e| ConnError {
                code: ErrorCode::QPACK_DECOMPRESSION_FAILED,
                reason: match e {
                    qpack::DecodeError::Truncated => "field section truncated",
                    qpack::DecodeError::IntegerOverflow => "QPACK integer overflow",
                    qpack::DecodeError::BadIndex => "QPACK static index out of range",
                    qpack::DecodeError::DynamicReference => "QPACK dynamic table reference",
                    _ => "invalid Huffman string",
                },
            })?;
        if trailers {
            if let Some(why) = check.error() {
                self.stream_error(id, st, ErrorCode::H3_MESSAGE_ERROR, why);
                return Ok(());
            }
            if decoded.over_limit {
                self.stream_error(
                    id,
                    st,
                    ErrorCode::H3_EXCESSIVE_LOAD,
                    "trailer section over the limit",
                );
                return Ok(());
            }
            if st.content_length.is_some_and(|cl| cl != st.received) {
                self.stream_error(
                    id,
                    st,
                    ErrorCode::H3_MESSAGE_ERROR,
                    "body shorter than content-length",
                );
                return Ok(());
            }
            st.phase = Phase::Trailers;
            self.events.push_back(Event::Trailers {
                stream: id,
                head: check.into_head(),
            });
            return Ok(());
        }
        if decoded.over_limit {
            st.phase = Phase::Ignored;
            self.events.push_back(Event::Reject {
                stream: id,
                status: 431,
            });
            return Ok(());
        }
        if let Some(why) = check.error() {
            self.stream_error(id, st, ErrorCode::H3_MESSAGE_ERROR, why);
            return Ok(());
        }
        if !check.is_request() {
            self.stream_error(
                id,
                st,
                ErrorCode::H3_MESSAGE_ERROR,
                "pseudo-headers do not make a request",
            );
            return Ok(());
        }
        let head = check.into_head();
        st.content_length = head.content_length();
        if ends && st.content_length.is_some_and(|cl| cl != 0) {
            self.stream_error(
                id,
                st,
                ErrorCode::H3_MESSAGE_ERROR,
                "no body after a non-zero content-length",
            );
            return Ok(());
        }
        // Ended with its head: the request is complete, and says so itself.
        st.phase = if ends { Phase::Trailers } else { Phase::Body };
        self.events.push_back(Event::Request {
            stream: id,
            head,
            end_stream: ends,
        });
        Ok(())
    }

    fn recv_uni(&mut self, id: u64, mut input: Bytes, fin: bool) -> Result<(), ConnError> {
        let mut st = self.uni.remove(&id).unwrap_or(UniStream {
            kind: UniKind::Unknown,
            reading: Reading::Header,
            buf: Vec::new(),
        });
        if st.kind == UniKind::Unknown {
            let Some(ty) = next_varint(&mut st.buf, &mut input) else {
                if !fin {
                    self.uni.insert(id, st);
                }
                return Ok(());
            };
            st.kind = match ty {
                frame::STREAM_CONTROL => {
                    claim(&mut self.control, id, "a second control stream")?;
                    UniKind::Control
                }
                frame::STREAM_QPACK_ENCODER => {
                    claim(
                        &mut self.encoder_stream,
                        id,
                        "a second QPACK encoder stream",
                    )?;
                    UniKind::QpackEncoder
                }
                frame::STREAM_QPACK_DECODER => {
                    claim(
                        &mut self.decoder_stream,
                        id,
                        "a second QPACK decoder stream",
                    )?;
                    UniKind::QpackDecoder
                }
                frame::STREAM_PUSH => {
                    return conn_err(
                        ErrorCode::H3_STREAM_CREATION_ERROR,
                        "push stream opened by a client",
                    );
                }
                _ => {
                    self.events.push_back(Event::StopSending {
                        stream: id,
                        code: ErrorCode::H3_STREAM_CREATION_ERROR,
                    });
                    UniKind::Ignored
                }
            };
        }
        match st.kind {
            UniKind::Control => self.control_input(&mut st, &mut input)?,
            UniKind::QpackEncoder => encoder_instructions(&mut st.buf, &mut input)?,
            UniKind::QpackDecoder => decoder_instructions(&mut st.buf, &mut input)?,
            UniKind::Ignored | UniKind::Unknown => {}
        }
        if fin {
            if matches!(
                st.kind,
                UniKind::Control | UniKind::QpackEncoder | UniKind::QpackDecoder
            ) {
                return conn_err(
                    ErrorCode::H3_CLOSED_CRITICAL_STREAM,
                    "control or QPACK stream closed",
                );
            }
            return Ok(());
        }
        self.uni.insert(id, st);
        Ok(())
    }

    fn control_input(&mut self, st: &mut UniStream, input: &mut Bytes) -> Result<(), ConnError> {
        loop {
            match st.reading {
                Reading::Header => {
                    let Some((ty, len)) = next_header(&mut st.buf, input) else {
                        return Ok(());
                    };
                    if self.peer.is_none() && ty != frame::SETTINGS {
                        return conn_err(
                            ErrorCode::H3_MISSING_SETTINGS,
                            "control stream did not start with SETTINGS",
                        );
                    }
                    st.reading = match ty {
                        frame::SETTINGS if self.peer.is_some() => {
                            return conn_err(ErrorCode::H3_FRAME_UNEXPECTED, "second SETTINGS");
                        }
                        frame::SETTINGS if len > MAX_SETTINGS => {
                            return conn_err(ErrorCode::H3_EXCESSIVE_LOAD, "SETTINGS too large");
                        }
                        frame::GOAWAY | frame::MAX_PUSH_ID | frame::CANCEL_PUSH if len > 8 => {
                            return conn_err(ErrorCode::H3_FRAME_ERROR, "frame longer than its ID");
                        }
                        frame::SETTINGS
                        | frame::GOAWAY
                        | frame::MAX_PUSH_ID
                        | frame::CANCEL_PUSH => Reading::Collect {
                            ty,
                            len: len as usize,
                        },
                        frame::DATA | frame::HEADERS | frame::PUSH_PROMISE => {
                            return conn_err(
                                ErrorCode::H3_FRAME_UNEXPECTED,
                                "request frame on the control stream",
                            );
                        }
                        t if frame::is_http2_only(t) => {
                            return conn_err(ErrorCode::H3_FRAME_UNEXPECTED, "HTTP/2 frame type");
                        }
                        _ if len == 0 => Reading::Header,
                        _ => Reading::Payload {
                            left: len,
                            data: false,
                        },
                    };
                    if let Reading::Collect { ty, len: 0 } = st.reading {
                        st.reading = Reading::Header;
                        self.control_frame(ty, &[])?;
                    }
                }
                Reading::Payload { left, .. } => {
                    if input.is_empty() {
                        return Ok(());
                    }
                    let n = left.min(input.len() as u64);
                    input.advance(n as usize);
                    st.reading = if n == left {
                        Reading::Header
                    } else {
                        Reading::Payload {
                            left: left - n,
                            data: false,
                        }
                    };
                }
                Reading::Collect { ty, len } => {
                    let n = (len - st.buf.len()).min(input.len());
                    st.buf.extend_from_slice(&input[..n]);
                    input.advance(n);
                    if st.buf.len() < len {
                        return Ok(());
                    }
                    st.reading = Reading::Header;
                    let payload = std::mem::take(&mut st.buf);
                    self.control_frame(ty, &payload)?;
                }
            }
        }
    }

    fn control_frame(&mut self, ty: u64, payload: &[u8]) -> Result<(), ConnError> {
        match ty {
            frame::SETTINGS => {
                let peer = parse_settings(payload)?;
                self.peer = Some(peer);
                self.events.push_back(Event::Settings(peer));
            }
            frame::GOAWAY => {
                let id = whole_varint(payload)?;
                self.events.push_back(Event::GoAway { id });
            }
            frame::MAX_PUSH_ID => {
                whole_varint(payload)?;
            }
            frame::CANCEL_PUSH => {
                whole_varint(payload)?;
                // No push was ever promised (Section 7.2.3).
                return conn_err(
                    ErrorCode::H3_ID_ERROR,
                    "CANCEL_PUSH for a push never promised",
                );
            }
            _ => {}
        }
        Ok(())
    }
}

/// Starts a frame of type `ty` whose payload is written next, with room for a two-byte
/// length; returns where the length goes, for [`close_frame`].
fn open_frame(ty: u64, dst: &mut Vec<u8>) -> usize {
    varint::encode(ty, dst);
    dst.extend_from_slice(&[0, 0]);
    dst.len() - 2
}

/// Writes the length of the payload after `at`: in the two bytes kept for it (a varint need
/// not be as short as possible, RFC 9000 Section 16), or in four when it is 16 KiB or more.
fn close_frame(at: usize, dst: &mut Vec<u8>) {
    let len = dst.len() - at - 2;
    if len < 1 << 14 {
        dst[at..at + 2].copy_from_slice(&(len as u16 | 0x4000).to_be_bytes());
    } else {
        let long = (len as u32 | 0x8000_0000).to_be_bytes();
        dst.splice(at..at + 2, long);
    }
}

/// Records `id` as the stream of a critical kind, unless there is one already.
fn claim(slot: &mut Option<u64>, id: u64, what: &'static str) -> Result<(), ConnError> {
    if slot.is_some() {
        return conn_err(ErrorCode::H3_STREAM_CREATION_ERROR, what);
    }
    *slot = Some(id);
    Ok(())
}

fn whole_varint(payload: &[u8]) -> Result<u64, ConnError> {
    match varint::decode(payload) {
        Some((v, n)) if n == payload.len() => Ok(v),
        _ => conn_err(ErrorCode::H3_FRAME_ERROR, "malformed frame payload"),
    }
}

fn parse_settings(mut payload: &[u8]) -> Result<PeerSettings, ConnError> {
    let mut peer = PeerSettings::default();
    let mut seen: Vec<u64> = Vec::new();
    while !payload.is_empty() {
        let Some((id, a)) = varint::decode(payload) else {
            return conn_err(ErrorCode::H3_FRAME_ERROR, "SETTINGS truncated");
        };
        let Some((value, b)) = varint::decode(&payload[a..]) else {
            return conn_err(ErrorCode::H3_FRAME_ERROR, "SETTINGS truncated");
        };
        payload = &payload[a + b..];
        if seen.contains(&id) {
            return conn_err(ErrorCode::H3_SETTINGS_ERROR, "repeated setting");
        }
        seen.push(id);
        if frame::is_http2_setting(id) {
            return conn_err(ErrorCode::H3_SETTINGS_ERROR, "HTTP/2 setting in SETTINGS");
        }
        match id {
            frame::SETTINGS_MAX_FIELD_SECTION_SIZE => peer.max_field_section_size = Some(value),
            frame::SETTINGS_QPACK_MAX_TABLE_CAPACITY => peer.qpack_max_table_capacity = value,
            frame::SETTINGS_ENABLE_CONNECT_PROTOCOL => match value {
                0 | 1 => peer.connect_protocol = value == 1,
                _ => {
                    return conn_err(
                        ErrorCode::H3_SETTINGS_ERROR,
                        "ENABLE_CONNECT_PROTOCOL not 0 or 1",
                    )
                }
            },
            // Blocked streams, datagrams, GREASE and the unknown: nothing to do (Section 7.2.4.1).
            _ => {}
        }
    }
    Ok(peer)
}

/// Reads a frame header from `buf` (a partial one kept from before) and `input`, moving what
/// it reads out of `input`; `None` (with the partial header in `buf`) when `input` ends first.
fn next_header(buf: &mut Vec<u8>, input: &mut Bytes) -> Option<(u64, u64)> {
    if buf.is_empty() {
        if let Some((ty, len, used)) = frame::header(input) {
            input.advance(used);
            return Some((ty, len));
        }
    }
    // Byte by byte: a header is at most 16 bytes.
    while !input.is_empty() {
        buf.push(input[0]);
        input.advance(1);
        if let Some((ty, len, _)) = frame::header(buf) {
            buf.clear();
            return Some((ty, len));
        }
    }
    None
}

fn next_varint(buf: &mut Vec<u8>, input: &mut Bytes) -> Option<u64> {
    while !input.is_empty() {
        buf.push(input[0]);
        input.advance(1);
        if let Some((v, _)) = varint::decode(buf) {
            buf.clear();
            return Some(v);
        }
    }
    None
}

/// Reads a prefix integer's bytes from `buf[pos..]`: `Some(end)` once it is whole.
fn prefix_int_end(buf: &[u8], n: u8) -> Option<Result<(u64, usize), ConnError>> {
    let mask = ((1u16 << n) - 1) as u8;
    let first = *buf.first()? & mask;
    if first < mask {
        return Some(Ok((u64::from(first), 1)));
    }
    let mut v = u64::from(mask);
    for (i, &b) in buf[1..].iter().enumerate() {
        if i > 8 {
            return Some(conn_err(
                ErrorCode::H3_EXCESSIVE_LOAD,
                "QPACK integer overflow",
            ));
        }
        v += u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(Ok((v, i + 2)));
        }
    }
    None
}

/// The encoder stream (RFC 9204, Section 4.3) with a table capacity of 0: only "Set Dynamic
/// Table Capacity" to 0 is valid; any insert cannot fit.
fn encoder_instructions(buf: &mut Vec<u8>, input: &mut Bytes) -> Result<(), ConnError> {
    buf.extend_from_slice(input);
    input.clear();
    while let Some(&b) = buf.first() {
        if b & 0xe0 != 0x20 {
            return conn_err(
                ErrorCode::QPACK_ENCODER_STREAM_ERROR,
                "QPACK insert into a table of capacity 0",
            );
        }
        match prefix_int_end(buf, 5) {
            None => return Ok(()),
            Some(Err(_)) => {
                return conn_err(
                    ErrorCode::QPACK_ENCODER_STREAM_ERROR,
                    "QPACK integer overflow",
                )
            }
            Some(Ok((0, used))) => {
                buf.drain(..used);
            }
            Some(Ok(_)) => {
                return conn_err(
                    ErrorCode::QPACK_ENCODER_STREAM_ERROR,
                    "QPACK table capacity above the advertised 0",
                )
            }
        }
    }
    Ok(())
}

/// The decoder stream (RFC 9204, Section 4.4): this encoder never references the dynamic
/// table, so only Stream Cancellation is valid.
fn decoder_instructions(buf: &mut Vec<u8>, input: &mut Bytes) -> Result<(), ConnError> {
    buf.extend_from_slice(input);
    input.clear();
    while let Some(&b) = buf.first() {
        let cancel = b & 0xc0 == 0x40;
        let n = if b & 0x80 != 0 { 7 } else { 6 };
        match prefix_int_end(buf, n) {
            None => return Ok(()),
            Some(Err(_)) => {
                return conn_err(
                    ErrorCode::QPACK_DECODER_STREAM_ERROR,
                    "QPACK integer overflow",
                )
            }
            Some(Ok((_, used))) => {
                if !cancel {
                    return conn_err(
                        ErrorCode::QPACK_DECODER_STREAM_ERROR,
                        "acknowledgment of a dynamic table never used",
                    );
                }
                buf.drain(..used);
            }
        }
    }
    Ok(())
}
