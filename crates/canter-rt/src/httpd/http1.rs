//! The HTTP/1.1 driver: one task per connection owns the transport, its [`Link`] (buffers,
//! read budget, write timeout, the close: see [`crate::core::link`]) and the [`canter_h1::Conn`]
//! state, and runs the handler inline. What is HTTP/1.1's lives here: the keep-or-close
//! decisions the engine makes, when a close lingers, the cached response preamble, the h2c
//! upgrade and the HTTP/2 preface sniffing.
//!
//! The loop, per turn:
//! 1. `process`: parse every complete request in the read buffer; for each, call the service and
//!    encode the response into the output buffer (pipelined responses accumulate). Above the
//!    high-water mark it flushes before parsing the next request, so a peer that does not read
//!    stops being read from.
//! 2. `flush`: write the whole batch with one `write`/`writev`.
//! 3. `read`: wait for more bytes under the idle or head timeout (buffers go back to the worker's
//!    pool while waiting), then loop.
//!
//! A handler that returns a future is polled by this same task; when it waits for request body
//! bytes the task reads the socket for it (see [`crate::httpd::body`]).

use std::cell::RefCell;
use std::fs::File;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use canter_h1::{BodyEvent, BodyLen, Conn, Discard, Next};
use canter_http::RequestHead;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::core::config::Config;
use crate::core::link::{Ending, Link, Stall, Timer, WriteError};
use crate::core::stats::ClientFault;
use crate::core::transport::Transport;
use crate::core::worker::{clock, later, Registration, Worker, READ_BUF};
use crate::httpd::body::{Body, BodyError, Pipe, PipeState, RequestBody};
use crate::httpd::service::{Reply, Request, Response, Service};
use crate::httpd::state::{count_io_fault, Http};

/// Buffered input up to which the connection keeps reading while a handler is pending, to
/// notice a peer that goes away.
const LOOKAHEAD: usize = READ_BUF;
/// Reads into a pending request head after which it is parsed again even without a new line.
const DEFER_MAX: u32 = 16;

/// Largest piece of a file body handed to one `sendfile(2)` call.
const FILE_PIECE: usize = 256 * 1024;
/// File body bytes sent in one turn before yielding to the worker's other connections.
const FILE_TURN: usize = 1024 * 1024;
/// Piece of a file read into memory for a transport that cannot take `sendfile(2)` (TLS): one
/// full TLS record's plaintext.
const COPY_PIECE: usize = 16 * 1024;

