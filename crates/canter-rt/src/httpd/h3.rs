//! The HTTP/3 connection actor: one task owns a QUIC connection ([`QuicLink`]), its
//! [`canter_h3::Connection`] and every request's handler, and runs them inline, as the HTTP/2
//! actor does over TCP.
//!
//! Each turn of [`H3::poll`]:
//! 1. take in the datagrams the endpoint routed here and the expired QUIC timers;
//! 2. take QUIC's events (streams opened, readable, writable, stopped; the connection lost);
//! 3. read the readable request streams (while their handler's pipe has room: that is the
//!    backpressure, as QUIC's flow control window is given back only for what is read) and let
//!    the engine parse them: requests start their handlers, body pieces go to their pipes;
//! 4. poll the pending handlers and pull response bodies while their stream has little queued;
//! 5. write each stream's queued frames as far as QUIC takes them, and send the packets.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::future::{poll_fn, Future};
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use canter_h3::{Connection, ErrorCode, Event, StreamIdHasher};
use http::StatusCode;
use quinn_proto::{Dir, ReadError, StreamEvent, StreamId, VarInt, WriteError};

use crate::core::config::Config;
use crate::core::stats::ClientFault;
use crate::core::worker::{later, Registration, Worker};
use crate::httpd::body::{Body, BodyError, BodyStream, Pipe, PipeState, RequestBody};
use crate::httpd::service::{Reply, Request, Response, Service};
use crate::httpd::state::{is_connection_specific, panicked, Http};
use crate::quic::endpoint::QuicLink;

/// Response bytes queued on one stream below which its body source is pulled for more.
const STREAM_AHEAD: usize = 64 * 1024;
/// Request bytes read from one stream in one turn.
const READ_TURN: usize = 64 * 1024;
/// Piece of a file read into memory per pull.
const FILE_PIECE: usize = 16 * 1024;
/// A whole body up to this size is copied into its response's head chunk.
const SMALL_BODY: usize = 4 * 1024;
/// Turns of the loop in one poll before yielding to the worker's other tasks.
const TURNS: usize = 16;

/// A stream ID the engine was given (so one QUIC made, always in range).
fn sid(id: u64) -> StreamId {
    StreamId::from(VarInt::from_u64(id).unwrap_or(VarInt::MAX))
}

fn code(c: ErrorCode) -> VarInt {
    VarInt::from_u64(c.0).unwrap_or(VarInt::MAX)
}

/// Serves one QUIC connection as HTTP/3 until it is drained.
pub(crate) async fn serve<S: Service>(
    registration: Registration,
    link: QuicLink,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
) {
    let settings = canter_h3::Settings::default()
        .with_max_field_section_size(cfg.limits.max_head() as u64)
        // WebSocket over HTTP/3 (RFC 9220) is served where WebSocket is.
        .with_connect_protocol(cfg!(feature = "ws"));
    let peer = link.peer();
    // A handshake has the TLS listener's time to complete, as over TCP.
    let handshake_by = cfg
        .tls
        .as_ref()
        .map(|t| later(Instant::now(), t.acceptor.handshake_timeout()));
    let mut h3 = H3 {
        handshake_by,
        engine: Connection::new(settings),
        link,
        peer,
        svc,
        worker,
        cfg,
        control: None,
        exchanges: HashMap::default(),
        readable: Vec::new(),
        held: Vec::new(),
        unacked: Vec::new(),
        goaway_sent: false,
        closing: false,
        connected: false,
        timer: Box::pin(tokio::time::sleep_until(tokio::time::Instant::now())),
        timer_at: None,
        scratch: Vec::with_capacity(256),
        ids: Vec::new(),
        pieces: Vec::new(),
        reading: Vec::new(),
    };
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    h3.worker.set_waker(registration.id, waker);
    poll_fn(|cx| h3.poll(cx)).await;
    h3.exchanges.clear();
    drop(registration);
}

/// Frames queued for one of this side's streams, and whether its FIN follows them.
#[derive(Default)]
struct Outgoing {
    chunks: VecDeque<Bytes>,
    queued: usize,
    /// The FIN follows the chunks.
    fin: bool,
    /// The FIN is written.
    finished: bool,
}

