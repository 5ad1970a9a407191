//! The connection actor's core: what every protocol driver on the runtime gets from one place.
//!
//! A driver is the task of one connection: HTTP/1.1's (`httpd/http1.rs`), HTTP/2's (`httpd/h2.rs`) and the
//! one that runs any [`Protocol`](crate::proto::Protocol) (`proto/mod.rs`). Each owns its transport
//! and its protocol's state; the rest of the connection is a [`Link`], with the same rules for
//! all three:
//!
//! - **Input** is read into one buffer, taken from the worker's pool only once the transport is
//!   readable, and counted against the read budget of the turn ([`Link::budget_spent`]).
//! - **Output** is one queue ([`Out`]): small pieces copied, large ones written with `writev`.
//!   Output left unwritten must make progress within the write timeout: a driver either waits
//!   for it ([`Link::flush`]) or writes what the peer takes and goes on ([`Link::poll_send`]),
//!   then asks when the peer will have stalled too long ([`Link::write_deadline`]) and, at that
//!   time, whether it has ([`Link::write_timed_out`]). Progress is what the peer takes, not only
//!   what the socket accepts: a slow reader behind a send buffer of megabytes leaves the socket
//!   unwritable for long while the kernel's queue goes down ([`Stall`]).
//! - **Buffers go back** to the worker's pool while the connection has nothing in them
//!   ([`Link::release_idle`]), so an idle connection holds none.
//! - **The end** ([`Link::finish`]): what is still queued is written, under the write timeout;
//!   then the transport closes as the driver says ([`Ending`]): at once, after a shutdown, or
//!   lingering when the peer may still be sending.
//!
//! What differs between protocols stays in their drivers: how much room a read makes (a head
//! limit, a frame size), which deadlines apply, and when a close must linger.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::time::Sleep;

use crate::core::output::Out;
use crate::core::transport::{poll_read_buf, Transport};
use crate::core::worker::{clock, later, Worker, READ_BUF};

/// Lingering close: how long in all, and how long per read, a connection keeps draining the
/// peer's input after its last answer.
const LINGER_TOTAL: Duration = Duration::from_secs(5);
const LINGER_READ: Duration = Duration::from_secs(2);

/// How [`Link::finish`] closes the connection once its output is written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ending {
    /// Nothing unread and nothing wrong: on plain TCP the socket is just closed, and the close
    /// sends the FIN (no separate `shutdown` call: one system call per connection fewer when
    /// each request has its own); a TLS transport says close_notify first.
    Settled,
    /// As `Settled`, and the peer has said it sends nothing more (HTTP/1.1's `Connection:
    /// close` on its last request): on plain TCP what is still queued is held back with
    /// `MSG_MORE` and leaves with the close's FIN in one segment, one packet fewer for both
    /// ends. Only then: had the peer sent more, the close would answer it with a reset and the
    /// held-back output would never leave.
    Final,
    /// Our side is shut down (the FIN goes out) before the socket is closed, so a peer whose
    /// last bytes we did not read sees the end of our output before the reset the close of a
    /// socket with unread input sends.
    Shutdown,
    /// The peer may still be sending (an error answered mid-message, input left unread): our
    /// side is shut down and the peer's input read and dropped for a bounded time, so the
    /// kernel does not answer unread bytes with a reset before the peer has read our last
    /// answer.
    Linger,
}

/// Why a write did not complete.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The transport failed.
    Io(io::Error),
    /// The peer took nothing for the write timeout.
    TimedOut,
}

/// A connection's buffers and their rules (see the module doc). The transport is the driver's
/// and is passed in, so the same `Link` serves a driver generic over its transport and one
/// (the protocol actor) whose state is not.
pub(crate) struct Link {
    /// Bytes read and not yet consumed by the protocol.
    pub(crate) input: BytesMut,
    /// Bytes to send.
    pub(crate) out: Out,
    pub(crate) worker: Rc<Worker>,
    /// Bytes read since the connection last yielded to the worker's others.
    read_in_turn: usize,
    /// The last readiness check found the transport not ready and left its waker there: the
    /// next poll is most likely the wake-up, so the read is tried without asking for readiness
    /// first (the read asks itself). Once only: if the wake-up was for something else (a
    /// broadcast to an idle WebSocket), the buffer goes back and the next poll asks again, so a
    /// connection woken often for other reasons does not take and return a buffer each time.
    read_waiting: bool,
    /// Output waiting without the socket taking any of it ([`Link::poll_send`]); `None` while
    /// everything is written.
    stalled: Option<Stall>,
}

/// Output that waits on the peer: since when the socket took none of it, and how much the
/// kernel held for the peer then. When the write timeout has passed, the peer has stalled only
/// if the kernel's queue did not go down meanwhile; if it did, the peer is reading (slowly,
/// through a large send buffer that reports the socket writable only when a good part of it is
/// free) and the wait starts again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stall {
    since: Instant,
    queued: Option<u32>,
}