/// Why a connection ended.
#[derive(Debug)]
enum Stop {
    /// Closed by protocol: `Connection: close`, an error answered, or draining.
    Done,
    /// The peer closed its side.
    Eof,
    /// A timeout fired in the named phase.
    Timeout(&'static str),
    /// The socket failed.
    Io(io::Error),
    /// The connection switches protocols after a 101: to HTTP/2 (`Upgrade: h2c`) or to what
    /// the handler's response says (WebSocket); `Driver::upgrade` says which.
    Upgrade,
}

type Res<T> = Result<T, Stop>;

/// A connection HTTP/1.1 gives up to HTTP/2 ([`serve`] returns it; `http.rs` runs HTTP/2 on
/// it): the transport with what was read and written so far, and, when it came by `Upgrade:
/// h2c` (answered 101 here), the request that asked and its decoded `HTTP2-Settings`.
#[cfg_attr(not(feature = "http2"), allow(dead_code))]
pub(crate) struct Handoff<S, T> {
    pub(crate) registration: Registration,
    pub(crate) io: T,
    pub(crate) link: Link,
    pub(crate) svc: Rc<Http<S>>,
    pub(crate) cfg: Rc<Config>,
    pub(crate) upgrade: Option<(RequestHead, Vec<u8>)>,
}

/// Serves one accepted connection as HTTP/1.1 until it closes. With `sniff_h2`, a connection
/// that opens with the HTTP/2 preface (h2c with prior knowledge), or that asks for `Upgrade:
/// h2c`, is given back ([`Handoff`]) for the caller to run HTTP/2 on.
pub(crate) async fn serve<S: Service, T: Transport>(
    registration: Registration,
    io: T,
    peer: SocketAddr,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
    sniff_h2: bool,
) -> Option<Handoff<S, T>> {
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    worker.set_waker(registration.id, waker);
    let now = worker.now();
    let mut driver = Driver {
        h1: Conn::new(cfg.limits, cfg.timeouts, now),
        tls: io.encrypted(),
        io,
        peer,
        link: Link::new(worker.clone(), BytesMut::new()),
        svc,
        cfg,
        timer: Timer::new(),
        phase: Phase::Open,
        deferred: 0,
        allow_h2c: sniff_h2,
        upgrade: None,
    };
    #[cfg(feature = "http2")]
    if sniff_h2 {
        match driver.sniff_h2().await {
            Ok(false) => {}
            Ok(true) => return Some(driver.hand_off(registration, None)),
            Err(e) => {
                if let Stop::Io(e) = e {
                    count_io_fault(&worker, &e);
                    tracing::debug!(%peer, error = %e, "connection error");
                }
                driver.link.release_idle();
                return None;
            }
        }
    }
    // Polled out of line: inlined into this function, the loop of every request shares its
    // code with the connection's set-up and end, and its hot path spreads over more cache lines.
    let result = OutOfLine(driver.run()).await;
    if let (Err(Stop::Upgrade), Some(upgrade)) = (&result, driver.upgrade.take()) {
        let (head, settings) = match *upgrade {
            Switch::H2c(head, settings) => (head, settings),
            #[cfg(feature = "ws")]
            Switch::WebSocket(up) => {
                // The 101 is written (`run` flushed it); what the client sent after its
                // request is the WebSocket's first input.
                let Driver { io, link, cfg, .. } = driver;
                let (timeout, budget) = (cfg.timeouts.write(), cfg.read_budget);
                let socket = async move {
                    // Draining wakes the connection through its registration: this task now.
                    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
                    link.worker.set_waker(registration.id, waker);
                    crate::ws::driver::serve(io, link, up, timeout, budget).await;
                    drop(registration);
                };
                if worker.spawns() {
                    // A task of its own, sized for the WebSocket: this one's HTTP/1.1 state
                    // (the largest part of an idle connection) is freed as it returns.
                    crate::core::tcp_loop::spawn_beside(socket);
                } else {
                    Box::pin(socket).await;
                }
                return None;
            }
        };
        // RFC 7540, Section 3.2: 101, then HTTP/2 frames; the request is answered on stream 1.
        driver.link.prepare_output();
        driver.link.out.buf.extend_from_slice(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        );
        if driver.flush().await.is_err() {
            driver.link.release_idle();
            return None;
        }
        return Some(driver.hand_off(registration, Some((head, settings))));
    }
    if matches!(result, Ok(()) | Err(Stop::Done)) {
        driver.finish().await;
    }
    match result {
        Ok(()) | Err(Stop::Done) | Err(Stop::Eof) | Err(Stop::Upgrade) => {}
        Err(Stop::Timeout(phase)) => {
            // A stalled head was counted where it was answered 408; a stalled write is the
            // reader's doing but not a fault of the request.
            if phase == "read" {
                driver.link.worker.fault(ClientFault::IdleTimeout);
            }
            tracing::debug!(%peer, phase, "connection timed out");
        }
        Err(Stop::Io(e)) => {
            count_io_fault(&driver.link.worker, &e);
            tracing::debug!(%peer, error = %e, "connection error");
        }
    }
    driver.link.release_idle();
    None
}

struct Driver<S, T> {
    h1: Conn,
    io: T,
    peer: SocketAddr,
    /// The transport is TLS (for [`crate::peer_is_tls`]).
    tls: bool,
    /// The input, the output and the worker: what every protocol's connection has.
    link: Link,
    svc: Rc<Http<S>>,
    cfg: Rc<Config>,
    timer: Timer,
    /// Where the connection is in its life.
    phase: Phase,
    /// Reads since a pending head was last parsed (a count, not part of the phase: it only
    /// paces parsing of a head that arrives in small pieces).
    deferred: u32,
    /// HTTP/2 is on and the connection is cleartext: `Upgrade: h2c` is honoured.
    allow_h2c: bool,
    /// The protocol the connection switches to once what is queued is written.
    upgrade: Option<Box<Switch>>,
}

/// What a connection switches to after HTTP/1.1.
enum Switch {
    /// HTTP/2, asked for by `Upgrade: h2c`: the request that asked (answered on stream 1) and
    /// its decoded `HTTP2-Settings`.
    H2c(RequestHead, Vec<u8>),
    /// WebSocket, as the handler's 101 says.
    #[cfg(feature = "ws")]
    WebSocket(crate::ws::Upgrade),
}

/// Where a connection is in its life: one value rather than a flag per condition, so that
/// no combination that cannot happen (an error answered on a connection that stays open, a
/// handler running on one that is closing) can be written down.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Reading and answering requests.
    Open,
    /// The service's `call` is running: a panic caught now is the handler's, answered 500.
    InHandler,
    /// Closes once what is buffered has been sent.
    Closing,
    /// An error was answered, or an exchange's state is unknown: the peer's input may be out
    /// of step with ours, so the close lingers (reads and drops what still comes) before the
    /// socket goes.
    Failed,
}

impl<S: Service, T: Transport> Driver<S, T> {
    /// The connection closes once what is buffered has been sent.
    #[inline]
    fn closing(&self) -> bool {
        matches!(self.phase, Phase::Closing | Phase::Failed)
    }

    /// Closes after what is buffered; a failed connection stays failed (its close lingers).
    #[inline]
    fn close(&mut self) {
        if self.phase != Phase::Failed {
            self.phase = Phase::Closing;
        }
    }

    /// Gives the connection, with what it has read, up for HTTP/2 (prior knowledge, or
    /// `upgrade` after a 101).
    fn hand_off(
        self,
        registration: Registration,
        upgrade: Option<(RequestHead, Vec<u8>)>,
    ) -> Handoff<S, T> {
        let Driver {
            io, link, svc, cfg, ..
        } = self;
        Handoff {
            registration,
            io,
            link,
            svc,
            cfg,
            upgrade,
        }
    }

    #[cfg(feature = "http2")]
    /// Reads until the input either starts with the HTTP/2 connection preface or cannot. What
    /// is not the preface is HTTP/1.1's to answer, malformed request lines included: a line
    /// with a missing, doubled or extra field, or a version that is no HTTP's (h2spec's
    /// invalid preface among them), gets its 400 and a close there, as over TLS and as nginx
    /// answers on a listener that also takes h2c.
    async fn sniff_h2(&mut self) -> Res<bool> {
        let preface = canter_h2::PREFACE;
        loop {
            let n = self.link.input.len().min(preface.len());
            if self.link.input[..n] != preface[..n] {
                return Ok(false);
            }
            if n == preface.len() {
                return Ok(true);
            }
            self.read().await?;
        }
    }

