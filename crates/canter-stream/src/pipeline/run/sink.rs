//! Where a pipeline's results go on one worker: the sink's output, and the tasks that write a TCP sink (reconnecting) or a file.

use super::clock;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::super::metrics::PipeMetrics;
use super::super::{Collector, Encoder};
use super::barrier::Rid;
use super::env::Env;
use super::input::Input;
use super::sink_buf::{mark, record_latency, SinkBuf};
use super::wait::{RateLog, Waiter};
use crate::resend::Seq;

/// The pipeline's end of its sink on one worker.
pub(super) enum SinkOut<O> {
    Buf {
        encode: Encoder<O>,
        buf: Rc<RefCell<SinkBuf>>,
        count: u64,
        /// The worker, when results carry a sequence header.
        seq: Option<u32>,
    },
    Collect {
        local: Vec<O>,
        segs: VecDeque<(u64, u64)>,
        to: Collector<O>,
        count: u64,
    },
    Discard {
        count: u64,
    },
    /// Into the heads of the pipelines reading a channel (or one of two, by `pred`) on this
    /// worker, at the end of each turn.
    Channel {
        out: Vec<Forward<O>>,
        pred: Option<Arc<dyn Fn(&O) -> bool + Send + Sync>>,
        env: Rc<Env>,
        count: u64,
    },
}

/// One channel a sink writes: what waits for the end of the turn, and its readers here
/// (looked up at the first delivery: every pipeline has started by then).
pub(super) struct Forward<O> {
    pub(super) id: u64,
    pub(super) clone: fn(&O) -> O,
    pub(super) pending: Vec<(O, u64)>,
    pub(super) readers: Option<Vec<Rc<RefCell<dyn Input<O>>>>>,
}

impl<O: 'static> Forward<O> {
    pub(super) fn new(id: u64, clone: fn(&O) -> O) -> Self {
        Forward {
            id,
            clone,
            pending: Vec::new(),
            readers: None,
        }
    }

    fn readers(&mut self, env: &Env) -> &[Rc<RefCell<dyn Input<O>>>] {
        let id = self.id;
        self.readers
            .get_or_insert_with(|| env.channel_readers::<O>(id))
    }

    /// Hands what waits to every reader (a clone to each but the last).
    fn deliver(&mut self, env: &Env) {
        if self.pending.is_empty() {
            return;
        }
        let clone = self.clone;
        let mut pending = std::mem::take(&mut self.pending);
        let readers = self.readers(env).to_vec();
        if let Some((last, others)) = readers.split_last() {
            for r in others {
                let mut copy = pending.iter().map(|(o, ns)| (clone(o), *ns)).collect();
                r.borrow_mut().items(&mut copy);
            }
            last.borrow_mut().items(&mut pending);
        }
        pending.clear();
        // The allocation goes back for the next turn.
        if self.pending.is_empty() {
            self.pending = pending;
        }
    }

    fn close(&mut self, env: &Env) {
        self.deliver(env);
        for r in self.readers(env).to_vec() {
            r.borrow_mut().end();
        }
    }
}

impl<O: 'static> SinkOut<O> {
    #[inline]
    pub(super) fn write(&mut self, o: O, read_ns: u64, origin: Rid, index: u32) {
        match self {
            SinkOut::Buf {
                encode,
                buf,
                count,
                seq,
            } => {
                let seq = seq.map(|worker| Seq {
                    stream: origin.stream,
                    position: origin.pos,
                    index,
                    worker,
                });
                buf.borrow_mut().push(encode, &o, read_ns, seq);
                *count += 1;
            }
            SinkOut::Collect {
                local, segs, count, ..
            } => {
                local.push(o);
                mark(segs, read_ns);
                *count += 1;
            }
            SinkOut::Discard { count } => *count += 1,
            SinkOut::Channel {
                out, pred, count, ..
            } => {
                let side = match pred {
                    Some(p) if !p(&o) => 1,
                    _ => 0,
                };
                if let Some(f) = out.get_mut(side) {
                    f.pending.push((o, read_ns));
                }
                *count += 1;
            }
        }
    }

    /// The pipeline has ended on this worker: what waits is delivered, and the channels'
    /// readers end.
    pub(super) fn close(&mut self) {
        if let SinkOut::Channel { out, env, .. } = self {
            for f in out {
                f.close(env);
            }
        }
    }

    pub(super) fn end_turn(&mut self, metrics: &PipeMetrics, me: usize) {
        match self {
            SinkOut::Buf { buf, .. } => buf.borrow_mut().flush(),
            SinkOut::Collect {
                local, segs, to, ..
            } => {
                if !local.is_empty() {
                    to.lock().append(local);
                    record_latency(metrics, me, segs.drain(..));
                }
            }
            SinkOut::Discard { .. } => {}
            SinkOut::Channel { out, env, .. } => {
                for f in out {
                    f.deliver(env);
                }
            }
        }
    }

    pub(super) fn count(&self) -> u64 {
        match self {
            SinkOut::Buf { count, .. }
            | SinkOut::Collect { count, .. }
            | SinkOut::Discard { count }
            | SinkOut::Channel { count, .. } => *count,
        }
    }
}

