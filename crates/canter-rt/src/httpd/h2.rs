//! The HTTP/2 connection actor: one task owns the socket, the [`canter_h2::Connection`] and
//! every stream's handler, and runs them all inline.
//!
//! Each turn of [`H2::poll`]:
//! 1. read what the socket has (up to the read budget, and only while the output is below
//!    the high-water mark) and let the engine parse it: requests start their handlers at
//!    once, body pieces go into their stream's pipe, resets drop their handler;
//! 2. poll the handlers still pending and pull response bodies (streams, files) while their
//!    stream has little queued, so a slow or zero-window client holds back the source
//!    instead of filling memory;
//! 3. give the window back for body bytes the handlers took;
//! 4. let the engine frame what the windows allow and write it all with one write.
//!
//! A handler that awaits does not hold the others: each is polled when the task wakes.

use std::cell::RefCell;
use std::fs::File;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use canter_h2::{Connection, ErrorCode, Event, Settings, Sink};
use http::StatusCode;

use crate::core::config::Config;
use crate::core::link::{Ending, Link, Timer};
use crate::core::output::Out;
use crate::core::stats::ClientFault;
use crate::core::transport::Transport;
use crate::core::worker::{later, Registration, Worker, READ_BUF};
use crate::httpd::body::{Body, BodyError, BodyStream, Pipe, PipeState, RequestBody};
use crate::httpd::service::{Reply, Request, Response, Service};
use crate::httpd::state::{count_io_fault, is_connection_specific, panicked, Http};

/// Response body bytes queued on one stream (waiting for window) below which its body source
/// is pulled for more.
const STREAM_AHEAD: usize = 64 * 1024;
/// Response body bytes pulled in one turn before yielding to the worker's other connections.
const PULL_TURN: usize = 1024 * 1024;
/// Piece of a file read into memory per pull.
const FILE_PIECE: usize = 16 * 1024;

impl Sink for Out {
    #[inline]
    fn buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
    #[inline]
    fn push(&mut self, data: Bytes) {
        Out::push(self, data)
    }
}