    async fn run(&mut self) -> Res<()> {
        let mut parse = true;
        loop {
            if parse {
                self.process().await?;
            }
            if self.closing() && self.final_answer() && self.upgrade.is_none() {
                // The client said this was its last request, and all of it was read: `finish`
                // writes the answer and the close together.
                return Ok(());
            }
            self.flush().await?;
            if self.upgrade.is_some() {
                return Err(Stop::Upgrade);
            }
            if self.closing() {
                return Ok(());
            }
            parse = self.read().await?;
        }
    }

    /// Answers every complete request in the read buffer, in order.
    async fn process(&mut self) -> Res<()> {
        let mut answered = 0;
        loop {
            crate::set_peer(self.peer, self.tls);
            // One unwinding boundary per run of requests answered without suspending, not one
            // per request: returning each reply through `catch_unwind` copied it twice more.
            let step = match catch_unwind(AssertUnwindSafe(|| self.answer_ready(&mut answered))) {
                Ok(step) => step,
                Err(_) => self.unwound(),
            };
            match step {
                Step::Done => return Ok(()),
                Step::Flush => self.flush().await?,
                Step::Yield => {
                    // Enough pipelined requests answered in one turn: send them, and let the
                    // worker's other connections run before parsing more.
                    answered = 0;
                    self.flush().await?;
                    tokio::task::yield_now().await;
                }
                // Boxed: the slow path's state would otherwise sit in every idle connection's
                // task.
                Step::Slow(slow) => Box::pin(self.exchange(slow)).await?,
            }
        }
    }

    /// Parses and answers requests while that needs no waiting; says what must happen next.
    fn answer_ready(&mut self, answered: &mut usize) -> Step {
        loop {
            if self.closing() {
                return Step::Done;
            }
            if self.link.out.len() >= self.cfg.high_water {
                return Step::Flush;
            }
            if *answered >= self.cfg.max_pipeline {
                return Step::Yield;
            }
            *answered += 1;
            match self
                .h1
                .poll_request(&mut self.link.input, self.link.worker.now())
            {
                // Asked of the connection, not the head, and handled out of line: a guard that
                // borrows the head, or a second place it moves to in this function, cost a
                // `memcpy` of the request on every exchange.
                Ok(Some(head)) if self.h1.h2c_upgrade_requested() => {
                    if let Some(step) = self.upgrade_or_exchange(head) {
                        return step;
                    }
                }
                Ok(Some(head)) => {
                    if let Some(slow) = self.exchange_sync(head) {
                        return Step::Slow(slow);
                    }
                }
                Ok(None) => return Step::Done,
                Err(e) => {
                    self.link.worker.fault(ClientFault::BadRequest);
                    tracing::debug!(peer = %self.peer, status = e.status(), error = %e, "bad request");
                    self.reject(e.status());
                    return Step::Done;
                }
            }
        }
    }

    /// A request with `Upgrade: h2c`: kept for the switch to HTTP/2 when h2c is allowed and
    /// the request qualifies (no body, valid `HTTP2-Settings`); otherwise served over HTTP/1.1,
    /// as RFC 7540 (Section 3.2) allows. `None`: answered, go on with the next request.
    #[cold]
    #[inline(never)]
    fn upgrade_or_exchange(&mut self, head: RequestHead) -> Option<Step> {
        match upgradable(&head).filter(|_| self.allow_h2c) {
            Some(settings) => {
                self.upgrade = Some(Box::new(Switch::H2c(head, settings)));
                Some(Step::Done)
            }
            None => self.exchange_sync(head).map(Step::Slow),
        }
    }

    /// After a panic in [`Driver::answer_ready`]: a handler's is answered 500 (and the
    /// connection closes); anywhere else the exchange's state is unknown, so the connection
    /// closes without another byte.
    fn unwound(&mut self) -> Step {
        if self.phase == Phase::InHandler {
            self.phase = Phase::Open;
            return Step::Slow(Slow {
                reply: None,
                pipe: None,
            });
        }
        tracing::error!(peer = %self.peer, "panic while serving the connection; closing it");
        self.phase = Phase::Failed;
        Step::Done
    }