impl Stall {
    /// A stall starting now.
    pub(crate) fn start<T: Transport>(io: &T) -> Stall {
        Stall {
            since: clock(),
            queued: io.kernel_queued(),
        }
    }

    /// When the stall will have lasted `timeout`.
    #[inline]
    pub(crate) fn deadline(&self, timeout: Duration) -> Instant {
        later(self.since, timeout)
    }

    /// At the deadline: whether the peer took nothing since the stall started. If it took
    /// something from the kernel's queue, the stall starts again now and this says false.
    pub(crate) fn timed_out<T: Transport>(&mut self, io: &T) -> bool {
        match (self.queued, io.kernel_queued()) {
            (Some(then), Some(now)) if now < then => {
                *self = Stall {
                    since: clock(),
                    queued: Some(now),
                };
                false
            }
            _ => true,
        }
    }
}

impl Link {
    /// A link whose input starts with `input` (what was read before, by whoever accepted).
    pub(crate) fn new(worker: Rc<Worker>, input: BytesMut) -> Link {
        Link {
            input,
            out: Out::default(),
            worker,
            read_in_turn: 0,
            read_waiting: false,
            stalled: None,
        }
    }

    /// Whether the turn's read budget is spent; if so the count starts again, and the caller
    /// yields to the worker's other connections before reading more.
    #[inline]
    pub(crate) fn budget_spent(&mut self, budget: usize) -> bool {
        if self.read_in_turn >= budget {
            self.read_in_turn = 0;
            return true;
        }
        false
    }