/// Why an HTTP/2 connection ended.
#[derive(Debug)]
enum Stop {
    /// Finished by protocol: GOAWAY exchanged, or the client closed.
    Done,
    /// A connection error, GOAWAY sent.
    Protocol(canter_h2::ConnError),
    /// A timeout fired in the named phase.
    Timeout(&'static str),
    /// The socket failed.
    Io(io::Error),
}

/// The HTTP/2 settings a server built with `cfg` advertises.
pub(crate) fn settings(cfg: &Config) -> Settings {
    let head = u32::try_from(cfg.limits.max_head()).unwrap_or(u32::MAX);
    cfg.http2
        .unwrap_or_default()
        .with_header_list_at_most(head)
        // WebSocket over HTTP/2 (RFC 8441) is served where WebSocket is.
        .with_connect_protocol(cfg!(feature = "ws"))
}

/// An HTTP/1.1 request that asked for `Upgrade: h2c`, answered 101.
pub(crate) struct Upgraded {
    pub(crate) head: canter_http::RequestHead,
    /// The decoded `HTTP2-Settings`.
    pub(crate) settings: Vec<u8>,
}

/// Serves one connection as HTTP/2 on `link`, whose input holds what was already read (the
/// preface, when it was sniffed on the plain listener). With `upgraded`, the connection comes
/// from HTTP/1.1 after a 101, and the upgrading request is stream 1.
pub(crate) async fn serve<S: Service, T: Transport>(
    registration: Registration,
    io: T,
    peer: SocketAddr,
    svc: Rc<Http<S>>,
    cfg: Rc<Config>,
    mut link: Link,
    upgraded: Option<Upgraded>,
) {
    link.prepare_output();
    let out = &mut link.out;
    let conn = match &upgraded {
        None => Connection::new(settings(&cfg), out),
        Some(up) => match Connection::upgrade(settings(&cfg), &up.settings, out) {
            Ok(conn) => conn,
            Err(e) => {
                link.worker.fault(ClientFault::Protocol);
                tracing::debug!(%peer, error = %e, "h2c upgrade refused");
                link.release_all();
                return;
            }
        },
    };
    let mut h2 = H2::new(conn, io, peer, svc, cfg, link);
    if let Some(up) = upgraded {
        let head_only = up.head.method() == canter_http::Method::Head;
        h2.dispatch(1, up.head, None, RequestBody::empty(), head_only, None);
    }
    drive(h2, registration).await;
}

async fn drive<S: Service, T: Transport>(mut h2: H2<S, T>, registration: Registration) {
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    h2.link.worker.set_waker(registration.id, waker);
    let peer = h2.peer;
    let result = poll_fn(|cx| h2.poll(cx)).await;
    match &result {
        Ok(()) | Err(Stop::Done) => {}
        Err(Stop::Protocol(e)) => {
            h2.link.worker.fault(ClientFault::Protocol);
            tracing::debug!(%peer, error = %e, "HTTP/2 connection error");
        }
        Err(Stop::Timeout(phase)) => {
            if *phase == "idle" {
                h2.link.worker.fault(ClientFault::IdleTimeout);
            }
            tracing::debug!(%peer, phase, "HTTP/2 connection timed out");
        }
        Err(Stop::Io(e)) => {
            count_io_fault(&h2.link.worker, e);
            tracing::debug!(%peer, error = %e, "HTTP/2 connection I/O error");
        }
    }
    if !matches!(result, Err(Stop::Io(_))) {
        // Send the GOAWAY (or anything else still buffered) before closing; bounded by the
        // write timeout.
        let timeout = h2.cfg.timeouts.write();
        h2.link.finish(&mut h2.io, timeout, Ending::Shutdown).await;
    }
    h2.exchanges.clear();
    h2.link.release_all();
    drop(registration);
}

/// One stream's exchange while it needs the task: its handler pending, or its body being
/// pulled.
struct Exchange {
    stream: u32,
    state: State,
    pipe: Option<Rc<RefCell<Pipe>>>,
    /// Body bytes the handler had taken at the last look (to give the window back).
    consumed: u64,
    /// Body bytes received, to enforce the body limit.
    received: u64,
    /// When the handler times out, or the body stream is deemed stalled.
    deadline: Instant,
    /// A HEAD request: the response has no body.
    head_only: bool,
    /// A CONNECT request: answered 2xx, the stream is a tunnel (RFC 8441's WebSocket), whose
    /// input is not a body under the body limit and whose silence is not a stall.
    connect: bool,
    /// The stream is such a tunnel.
    tunnel: bool,
    /// The body's source said Pending at the last pull: it wakes the task when it has more,
    /// so it is not pulled again just because its stream has room (that spun the task while
    /// a slow stream or a quiet tunnel waited).
    source_waits: bool,
}

/// Whether `res` switches its stream to another protocol (see `H2::tunnel`).
#[inline]
fn switches(res: &Response) -> bool {
    #[cfg(feature = "ws")]
    return matches!(res.body, Body::Upgrade(_));
    #[cfg(not(feature = "ws"))]
    {
        let _ = res;
        false
    }
}

/// How long a tunnel may be silent as far as the stall timeout goes: its protocol has timeouts
/// of its own.
const TUNNEL_QUIET: std::time::Duration = std::time::Duration::from_secs(365 * 86400);

enum State {
    Handler(Pin<Box<dyn Future<Output = Response>>>),
    Stream(Pin<Box<dyn BodyStream>>),
    File {
        file: File,
        pos: u64,
        left: u64,
    },
    /// The response is out (or queued in the engine); kept while the body may still arrive.
    Done,
}

struct H2<S, T> {
    conn: Connection,
    io: T,
    peer: SocketAddr,
    /// The transport is TLS (for [`crate::peer_is_tls`]).
    tls: bool,
    /// The input, the output and the worker: what every protocol's connection has.
    link: Link,
    svc: Rc<Http<S>>,
    cfg: Rc<Config>,
    exchanges: Vec<Exchange>,
    timer: Timer,
    eof: bool,
    /// Last time a stream was open or a frame arrived: the idle timeout counts from here.
    active_at: Instant,
    drained: bool,
    /// The input holds bytes not parsed yet.
    unparsed: bool,
    /// Response body bytes pulled since the task last yielded.
    pulled_in_turn: usize,
}

impl<S: Service, T: Transport> H2<S, T> {
    fn new(
        conn: Connection,
        io: T,
        peer: SocketAddr,
        svc: Rc<Http<S>>,
        cfg: Rc<Config>,
        link: Link,
    ) -> H2<S, T> {
        let now = link.worker.now();
        H2 {
            conn,
            tls: io.encrypted(),
            io,
            peer,
            unparsed: !link.input.is_empty(),
            link,
            svc,
            cfg,
            exchanges: Vec::new(),
            timer: Timer::new(),
            eof: false,
            active_at: now,
            drained: false,
            pulled_in_turn: 0,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Stop>> {
        crate::set_peer(self.peer, self.tls);
        self.pulled_in_turn = 0;
        loop {
            if self.link.worker.draining() && !self.drained {
                self.drained = true;
                self.link.prepare_output();
                self.conn.go_away(&mut self.link.out);
            }
            let mut again = false;
            // Input already buffered (the sniffed preface and what came with it) is parsed
            // before anything is read.
            let mut input = std::mem::take(&mut self.unparsed);
            // Reading waits while the output is above its high-water mark; once this turn's
            // writes bring it below, the read must be tried again here: the wake-up that
            // brought the client's next frames (a WINDOW_UPDATE that reopens a stream) may
            // already have been spent on this turn, and no other would come.
            let read_held = !input && !self.eof && self.link.out.len() >= self.cfg.high_water;
            if !input && !self.eof && !read_held {
                if self.link.budget_spent(self.cfg.read_budget) {
                    // Let the worker's other connections run.
                    cx.waker().wake_by_ref();
                    self.poll_write(cx)?;
                    return Poll::Pending;
                }
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) => self.eof = true,
                    Poll::Ready(Ok(_)) => input = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Stop::Io(e))),
                    Poll::Pending => {}
                }
            }
            if input {
                again = true;
                self.active_at = self.link.worker.now();
                self.link.prepare_output();
                if let Err(e) = self.conn.recv(&mut self.link.input, &mut self.link.out) {
                    self.events();
                    self.poll_write(cx)?;
                    return Poll::Ready(Err(Stop::Protocol(e)));
                }
                self.events();
            }
            self.poll_exchanges(cx);
            self.give_back_windows();
            if !self.link.out.is_empty() || self.conn.queued() > 0 {
                self.link.prepare_output();
            }
            self.conn.flush(&mut self.link.out);
            self.poll_write(cx)?;
            if read_held && self.link.out.len() < self.cfg.high_water {
                again = true;
            }
            // Bodies whose queue the flush emptied can give more now, while the socket takes it.
            if !again && self.link.out.len() < self.cfg.high_water && self.wants_pull() {
                if self.pulled_in_turn >= PULL_TURN {
                    self.pulled_in_turn = 0;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                again = true;
            }
            if self.eof {
                // The client closed its side: nobody reads the answers still pending.
                if !self.exchanges.is_empty() {
                    tracing::debug!(peer = %self.peer, streams = self.exchanges.len(), "client closed; handlers cancelled");
                }
                return Poll::Ready(Err(Stop::Done));
            }
            if self.conn.is_finished() && self.exchanges.is_empty() && self.link.out.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if !again {
                break;
            }
        }
        // The input stays while streams are open: their body pieces may still share it.
        if self.exchanges.is_empty() {
            self.link.release_idle();
        } else if self.link.out.is_empty() && self.link.out.buf.capacity() > 0 {
            self.link
                .worker
                .give_buf(std::mem::take(&mut self.link.out.buf));
        }
        self.poll_timeouts(cx)
    }