    /// Starts an exchange and completes it without suspending when it can: no request body
    /// and a ready response with a full or empty body (the common case). Otherwise returns what
    /// [`Driver::exchange`] needs to finish it. A panic in the handler unwinds through here to
    /// [`Driver::process`], in [`Phase::InHandler`].
    #[inline(always)]
    fn exchange_sync(&mut self, head: RequestHead) -> Option<Slow> {
        if self.link.worker.draining() {
            self.h1.set_close();
        }
        let (pipe, body) = match head.body_kind() {
            canter_http::BodyKind::Length(0) => (None, RequestBody::empty()),
            kind => {
                let pipe = Rc::new(RefCell::new(Pipe::new()));
                let declared = match kind {
                    canter_http::BodyKind::Length(n) => Some(n),
                    canter_http::BodyKind::Chunked => None,
                };
                (Some(pipe.clone()), RequestBody::piped(pipe, declared))
            }
        };
        // The body is decoded only once the handler asks for it, so that limits it sets first
        // (`RequestBody::restrict`) cover every byte.
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut req = Request::new(head, body);
        // The client's verified certificates (TLS with client authentication). Nothing at all
        // on plain TCP, where the transport's answer is a constant `None`.
        #[cfg(feature = "tls")]
        if let Some(certs) = self.io.peer_certificates() {
            req.extensions_mut().insert(certs);
        }
        self.phase = Phase::InHandler;
        let reply = self.svc.call(req);
        self.phase = Phase::Open;
        match reply {
            Reply::Ready(Response {
                status,
                content_type,
                headers,
                body,
            }) if pipe.is_none() && matches!(body, Body::Empty | Body::Full(_)) => {
                let with_body = self.begin(status, content_type.as_ref(), &headers, &body, false);
                release_fields(headers);
                let complete = match body {
                    Body::Full(data) => !with_body || self.send(data),
                    _ => true,
                };
                self.end(complete);
                None
            }
            reply => Some(Slow {
                reply: Some(reply),
                pipe,
            }),
        }
    }

    /// Completes an exchange that needs to wait: for the handler's future, for the request
    /// body, or for the peer while a body streams out.
    async fn exchange(&mut self, slow: Slow) -> Res<()> {
        let Slow { reply, pipe } = slow;
        let response = match reply {
            Some(Reply::Ready(response)) => response,
            Some(Reply::Pending(mut fut)) => {
                let deadline = later(self.link.worker.now(), self.cfg.handler_timeout);
                match self
                    .drive(&mut fut, pipe.as_deref(), Some(deadline))
                    .await?
                {
                    Driven::Done(response) => response,
                    Driven::Panicked => self.panicked(),
                    Driven::Gone => {
                        tracing::debug!(peer = %self.peer, "peer closed the connection; handler cancelled");
                        return Err(Stop::Eof);
                    }
                    Driven::TimedOut => {
                        tracing::warn!(peer = %self.peer, "handler timed out");
                        self.h1.set_close();
                        Response::handler_timed_out()
                    }
                }
            }
            None => self.panicked(),
        };
        let complete = self.respond(response, pipe.as_ref()).await?;
        if let Some(pipe) = &pipe {
            pipe.borrow_mut()
                .close(PipeState::Failed(BodyError::Detached));
            if complete {
                self.discard_body().await?;
            }
        }
        self.end(complete);
        Ok(())
    }

    /// Answers `status` with a short text body and `Connection: close`, and closes lingering:
    /// the peer's input can no longer be trusted to be in step.
    fn reject(&mut self, status: u16) {
        let date = self.link.worker.date();
        self.link.prepare_output();
        let server = self.cfg.server_name.as_bytes();
        self.h1
            .reject(status, &date, server, &mut self.link.out.buf);
        self.phase = Phase::Failed;
    }

    /// Ends the response framing and decides whether the connection goes on.
    fn end(&mut self, complete: bool) {
        if !complete {
            self.close();
            return;
        }
        match self
            .h1
            .finish(&mut self.link.out.buf, self.link.worker.now())
        {
            Ok(Next::KeepAlive) => {}
            Ok(Next::Close) => self.close(),
            Err(_) => {
                tracing::error!(peer = %self.peer, "response body shorter than its Content-Length");
                self.close();
            }
        }
    }

    fn panicked(&mut self) -> Response {
        tracing::error!(peer = %self.peer, "handler panicked; answering 500 and closing");
        self.h1.set_close();
        Response::handler_panicked()
    }

    /// Encodes `response`; streams its body under backpressure. Returns false if the body was
    /// cut short (the connection must close without completing the framing).
    async fn respond(&mut self, response: Response, pipe: Option<&Rc<RefCell<Pipe>>>) -> Res<bool> {
        let Response {
            status,
            content_type,
            headers,
            body,
        } = response;
        // Something besides the connection still holds the request body: a streamed response
        // reading the upload as it answers (an echo), which may yet consume all of it.
        let body_held = pipe.is_some_and(|p| Rc::strong_count(p) > 1);
        let pipe = pipe.map(|p| &**p);
        let with_body = self.begin(status, content_type.as_ref(), &headers, &body, body_held);
        release_fields(headers);
        match body {
            Body::Empty => Ok(true),
            Body::Full(data) => Ok(!with_body || self.send(data)),
            Body::File { file, offset, len } => {
                if !with_body {
                    return Ok(true);
                }
                self.send_file(&file, offset, len).await
            }
            #[cfg(feature = "ws")]
            Body::Upgrade(up) => {
                // No further request is read: what follows the 101 is the new protocol's.
                if status == StatusCode::SWITCHING_PROTOCOLS && !self.closing() {
                    self.upgrade = Some(Box::new(Switch::WebSocket(up)));
                } else {
                    tracing::error!(peer = %self.peer, %status, "protocol upgrade without a 101, or on a closing connection; not switching");
                }
                self.close();
                Ok(true)
            }
            Body::Stream { mut stream, .. } => {
                if !with_body {
                    return Ok(true);
                }
                loop {
                    if self.link.out.len() >= self.cfg.high_water {
                        self.flush().await?;
                    }
                    // A stream that produces nothing for this long is abandoned: nothing else
                    // would notice a client that went away meanwhile.
                    let stall = later(self.link.worker.now(), self.cfg.handler_timeout);
                    let mut next = poll_fn(|cx| stream.as_mut().poll_next(cx));
                    match self.drive(&mut next, pipe, Some(stall)).await? {
                        Driven::Done(Some(Ok(data))) => {
                            if !self.send(data) {
                                return Ok(false);
                            }
                        }
                        Driven::Done(None) => return Ok(true),
                        Driven::Done(Some(Err(e))) => {
                            tracing::warn!(peer = %self.peer, error = %e, "response body stream failed; closing");
                            return Ok(false);
                        }
                        Driven::TimedOut => {
                            tracing::warn!(peer = %self.peer, "response body stream stalled; closing");
                            return Ok(false);
                        }
                        Driven::Panicked => {
                            tracing::error!(peer = %self.peer, "response body stream panicked; closing");
                            return Ok(false);
                        }
                        Driven::Gone => {
                            tracing::debug!(peer = %self.peer, "peer closed the connection; response body stream dropped");
                            return Err(Stop::Eof);
                        }
                    }
                }
            }
        }
    }