impl Outgoing {
    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.queued += b.len();
            self.chunks.push_back(b);
        }
    }
}

enum State {
    Handler(Pin<Box<dyn Future<Output = Response>>>),
    Stream(Pin<Box<dyn BodyStream>>),
    File {
        file: File,
        pos: u64,
        left: u64,
    },
    /// The response is queued whole.
    Done,
}

/// One request's exchange, from its head until its response is written.
struct Exchange {
    state: State,
    pipe: Option<Rc<RefCell<Pipe>>>,
    received: u64,
    deadline: Instant,
    head_only: bool,
    out: Outgoing,
    /// The request stream's receive side has ended (FIN, reset or stopped).
    recv_done: bool,
    source_waits: bool,
    /// The response body failed after its head went out: the stream is reset.
    failed: bool,
    /// A CONNECT request: answered 2xx, the stream may become a tunnel.
    #[cfg_attr(not(feature = "ws"), allow(dead_code))]
    connect: bool,
    /// The stream is a tunnel (RFC 9220's WebSocket): its input is not a body under the body
    /// limit, and its silence is not a stall.
    tunnel: bool,
}

struct H3<S> {
    link: QuicLink,
    engine: Connection,
    peer: SocketAddr,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
    control: Option<(StreamId, Outgoing)>,
    exchanges: HashMap<StreamId, Exchange, BuildHasherDefault<StreamIdHasher>>,
    readable: Vec<StreamId>,
    /// Readable streams whose handler's pipe is full.
    held: Vec<StreamId>,
    /// Responses written whole whose last bytes the client has not acknowledged yet: closing
    /// now would lose them.
    unacked: Vec<StreamId>,
    goaway_sent: bool,
    closing: bool,
    /// The handshake completed.
    connected: bool,
    /// When a handshake still running is given up.
    handshake_by: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
    timer_at: Option<Instant>,
    /// Where a response's head is encoded before it is copied out.
    scratch: Vec<u8>,
    /// Stream IDs gathered during a turn (kept to save an allocation each time).
    ids: Vec<StreamId>,
    /// The pieces read from one stream (kept likewise).
    pieces: Vec<Bytes>,
    /// The readable streams being read this turn (kept likewise).
    reading: Vec<StreamId>,
}