    fn poll_write(&mut self, cx: &mut Context<'_>) -> Result<(), Stop> {
        self.link.poll_send(&mut self.io, cx).map_err(Stop::Io)
    }

    fn poll_timeouts(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Stop>> {
        let t = &self.cfg.timeouts;
        let write_at = self.link.write_deadline(t.write());
        // Streams whose response is out but whose request body never ends do not keep a quiet
        // connection alive.
        let idle_at = self
            .exchanges
            .is_empty()
            .then(|| later(self.active_at, t.idle()));
        let handler_at = self.exchanges.iter().map(|e| e.deadline).min();
        let Some(first) = [write_at, idle_at, handler_at].into_iter().flatten().min() else {
            return Poll::Pending;
        };
        if !self.timer.poll_expired(cx, first) {
            return Poll::Pending;
        }
        let passed = |at: Instant| crate::core::worker::clock() >= Worker::expiry(at);
        if write_at.is_some_and(passed) {
            if self.link.write_timed_out(&self.io) {
                return Poll::Ready(Err(Stop::Timeout("write")));
            }
            // The peer is still taking what the kernel holds: the deadline moved on.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if idle_at.is_some_and(passed) {
            self.conn.go_away(&mut self.link.out);
            let _ = self.poll_write(cx);
            return Poll::Ready(Err(Stop::Timeout("idle")));
        }
        // Handlers past their deadline: 503 if nothing was sent, else the stream is reset.
        let expired: Vec<usize> = (0..self.exchanges.len())
            .filter(|&i| passed(self.exchanges[i].deadline))
            .collect();
        for i in expired.into_iter().rev() {
            let ex = self.exchanges.swap_remove(i);
            self.link.prepare_output();
            match ex.state {
                State::Handler(_) => {
                    tracing::warn!(peer = %self.peer, stream = ex.stream, "handler timed out");
                    self.release(&ex, BodyError::Detached);
                    let res = Response::handler_timed_out();
                    self.respond_and_track(ex.stream, res, ex.head_only, None, false);
                }
                State::Stream(_) | State::File { .. } => {
                    tracing::warn!(peer = %self.peer, stream = ex.stream, "response body stalled; stream reset");
                    self.release(&ex, BodyError::Detached);
                    self.conn
                        .reset(ex.stream, ErrorCode::INTERNAL_ERROR, &mut self.link.out);
                }
                State::Done => {}
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let max_frame = self.conn.max_frame_buffer();
        self.link.poll_read(&mut self.io, cx, READ_BUF, |input| {
            // Room for at least a whole frame of the largest size we accept.
            let want = max_frame.saturating_sub(input.len()).max(READ_BUF / 2);
            if input.capacity() - input.len() < READ_BUF / 2 {
                input.reserve(want.min(max_frame));
            }
        })
    }

    fn find(&mut self, stream: u32) -> Option<usize> {
        self.exchanges.iter().position(|e| e.stream == stream)
    }

    fn events(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                Event::Request {
                    stream,
                    head,
                    end_stream,
                } => self.start(stream, head, end_stream),
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => self.data(stream, data, end_stream),
                Event::Trailers { stream, .. } => {
                    if let Some(i) = self.find(stream) {
                        if let Some(pipe) = &self.exchanges[i].pipe {
                            pipe.borrow_mut().close(PipeState::End);
                        }
                    }
                }
                Event::Reset { stream, code } => {
                    if let Some(i) = self.find(stream) {
                        let ex = self.exchanges.swap_remove(i);
                        self.release(&ex, BodyError::Disconnected);
                        tracing::debug!(peer = %self.peer, stream, %code, "stream reset");
                    }
                }
                Event::Reject { stream, status } => {
                    self.link.worker.fault(ClientFault::BadRequest);
                    tracing::debug!(peer = %self.peer, stream, status, "request rejected");
                    let res = Response::new(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                    );
                    self.respond_and_track(stream, res, false, None, false);
                }
                Event::GoAway { last_stream, code } => {
                    tracing::debug!(peer = %self.peer, last_stream, %code, "client sent GOAWAY");
                }
            }
        }
    }

    fn data(&mut self, stream: u32, data: Bytes, end_stream: bool) {
        let len = data.len();
        let Some(i) = self.find(stream) else {
            // Nobody reads this body any more.
            self.conn.consume(stream, len, &mut self.link.out);
            return;
        };
        let max_body = self.cfg.limits.max_body();
        let ex = &mut self.exchanges[i];
        ex.received += len as u64;
        let Some(pipe) = &ex.pipe else {
            self.conn.consume(stream, len, &mut self.link.out);
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
            drop(p);
            self.conn.consume(stream, len, &mut self.link.out);
        } else if ex.received > limit {
            p.close(PipeState::Failed(BodyError::TooLarge));
            drop(p);
            self.conn.consume(stream, len, &mut self.link.out);
        } else {
            if len > 0 {
                p.push(data);
            }
            if end_stream {
                p.close(PipeState::End);
            }
            drop(p);
        }
    }

    fn start(&mut self, stream: u32, head: canter_h2::RequestHead, end_stream: bool) {
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
            Ok(rh) => rh,
            Err(e) => {
                self.link.worker.fault(ClientFault::BadRequest);
                tracing::debug!(peer = %self.peer, stream, status = e.status(), error = %e, "bad request");
                let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
                let res = Response::text(format!(
                    "{}\n",
                    status.canonical_reason().unwrap_or("Bad Request")
                ))
                .with_status(status);
                self.respond_and_track(stream, res, head_only, None, false);
                return;
            }
        };
        if declared.is_some_and(|n| n > self.cfg.limits.max_body()) {
            let res =
                Response::text("Payload Too Large\n").with_status(StatusCode::PAYLOAD_TOO_LARGE);
            self.respond_and_track(stream, res, head_only, None, false);
            return;
        }
        let (pipe, body) = if end_stream {
            (None, RequestBody::empty())
        } else {
            let pipe = Rc::new(RefCell::new(Pipe::new()));
            (Some(pipe.clone()), RequestBody::piped(pipe, declared))
        };
        let protocol = head.protocol().map(|p| {
            crate::httpd::service::ConnectProtocol(String::from_utf8_lossy(p).into_owned())
        });
        self.dispatch(stream, rh, pipe, body, head_only, protocol);
    }