    /// Encodes the status line and header section of a response whose body is `body`; returns
    /// whether body bytes go out. The response's parts come by reference: moving the whole
    /// `Response` in and its body back out cost a copy each way per request. `body_held`: the
    /// request body may still be read (by the response's stream).
    fn begin(
        &mut self,
        status: StatusCode,
        content_type: Option<&HeaderValue>,
        headers: &[(HeaderName, HeaderValue)],
        body: &Body,
        body_held: bool,
    ) -> bool {
        // Decide now whether the connection survives, so the head can say `Connection: close`.
        if self.link.worker.draining() || self.closing() {
            self.h1.set_close();
        }
        if !self.h1.body_done() && !body_held {
            self.h1
                .judge_unread_body(&mut self.link.input, self.link.worker.now());
        }
        let len = match body {
            Body::Empty => BodyLen::Known(0),
            Body::Full(b) => BodyLen::Known(b.len() as u64),
            Body::Stream { len, .. } => len.map_or(BodyLen::Unknown, BodyLen::Known),
            Body::File { len, .. } => BodyLen::Known(*len),
            #[cfg(feature = "ws")]
            Body::Upgrade(_) => BodyLen::Known(0),
        };
        self.link.prepare_output();
        let fields = headers.iter().map(|(n, v)| (n, v));
        let (h1, out) = (&mut self.h1, &mut self.link.out.buf);
        // Asked of the transport, whose answer on plain TCP is a constant: that copy of the
        // driver looks at one block only.
        let preamble = self.svc.preamble_for(self.io.encrypted());
        preamble.with(&self.link.worker, |preamble| {
            h1.start_response_prevalidated(
                status.as_u16(),
                content_type,
                fields,
                len,
                preamble,
                out,
            )
        })
    }

    /// Queues one piece of body with its framing. False if it overran the Content-Length.
    fn send(&mut self, data: Bytes) -> bool {
        let len = data.len();
        match self.h1.data_prefix(len, &mut self.link.out.buf) {
            Ok(true) => {
                self.link.out.push(data);
                self.h1.data_suffix(len, &mut self.link.out.buf);
                true
            }
            Ok(false) => true,
            Err(_) => {
                tracing::error!(peer = %self.peer, "response body longer than its Content-Length");
                false
            }
        }
    }

