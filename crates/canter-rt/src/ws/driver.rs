//! The WebSocket session and its HTTP/1.1 driver: a connection after its upgrade (the 101
//! written) runs on the connection's own task ([`serve`]). One over an HTTP/2 stream (RFC
//! 8441's extended CONNECT) is the same [`Session`] as the stream's response body
//! (`ws/h2.rs`): the engine, the handler's future and the bounds described in [`crate::ws`];
//! only where the bytes come from and go to differs.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use canter_ws::{close, Event};

use crate::core::link::{Ending, Link, Timer};
use crate::core::stats::ClientFault;
use crate::core::transport::Transport;
use crate::core::worker::{clock, later, Worker, READ_BUF};
use crate::ws::{
    Accepted, CloseFrame, Message, State, Text, Upgrade, WebSocket, WsConfig, WsError,
};

/// An input buffer above this capacity is given back once it is empty (it grew for a large
/// frame).
const BIG_INPUT: usize = 1 << 20;

/// How a WebSocket connection ended, for the log.
#[derive(Debug)]
pub(crate) enum End {
    /// Both closes were exchanged.
    Closed,
    /// The peer broke the protocol; our close was sent.
    Failed(canter_ws::Error),
    /// The peer closed its side without a close handshake.
    Eof,
    /// The peer did not answer our close in time.
    CloseTimeout,
    /// No input after a ping.
    PingTimeout,
    /// The peer took no output for the write timeout.
    WriteTimeout,
    Io(io::Error),
}

/// A piece of output ([`Session::take_output`]).
pub(crate) enum Piece<'a> {
    /// A frame shared with other connections.
    Shared(bytes::Bytes),
    /// Frames encoded for this connection.
    Copy(&'a [u8]),
}

/// One WebSocket's state apart from its transport.
pub(crate) struct Session {
    state: Rc<RefCell<State>>,
    handler: Option<Pin<Box<dyn Future<Output = ()>>>>,
    config: WsConfig,
    /// When input last arrived (the keepalive's clock).
    last_input: Instant,
    /// A keepalive ping is out, unanswered by any input.
    ping_sent: bool,
    /// When the peer must have answered our close.
    close_at: Option<Instant>,
    /// The peer broke the protocol: nothing more is read, and our close is queued (once the
    /// handler took what arrived before the fault, see `failing`).
    failed: bool,
    /// The peer's fault, and when to give up waiting for the handler, while the handler still
    /// has messages that arrived before it: their answers go out before the close.
    failing: Option<(canter_ws::Error, Instant)>,
    /// The peer ended its side.
    pub(crate) eof: bool,
    pub(crate) peer: Option<SocketAddr>,
    /// Bytes this connection holds in a message still being assembled, counted in the
    /// worker's budget ([`WsConfig::worker_budget`]).
    held: usize,
    worker: Rc<Worker>,
}

impl Session {
    /// Starts the handler on the socket.
    pub(crate) fn start(upgrade: Upgrade, worker: Rc<Worker>) -> Session {
        let now = worker.now();
        let Accepted {
            engine,
            config,
            info,
            handler,
        } = *upgrade.0;
        let state = Rc::new(RefCell::new(State {
            engine,
            pieces: VecDeque::new(),
            pieces_bytes: 0,
            out: Vec::new(),
            queued: 0,
            high_water: config.high_water.max(1),
            inbound: VecDeque::new(),
            inbound_bytes: 0,
            read_buffer: config.read_buffer.max(1),
            failure: None,
            ended: false,
            in_driver: false,
            driver: None,
            recv_waiter: None,
            send_waiter: None,
            direct: None,
            corked: false,
        }));
        let peer = info.peer;
        let socket = WebSocket {
            state: state.clone(),
            info,
        };
        let mut session = Session {
            state,
            handler: None,
            config,
            last_input: now,
            ping_sent: false,
            close_at: None,
            failed: false,
            failing: None,
            eof: false,
            peer,
            held: 0,
            worker,
        };
        match catch_unwind(AssertUnwindSafe(|| handler(socket))) {
            Ok(fut) => session.handler = Some(fut),
            Err(_) => session.handler_panicked(),
        }
        session
    }