    /// Runs the service for a request; answers at once or keeps the pending handler.
    fn dispatch(
        &mut self,
        stream: u32,
        rh: canter_http::RequestHead,
        pipe: Option<Rc<RefCell<Pipe>>>,
        body: RequestBody,
        head_only: bool,
        protocol: Option<crate::httpd::service::ConnectProtocol>,
    ) {
        let connect = rh.method() == canter_http::Method::Connect;
        let mut req = Request::new(rh, body);
        if let Some(protocol) = protocol {
            req.extensions_mut().insert(protocol);
        }
        #[cfg(feature = "tls")]
        if let Some(certs) = self.io.peer_certificates() {
            req.extensions_mut().insert(certs);
        }
        let svc = &self.svc;
        let reply = match catch_unwind(AssertUnwindSafe(|| svc.call(req))) {
            Ok(r) => r,
            Err(_) => Reply::Ready(panicked(&self.peer)),
        };
        match reply {
            Reply::Ready(res) => self.respond_and_track(stream, res, head_only, pipe, connect),
            Reply::Pending(fut) => self.exchanges.push(Exchange {
                stream,
                state: State::Handler(fut),
                pipe,
                consumed: 0,
                received: 0,
                deadline: later(self.link.worker.now(), self.cfg.handler_timeout),
                head_only,
                connect,
                tunnel: false,
                source_waits: false,
            }),
        }
    }