    /// Sends `len` bytes of `file` from `offset` with `sendfile(2)`, after the head and anything
    /// else already buffered. Works in pieces of at most [`FILE_PIECE`] bytes and yields to the
    /// worker's other connections after [`FILE_TURN`] bytes; waits for writability under the
    /// write timeout. Returns false if the file ended early or could not be read (the
    /// connection must close without completing the framing).
    async fn send_file(&mut self, file: &File, offset: u64, len: u64) -> Res<bool> {
        if !self.io.plain_tcp() {
            return self.copy_file(file, offset, len).await;
        }
        self.flush().await?;
        // Waiting for writability below needs the socket in the event loop.
        self.io.register().map_err(Stop::Io)?;
        let Some(mut off) = offset
            .checked_add(len)
            .and_then(|end| libc::off_t::try_from(end).ok())
            .and_then(|_| libc::off_t::try_from(offset).ok())
        else {
            tracing::error!(peer = %self.peer, offset, len, "file body range out of bounds; closing");
            return Ok(false);
        };
        let src = file.as_raw_fd();
        let mut left = len;
        let timeout = self.cfg.timeouts.write();
        // Since when the socket has taken nothing (see `Stall`); `None` while it takes.
        let mut stall: Option<Stall> = None;
        poll_fn(|cx| {
            let mut turn = 0;
            loop {
                if left == 0 {
                    return Poll::Ready(Ok(true));
                }
                if turn >= FILE_TURN {
                    // Enough for one turn: let the worker's other connections run.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let count = left.min(FILE_PIECE as u64) as usize;
                let sent = match self.io.poll_send_file(cx, src, &mut off, count) {
                    Poll::Ready(sent) => sent,
                    Poll::Pending => {
                        let stall = stall.get_or_insert_with(|| Stall::start(&self.io));
                        if self.timer.poll_expired(cx, stall.deadline(timeout)) {
                            if stall.timed_out(&self.io) {
                                return Poll::Ready(Err(Stop::Timeout("write")));
                            }
                            // The peer is still taking what the kernel holds.
                            cx.waker().wake_by_ref();
                        }
                        return Poll::Pending;
                    }
                };
                match sent {
                    Ok(0) => {
                        tracing::error!(peer = %self.peer, missing = left, "file ended before its Content-Length; closing");
                        return Poll::Ready(Ok(false));
                    }
                    Ok(n) => {
                        left -= n as u64;
                        turn += n;
                        // For the Content-Length bookkeeping; writes nothing for a sized body.
                        let _ = self.h1.data_prefix(n, &mut self.link.out.buf);
                        stall = None;
                    }
                    Err(e) if is_peer_gone(&e) => return Poll::Ready(Err(Stop::Io(e))),
                    Err(e) => {
                        tracing::error!(peer = %self.peer, error = %e, "file body could not be sent; closing");
                        return Poll::Ready(Ok(false));
                    }
                }
            }
        })
        .await
    }

    /// Sends `len` bytes of `file` from `offset` through a transport that transforms what it
    /// sends (TLS): read in pieces into the output, flushed whenever it reaches the high-water
    /// mark, so at most that much is held per connection. Returns false as
    /// [`Driver::send_file`] does.
    async fn copy_file(&mut self, file: &File, offset: u64, len: u64) -> Res<bool> {
        use std::os::unix::fs::FileExt;
        let mut at = offset;
        let mut left = len;
        let mut turn = 0;
        while left > 0 {
            if self.link.out.len() >= self.cfg.high_water {
                self.flush().await?;
            }
            if turn >= FILE_TURN {
                turn = 0;
                self.flush().await?;
                tokio::task::yield_now().await;
            }
            let want = left.min(COPY_PIECE as u64) as usize;
            let mut piece = BytesMut::zeroed(want);
            match file.read_at(&mut piece, at) {
                Ok(0) => {
                    tracing::error!(peer = %self.peer, missing = left, "file ended before its Content-Length; closing");
                    return Ok(false);
                }
                Ok(n) => {
                    piece.truncate(n);
                    if !self.send(piece.freeze()) {
                        return Ok(false);
                    }
                    at += n as u64;
                    left -= n as u64;
                    turn += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(peer = %self.peer, error = %e, "file body could not be read; closing");
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Polls `fut` to completion on this task, reading request body bytes for it whenever it
    /// waits on them, until `deadline` (if any).
    async fn drive<F>(
        &mut self,
        fut: &mut F,
        pipe: Option<&RefCell<Pipe>>,
        deadline: Option<Instant>,
    ) -> Res<Driven<F::Output>>
    where
        F: Future + Unpin,
    {
        poll_fn(|cx| {
            loop {
                crate::set_peer(self.peer, self.tls);
                match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *fut).poll(cx))) {
                    Ok(Poll::Ready(v)) => return Poll::Ready(Ok(Driven::Done(v))),
                    Ok(Poll::Pending) => {}
                    Err(_) => return Poll::Ready(Ok(Driven::Panicked)),
                }
                let Some(pipe) = pipe else { break };
                {
                    let mut p = pipe.borrow_mut();
                    if !p.wanted {
                        break;
                    }
                    p.forget_waker_if(cx.waker());
                }
                self.h1.write_continue(&mut self.link.out.buf);
                if self.link.has_output(&self.io) {
                    if let Poll::Ready(Err(e)) = self.link.poll_write(&mut self.io, cx) {
                        return Poll::Ready(Err(Stop::Io(e)));
                    }
                }
                if self.feed(pipe) {
                    continue;
                }
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        pipe.borrow_mut()
                            .close(PipeState::Failed(BodyError::Disconnected));
                        self.h1.set_close();
                        self.close();
                    }
                    Poll::Ready(Ok(_)) => {}
                    Poll::Pending => break,
                }
            }
            // The future waits on something else. Unless configured otherwise, watch the peer
            // meanwhile: if it closed the connection, nobody waits for this answer.
            if !self.cfg.half_close && self.h1.body_done() && !self.closing() && self.peer_gone(cx)
            {
                return Poll::Ready(Ok(Driven::Gone));
            }
            // Send what is ready meanwhile (earlier pipelined responses, the head and pieces of
            // a streamed body, and TLS records still inside the session).
            if self.link.has_output(&self.io) {
                if let Poll::Ready(Err(e)) = self.link.poll_write(&mut self.io, cx) {
                    return Poll::Ready(Err(Stop::Io(e)));
                }
            }
            let waiting = pipe.filter(|p| p.borrow().wanted);
            let body_deadline = waiting.and_then(|_| self.h1.deadline());
            let rate_deadline = waiting.and_then(|p| {
                p.borrow()
                    .rate_deadline(self.cfg.min_body_rate, self.cfg.min_body_rate_grace)
            });
            let first = [deadline, body_deadline, rate_deadline]
                .into_iter()
                .flatten()
                .min();
            if let Some(at) = first {
                if self.timer.poll_expired(cx, at) {
                    if deadline.is_some_and(|d| d <= at) && clock() >= at {
                        return Poll::Ready(Ok(Driven::TimedOut));
                    }
                    if let Some(pipe) = pipe {
                        self.link.worker.fault(ClientFault::BodyTimeout);
                        tracing::debug!(peer = %self.peer, "request body timed out or too slow");
                        pipe.borrow_mut()
                            .close(PipeState::Failed(BodyError::TimedOut));
                        self.h1.set_close();
                        self.close();
                        cx.waker().wake_by_ref();
                    }
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Reads what the peer sends while a handler is pending and no request body is being read
    /// (the next pipelined request), up to [`LOOKAHEAD`] buffered bytes; true if the peer closed
    /// or reset the connection. Once the buffer holds that much the peer is no longer watched.
    fn peer_gone(&mut self, cx: &mut Context<'_>) -> bool {
        while self.link.input.len() < LOOKAHEAD {
            match self.poll_read(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        false
    }

    /// Moves decoded body bytes from the read buffer into the pipe while it has room. Returns
    /// whether anything changed for the handler.
    fn feed(&mut self, pipe: &RefCell<Pipe>) -> bool {
        let mut progressed = false;
        let mut p = pipe.borrow_mut();
        if let Some((max_body, max_chunk_ext)) = p.restrict.take() {
            self.h1.restrict_body(max_body, max_chunk_ext);
        }
        while p.has_room() {
            match self
                .h1
                .poll_body(&mut self.link.input, self.link.worker.now())
            {
                Ok(BodyEvent::Data(data)) => p.push(data),
                Ok(BodyEvent::End) => p.close(PipeState::End),
                Ok(BodyEvent::NeedMore) => break,
                Err(e) => {
                    self.link.worker.fault(ClientFault::BadBody);
                    tracing::debug!(peer = %self.peer, status = e.status(), error = %e, "bad request body");
                    let err = match e {
                        canter_h1::Error::BodyTooLarge => BodyError::TooLarge,
                        e => BodyError::Malformed(e),
                    };
                    p.close(PipeState::Failed(err));
                    self.close();
                }
            }
            progressed = true;
        }
        progressed
    }

    /// Reads and drops a small unread remainder of the request body so the connection can be
    /// reused; closes instead when the remainder is large or unknown-and-long.
    async fn discard_body(&mut self) -> Res<()> {
        if self.closing() {
            return Ok(());
        }
        let mut dropped = 0u64;
        while self
            .h1
            .discard_unread(&mut self.link.input, self.link.worker.now(), &mut dropped)
            == Discard::NeedMore
        {
            // The answer leaves first: a client may wait for it before sending the rest.
            self.h1.end_body(&mut self.link.out.buf);
            if !self.link.out.is_empty() {
                self.flush().await?;
            }
            let n = poll_fn(|cx| match self.poll_read(cx) {
                Poll::Pending => match self.h1.deadline() {
                    Some(at) if self.timer.poll_expired(cx, at) => Poll::Ready(Ok(0)),
                    _ => Poll::Pending,
                },
                ready => ready,
            })
            .await
            .map_err(Stop::Io)?;
            if n == 0 {
                self.h1.set_close();
                return Ok(());
            }
        }
        Ok(())
    }

    /// Writes everything buffered; fails after the write timeout without progress.
    #[inline]
    async fn flush(&mut self) -> Res<()> {
        let timeout = self.cfg.timeouts.write();
        match self
            .link
            .flush(&mut self.io, &mut self.timer, timeout)
            .await
        {
            Ok(()) => Ok(()),
            Err(WriteError::Io(e)) => Err(Stop::Io(e)),
            Err(WriteError::TimedOut) => Err(Stop::Timeout("write")),
        }
    }

    /// Waits for more request bytes under the idle/head timeout.
    ///
    /// Returns whether the buffer is worth parsing again. A head still incomplete after the last
    /// parse is re-parsed from its start, so a client dribbling a head byte by byte would cost
    /// quadratic work; it is re-parsed only once the new bytes end a line, the head limit is
    /// reached, or [`DEFER_MAX`] reads went by (errors show up at the latest at the next line
    /// end, the limit or the head timeout).
    async fn read(&mut self) -> Res<bool> {
        let before = self.link.input.len();
        if self.link.budget_spent(self.cfg.read_budget) {
            tokio::task::yield_now().await;
        }
        self.link.release_idle();
        let result = poll_fn(|cx| {
            if self.link.worker.draining() && self.link.input.is_empty() && self.h1.is_idle() {
                return Poll::Ready(Err(Stop::Done));
            }
            match self.poll_read(cx) {
                Poll::Ready(Ok(0)) => Poll::Ready(Err(Stop::Eof)),
                Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
                Poll::Ready(Err(e)) => Poll::Ready(Err(Stop::Io(e))),
                Poll::Pending => match self.h1.deadline() {
                    Some(at) if self.timer.poll_expired(cx, at) => {
                        Poll::Ready(Err(Stop::Timeout("read")))
                    }
                    _ => Poll::Pending,
                },
            }
        })
        .await;
        if result.is_ok() {
            let head_pending = !self.h1.is_idle();
            let max_head = self
                .cfg
                .limits
                .max_head()
                .min(canter_http::Limits::HEAD_CAP);
            let fresh = self.link.input.get(before..).unwrap_or_default();
            self.deferred += 1;
            let due = !head_pending
                || fresh.contains(&b'\n')
                || self.link.input.len() >= max_head
                || self.deferred >= DEFER_MAX;
            if due {
                self.deferred = 0;
            }
            return Ok(due);
        }
        if let Err(Stop::Timeout(_)) = result {
            if !self.h1.is_idle() || !self.link.input.is_empty() {
                // A slow or stalled request head: say so, then close.
                self.link.worker.fault(ClientFault::HeadTimeout);
                tracing::debug!(peer = %self.peer, "request head timed out");
                self.reject(408);
                let _ = self.flush().await;
                return Err(Stop::Timeout("head"));
            }
        }
        result.map(|()| true)
    }

    /// Reads once into the read buffer (see [`Link::poll_read`]).
    #[inline]
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let body_done = self.h1.body_done();
        let max_head = self
            .cfg
            .limits
            .max_head()
            .min(canter_http::Limits::HEAD_CAP);
        self.link.poll_read(&mut self.io, cx, READ_BUF, |input| {
            // While a head is pending, never grow past what can still be part of a valid head
            // (a full buffer would otherwise double for the last few bytes), and once the head
            // is large, read into whatever room is left before growing at all (growing
            // doubles).
            if body_done {
                let want = (max_head + 1)
                    .saturating_sub(input.len())
                    .clamp(1, READ_BUF / 2);
                let room = input.capacity() - input.len();
                if input.len() < READ_BUF || room == 0 {
                    input.reserve(want);
                }
            } else {
                input.reserve(READ_BUF / 2);
            }
        })
    }

    /// Nothing is left unread and nothing went wrong: the close needs no lingering.
    #[inline]
    fn settled(&self) -> bool {
        self.h1.body_done()
            && !self.h1.body_abandoned()
            && self.link.input.is_empty()
            && self.phase != Phase::Failed
    }

    /// The close follows the client's own last request (`Connection: close`), read to its end:
    /// nothing more comes from the client, so its answer can leave with the close.
    #[inline]
    fn final_answer(&self) -> bool {
        self.h1.close_requested() && self.settled()
    }

    /// Ends a connection closed by protocol. The close lingers (our side shut down, the peer's
    /// input read and dropped for a while) when the peer may still be sending: an error was
    /// answered mid-request, or a request body or pipelined input was left unread.
    async fn finish(&mut self) {
        let ending = if self.final_answer() {
            Ending::Final
        } else if self.settled() {
            Ending::Settled
        } else {
            Ending::Linger
        };
        let timeout = self.cfg.timeouts.write();
        self.link.finish(&mut self.io, timeout, ending).await;
    }
}

/// Drops a response's extra fields; the usual empty, never-allocated list without the call
/// into `Vec`'s destructor.
#[inline]
fn release_fields(headers: Vec<(HeaderName, HeaderValue)>) {
    if headers.capacity() == 0 {
        // Nothing was allocated and there are no elements: nothing to drop or free.
        std::mem::forget(headers);
    }
}

/// The decoded `HTTP2-Settings` of an `Upgrade: h2c` request that can be honoured: one without
/// a body (the upgrade would have to carry it over) and with valid settings (base64url of a
/// SETTINGS payload). Otherwise it is served over HTTP/1.1, as RFC 7540 allows.
fn upgradable(head: &RequestHead) -> Option<Vec<u8>> {
    if head.body_kind() != canter_http::BodyKind::Length(0) {
        return None;
    }
    head.header("http2-settings")
        .and_then(base64url)
        .filter(|s| s.len() % 6 == 0)
}

/// Decodes unpadded base64url (RFC 4648, Section 5), as `HTTP2-Settings` carries it.
fn base64url(s: &[u8]) -> Option<Vec<u8>> {
    let s = s.trim_ascii();
    let s = s
        .strip_suffix(b"==")
        .or_else(|| s.strip_suffix(b"="))
        .unwrap_or(s);
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = acc << 6 | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// What [`Driver::process`] does after answering what was ready.
enum Step {
    /// Nothing more to parse now (or the connection is closing).
    Done,
    /// The output is above its high-water mark: flush before parsing more.
    Flush,
    /// The turn's pipeline allowance is used up: flush and let other connections run.
    Yield,
    /// An exchange has to wait for its handler, its body, or the peer.
    Slow(Slow),
}

/// An exchange that could not complete synchronously: the reply (`None` if the handler
/// panicked) and the request body pipe.
struct Slow {
    reply: Option<Reply>,
    pipe: Option<Rc<RefCell<Pipe>>>,
}

/// Whether a send error says the peer is gone (rather than that the file could not be read).
fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
    )
}

/// The outcome of driving a future on the connection task.
enum Driven<T> {
    Done(T),
    Panicked,
    TimedOut,
    /// The peer closed or reset the connection while the future was pending.
    Gone,
}

/// A future polled by a function of its own, never inlined into its caller's poll.
struct OutOfLine<F>(F);

impl<F: Future> Future for OutOfLine<F> {
    type Output = F::Output;

    #[inline(never)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: structural pinning: the field is never moved out of the pinned wrapper.
        unsafe { self.map_unchecked_mut(|s| &mut s.0) }.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::base64url;

    #[test]
    fn base64url_decodes_http2_settings() {
        // curl's HTTP2-Settings: MAX_CONCURRENT_STREAMS 100, INITIAL_WINDOW_SIZE 10 MiB,
        // ENABLE_PUSH 0.
        let s = base64url(b"AAMAAABkAAQAoAAAAAIAAAAA").unwrap_or_default();
        assert_eq!(
            s,
            [0, 3, 0, 0, 0, 100, 0, 4, 0, 0xa0, 0, 0, 0, 2, 0, 0, 0, 0]
        );
        assert_eq!(base64url(b"-_8="), Some(vec![0xfb, 0xff]));
        assert_eq!(base64url(b""), Some(vec![]));
        assert_eq!(base64url(b"AA+A"), None);
    }
}