    fn handler_panicked(&mut self) {
        tracing::error!(peer = ?self.peer, "WebSocket handler panicked; closing with 1011");
        self.close(close::INTERNAL_ERROR, "");
    }

    /// The peer's fault (see `failing`) takes effect: our close with its code is queued and the
    /// handler's `recv` gives the error.
    fn fail_now(&mut self) {
        let Some((e, _)) = self.failing.take() else {
            return;
        };
        let mut s = self.state.borrow_mut();
        let State { engine, out, .. } = &mut *s;
        engine.close(e.close_code(), "", out);
        s.failure = Some(WsError::Protocol(e));
        if let Some(w) = s.recv_waiter.take() {
            w.wake();
        }
    }

    /// Queues this end's close (once).
    fn close(&mut self, code: u16, reason: &str) {
        let mut s = self.state.borrow_mut();
        let State { engine, out, .. } = &mut *s;
        engine.close(code, reason, out);
    }

    /// Polls the handler (it takes what was read and sends); a handler that returns without
    /// closing closes normally, one that panics with 1011. Then starts the close timeout once
    /// our close is out, and closes with 1001 when the server drains.
    pub(crate) fn turn(&mut self, cx: &mut Context<'_>, now: Instant, draining: bool) {
        if let Some(handler) = self.handler.as_mut() {
            self.state.borrow_mut().in_driver = true;
            let polled = catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx)));
            self.state.borrow_mut().in_driver = false;
            match polled {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) => {
                    self.handler = None;
                    self.close(close::NORMAL, "");
                }
                Err(_) => {
                    self.handler = None;
                    self.handler_panicked();
                }
            }
        }
        if let Some((_, by)) = self.failing {
            let taken = self.state.borrow().inbound.is_empty();
            if taken || self.handler.is_none() || by <= now {
                self.fail_now();
            }
        }
        if draining {
            self.close(close::GOING_AWAY, "server shutting down");
        }
        if self.close_at.is_none() && self.state.borrow().engine.close_sent() {
            self.close_at = Some(later(now, self.config.close_timeout));
        }
    }

    /// Hands what was sent (by the handler, and by the engine: pongs, the close's answer) to
    /// `put`, in order: shared frames as they are, then the encoded ones.
    pub(crate) fn take_output(&mut self, mut put: impl FnMut(Piece<'_>)) {
        let mut s = self.state.borrow_mut();
        while let Some(piece) = s.pieces.pop_front() {
            put(Piece::Shared(piece));
        }
        s.pieces_bytes = 0;
        if s.out.is_empty() {
            return;
        }
        put(Piece::Copy(&s.out));
        s.out_written();
    }

    /// With nothing queued on the transport before it, writes what was sent straight from the
    /// session's buffer (no copy into the connection's output, which then needs no buffer);
    /// what the transport does not take now is left for [`Session::take_output`].
    pub(crate) fn write_out<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> io::Result<()> {
        let mut s = self.state.borrow_mut();
        if s.out.is_empty() || !s.pieces.is_empty() {
            return Ok(());
        }
        if let Poll::Ready(n) = io.poll_write(cx, &s.out) {
            let n = n?;
            if n == s.out.len() {
                s.out_written();
            } else {
                s.out.drain(..n);
            }
        }
        Ok(())
    }

    /// Lets the worker's flusher write sends from other tasks straight to socket `fd` (see
    /// [`crate::ws`]); the session's own output must be all out.
    pub(crate) fn set_direct(&mut self, fd: std::os::fd::RawFd) {
        crate::ws::start_flusher();
        self.state.borrow_mut().direct = Some(fd);
    }

    /// Records what the transport still holds; below the low-water mark a waiting sender may
    /// go on. True when that sender is the handler polled by `cx`'s task (poll it again).
    pub(crate) fn set_queued(&mut self, queued: usize, cx: &Context<'_>) -> bool {
        let mut s = self.state.borrow_mut();
        s.queued = queued;
        if s.queued > s.high_water / 4 {
            return false;
        }
        match s.send_waiter.take() {
            Some(w) if !w.will_wake(cx.waker()) => {
                w.wake();
                false
            }
            Some(_) => self.handler.is_some(),
            None => false,
        }
    }

    /// How the session is over, once `flushed` (nothing of ours left to write), if it is.
    pub(crate) fn finished(&self, flushed: bool) -> Option<End> {
        let s = self.state.borrow();
        if s.engine.close_sent() && flushed {
            if s.engine.close_received() {
                return Some(End::Closed);
            }
            if self.failed {
                let e = match s.failure {
                    Some(WsError::Protocol(e)) => e,
                    _ => canter_ws::Error::Protocol("failed"),
                };
                return Some(End::Failed(e));
            }
        }
        if self.eof {
            return Some(if s.engine.close_received() {
                End::Closed
            } else {
                End::Eof
            });
        }
        None
    }

    /// Whether to read: not while the handler is behind, after a failure or the peer's close.
    pub(crate) fn wants_input(&self) -> bool {
        let s = self.state.borrow();
        !self.failed && !self.eof && !s.engine.close_received() && s.inbound_bytes < s.read_buffer
    }

    /// Runs what was read through the engine: messages for the handler, pongs and the close's
    /// answer into the output, a protocol error into our close.
    pub(crate) fn take_input(&mut self, input: &mut BytesMut, now: Instant, cx: &Context<'_>) {
        self.last_input = now;
        self.ping_sent = false;
        let mut s = self.state.borrow_mut();
        let mut woke = false;
        loop {
            let State { engine, out, .. } = &mut *s;
            match engine.poll(input, out) {
                Ok(Some(event)) => {
                    let msg = match event {
                        Event::Text(b) => Message::Text(Text::validated(b)),
                        Event::Binary(b) => Message::Binary(b),
                        Event::Ping(_) | Event::Pong(_) => continue,
                        Event::Close(why) => {
                            Message::Close(why.map(|(code, reason)| CloseFrame { code, reason }))
                        }
                    };
                    if self.handler.is_none() && !matches!(msg, Message::Close(_)) {
                        // Nobody will read it: the handler is done and our close is out.
                        continue;
                    }
                    s.inbound_bytes += msg.len();
                    s.inbound.push_back(msg);
                    woke = true;
                    if s.inbound_bytes >= s.read_buffer {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Messages that came before the fault are the handler's first (Autobahn's
                    // strict verdict: an echo of the valid message precedes the close); the
                    // close follows once it took them, or after the close timeout.
                    self.failing = Some((e, later(now, self.config.close_timeout)));
                    self.failed = true;
                    input.clear();
                    woke = true;
                    break;
                }
            }
        }
        // What a message still being assembled holds: counted in the worker's budget, where
        // more than the budget allows fails this connection (1013) instead of taking memory.
        let held = if self.failed {
            0
        } else {
            input.len() + s.engine.assembling()
        };
        if !self
            .worker
            .ws_hold(self.held, held, self.config.worker_budget)
        {
            tracing::debug!(peer = ?self.peer, held, budget = self.config.worker_budget, "WebSocket message refused: the worker's budget for messages being assembled is in use; closing with 1013");
            let State { engine, out, .. } = &mut *s;
            engine.close(canter_ws::Error::Busy.close_code(), "", out);
            s.failure = Some(WsError::Protocol(canter_ws::Error::Busy));
            self.failed = true;
            input.clear();
            woke = true;
            self.worker.ws_hold(self.held, 0, usize::MAX);
            self.held = 0;
        } else {
            self.held = held;
        }
        // A buffer grown for a large frame goes back once it is empty: an idle connection
        // keeps no megabytes.
        if input.is_empty() && input.capacity() > BIG_INPUT {
            *input = BytesMut::new();
        }
        if woke {
            if let Some(w) = s.recv_waiter.take() {
                // A waiter in this task is polled again by the driver's loop.
                if !w.will_wake(cx.waker()) {
                    w.wake();
                }
            }
        }
    }

    /// The next time a timer of the session is due: the close's answer, the keepalive.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let keepalive = self.config.ping_interval.map(|every| {
            if self.ping_sent {
                later(self.last_input, every + self.config.ping_timeout)
            } else {
                later(self.last_input, every)
            }
        });
        let failing = self.failing.as_ref().map(|(_, by)| *by);
        [self.close_at, keepalive, failing]
            .into_iter()
            .flatten()
            .min()
    }

    /// At `now`, after [`Session::next_deadline`]: how the session ends, if a timer says so;
    /// else a keepalive ping may have been queued.
    pub(crate) fn on_timer(&mut self, now: Instant) -> Option<End> {
        if self.close_at.is_some_and(|d| d <= now) {
            return Some(End::CloseTimeout);
        }
        let every = self.config.ping_interval?;
        if self.ping_sent {
            if later(self.last_input, every + self.config.ping_timeout) <= now {
                return Some(End::PingTimeout);
            }
        } else if later(self.last_input, every) <= now {
            self.ping_sent = true;
            let mut s = self.state.borrow_mut();
            let State { engine, out, .. } = &mut *s;
            // Sent only while this end has not closed (its close timeout governs then).
            let _ = engine.send_ping(b"", out);
        }
        None
    }

    /// Registers `cx` as the one to wake when a half in another task sends or takes.
    pub(crate) fn park(&self, cx: &Context<'_>) {
        let mut s = self.state.borrow_mut();
        if !s.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.driver = Some(cx.waker().clone());
        }
    }

    /// The end: the handler's sends fail and its `recv` returns what is left, then `None` (an
    /// error first when the end was abnormal); a handler still running is dropped. Logged.
    pub(crate) fn end(&mut self, end: &End, worker: Option<&Worker>) {
        {
            let mut s = self.state.borrow_mut();
            // The transport closes after this: the flusher must not write to it.
            s.direct = None;
            if s.ended {
                return;
            }
            s.ended = true;
            self.worker.ws_hold(self.held, 0, usize::MAX);
            self.held = 0;

            if !matches!(end, End::Closed | End::Failed(_)) && s.failure.is_none() {
                s.failure = Some(WsError::Abnormal);
            }
            for w in [s.recv_waiter.take(), s.send_waiter.take()]
                .into_iter()
                .flatten()
            {
                w.wake();
            }
        }
        drop(self.handler.take());
        let peer = self.peer;
        match end {
            End::Closed => tracing::debug!(?peer, "WebSocket closed"),
            End::Failed(e) => {
                if let Some(worker) = worker {
                    worker.fault(ClientFault::Protocol);
                }
                tracing::debug!(?peer, error = %e, "WebSocket failed");
            }
            End::Io(e) => tracing::debug!(?peer, error = %e, "WebSocket connection error"),
            other => tracing::debug!(?peer, end = ?other, "WebSocket dropped"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // An HTTP/2 stream reset, or a connection that went: the handler sees an abnormal end.
        self.end(&End::Eof, None);
    }
}

/// Runs a WebSocket connection on `io` after its upgrade (the 101 is written) until it ends.
pub(crate) async fn serve<T: Transport>(
    mut io: T,
    mut link: Link,
    upgrade: Upgrade,
    write_timeout: Duration,
    read_budget: usize,
) {
    let mut driver = Driver {
        session: Session::start(upgrade, link.worker.clone()),
        write_timeout,
        read_budget,
        timer: Timer::new(),
        early_input: true,
        direct: false,
    };
    let end = poll_fn(|cx| driver.poll(&mut io, &mut link, cx)).await;
    driver.session.end(&end, Some(&link.worker));
    let ending = match end {
        End::Closed | End::CloseTimeout | End::PingTimeout => Ending::Shutdown,
        // Our close was queued while the peer may still be sending.
        End::Failed(_) => Ending::Linger,
        End::Eof | End::WriteTimeout | End::Io(_) => {
            link.release_all();
            return;
        }
    };
    driver.session.take_output(|piece| {
        link.prepare_output();
        match piece {
            Piece::Shared(frame) => link.out.push(frame),
            Piece::Copy(out) => link.out.buf.extend_from_slice(out),
        }
    });
    link.finish(&mut io, write_timeout, ending).await;
    link.release_all();
}

/// The HTTP/1.1 upgrade's driver: the session on the connection's transport and link.
struct Driver {
    session: Session,
    write_timeout: Duration,
    read_budget: usize,
    timer: Timer,
    /// The input may hold bytes read before the switch, not yet run through the engine.
    early_input: bool,
    /// The flusher may write to the socket (set once the 101 is out).
    direct: bool,
}

impl Driver {
    fn poll<T: Transport>(
        &mut self,
        io: &mut T,
        link: &mut Link,
        cx: &mut Context<'_>,
    ) -> Poll<End> {
        loop {
            let now = link.worker.now();
            self.session.turn(cx, now, link.worker.draining());
            if !link.has_output(io) {
                if let Err(e) = self.session.write_out(io, cx) {
                    return Poll::Ready(End::Io(e));
                }
            }
            self.session.take_output(|piece| {
                link.prepare_output();
                match piece {
                    Piece::Shared(frame) => link.out.push(frame),
                    Piece::Copy(out) => link.out.buf.extend_from_slice(out),
                }
            });
            if let Err(e) = link.poll_send(io, cx) {
                return Poll::Ready(End::Io(e));
            }
            if self.session.set_queued(link.out.len(), cx) {
                continue;
            }
            let flushed = !link.has_output(io);
            if flushed {
                link.release_idle();
                if !self.direct {
                    self.direct = true;
                    if io.plain_tcp() && io.register().is_ok() {
                        if let Some(fd) = io.raw_fd() {
                            self.session.set_direct(fd);
                        }
                    }
                }
            }
            if let Some(end) = self.session.finished(flushed) {
                return Poll::Ready(end);
            }
            if std::mem::take(&mut self.early_input) && !link.input.is_empty() {
                // What the client sent right behind its upgrade request.
                self.session.take_input(&mut link.input, now, cx);
                continue;
            }
            // Read, unless the handler is behind, the output is, or nothing more may come.
            if self.session.wants_input() && link.out.len() < self.session.config.high_water {
                if link.budget_spent(self.read_budget) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let read = link.poll_read(io, cx, READ_BUF, |input| {
                    if input.capacity() - input.len() < READ_BUF / 2 {
                        input.reserve(READ_BUF);
                    }
                });
                match read {
                    Poll::Ready(Ok(0)) => {
                        self.session.eof = true;
                        continue;
                    }
                    Poll::Ready(Ok(_)) => {
                        self.session.take_input(&mut link.input, now, cx);
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(End::Io(e)),
                    Poll::Pending => {}
                }
            }
            // Timers: the write timeout, the session's.
            let write_deadline = link.write_deadline(self.write_timeout);
            let Some(next) = [write_deadline, self.session.next_deadline()]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            if next > now && !self.timer.poll_expired(cx, next) {
                break;
            }
            // Due, judged by the real clock: the timer fires a tick past the deadline, when the
            // worker's coarse clock may not have moved yet, and it would not move while this
            // loop ran (the loop would spin on a deadline the coarse clock calls future).
            let now = clock();
            if write_deadline.is_some_and(|d| d <= now) && link.write_timed_out(io) {
                return Poll::Ready(End::WriteTimeout);
            }
            if let Some(end) = self.session.on_timer(now) {
                return Poll::Ready(end);
            }
        }
        self.session.park(cx);
        Poll::Pending
    }
}
