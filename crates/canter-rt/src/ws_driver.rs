//! The WebSocket driver: runs a connection after its upgrade (the 101 written) until it ends,
//! on the connection's own task: the engine, the handler's future, and the bounds described in
//! [`crate::ws`].

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

use canter_ws::{close, Event};

use crate::link::{Ending, Link, Timer};
use crate::stats::ClientFault;
use crate::transport::Transport;
use crate::worker::{later, READ_BUF};
use crate::ws::{
    Accepted, CloseFrame, Message, State, Text, Upgrade, WebSocket, WsConfig, WsError,
};

/// How a WebSocket connection ended, for the log.
#[derive(Debug)]
enum End {
    /// Both closes were exchanged.
    Closed,
    /// The peer broke the protocol; our close was sent.
    Failed(canter_ws::Error),
    /// The peer closed the TCP connection without a close handshake.
    Eof,
    /// The peer did not answer our close in time.
    CloseTimeout,
    /// No input after a ping.
    PingTimeout,
    /// The peer took no output for the write timeout.
    WriteTimeout,
    Io(io::Error),
}

/// Runs a WebSocket connection on `io` after its upgrade (the 101 is written) until it ends:
/// the engine, the handler's future, the bounds of the module doc.
pub(crate) async fn serve<T: Transport>(
    mut io: T,
    mut link: Link,
    peer: SocketAddr,
    upgrade: Upgrade,
    write_timeout: Duration,
    read_budget: usize,
) {
    let Accepted {
        engine,
        config,
        info,
        handler,
    } = *upgrade.0;
    let state = Rc::new(RefCell::new(State {
        engine,
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
    }));
    let socket = WebSocket {
        state: state.clone(),
        info,
    };
    let mut driver = Driver {
        state,
        handler: None,
        config,
        write_timeout,
        read_budget,
        timer: Timer::new(),
        last_input: link.worker.now(),
        ping_sent: false,
        close_at: None,
        failed: false,
        eof: false,
        early_input: true,
    };
    match catch_unwind(AssertUnwindSafe(|| handler(socket))) {
        Ok(fut) => driver.handler = Some(fut),
        Err(_) => driver.handler_panicked(),
    }
    let end = poll_fn(|cx| driver.poll(&mut io, &mut link, cx)).await;
    // The handler sees the end: its sends fail, its `recv` returns what is left, then `None`.
    {
        let mut s = driver.state.borrow_mut();
        s.ended = true;
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
    // A handler still running has nothing left to do on this connection.
    drop(driver.handler.take());
    match &end {
        End::Closed => tracing::debug!(%peer, "WebSocket closed"),
        End::Failed(e) => {
            link.worker.fault(ClientFault::Protocol);
            tracing::debug!(%peer, error = %e, "WebSocket failed");
        }
        End::Io(e) => tracing::debug!(%peer, error = %e, "WebSocket connection error"),
        other => tracing::debug!(%peer, end = ?other, "WebSocket dropped"),
    }
    let ending = match end {
        End::Closed | End::CloseTimeout | End::PingTimeout => Ending::Shutdown,
        // Our close was queued while the peer may still be sending.
        End::Failed(_) => Ending::Linger,
        End::Eof | End::WriteTimeout | End::Io(_) => {
            link.release_all();
            return;
        }
    };
    {
        let mut s = driver.state.borrow_mut();
        if !s.out.is_empty() {
            link.prepare_output();
            link.out.buf.extend_from_slice(&s.out);
            s.out = Vec::new();
        }
    }
    link.finish(&mut io, write_timeout, ending).await;
    link.release_all();
}

struct Driver {
    state: Rc<RefCell<State>>,
    handler: Option<Pin<Box<dyn Future<Output = ()>>>>,
    config: WsConfig,
    write_timeout: Duration,
    read_budget: usize,
    timer: Timer,
    /// When input last arrived (the keepalive's clock).
    last_input: Instant,
    /// A keepalive ping is out, unanswered by any input.
    ping_sent: bool,
    /// When the peer must have answered our close.
    close_at: Option<Instant>,
    /// The peer broke the protocol: our close is queued, nothing more is read.
    failed: bool,
    eof: bool,
    /// The input may hold bytes read before the switch, not yet run through the engine.
    early_input: bool,
}

impl Driver {
    fn handler_panicked(&mut self) {
        tracing::error!("WebSocket handler panicked; closing with 1011");
        let mut s = self.state.borrow_mut();
        let State { engine, out, .. } = &mut *s;
        engine.close(close::INTERNAL_ERROR, "", out);
    }

    fn poll<T: Transport>(
        &mut self,
        io: &mut T,
        link: &mut Link,
        cx: &mut Context<'_>,
    ) -> Poll<End> {
        loop {
            // The handler: it takes what was read and sends.
            if let Some(handler) = self.handler.as_mut() {
                self.state.borrow_mut().in_driver = true;
                let polled = catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx)));
                let mut s = self.state.borrow_mut();
                s.in_driver = false;
                match polled {
                    Ok(Poll::Pending) => {}
                    Ok(Poll::Ready(())) => {
                        drop(s);
                        self.handler = None;
                        // A handler that returns without closing closes normally.
                        let mut s = self.state.borrow_mut();
                        let State { engine, out, .. } = &mut *s;
                        engine.close(close::NORMAL, "", out);
                    }
                    Err(_) => {
                        drop(s);
                        self.handler = None;
                        self.handler_panicked();
                    }
                }
            }
            let mut s = self.state.borrow_mut();
            if link.worker.draining() && !s.engine.close_sent() {
                let State { engine, out, .. } = &mut *s;
                engine.close(close::GOING_AWAY, "server shutting down", out);
            }
            if s.engine.close_sent() && self.close_at.is_none() {
                self.close_at = Some(later(link.worker.now(), self.config.close_timeout));
            }
            // What the handler (and the engine: pongs, the close's answer) sent goes out.
            if !s.out.is_empty() {
                link.prepare_output();
                link.out.buf.extend_from_slice(&s.out);
                s.out.clear();
                if s.out.capacity() > 4 * READ_BUF {
                    s.out = Vec::new();
                }
            }
            if let Err(e) = link.poll_send(io, cx) {
                return Poll::Ready(End::Io(e));
            }
            s.queued = link.out.len();
            if s.queued <= s.high_water / 4 {
                if let Some(w) = s.send_waiter.take() {
                    if !w.will_wake(cx.waker()) {
                        w.wake();
                    } else if self.handler.is_some() {
                        // The waiter is the handler, polled by this loop: again, now.
                        continue;
                    }
                }
            }
            let flushed = !link.has_output(io);
            if flushed {
                link.release_idle();
            }
            if s.engine.close_sent() && flushed {
                if s.engine.close_received() {
                    return Poll::Ready(End::Closed);
                }
                if self.failed {
                    let e = match s.failure {
                        Some(WsError::Protocol(e)) => e,
                        _ => canter_ws::Error::Protocol("failed"),
                    };
                    return Poll::Ready(End::Failed(e));
                }
            }
            if self.eof {
                return Poll::Ready(if s.engine.close_received() {
                    End::Closed
                } else {
                    End::Eof
                });
            }
            if std::mem::take(&mut self.early_input) && !link.input.is_empty() {
                // What the client sent right behind its upgrade request.
                drop(s);
                self.take_input(link, cx);
                continue;
            }
            // Read, unless the handler is behind, the output is, or nothing more may come.
            let reading = !self.failed
                && !s.engine.close_received()
                && s.inbound_bytes < s.read_buffer
                && link.out.len() < s.high_water;
            drop(s);
            if reading {
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
                        self.eof = true;
                        continue;
                    }
                    Poll::Ready(Ok(_)) => {
                        self.last_input = link.worker.now();
                        self.ping_sent = false;
                        self.take_input(link, cx);
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(End::Io(e)),
                    Poll::Pending => {}
                }
            }
            // Timers: the write timeout, the close's answer, the keepalive.
            let now = link.worker.now();
            let write_deadline = link.write_deadline(self.write_timeout);
            let keepalive = self.config.ping_interval.map(|every| {
                if self.ping_sent {
                    later(self.last_input, every + self.config.ping_timeout)
                } else {
                    later(self.last_input, every)
                }
            });
            let next = [write_deadline, self.close_at, keepalive]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next else {
                break;
            };
            if next > now && !self.timer.poll_expired(cx, next) {
                break;
            }
            if write_deadline.is_some_and(|d| d <= now) && link.write_timed_out(io) {
                return Poll::Ready(End::WriteTimeout);
            }
            if self.close_at.is_some_and(|d| d <= now) {
                return Poll::Ready(End::CloseTimeout);
            }
            if keepalive.is_some_and(|d| d <= now) {
                if self.ping_sent {
                    return Poll::Ready(End::PingTimeout);
                }
                self.ping_sent = true;
                let mut s = self.state.borrow_mut();
                let State { engine, out, .. } = &mut *s;
                // Sent only while this end has not closed (its close timeout governs then).
                let _ = engine.send_ping(b"", out);
            }
        }
        let mut s = self.state.borrow_mut();
        if !s.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.driver = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Runs what was read through the engine: messages for the handler, pongs and the close's
    /// answer into the output, a protocol error into our close.
    fn take_input(&mut self, link: &mut Link, cx: &Context<'_>) {
        let mut s = self.state.borrow_mut();
        let mut woke = false;
        loop {
            let State { engine, out, .. } = &mut *s;
            match engine.poll(&mut link.input, out) {
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
                    let State { engine, out, .. } = &mut *s;
                    engine.close(e.close_code(), "", out);
                    s.failure = Some(WsError::Protocol(e));
                    self.failed = true;
                    link.input.clear();
                    woke = true;
                    break;
                }
            }
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
}
