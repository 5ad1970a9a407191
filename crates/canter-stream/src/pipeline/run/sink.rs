//! Where a pipeline's results go on one worker: the sink's output, and the tasks that write a TCP sink (reconnecting) or a file.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::super::metrics::PipeMetrics;
use super::super::{Collector, Encoder};
use super::env::Env;
use super::sink_buf::{mark, record_latency, SinkBuf};
use super::wait::{RateLog, Waiter};

/// The pipeline's end of its sink on one worker.
pub(super) enum SinkOut<O> {
    Buf {
        encode: Encoder<O>,
        buf: Rc<RefCell<SinkBuf>>,
        count: u64,
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
}

impl<O> SinkOut<O> {
    #[inline]
    pub(super) fn write(&mut self, o: O, read_ns: u64) {
        match self {
            SinkOut::Buf { encode, buf, count } => {
                buf.borrow_mut().push(encode, &o, read_ns);
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
        }
    }

    pub(super) fn count(&self) -> u64 {
        match self {
            SinkOut::Buf { count, .. }
            | SinkOut::Collect { count, .. }
            | SinkOut::Discard { count } => *count,
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
                buf.borrow_mut().socket = Some(socket.clone());
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
    if b.data.is_empty() {
        return true;
    }
    if since.elapsed() > env.opts.drain_timeout {
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
                b.closing() && b.data.is_empty(),
                b.written,
            )
        };
        stalled = match stalled {
            _ if !pending => None,
            Some((since, was)) if written == was => Some((since, was)),
            _ => Some((Instant::now(), written)),
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
                // The receiving end sends nothing; what it does send is dropped.
                match socket.try_read(&mut scratch) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(_) => {}
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