    /// Reads once into the input. While the input holds no buffer, one is taken only once the
    /// transport is readable: from the worker's pool when `fresh` (its size) is a pool buffer's,
    /// allocated otherwise. Then `grow` makes the room this read may fill (the protocol's own
    /// rule), and the read is counted against the budget.
    #[inline(always)]
    pub(crate) fn poll_read<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
        fresh: usize,
        grow: impl FnOnce(&mut BytesMut),
    ) -> Poll<io::Result<usize>> {
        let took = self.input.capacity() == 0;
        if took {
            if !std::mem::take(&mut self.read_waiting) && io.poll_read_ready(cx)?.is_pending() {
                self.read_waiting = true;
                return Poll::Pending;
            }
            self.input = if fresh <= READ_BUF {
                self.worker.take_buf()
            } else {
                BytesMut::with_capacity(fresh)
            };
        }
        grow(&mut self.input);
        let read = poll_read_buf(io, cx, &mut self.input);
        if io.has_pending_output() {
            // The read made output of the transport's own (TLS: the alert that refuses a
            // renegotiation, a key update's answer): it leaves now, whether or not the read
            // brought anything for the protocol, which may have nothing to send for long.
            if let Poll::Ready(Err(e)) = io.poll_flush(cx) {
                return Poll::Ready(Err(e));
            }
        }
        if took && read.is_pending() && self.input.is_empty() {
            // Readiness was a guess (a socket not yet in the event loop, or readiness left from
            // the last read) and nothing came: the buffer goes back while the connection waits,
            // or every idle connection would keep one.
            self.worker.give_buf(std::mem::take(&mut self.input));
        }
        let n = ready!(read)?;
        self.read_in_turn += n;
        Poll::Ready(Ok(n))
    }

    /// Whether anything is left to write: queued output, or records the transport still holds
    /// (TLS; on plain TCP the transport's answer is a constant `false`).
    #[inline]
    pub(crate) fn has_output<T: Transport>(&self, io: &T) -> bool {
        !self.out.is_empty() || io.has_pending_output()
    }

    /// Writes what the transport takes now, without waiting.
    #[inline]
    pub(crate) fn poll_write<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.out.poll_write(io, cx)
    }

    /// Writes what the transport takes now, without waiting, and keeps the stall for
    /// [`Link::write_deadline`] (restarted by every write that makes progress).
    pub(crate) fn poll_send<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> io::Result<()> {
        if !self.has_output(io) {
            self.stalled = None;
            return Ok(());
        }
        let before = self.out.len();
        match self.out.poll_write(io, cx) {
            Poll::Ready(Ok(())) => self.stalled = None,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => {
                if self.out.len() < before || self.stalled.is_none() {
                    self.stalled = Some(Stall::start(io));
                }
            }
        }
        Ok(())
    }

    /// When the output left by [`Link::poll_send`] will have waited `timeout` without progress
    /// (`None` while everything is written): the driver asks [`Link::write_timed_out`] then.
    #[inline]
    pub(crate) fn write_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.stalled.map(|stall| stall.deadline(timeout))
    }

    /// Once [`Link::write_deadline`] has passed: whether the peer has stalled (the driver closes
    /// the connection), or is still taking what the kernel holds (the deadline moves on).
    pub(crate) fn write_timed_out<T: Transport>(&mut self, io: &T) -> bool {
        self.stalled
            .as_mut()
            .is_none_or(|stall| stall.timed_out(io))
    }

    /// Makes sure the output has a buffer to encode into (it went back to the pool while idle).
    #[inline]
    pub(crate) fn prepare_output(&mut self) {
        self.out.prepare(&self.worker);
    }

    /// Writes everything queued; fails once the peer has taken nothing for `timeout` (measured
    /// on the worker's coarse clock, and restarted by every write that makes progress and
    /// whenever the kernel's queue went down: see [`Stall`]).
    pub(crate) async fn flush<T: Transport>(
        &mut self,
        io: &mut T,
        timer: &mut Timer,
        timeout: Duration,
    ) -> Result<(), WriteError> {
        if !self.has_output(io) {
            return Ok(());
        }
        let mut stall: Option<Stall> = None;
        poll_fn(|cx| loop {
            let before = self.out.len();
            match self.out.poll_write(io, cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Ok(())),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(WriteError::Io(e))),
                Poll::Pending => {
                    if self.out.len() < before || stall.is_none() {
                        stall = Some(Stall::start(io));
                    }
                    let Some(waiting) = stall.as_mut() else {
                        return Poll::Pending;
                    };
                    if !timer.poll_expired(cx, waiting.deadline(timeout)) {
                        return Poll::Pending;
                    }
                    if waiting.timed_out(io) {
                        return Poll::Ready(Err(WriteError::TimedOut));
                    }
                }
            }
        })
        .await
    }

    /// Returns the input and output buffers to the worker's pool if they are empty.
    #[inline]
    pub(crate) fn release_idle(&mut self) {
        if self.input.is_empty() && self.input.capacity() > 0 {
            self.worker.give_buf(std::mem::take(&mut self.input));
        }
        if self.out.is_empty() && self.out.buf.capacity() > 0 {
            self.worker.give_buf(std::mem::take(&mut self.out.buf));
        }
    }

    /// Returns both buffers to the pool, whatever they hold (the connection is over).
    pub(crate) fn release_all(&mut self) {
        let input = std::mem::take(&mut self.input);
        let out = std::mem::take(&mut self.out.buf);
        for buf in [input, out] {
            if buf.capacity() > 0 {
                self.worker.give_buf(buf);
            }
        }
    }

    /// Ends the connection: writes what is still queued (giving up after `write_timeout`), then
    /// closes our side as `ending` says.
    pub(crate) async fn finish<T: Transport>(
        &mut self,
        io: &mut T,
        write_timeout: Duration,
        ending: Ending,
    ) {
        if ending == Ending::Final && io.plain_tcp() && self.out.is_single() {
            // The last bytes, held back to leave with the FIN (see `Ending::Final`); a write
            // that takes only part of them pushes the rest out below.
            let last = poll_fn(|cx| Poll::Ready(io.poll_write_last(cx, &self.out.buf))).await;
            match last {
                Poll::Ready(Ok(n)) => self.out.consume(n),
                Poll::Ready(Err(_)) => return,
                Poll::Pending => {}
            }
        }
        if self.has_output(io)
            && self
                .flush(io, &mut Timer::new(), write_timeout)
                .await
                .is_err()
        {
            return;
        }
        if matches!(ending, Ending::Settled | Ending::Final) && io.plain_tcp() {
            return;
        }
        let shutdown = poll_fn(|cx| io.poll_shutdown(cx));
        if !matches!(
            tokio::time::timeout(write_timeout, shutdown).await,
            Ok(Ok(()))
        ) || ending != Ending::Linger
        {
            return;
        }
        let until = tokio::time::Instant::now() + LINGER_TOTAL;
        let mut scratch = self.worker.take_buf();
        loop {
            let step = until.min(tokio::time::Instant::now() + LINGER_READ);
            scratch.clear();
            let read = poll_fn(|cx| poll_read_buf(io, cx, &mut scratch));
            match tokio::time::timeout_at(step, read).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        self.worker.give_buf(scratch);
    }
}

/// One lazily re-armed timer per connection: moving a deadline later costs nothing until the
/// old one fires, so per-request deadline updates never touch the timer wheel. Deadlines come
/// from the worker's coarse clock.
pub(crate) struct Timer {
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// The sleep has been polled since it was last reset, so it holds this task's waker and
    /// will wake it; until it elapses there is no need to poll it again.
    registered: bool,
}

impl Timer {
    pub(crate) fn new() -> Timer {
        let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        Timer {
            sleep: Box::pin(tokio::time::sleep_until(far)),
            armed: None,
            registered: false,
        }
    }

    /// Whether `deadline` (taken from the worker's coarse clock) has passed; otherwise arranges
    /// a wake-up for when it will have.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        let deadline = Worker::expiry(deadline);
        if self.armed.is_none_or(|at| at > deadline) {
            self.sleep.as_mut().reset(deadline.into());
            self.armed = Some(deadline);
            self.registered = false;
        } else if self.registered && !self.sleep.is_elapsed() {
            return false;
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if clock() >= deadline {
                self.armed = None;
                self.registered = false;
                return true;
            }
            self.sleep.as_mut().reset(deadline.into());
            self.armed = Some(deadline);
        }
        self.registered = true;
        false
    }
}