    /// Sends `res` on a stream that has no exchange (yet), and keeps one if its body is still
    /// to be pulled. `connect`: the request was a CONNECT (see [`Exchange::connect`]).
    fn respond_and_track(
        &mut self,
        stream: u32,
        res: Response,
        head_only: bool,
        pipe: Option<Rc<RefCell<Pipe>>>,
        connect: bool,
    ) {
        let mut res = res;
        let tunnel = self.tunnel(&mut res, connect, pipe.as_ref());
        let state = self.respond(stream, res, head_only);
        if matches!(state, State::Done) {
            detach(pipe.as_ref());
            return;
        }
        let deadline = self.stall_deadline(tunnel);
        self.exchanges.push(Exchange {
            stream,
            state,
            pipe,
            consumed: 0,
            received: 0,
            deadline,
            head_only,
            connect,
            tunnel,
            source_waits: false,
        });
    }

    /// When a body that yields nothing more counts as stalled: never, for a tunnel.
    fn stall_deadline(&self, tunnel: bool) -> Instant {
        let quiet = if tunnel {
            TUNNEL_QUIET
        } else {
            self.cfg.handler_timeout
        };
        later(self.link.worker.now(), quiet)
    }

    /// A response that switches the stream to another protocol (RFC 8441's WebSocket, a 200 to
    /// an extended CONNECT) becomes the tunnel's body, fed by the request body; true then. A
    /// switch answered to anything else is the handler's mistake: 500. Every other response
    /// passes untouched (one test of its body's kind).
    #[inline]
    fn tunnel(&self, res: &mut Response, connect: bool, pipe: Option<&Rc<RefCell<Pipe>>>) -> bool {
        #[cfg(feature = "ws")]
        if switches(res) {
            return self.open_tunnel(res, connect, pipe);
        }
        let _ = (res, connect, pipe);
        false
    }