/// The TCP sink's task: connects (Nagle off: each write is a batch already), lends the socket
/// to the sources' end-of-read writes, writes what they left, and connects again with backoff
/// when the connection fails.
pub(super) async fn tcp_sink(
    addr: SocketAddr,
    buf: Rc<RefCell<SinkBuf>>,
    env: Rc<Env>,
    flushed: Rc<Notify>,
) {
    let wake = Rc::new(Notify::new());
    buf.borrow_mut().driver = Some(Waiter::Task(wake.clone()));
    let mut backoff = Duration::from_millis(50);
    let mut log = RateLog::default();
    loop {
        match canter_rt::connect_tcp(addr, Duration::from_secs(5)).await {
            Ok(socket) => {
                backoff = Duration::from_millis(50);
                tracing::debug!(%addr, "sink connected");
                let socket = Rc::new(socket);
                {
                    let mut b = buf.borrow_mut();
                    b.reconnected();
                    b.socket = Some(socket.clone());
                }
                let lost = drive_sink(&socket, &buf, &env, &wake).await;
                buf.borrow_mut().socket = None;
                match lost {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "sink connection lost; reconnecting")
                    }
                }
            }
            Err(e) => {
                if let Some(held) = log.allow() {
                    tracing::warn!(%addr, error = %e, held, "sink cannot connect; retrying with backoff");
                }
                if closing_expired(&buf, &env, addr) {
                    break;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
        if closing_expired(&buf, &env, addr) {
            break;
        }
    }
    flushed.notify_one();
}

/// At shutdown, whether the sink has had its time to deliver what it holds.
pub(super) fn closing_expired(buf: &RefCell<SinkBuf>, env: &Env, addr: SocketAddr) -> bool {
    let b = buf.borrow();
    let Some(since) = b.closing_since else {
        return false;
    };
    if b.data.is_empty() && b.retained_len() == 0 {
        return true;
    }
    if clock().saturating_duration_since(since) > env.opts.drain_timeout {
        tracing::warn!(%addr, bytes = b.data.len(), "sink gave up delivering at shutdown");
        return true;
    }
    false
}

/// One connection of a TCP sink: writes what the sources could not, resumes them when there is
/// room, and watches for the peer closing. `Ok` once everything is delivered at shutdown.
pub(super) async fn drive_sink(
    socket: &tokio::net::TcpStream,
    buf: &RefCell<SinkBuf>,
    env: &Env,
    wake: &Notify,
) -> io::Result<()> {
    let mut scratch = [0u8; 1024];
    // Since when records have waited while the socket took nothing, and what it had taken.
    let mut stalled: Option<(Instant, u64)> = None;
    loop {
        let (pending, room, done, written) = {
            let mut b = buf.borrow_mut();
            b.write_out()?;
            (
                !b.data.is_empty(),
                b.data.len() < b.low,
                // A receiver that acknowledges has everything first.
                b.closing() && b.data.is_empty() && b.retained_len() == 0,
                b.written,
            )
        };
        stalled = match stalled {
            _ if !pending => None,
            Some((since, was)) if written == was => Some((since, was)),
            _ => Some((clock(), written)),
        };
        let write_deadline = stalled.map(|(since, _)| since + env.opts.sink_write_timeout);
        if room {
            env.resume_all();
        }
        if done {
            // Dropping the socket closes it after what the kernel holds is delivered.
            return Ok(());
        }
        let deadline = buf
            .borrow()
            .closing_since
            .map(|t| t + env.opts.drain_timeout);
        tokio::select! {
            r = socket.writable(), if pending => r?,
            r = socket.readable() => {
                r?;
                // The receiving end sends nothing but acknowledgements (kept for a sequenced
                // sink); anything else is dropped.
                match socket.try_read(&mut scratch) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => buf.borrow_mut().on_read(&scratch[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            () = wake.notified() => {}
            () = sleep_until(write_deadline) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the peer took nothing for the write timeout"));
            }
            () = sleep_until(deadline) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "shutdown drain timed out"));
            }
        }
    }
}

/// Sleeps until `at`, or for ever without it.
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