impl<S: Service> H3<S> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        crate::set_peer(self.peer, true);
        for _ in 0..TURNS {
            self.link.poll_io(cx);
            if self.link.conn.is_drained() {
                // Its last events first: how it was lost is counted there (an idle timeout
                // drains the connection at once).
                self.quic_events();
                return Poll::Ready(());
            }
            let mut progress = self.quic_events();
            if self.worker.draining() && !self.goaway_sent {
                self.go_away();
            }
            progress |= self.read_streams();
            progress |= self.engine_events();
            progress |= self.poll_exchanges(cx);
            // A handler that read from a full pipe made room: its stream is read again.
            progress |= self.held.iter().any(|&id| !self.pipe_full(id));
            self.write_streams();
            if self.goaway_sent
                && !self.closing
                && self.exchanges.is_empty()
                && self.unacked.is_empty()
            {
                self.close(ErrorCode::H3_NO_ERROR, "shutting down");
            }
            if !progress {
                self.link.poll_io(cx);
                self.poll_timeouts(cx);
                return Poll::Pending;
            }
        }
        // More to do: let the worker's other tasks run first.
        self.link.poll_io(cx);
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn close(&mut self, c: ErrorCode, reason: &'static str) {
        self.closing = true;
        self.exchanges.clear();
        self.link.conn.close(
            Instant::now(),
            code(c),
            Bytes::from_static(reason.as_bytes()),
        );
    }

    fn go_away(&mut self) {
        self.goaway_sent = true;
        if let Some((_, out)) = &mut self.control {
            let mut buf = Vec::new();
            self.engine.go_away(&mut buf);
            out.push(buf.into());
        }
    }

    /// QUIC's events; true if any.
    fn quic_events(&mut self) -> bool {
        let mut any = false;
        while let Some(ev) = self.link.conn.poll() {
            any = true;
            match ev {
                quinn_proto::Event::Connected => {
                    self.connected = true;
                    self.open_control();
                }
                quinn_proto::Event::ConnectionLost { reason } => {
                    if !self.connected {
                        // The handshake failed or timed out.
                        self.worker.fault(ClientFault::TlsHandshake);
                    } else if matches!(reason, quinn_proto::ConnectionError::TimedOut) {
                        self.worker.fault(ClientFault::IdleTimeout);
                    }
                    tracing::debug!(peer = %self.peer, %reason, "QUIC connection closed");
                    self.closing = true;
                    self.exchanges.clear();
                }
                quinn_proto::Event::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.link.conn.streams().accept(dir) {
                        self.readable.push(id);
                    }
                }
                quinn_proto::Event::Stream(StreamEvent::Readable { id })
                    if !self.readable.contains(&id) =>
                {
                    self.readable.push(id);
                }
                quinn_proto::Event::Stream(StreamEvent::Finished { id }) => {
                    self.unacked.retain(|&s| s != id);
                }
                quinn_proto::Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                    self.unacked.retain(|&s| s != id);
                    // The client wants no more of this response.
                    if let Some(ex) = self.exchanges.remove(&id) {
                        tracing::debug!(peer = %self.peer, stream = %id, code = %error_code, "response stopped by the client");
                        release(&ex, BodyError::Disconnected);
                        let _ = self.link.conn.send_stream(id).reset(error_code);
                    }
                }
                _ => {}
            }
        }
        any
    }

    fn open_control(&mut self) {
        if self.control.is_some() {
            return;
        }
        let Some(id) = self.link.conn.streams().open(Dir::Uni) else {
            return;
        };
        let mut buf = Vec::new();
        self.engine.control_preamble(&mut buf);
        let mut out = Outgoing::default();
        out.push(buf.into());
        self.control = Some((id, out));
        if self.goaway_sent {
            self.goaway_sent = false;
            self.go_away();
        }
    }

    /// Reads the readable streams into the engine; true if anything was read.
    fn read_streams(&mut self) -> bool {
        // Streams held back by a full pipe are tried again once it has room.
        let mut i = 0;
        while i < self.held.len() {
            let id = self.held[i];
            if self.pipe_full(id) {
                i += 1;
            } else {
                self.held.swap_remove(i);
                self.readable.push(id);
            }
        }
        let mut any = false;
        // This turn's list; the streams found readable meanwhile go to the other one.
        let mut list = std::mem::take(&mut self.reading);
        std::mem::swap(&mut list, &mut self.readable);
        for &id in &list {
            if self.pipe_full(id) {
                self.held.push(id);
                continue;
            }
            let mut pieces = std::mem::take(&mut self.pieces);
            let mut fin = false;
            let mut reset = None;
            let mut more = false;
            {
                let mut rs = self.link.conn.recv_stream(id);
                let Ok(mut chunks) = rs.read(true) else {
                    continue;
                };
                let mut taken = 0;
                loop {
                    if taken >= READ_TURN {
                        more = true;
                        break;
                    }
                    match chunks.next(READ_TURN) {
                        Ok(Some(c)) => {
                            taken += c.bytes.len();
                            pieces.push(c.bytes);
                        }
                        Ok(None) => {
                            fin = true;
                            break;
                        }
                        Err(ReadError::Blocked) => break,
                        Err(ReadError::Reset(c)) => {
                            reset = Some(c);
                            break;
                        }
                    }
                }
                let _ = chunks.finalize();
            }
            any |= !pieces.is_empty() || fin || reset.is_some();
            if more {
                self.readable.push(id);
            }
            let sid = u64::from(id);
            let n = pieces.len();
            for (k, piece) in pieces.drain(..).enumerate() {
                if let Err(e) = self.engine.recv(sid, piece, fin && k + 1 == n) {
                    return self.conn_error(e);
                }
            }
            self.pieces = pieces;
            if fin && n == 0 {
                if let Err(e) = self.engine.recv(sid, Bytes::new(), true) {
                    return self.conn_error(e);
                }
            }
            if fin {
                if let Some(ex) = self.exchanges.get_mut(&id) {
                    ex.recv_done = true;
                }
            }
            if let Some(c) = reset {
                if let Err(e) = self.engine.stream_reset(sid) {
                    return self.conn_error(e);
                }
                if let Some(ex) = self.exchanges.remove(&id) {
                    tracing::debug!(peer = %self.peer, stream = sid, code = %c, "request stream reset by the client");
                    release(&ex, BodyError::Disconnected);
                    let _ = self
                        .link
                        .conn
                        .send_stream(id)
                        .reset(code(ErrorCode::H3_REQUEST_CANCELLED));
                }
            }
        }
        list.clear();
        self.reading = list;
        any
    }

    fn pipe_full(&self, id: StreamId) -> bool {
        self.exchanges
            .get(&id)
            .and_then(|ex| ex.pipe.as_ref())
            .is_some_and(|p| {
                let p = p.borrow();
                p.state == PipeState::Open && !p.has_room()
            })
    }

    fn conn_error(&mut self, e: canter_h3::ConnError) -> bool {
        self.worker.fault(ClientFault::Protocol);
        tracing::debug!(peer = %self.peer, error = %e, "HTTP/3 connection error");
        self.close(e.code, e.reason);
        true
    }

    /// The engine's events; true if any.
    fn engine_events(&mut self) -> bool {
        let mut any = false;
        while let Some(ev) = self.engine.poll_event() {
            any = true;
            match ev {
                Event::Request {
                    stream,
                    head,
                    end_stream,
                } => self.start(sid(stream), head, end_stream),
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => self.data(sid(stream), data, end_stream),
                Event::Trailers { stream, .. } => {
                    if let Some(ex) = self.exchanges.get_mut(&sid(stream)) {
                        if let Some(pipe) = &ex.pipe {
                            pipe.borrow_mut().close(PipeState::End);
                        }
                    }
                }
                Event::Reject { stream, status } => {
                    self.worker.fault(ClientFault::BadRequest);
                    tracing::debug!(peer = %self.peer, stream, status, "request rejected");
                    let res = Response::new(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                    );
                    self.respond_new(sid(stream), res, false, None, false);
                }
                Event::StreamError {
                    stream,
                    code: c,
                    reason,
                } => {
                    if c != ErrorCode::H3_REQUEST_REJECTED {
                        self.worker.fault(ClientFault::Protocol);
                    }
                    tracing::debug!(peer = %self.peer, stream, code = %c, reason, "HTTP/3 stream error");
                    let id = sid(stream);
                    if let Some(ex) = self.exchanges.remove(&id) {
                        release(&ex, BodyError::Disconnected);
                    }
                    self.engine.forget(stream);
                    let _ = self.link.conn.recv_stream(id).stop(code(c));
                    let _ = self.link.conn.send_stream(id).reset(code(c));
                }
                Event::StopSending { stream, code: c } => {
                    let _ = self.link.conn.recv_stream(sid(stream)).stop(code(c));
                }
                Event::GoAway { id } => {
                    tracing::debug!(peer = %self.peer, id, "client sent GOAWAY");
                }
                Event::Settings(_) => {}
            }
        }
        any
    }

    fn data(&mut self, id: StreamId, data: Bytes, end_stream: bool) {
        let max_body = self.cfg.limits.max_body();
        let Some(ex) = self.exchanges.get_mut(&id) else {
            return;
        };
        ex.received += data.len() as u64;
        let Some(pipe) = &ex.pipe else {
            return;
        };
        let mut p = pipe.borrow_mut();
        // A tunnel's input is a stream of messages, bounded by flow control, not a body.
        let limit = if ex.tunnel {
            u64::MAX
        } else {
            p.restrict.map_or(max_body, |(b, _)| b.min(max_body))
        };
        if p.state != PipeState::Open {
            return;
        }
        if ex.received > limit {
            p.close(PipeState::Failed(BodyError::TooLarge));
            return;
        }
        if !data.is_empty() {
            p.push(data);
        }
        if end_stream {
            p.close(PipeState::End);
        }
    }

    fn start(&mut self, id: StreamId, head: canter_h3::RequestHead, end_stream: bool) {
        let head_only = head.method() == b"HEAD";
        let declared = if end_stream {
            Some(0)
        } else {
            head.content_length()
        };
        let built = canter_http::RequestHead::from_fields(
            head.method(),
            head.path(),
            head.authority(),
            head.fields(),
            head.content_length(),
            end_stream,
        );
        let rh = match built {
            Ok(rh) => rh.with_version(canter_http::Version::Http3),
            Err(e) => {
                self.worker.fault(ClientFault::BadRequest);
                tracing::debug!(peer = %self.peer, stream = %id, status = e.status(), error = %e, "bad request");
                let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
                let res = Response::text(format!(
                    "{}\n",
                    status.canonical_reason().unwrap_or("Bad Request")
                ))
                .with_status(status);
                self.respond_new(id, res, head_only, None, false);
                return;
            }
        };
        if declared.is_some_and(|n| n > self.cfg.limits.max_body()) {
            let res =
                Response::text("Payload Too Large\n").with_status(StatusCode::PAYLOAD_TOO_LARGE);
            self.respond_new(id, res, head_only, None, false);
            return;
        }
        let (pipe, body) = if end_stream {
            (None, RequestBody::empty())
        } else {
            let pipe = Rc::new(RefCell::new(Pipe::new()));
            (Some(pipe.clone()), RequestBody::piped(pipe, declared))
        };
        // 0-RTT (Config::http3_early_data): a request that came before the handshake finished
        // may be a replay; only a safe method is served from it (RFC 8470, RFC 9114 Section
        // 10.9).
        if self.link.conn.is_handshaking()
            && !matches!(
                rh.method(),
                canter_http::Method::Get | canter_http::Method::Head | canter_http::Method::Options
            )
        {
            tracing::debug!(peer = %self.peer, stream = %id, "unsafe method in 0-RTT: 425");
            let res = Response::text("Too Early\n").with_status(StatusCode::TOO_EARLY);
            self.respond_new(id, res, head_only, pipe, false);
            return;
        }
        let connect = rh.method() == canter_http::Method::Connect;
        let mut req = Request::new(rh, body);
        if let Some(p) = head.protocol() {
            req.extensions_mut()
                .insert(crate::httpd::service::ConnectProtocol(
                    String::from_utf8_lossy(p).into_owned(),
                ));
        }
        #[cfg(feature = "tls")]
        if let Some(certs) = self.link.peer_certificates() {
            req.extensions_mut().insert(certs);
        }
        let svc = &self.svc;
        let reply = match catch_unwind(AssertUnwindSafe(|| svc.call(req))) {
            Ok(r) => r,
            Err(_) => Reply::Ready(panicked(&self.peer)),
        };
        match reply {
            Reply::Ready(res) => self.respond_new(id, res, head_only, pipe, connect),
            Reply::Pending(fut) => {
                let ex = Exchange {
                    state: State::Handler(fut),
                    pipe,
                    received: 0,
                    deadline: later(self.worker.now(), self.cfg.handler_timeout),
                    head_only,
                    out: Outgoing::default(),
                    recv_done: end_stream,
                    source_waits: false,
                    failed: false,
                    connect,
                    tunnel: false,
                };
                self.exchanges.insert(id, ex);
            }
        }
    }

    /// How long a response body may give nothing before it counts as stalled: never, for a
    /// tunnel (its protocol has timeouts of its own).
    fn quiet(&self, tunnel: bool) -> std::time::Duration {
        if tunnel {
            std::time::Duration::from_secs(365 * 86400)
        } else {
            self.cfg.handler_timeout
        }
    }

    /// Answers a request that has no exchange yet.
    fn respond_new(
        &mut self,
        id: StreamId,
        res: Response,
        head_only: bool,
        pipe: Option<Rc<RefCell<Pipe>>>,
        connect: bool,
    ) {
        let mut ex = Exchange {
            state: State::Done,
            pipe,
            received: 0,
            deadline: later(self.worker.now(), self.cfg.handler_timeout),
            head_only,
            out: Outgoing::default(),
            recv_done: false,
            source_waits: false,
            failed: false,
            connect,
            tunnel: false,
        };
        self.respond(&mut ex, res);
        self.exchanges.insert(id, ex);
    }

    /// Queues `res`'s head and, if whole, its body; a streamed or file body is left to pull.
    fn respond(&mut self, ex: &mut Exchange, res: Response) {
        let Response {
            status,
            content_type,
            headers,
            body,
        } = res;
        #[cfg(feature = "ws")]
        let (status, body) = match body {
            Body::Upgrade(up) => self.open_tunnel(ex, status, up),
            body => (status, body),
        };
        let len = body.exact_len();
        let date = self.worker.date();
        let mut len_buf = itoa::Buffer::new();
        let len_field: Option<(&[u8], &[u8])> = match len {
            Some(n) if status != StatusCode::NO_CONTENT && status != StatusCode::NOT_MODIFIED => {
                Some((b"content-length", len_buf.format(n).as_bytes()))
            }
            _ => None,
        };
        let no_body = ex.head_only
            || matches!(body, Body::Empty)
            || len == Some(0)
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let fields = [
            (&b"server"[..], self.cfg.server_name.as_bytes()),
            (&b"date"[..], &date[..]),
        ]
        .into_iter()
        .chain(
            content_type
                .as_ref()
                .map(|ct| (&b"content-type"[..], ct.as_bytes())),
        )
        .chain(
            headers
                .iter()
                .filter(|(n, _)| !is_connection_specific(n))
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        )
        .chain(len_field);
        // The head, and a small whole body with it, leave as one chunk copied out of a buffer
        // the connection keeps: one allocation a response.
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        self.engine.headers(status.as_u16(), fields, &mut buf);
        ex.state = State::Done;
        if no_body {
            ex.out.push(Bytes::copy_from_slice(&buf));
            self.scratch = buf;
            ex.out.fin = true;
            return;
        }
        match body {
            Body::Full(b) => {
                self.engine.data_head(b.len() as u64, &mut buf);
                if b.len() <= SMALL_BODY {
                    buf.extend_from_slice(&b);
                    ex.out.push(Bytes::copy_from_slice(&buf));
                } else {
                    ex.out.push(Bytes::copy_from_slice(&buf));
                    ex.out.push(b);
                }
                ex.out.fin = true;
                self.scratch = buf;
                return;
            }
            Body::Stream { stream, .. } => ex.state = State::Stream(stream),
            Body::File { file, offset, len } => {
                ex.state = State::File {
                    file,
                    pos: offset,
                    left: len,
                }
            }
            _ => ex.out.fin = true,
        }
        ex.out.push(Bytes::copy_from_slice(&buf));
        self.scratch = buf;
    }

    /// A response that switches its stream to WebSocket (RFC 9220: a 200 to an extended CONNECT
    /// with `:protocol` `websocket`) becomes a tunnel: the session is the response body, fed by
    /// the request body, as over HTTP/2 (`ws/h2.rs`). A switch answered to anything else is the
    /// handler's mistake: 500.
    #[cfg(feature = "ws")]
    #[cold]
    fn open_tunnel(
        &self,
        ex: &mut Exchange,
        status: StatusCode,
        up: crate::ws::Upgrade,
    ) -> (StatusCode, Body) {
        match &ex.pipe {
            Some(pipe) if ex.connect && status == StatusCode::OK => {
                let input = RequestBody::piped(pipe.clone(), None);
                let tunnel = crate::ws::h2::H2Tunnel::new(up, input, self.worker.clone());
                ex.tunnel = true;
                (status, Body::stream(None, tunnel))
            }
            _ => {
                tracing::error!(peer = %self.peer, "a protocol switch answered to a request that cannot switch; answering 500");
                let res = Response::handler_panicked();
                (res.status, res.body)
            }
        }
    }

    /// Polls handlers and pulls bodies; true if anything moved.
    fn poll_exchanges(&mut self, cx: &mut Context<'_>) -> bool {
        let mut any = false;
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        ids.extend(self.exchanges.keys().copied());
        for &id in &ids {
            let Some(mut ex) = self.exchanges.remove(&id) else {
                continue;
            };
            if let State::Handler(fut) = &mut ex.state {
                let res = match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(Poll::Ready(res)) => Some(res),
                    Ok(Poll::Pending) => None,
                    Err(_) => Some(panicked(&self.peer)),
                };
                if let Some(res) = res {
                    any = true;
                    self.respond(&mut ex, res);
                    ex.deadline = later(self.worker.now(), self.quiet(ex.tunnel));
                }
            }
            if matches!(ex.state, State::Stream(_) | State::File { .. })
                && ex.out.queued < STREAM_AHEAD
            {
                any |= self.pull_body(id, &mut ex, cx);
            }
            self.exchanges.insert(id, ex);
        }
        self.ids = ids;
        any
    }

    /// Pulls a response body while its stream has little queued; true if anything came.
    fn pull_body(&self, id: StreamId, ex: &mut Exchange, cx: &mut Context<'_>) -> bool {
        let mut any = false;
        ex.source_waits = false;
        while ex.out.queued < STREAM_AHEAD {
            let piece = match &mut ex.state {
                State::Stream(s) => {
                    match catch_unwind(AssertUnwindSafe(|| s.as_mut().poll_next(cx))) {
                        Ok(Poll::Ready(Some(Ok(b)))) => Some(b),
                        Ok(Poll::Ready(None)) => None,
                        Ok(Poll::Ready(Some(Err(e)))) => {
                            tracing::warn!(peer = %self.peer, stream = %id, error = %e, "response body stream failed; stream reset");
                            ex.state = State::Done;
                            ex.failed = true;
                            return true;
                        }
                        Err(_) => {
                            tracing::error!(peer = %self.peer, stream = %id, "response body stream panicked; stream reset");
                            ex.state = State::Done;
                            ex.failed = true;
                            return true;
                        }
                        Ok(Poll::Pending) => {
                            ex.source_waits = true;
                            return any;
                        }
                    }
                }
                State::File { file, pos, left } => {
                    if *left == 0 {
                        None
                    } else {
                        let n = (*left).min(FILE_PIECE as u64) as usize;
                        let mut buf = BytesMut::zeroed(n);
                        match file.read_at(&mut buf, *pos) {
                            Ok(got) if got > 0 => {
                                buf.truncate(got);
                                *pos += got as u64;
                                *left -= got as u64;
                                Some(buf.freeze())
                            }
                            _ => {
                                tracing::error!(peer = %self.peer, stream = %id, "file body ended early or failed; stream reset");
                                ex.state = State::Done;
                                ex.failed = true;
                                return true;
                            }
                        }
                    }
                }
                _ => return any,
            };
            any = true;
            ex.deadline = later(self.worker.now(), self.quiet(ex.tunnel));
            match piece {
                Some(b) => {
                    if b.is_empty() {
                        continue;
                    }
                    let mut frame = Vec::with_capacity(8);
                    self.engine.data_head(b.len() as u64, &mut frame);
                    ex.out.push(frame.into());
                    ex.out.push(b);
                }
                None => {
                    ex.state = State::Done;
                    ex.out.fin = true;
                    return true;
                }
            }
        }
        any
    }

    /// Writes what each stream has queued; finishes the streams whose response is out.
    fn write_streams(&mut self) {
        if let Some((id, out)) = &mut self.control {
            let _ = write_out(&mut self.link.conn, *id, out);
        }
        let mut done = std::mem::take(&mut self.ids);
        done.clear();
        for (&id, ex) in self.exchanges.iter_mut() {
            if ex.failed {
                // A body that failed mid-way: the stream is reset rather than cut short
                // silently.
                let _ = self
                    .link
                    .conn
                    .send_stream(id)
                    .reset(code(ErrorCode::H3_INTERNAL_ERROR));
                done.push(id);
                continue;
            }
            match write_out(&mut self.link.conn, id, &mut ex.out) {
                Ok(true) if matches!(ex.state, State::Done) => {
                    self.unacked.push(id);
                    done.push(id);
                }
                Ok(_) => {}
                Err(()) => done.push(id),
            }
        }
        for &id in &done {
            if let Some(ex) = self.exchanges.remove(&id) {
                release(&ex, BodyError::Detached);
                if !ex.recv_done {
                    // The response is complete: the rest of the request is not needed
                    // (RFC 9114, Section 4.1).
                    let _ = self
                        .link
                        .conn
                        .recv_stream(id)
                        .stop(code(ErrorCode::H3_NO_ERROR));
                    self.engine.forget(u64::from(id));
                }
            }
        }
        self.ids = done;
    }

    /// Handler deadlines: 503 for a handler that ran out of time, a reset for a body that
    /// stalled.
    fn poll_timeouts(&mut self, cx: &mut Context<'_>) {
        let handshake_by = self
            .handshake_by
            .filter(|_| !self.connected && !self.closing);
        let Some(first) = self
            .exchanges
            .values()
            .map(|e| e.deadline)
            .chain(handshake_by)
            .min()
        else {
            self.timer_at = None;
            return;
        };
        if self.timer_at != Some(first) {
            self.timer_at = Some(first);
            self.timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(first));
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return;
        }
        let now = Instant::now();
        if handshake_by.is_some_and(|at| at <= now) {
            tracing::debug!(peer = %self.peer, "QUIC handshake timed out");
            self.worker.fault(ClientFault::TlsHandshake);
            self.handshake_by = None;
            self.close(ErrorCode::H3_NO_ERROR, "handshake timed out");
        }
        let expired: Vec<StreamId> = self
            .exchanges
            .iter()
            .filter(|(_, e)| e.deadline <= now && !matches!(e.state, State::Done))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let Some(mut ex) = self.exchanges.remove(&id) else {
                continue;
            };
            if let State::Handler(_) = ex.state {
                tracing::warn!(peer = %self.peer, stream = %id, "handler timed out");
                release(&ex, BodyError::Detached);
                ex.pipe = None;
                self.respond(&mut ex, Response::handler_timed_out());
                self.exchanges.insert(id, ex);
            } else {
                tracing::warn!(peer = %self.peer, stream = %id, "response body stalled; stream reset");
                release(&ex, BodyError::Detached);
                let _ = self
                    .link
                    .conn
                    .send_stream(id)
                    .reset(code(ErrorCode::H3_INTERNAL_ERROR));
            }
        }
        self.timer_at = None;
        cx.waker().wake_by_ref();
    }
}

/// Writes `out` on stream `id` as far as QUIC takes it; `Ok(true)` once all of it and its FIN
/// are written, `Err` if the stream is gone (stopped or closed).
fn write_out(
    conn: &mut quinn_proto::Connection,
    id: StreamId,
    out: &mut Outgoing,
) -> Result<bool, ()> {
    if out.finished {
        return Ok(true);
    }
    let mut s = conn.send_stream(id);
    while !out.chunks.is_empty() {
        match s.write_chunks(out.chunks.make_contiguous()) {
            Ok(w) => {
                out.queued -= w.bytes;
                for _ in 0..w.chunks {
                    out.chunks.pop_front();
                }
                if w.bytes == 0 {
                    return Ok(false);
                }
            }
            Err(WriteError::Blocked) => return Ok(false),
            Err(_) => return Err(()),
        }
    }
    if out.fin {
        out.finished = true;
        return match s.finish() {
            Ok(()) => Ok(true),
            Err(_) => Err(()),
        };
    }
    Ok(false)
}

/// The exchange's request body fails with `why` from now on.
fn release(ex: &Exchange, why: BodyError) {
    if let Some(pipe) = &ex.pipe {
        pipe.borrow_mut().close(PipeState::Failed(why));
    }
}