    #[cfg(feature = "ws")]
    #[cold]
    #[inline(never)]
    fn open_tunnel(
        &self,
        res: &mut Response,
        connect: bool,
        pipe: Option<&Rc<RefCell<Pipe>>>,
    ) -> bool {
        let body = std::mem::replace(&mut res.body, Body::Empty);
        match (body, pipe) {
            (Body::Upgrade(up), Some(pipe)) if connect && res.status == StatusCode::OK => {
                let input = RequestBody::piped(pipe.clone(), None);
                let tunnel = crate::ws::h2::H2Tunnel::new(up, input, self.link.worker.clone());
                res.body = Body::stream(None, tunnel);
                true
            }
            _ => {
                tracing::error!(peer = %self.peer, "a protocol switch answered to a request that cannot switch; answering 500");
                *res = Response::handler_panicked();
                false
            }
        }
    }

    /// Sends `res` on `stream`: the head at once, a full body queued; returns what is left to
    /// do (a stream or file body to pull), or [`State::Done`].
    fn respond(&mut self, stream: u32, res: Response, head_only: bool) -> State {
        // A switch reaches here only unconverted (see `tunnel`): it cannot happen.
        #[cfg(feature = "ws")]
        let res = if matches!(res.body, Body::Upgrade(_)) {
            Response::handler_panicked()
        } else {
            res
        };
        let Response {
            status,
            content_type,
            headers,
            body,
        } = res;
        let len = body.exact_len();
        let date = self.link.worker.date();
        let mut len_buf = itoa::Buffer::new();
        let len_field: Option<(&[u8], &[u8])> = match len {
            Some(n) if status != StatusCode::NO_CONTENT && status != StatusCode::NOT_MODIFIED => {
                Some((b"content-length", len_buf.format(n).as_bytes()))
            }
            _ => None,
        };
        let no_body = head_only
            || matches!(body, Body::Empty)
            || len == Some(0)
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        // `Alt-Svc` (over TLS with HTTP/3 on) with the fixed fields: one more level of `chain`
        // cost every other connection 40 instructions a response.
        let alt_svc = self.svc.alt_svc_for(self.tls);
        let fixed = [
            (&b"server"[..], self.cfg.server_name.as_bytes()),
            (&b"date"[..], &date[..]),
            alt_svc.map_or((&b""[..], &b""[..]), |(n, v)| {
                (n.as_str().as_bytes(), v.as_bytes())
            }),
        ];
        let fields = fixed[..2 + usize::from(alt_svc.is_some())]
            .iter()
            .copied()
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
        self.link.prepare_output();
        if self
            .conn
            .send_headers(stream, status.as_u16(), fields, no_body, &mut self.link.out)
            .is_err()
            || no_body
        {
            return State::Done;
        }
        match body {
            Body::Empty => State::Done,
            Body::Full(b) => {
                let _ = self.conn.send_data(stream, b, true);
                State::Done
            }
            Body::Stream { stream: s, .. } => State::Stream(s),
            Body::File { file, offset, len } => State::File {
                file,
                pos: offset,
                left: len,
            },
            #[cfg(feature = "ws")]
            Body::Upgrade(_) => State::Done,
        }
    }