pub(super) async fn file_sink(
    mut file: std::fs::File,
    buf: Rc<RefCell<SinkBuf>>,
    env: Rc<Env>,
    wake: Rc<Notify>,
    flushed: Rc<Notify>,
) {
    loop {
        let (data, closing) = {
            let mut b = buf.borrow_mut();
            let data = (!b.data.is_empty()).then(|| b.take());
            (data, b.closing())
        };
        match data {
            Some(data) => {
                if let Err(e) = file.write_all(&data) {
                    tracing::error!(error = %e, bytes = data.len(), "sink file write failed; records lost");
                }
                env.resume_all();
                tokio::task::yield_now().await;
            }
            None if closing => break,
            None => wake.notified().await,
        }
    }
    flushed.notify_one();
}

#[cfg(test)]
mod tests {
    //! The sink's timeouts, on tokio's paused clock: a stalled peer and a receiver that never
    //! comes back are cut at their deadlines (and not before) without the test waiting for
    //! them.

    use std::sync::Arc;

    use super::super::super::metrics::PipeMetrics;
    use super::super::super::RunOptions;
    use super::*;

    fn env(opts: RunOptions) -> Rc<Env> {
        Rc::new(Env::new(
            0,
            opts,
            Arc::new(vec![Arc::new(Notify::new())]),
            None,
            (Arc::default(), Arc::default()),
        ))
    }

    fn buffer(bytes: usize) -> Rc<RefCell<SinkBuf>> {
        let metrics = Arc::new(PipeMetrics::new("test", Vec::new(), 1));
        let buf = Rc::new(RefCell::new(SinkBuf::new(64 << 20, metrics, 0)));
        buf.borrow_mut().data.resize(bytes, 7);
        buf
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_takes_nothing_is_cut_at_the_write_timeout_and_not_before() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let socket = tokio::net::TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        // Accepted and held open, never read: the kernel's buffers fill, then nothing moves.
        let (_peer, _) = listener.accept().expect("accept");
        let env = env(RunOptions::default().sink_write_timeout(Duration::from_secs(30)));
        let buf = buffer(32 << 20);
        let socket = Rc::new(socket);
        buf.borrow_mut().socket = Some(socket.clone());
        let started = tokio::time::Instant::now();
        let wake = Notify::new();
        let cut = tokio::time::timeout(
            Duration::from_secs(60),
            drive_sink(&socket, &buf, &env, &wake),
        )
        .await
        .expect("cut within a minute");
        let took = started.elapsed();
        let e = cut.expect_err("a stalled peer is cut");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(
            took >= Duration::from_secs(30) && took < Duration::from_secs(31),
            "cut after {took:?}"
        );
        assert!(buf.borrow().written > 0, "the kernel took the first bytes");
        assert!(
            !buf.borrow().data.is_empty(),
            "the rest is kept for the next connection"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closing_sink_that_cannot_connect_gives_up_at_the_drain_timeout() {
        // A port nothing listens on: every connection is refused at once.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let env = env(RunOptions {
            drain_timeout: Duration::from_secs(5),
            ..RunOptions::default()
        });
        let buf = buffer(1000);
        buf.borrow_mut().closing_since = Some(clock());
        let flushed = Rc::new(Notify::new());
        let started = tokio::time::Instant::now();
        let gave_up = tcp_sink(addr, buf.clone(), env, flushed.clone());
        tokio::time::timeout(Duration::from_secs(60), gave_up)
            .await
            .expect("gave up within a minute");
        let took = started.elapsed();
        // It retried with backoff (at most 2 s apart) until the drain timeout had passed.
        assert!(
            took > Duration::from_secs(5) && took <= Duration::from_secs(7),
            "gave up after {took:?}"
        );
        assert_eq!(buf.borrow().data.len(), 1000, "nothing was delivered");
        // Whoever waits for the sink at shutdown hears that it is done.
        tokio::time::timeout(Duration::from_millis(1), flushed.notified())
            .await
            .expect("flushed is notified");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closing_sink_with_nothing_left_is_done_at_once() {
        let env = env(RunOptions::default());
        let addr = "127.0.0.1:9".parse().expect("addr");
        let buf = buffer(0);
        assert!(!closing_expired(&buf, &env, addr), "not closing yet");
        buf.borrow_mut().closing_since = Some(clock());
        assert!(closing_expired(&buf, &env, addr));
        let held = buffer(10);
        held.borrow_mut().closing_since = Some(clock());
        assert!(!closing_expired(&held, &env, addr));
        tokio::time::advance(env.opts.drain_timeout).await;
        assert!(
            !closing_expired(&held, &env, addr),
            "the drain timeout is not over"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(closing_expired(&held, &env, addr));
    }
}