    fn poll_exchanges(&mut self, cx: &mut Context<'_>) {
        let mut i = 0;
        while i < self.exchanges.len() {
            let ex = &mut self.exchanges[i];
            let stream = ex.stream;
            if let State::Handler(fut) = &mut ex.state {
                let res = match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(Poll::Ready(res)) => Some(res),
                    Ok(Poll::Pending) => None,
                    Err(_) => Some(panicked(&self.peer)),
                };
                if let Some(mut res) = res {
                    let (head_only, connect) = (ex.head_only, ex.connect);
                    // The request body's pipe, only for a response that may become a tunnel.
                    let pipe = switches(&res).then(|| ex.pipe.clone()).flatten();
                    let tunnel = self.tunnel(&mut res, connect, pipe.as_ref());
                    let state = self.respond(stream, res, head_only);
                    let deadline = self.stall_deadline(tunnel);
                    let ex = &mut self.exchanges[i];
                    ex.state = state;
                    ex.tunnel = tunnel;
                    ex.deadline = deadline;
                }
            }
            if matches!(
                self.exchanges[i].state,
                State::Stream(_) | State::File { .. }
            ) {
                self.pull_body(i, cx);
            }
            // Done: the response is with the engine; a body still arriving is discarded.
            if matches!(self.exchanges[i].state, State::Done) {
                let ex = self.exchanges.swap_remove(i);
                self.release(&ex, BodyError::Detached);
                continue;
            }
            i += 1;
        }
    }

    /// Whether a body being pulled has room for more in its stream's queue.
    fn wants_pull(&self) -> bool {
        self.exchanges.iter().any(|e| {
            matches!(e.state, State::Stream(_) | State::File { .. })
                && !e.source_waits
                && self.conn.stream_queued(e.stream) < STREAM_AHEAD
                && self.conn.can_send(e.stream)
        })
    }

    /// Pulls a response body from its source while the stream has little queued.
    fn pull_body(&mut self, i: usize, cx: &mut Context<'_>) {
        let stream = self.exchanges[i].stream;
        self.exchanges[i].source_waits = false;
        loop {
            if self.conn.stream_queued(stream) >= STREAM_AHEAD
                || self.link.out.len() >= self.cfg.high_water
            {
                return;
            }
            if !self.conn.can_send(stream) {
                self.exchanges[i].state = State::Done;
                return;
            }
            let ex = &mut self.exchanges[i];
            match &mut ex.state {
                State::Stream(s) => {
                    match catch_unwind(AssertUnwindSafe(|| s.as_mut().poll_next(cx))) {
                        Ok(Poll::Ready(Some(Ok(b)))) => {
                            self.pulled_in_turn += b.len();
                            if !ex.tunnel {
                                ex.deadline =
                                    later(self.link.worker.now(), self.cfg.handler_timeout);
                            }
                            let _ = self.conn.send_data(stream, b, false);
                        }
                        Ok(Poll::Ready(None)) => {
                            ex.state = State::Done;
                            let _ = self.conn.send_data(stream, Bytes::new(), true);
                            return;
                        }
                        Ok(Poll::Ready(Some(Err(e)))) => {
                            tracing::warn!(peer = %self.peer, stream, error = %e, "response body stream failed; stream reset");
                            ex.state = State::Done;
                            self.link.prepare_output();
                            self.conn
                                .reset(stream, ErrorCode::INTERNAL_ERROR, &mut self.link.out);
                            return;
                        }
                        Err(_) => {
                            tracing::error!(peer = %self.peer, stream, "response body stream panicked; stream reset");
                            ex.state = State::Done;
                            self.link.prepare_output();
                            self.conn
                                .reset(stream, ErrorCode::INTERNAL_ERROR, &mut self.link.out);
                            return;
                        }
                        Ok(Poll::Pending) => {
                            ex.source_waits = true;
                            return;
                        }
                    }
                }
                State::File { file, pos, left } => {
                    let n = (*left).min(FILE_PIECE as u64) as usize;
                    let mut buf = BytesMut::zeroed(n);
                    match file.read_at(&mut buf, *pos) {
                        Ok(0) | Err(_) => {
                            tracing::error!(peer = %self.peer, stream, "file body ended early or failed; stream reset");
                            ex.state = State::Done;
                            self.link.prepare_output();
                            self.conn
                                .reset(stream, ErrorCode::INTERNAL_ERROR, &mut self.link.out);
                            return;
                        }
                        Ok(got) => {
                            self.pulled_in_turn += got;
                            buf.truncate(got);
                            *pos += got as u64;
                            *left -= got as u64;
                            let end = *left == 0;
                            if end {
                                ex.state = State::Done;
                            }
                            ex.deadline = later(self.link.worker.now(), self.cfg.handler_timeout);
                            let _ = self.conn.send_data(stream, buf.freeze(), end);
                            if end {
                                return;
                            }
                        }
                    }
                }
                _ => return,
            }
        }
    }

    /// Ends an exchange that leaves the connection: its request body fails with `why` from now
    /// on, and the body bytes it was given but did not read go back to the connection window
    /// (kept, they would shrink it for good: enough resets of uploads and no client could send).
    fn release(&mut self, ex: &Exchange, why: BodyError) {
        let Some(pipe) = &ex.pipe else {
            return;
        };
        let delivered = {
            let mut p = pipe.borrow_mut();
            p.close(PipeState::Failed(why));
            p.delivered()
        };
        if delivered > ex.consumed {
            self.link.prepare_output();
            self.conn.consume(
                ex.stream,
                (delivered - ex.consumed) as usize,
                &mut self.link.out,
            );
        }
    }

    /// Opens the windows again by what the handlers have read from their pipes.
    fn give_back_windows(&mut self) {
        for ex in &mut self.exchanges {
            if let Some(pipe) = &ex.pipe {
                let consumed = pipe.borrow().consumed();
                if consumed > ex.consumed {
                    let n = (consumed - ex.consumed) as usize;
                    ex.consumed = consumed;
                    self.link.prepare_output();
                    self.conn.consume(ex.stream, n, &mut self.link.out);
                }
            }
        }
    }
}

/// The handler is done with the request body: later reads fail, later data is discarded.
fn detach(pipe: Option<&Rc<RefCell<Pipe>>>) {
    if let Some(p) = pipe {
        p.borrow_mut().close(PipeState::Failed(BodyError::Detached));
    }
}
