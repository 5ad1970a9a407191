//! Running a topology: one thread per worker, each with its own single-threaded event loop.
//!
//! On each worker, every source connection is a connection actor (`canter_rt::proto`) whose
//! protocol decodes frames and runs the pipeline's fused steps inline. A record whose key the
//! worker owns goes straight on to the stateful step and the sink buffer in the same call; one
//! whose key lives elsewhere joins that worker's batch, handed over at the end of the read.
//! The sink of each pipeline on each worker is a buffer. A TCP sink's buffer is written to its
//! socket by the source connection that produced the records, at the end of each read, so a
//! result does not wait for the rest of the worker's turn; the sink's own task writes only what
//! the socket had no room for, resumes the sources, and reconnects. A file sink's task writes
//! its file.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::hash::Hash;
use std::io::{self, Read, Write};
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use canter_rt::proto::{self, Conn, Handle, Protocol, Settings};
use canter_rt::{ServerWorker, ShutdownHandle};
use tokio::sync::Notify;

use super::metrics::{Metrics, PipeMetrics};
use super::state::{owner, Emit, KeyedState, Stateful, Store};
use super::step::Step;
use super::{Collector, Encoder, Framing, RunOptions, Sink, Source};
use crate::frame::{self, FrameError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Now, in ns since the Unix epoch.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Allows a log line at most once a second, counting what it held back.
#[derive(Default)]
struct RateLog {
    last: Option<Instant>,
    held: u64,
}

impl RateLog {
    /// `Some(lines held back since the last one)` when a line may be written now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now - t < Duration::from_secs(1)) {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

// ------------------------------------------------------------------------------------------
// Per-worker environment

/// Something to wake once a sink or an inbox has room again.
#[derive(Clone)]
enum Waiter {
    Conn(Handle),
    Task(Rc<Notify>),
}

impl Waiter {
    fn wake(&self) {
        match self {
            Waiter::Conn(h) => h.wake(),
            Waiter::Task(n) => n.notify_one(),
        }
    }
}

/// Records in flight into one worker's inbox of one pipeline, and which workers wait for room.
pub(crate) struct Gauge {
    pending: AtomicUsize,
    blocked: AtomicU64,
}

/// What one worker shares among its pipelines' tasks.
pub(crate) struct Env {
    me: usize,
    workers: usize,
    opts: RunOptions,
    stores: RefCell<HashMap<u64, Rc<dyn Any>>>,
    sinks: RefCell<Vec<Rc<RefCell<SinkBuf>>>>,
    /// Inboxes on other workers that this worker feeds.
    gauges: RefCell<Vec<Arc<Gauge>>>,
    waiters: RefCell<Vec<Waiter>>,
    sources: RefCell<Vec<Handle>>,
    /// Source connections open on this worker.
    open_sources: Cell<usize>,
    tasks: RefCell<Vec<tokio::task::JoinHandle<()>>>,
    shutting: Cell<bool>,
    resumes: Arc<Vec<Arc<Notify>>>,
}

impl Env {
    fn store<K: Hash + Eq + 'static, S: 'static>(
        &self,
        state: &KeyedState<K, S>,
    ) -> Rc<RefCell<Store<K, S>>> {
        let mut stores = self.stores.borrow_mut();
        if let Some(s) = stores.get(&state.id) {
            if let Ok(s) = s.clone().downcast::<RefCell<Store<K, S>>>() {
                return s;
            }
        }
        let s = Rc::new(RefCell::new(Store::new(state)));
        stores.insert(state.id, s.clone());
        s
    }

    fn sinks_full(&self) -> bool {
        self.sinks.borrow().iter().any(|s| s.borrow().full())
    }

    /// Whether the sources must stop reading: a sink of this worker is full, or an inbox this
    /// worker feeds is (then this worker is marked as waiting for it).
    fn must_wait(&self) -> bool {
        if self.sinks_full() {
            return true;
        }
        let cap = self.opts.inbox_capacity;
        for g in self.gauges.borrow().iter() {
            if g.pending.load(Ordering::Acquire) >= cap {
                g.blocked.fetch_or(1 << self.me, Ordering::SeqCst);
                // The receiver may have drained in between and missed the mark: look again.
                if g.pending.load(Ordering::SeqCst) >= cap {
                    return true;
                }
            }
        }
        false
    }

    fn wait(&self, w: Waiter) {
        self.waiters.borrow_mut().push(w);
    }

    /// Wakes everything that waited for room; each looks again.
    fn resume_all(&self) {
        let ws = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in ws {
            w.wake();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Inboxes: batches from other workers

enum Batch<K, T> {
    Data(Vec<(K, T, u64)>),
    End,
}

struct Inbox<K, T> {
    queue: Mutex<Vec<Batch<K, T>>>,
    notify: Notify,
    gauge: Arc<Gauge>,
}

impl<K, T> Inbox<K, T> {
    fn push(&self, b: Batch<K, T>) {
        if let Batch::Data(v) = &b {
            self.gauge.pending.fetch_add(v.len(), Ordering::SeqCst);
        }
        lock(&self.queue).push(b);
        self.notify.notify_one();
    }

    fn release(&self, n: usize, low: usize, resumes: &[Arc<Notify>]) {
        let left = self.gauge.pending.fetch_sub(n, Ordering::SeqCst) - n;
        if left < low {
            let mask = self.gauge.blocked.swap(0, Ordering::SeqCst);
            for (w, r) in resumes.iter().enumerate() {
                if mask & (1 << w) != 0 {
                    r.notify_one();
                }
            }
        }
    }
}

struct Shared<K, T> {
    inboxes: Vec<Inbox<K, T>>,
}

// ------------------------------------------------------------------------------------------
// Sinks

/// The sink buffer's starting capacity.
const SINK_CHUNK: usize = 64 * 1024;

/// A buffer that grew past this while the sink's peer lagged is given back once it empties.
const SINK_KEEP: usize = 4 * SINK_CHUNK;

/// A sink's buffer on one worker: framed records waiting for the connection or file.
///
/// For a TCP sink the connected socket sits here too, so that the code producing records writes
/// them at the end of each read (see [`SinkBuf::flush`]) instead of waiting for the sink's task
/// to be scheduled after the rest of the worker's turn; the task writes only when the socket
/// had no room, and it owns reconnecting.
pub(crate) struct SinkBuf {
    data: Vec<u8>,
    /// (read time, records) of what is in `data`, oldest first, for the latency histogram.
    segs: VecDeque<(u64, u64)>,
    high: usize,
    low: usize,
    /// The TCP sink's socket while it is connected.
    socket: Option<Rc<tokio::net::TcpStream>>,
    /// Bytes the socket has taken, for telling a peer that reads slowly from one that stopped.
    written: u64,
    driver: Option<Waiter>,
    /// When the worker began shutting down (the sink then has `drain_timeout` to deliver).
    closing_since: Option<Instant>,
    metrics: Arc<PipeMetrics>,
    me: usize,
}

impl SinkBuf {
    fn new(high: usize, metrics: Arc<PipeMetrics>, me: usize) -> Self {
        SinkBuf {
            data: Vec::with_capacity(SINK_CHUNK),
            segs: VecDeque::new(),
            high,
            low: high / 4,
            socket: None,
            written: 0,
            driver: None,
            closing_since: None,
            metrics,
            me,
        }
    }

    /// The worker is shutting down: deliver what is held, then end.
    fn closing(&self) -> bool {
        self.closing_since.is_some()
    }

    fn full(&self) -> bool {
        self.data.len() >= self.high
    }

    /// Encodes `record` straight into the buffer, framed.
    #[inline]
    fn push<O>(&mut self, encode: &Encoder<O>, record: &O, read_ns: u64) {
        let start = self.data.len();
        self.data.extend_from_slice(&[0; 4]);
        encode(record, &mut self.data);
        let Ok(len) = u32::try_from(self.data.len() - start - 4) else {
            tracing::error!("a record of 4 GiB or more cannot be framed; dropped");
            self.data.truncate(start);
            return;
        };
        self.data[start..start + 4].copy_from_slice(&len.to_be_bytes());
        mark(&mut self.segs, read_ns);
    }

    /// Takes everything buffered, recording its latency as written now.
    fn take(&mut self) -> Vec<u8> {
        record_latency(&self.metrics, self.me, self.segs.drain(..));
        std::mem::replace(&mut self.data, Vec::with_capacity(SINK_CHUNK))
    }

    /// Writes what is buffered to the socket, as much as it takes without waiting. A record's
    /// latency is taken when the buffer is written out to its end (a record finished by a
    /// partial write counts from the write that empties the buffer, so none counts early).
    fn write_out(&mut self) -> io::Result<()> {
        let Some(socket) = &self.socket else {
            return Ok(());
        };
        while !self.data.is_empty() {
            let taken = socket.try_write(&self.data);
            if let Ok(n) = taken {
                self.written += n as u64;
            }
            match taken {
                Ok(n) if n == self.data.len() => {
                    record_latency(&self.metrics, self.me, self.segs.drain(..));
                    if self.data.capacity() > SINK_KEEP {
                        self.data = Vec::with_capacity(SINK_CHUNK);
                    } else {
                        self.data.clear();
                    }
                }
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.data.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Called where records were produced, at the end of each read: a connected TCP sink is
    /// written at once; otherwise, or when the socket is full or failed, or when this made room
    /// that sources may be waiting for, the sink's task is woken to carry on.
    fn flush(&mut self) {
        if self.data.is_empty() {
            return;
        }
        if self.socket.is_none() {
            self.wake_driver();
            return;
        }
        let was_full = self.full();
        let ok = self.write_out().is_ok();
        if !ok || !self.data.is_empty() || was_full {
            self.wake_driver();
        }
    }

    fn wake_driver(&self) {
        if let Some(d) = &self.driver {
            d.wake();
        }
    }
}

#[inline]
fn mark(segs: &mut VecDeque<(u64, u64)>, read_ns: u64) {
    match segs.back_mut() {
        Some((ns, n)) if *ns == read_ns => *n += 1,
        _ => segs.push_back((read_ns, 1)),
    }
}

fn record_latency(metrics: &PipeMetrics, me: usize, segs: impl Iterator<Item = (u64, u64)>) {
    let now = now_ns();
    let mut l = lock(&metrics.workers[me].latency);
    for (ns, n) in segs {
        // Records emitted when windows are flushed at the end have no read time.
        if ns != 0 {
            l.record(now, ns, n);
        }
    }
}

/// The pipeline's end of its sink on one worker.
enum SinkOut<O> {
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
    fn write(&mut self, o: O, read_ns: u64) {
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

    fn end_turn(&mut self, metrics: &PipeMetrics, me: usize) {
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

    fn count(&self) -> u64 {
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
async fn tcp_sink(addr: SocketAddr, buf: Rc<RefCell<SinkBuf>>, env: Rc<Env>, flushed: Rc<Notify>) {
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
fn closing_expired(buf: &RefCell<SinkBuf>, env: &Env, addr: SocketAddr) -> bool {
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
async fn drive_sink(
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
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

async fn file_sink(
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

// ------------------------------------------------------------------------------------------
// The pipeline on one worker: head (decode, steps, route) and tail (state, steps, sink)

pub(crate) trait Process {
    fn begin(&mut self);
    fn record(&mut self, rec: &[u8]);
    /// Runs every complete record at the start of `buf`; returns the bytes they took.
    fn records(&mut self, framing: Framing, buf: &[u8]) -> Result<usize, FrameError>;
    fn end_turn(&mut self);
    fn frame_error(&mut self, peer: Option<SocketAddr>, e: &dyn Display);
    fn end_of_input(&mut self);
}

trait TailOps<K, T> {
    fn process(&mut self, key: K, item: T, read_ns: u64);
    fn end_turn(&mut self);
    fn finish(&mut self);
}

struct TailInst<K, U: Stateful<K, X>, X, P: Step<U::Out>> {
    store: Rc<RefCell<Store<K, U::State>>>,
    step: U,
    post: P,
    sink: SinkOut<P::Out>,
    metrics: Arc<PipeMetrics>,
    me: usize,
    _x: PhantomData<fn(X)>,
}

impl<K, X, U, P> TailOps<K, X> for TailInst<K, U, X, P>
where
    K: Hash + Eq,
    U: Stateful<K, X>,
    P: Step<U::Out>,
{
    #[inline]
    fn process(&mut self, key: K, item: X, read_ns: u64) {
        let TailInst {
            store,
            step,
            post,
            sink,
            ..
        } = self;
        let mut store = store.borrow_mut();
        let st = store.get(key);
        step.update(
            st,
            item,
            &mut Emit::new(
                &mut |o| post.push(o, &mut |o| sink.write(o, read_ns)),
                read_ns,
            ),
        );
    }

    fn end_turn(&mut self) {
        self.sink.end_turn(&self.metrics, self.me);
        let m = &self.metrics.workers[self.me];
        m.sink.store(self.sink.count(), Ordering::Relaxed);
        m.late.store(self.step.late(), Ordering::Relaxed);
    }

    fn finish(&mut self) {
        let TailInst {
            store,
            step,
            post,
            sink,
            ..
        } = self;
        let mut store = store.borrow_mut();
        for st in store.map.values_mut() {
            step.finish(
                st,
                &mut Emit::new(&mut |o| post.push(o, &mut |o| sink.write(o, 0)), 0),
            );
        }
    }
}

struct Head<T, D, C: Step<T>, KF, K, Tl> {
    decode: D,
    chain: C,
    key: KF,
    tail: Rc<RefCell<Tl>>,
    out: Vec<Vec<(K, C::Out, u64)>>,
    shared: Arc<Shared<K, C::Out>>,
    me: usize,
    workers: usize,
    read_ns: u64,
    records: u64,
    rejected: u64,
    frame_errors: u64,
    log: RateLog,
    metrics: Arc<PipeMetrics>,
    counts: Vec<u64>,
    _t: PhantomData<fn() -> T>,
}

impl<T, E, D, C, KF, K, Tl> Process for Head<T, D, C, KF, K, Tl>
where
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E>,
    C: Step<T>,
    KF: FnMut(&C::Out) -> K,
    K: Hash,
    Tl: TailOps<K, C::Out>,
{
    fn begin(&mut self) {
        self.read_ns = now_ns();
    }

    #[inline]
    fn record(&mut self, rec: &[u8]) {
        self.records += 1;
        match (self.decode)(rec) {
            Ok(item) => {
                let Head {
                    chain,
                    key,
                    tail,
                    out,
                    me,
                    workers,
                    read_ns,
                    ..
                } = self;
                let (me, workers, read_ns) = (*me, *workers, *read_ns);
                chain.push(item, &mut |x| {
                    let k = key(&x);
                    let w = owner(&k, workers);
                    if w == me {
                        tail.borrow_mut().process(k, x, read_ns);
                    } else {
                        out[w].push((k, x, read_ns));
                    }
                });
            }
            Err(e) => {
                self.rejected += 1;
                if let Some(held) = self.log.allow() {
                    tracing::warn!(
                        pipeline = %self.metrics.name, worker = self.me, error = %e,
                        bytes = rec.len(), held, "input record rejected"
                    );
                }
            }
        }
    }

    fn records(&mut self, framing: Framing, buf: &[u8]) -> Result<usize, FrameError> {
        split(framing, buf, |rec| self.record(rec))
    }

    fn end_turn(&mut self) {
        for (w, batch) in self.out.iter_mut().enumerate() {
            if !batch.is_empty() {
                let full = std::mem::replace(batch, Vec::with_capacity(batch.len()));
                self.shared.inboxes[w].push(Batch::Data(full));
            }
        }
        self.tail.borrow_mut().end_turn();
        let m = &self.metrics.workers[self.me];
        m.source.store(self.records, Ordering::Relaxed);
        m.rejected.store(self.rejected, Ordering::Relaxed);
        m.frame_errors.store(self.frame_errors, Ordering::Relaxed);
        self.counts.clear();
        self.chain.counts(&mut self.counts);
        for (a, n) in m.steps.iter().zip(&self.counts) {
            a.store(*n, Ordering::Relaxed);
        }
    }

    fn frame_error(&mut self, peer: Option<SocketAddr>, e: &dyn Display) {
        self.frame_errors += 1;
        tracing::warn!(
            pipeline = %self.metrics.name, worker = self.me, peer = ?peer, error = %e,
            "broken frame; source connection closed"
        );
    }

    fn end_of_input(&mut self) {
        self.end_turn();
        for inbox in &self.shared.inboxes {
            inbox.push(Batch::End);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Sources

fn split(framing: Framing, buf: &[u8], each: impl FnMut(&[u8])) -> Result<usize, FrameError> {
    match framing {
        Framing::LengthPrefixed { max } => frame::split(buf, max, each),
        Framing::Lines { max } => split_lines(buf, max, each),
    }
}

/// Splits the complete lines at the start of `buf` (`\n` or `\r\n` ended).
fn split_lines(buf: &[u8], max: usize, mut each: impl FnMut(&[u8])) -> Result<usize, FrameError> {
    let mut at = 0;
    while let Some(i) = buf[at..].iter().position(|&b| b == b'\n') {
        let mut line = &buf[at..at + i];
        if let Some(l) = line.strip_suffix(b"\r") {
            line = l;
        }
        if line.len() > max {
            return Err(FrameError::TooLarge {
                len: line.len(),
                max,
            });
        }
        each(line);
        at += i + 1;
    }
    if buf.len() - at > max + 1 {
        return Err(FrameError::TooLarge {
            len: buf.len() - at,
            max,
        });
    }
    Ok(at)
}

/// A source connection: frames in, the pipeline run inline.
struct SourceConn {
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    framing: Framing,
    peer: SocketAddr,
    /// Counted in [`Env::open_sources`] (it was not over the bound when it opened).
    counted: bool,
    /// Rate-limits the warnings of refused connections, for the worker.
    refusals: Rc<RefCell<RateLog>>,
}

impl SourceConn {
    fn hold(&self, conn: &mut Conn<'_>) {
        conn.mute();
        self.env.wait(Waiter::Conn(conn.handle()));
    }
}

impl Protocol for SourceConn {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        // Each connection may hold up to a frame of input: their number is bounded.
        if self.env.open_sources.get() >= self.env.opts.max_source_connections {
            if let Some(held) = self.refusals.borrow_mut().allow() {
                let peer = self.peer;
                tracing::warn!(%peer, held, "source connection refused: at max_source_connections");
            }
            conn.close();
            return;
        }
        self.env.open_sources.set(self.env.open_sources.get() + 1);
        self.counted = true;
        let mut sources = self.env.sources.borrow_mut();
        sources.retain(|h| !h.is_closed());
        sources.push(conn.handle());
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        if self.env.shutting.get() {
            conn.close();
            return;
        }
        if self.env.must_wait() {
            self.hold(conn);
            return;
        }
        let mut head = self.head.borrow_mut();
        head.begin();
        match head.records(self.framing, input) {
            Ok(used) => {
                let _ = input.split_to(used);
            }
            Err(e) => {
                head.frame_error(Some(conn.peer_addr()), &e);
                input.clear();
                conn.close();
            }
        }
        head.end_turn();
        drop(head);
        if !conn.is_closing() && self.env.must_wait() {
            self.hold(conn);
        }
    }

    fn on_wake(&mut self, conn: &mut Conn<'_>) {
        if self.env.shutting.get() {
            conn.close();
        } else if conn.is_muted() {
            if self.env.must_wait() {
                self.env.wait(Waiter::Conn(conn.handle()));
            } else {
                conn.unmute();
            }
        }
    }

    fn on_shutdown(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    fn on_close(&mut self, why: &proto::Close) {
        if self.counted {
            self.env.open_sources.set(self.env.open_sources.get() - 1);
        }
        tracing::debug!(peer = %self.peer, %why, "source connection closed");
    }
}

/// Serves a TCP source on this worker: the runtime's accept loop for the source's server,
/// each connection a [`SourceConn`], until shutdown.
async fn serve_source(
    server: ServerWorker,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    framing: Framing,
) {
    let built = Settings::builder()
        .read_budget(env.opts.read_budget)
        .read_size((256 * 1024).min(env.opts.read_budget).max(1024))
        .max_input(match framing {
            Framing::LengthPrefixed { max } | Framing::Lines { max } => max + 64 * 1024,
        })
        .build();
    let settings = match built {
        Ok(settings) => settings,
        Err(e) => {
            tracing::error!(error = %e, "source connection settings");
            return;
        }
    };
    let refusals = Rc::new(RefCell::new(RateLog::default()));
    let make = {
        let env = env.clone();
        move |peer| SourceConn {
            head: head.clone(),
            env: env.clone(),
            framing,
            peer,
            counted: false,
            refusals: refusals.clone(),
        }
    };
    if let Err(e) = server.serve_protocol(Some(settings), make).await {
        tracing::error!(error = %e, "source listener failed");
    }
}

/// Waits until the sources may read.
async fn room(env: &Env, wake: &Rc<Notify>) {
    while env.must_wait() {
        env.wait(Waiter::Task(wake.clone()));
        wake.notified().await;
    }
}

async fn file_source(
    path: std::path::PathBuf,
    framing: Framing,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
) {
    let wake = Rc::new(Notify::new());
    match std::fs::File::open(&path) {
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "source file cannot be opened")
        }
        Ok(mut file) => {
            let mut buf: Vec<u8> = Vec::new();
            let mut chunk = vec![0u8; 256 * 1024];
            while !env.shutting.get() {
                room(&env, &wake).await;
                let n = match file.read(&mut chunk) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "source file read failed");
                        break;
                    }
                };
                if n == 0 {
                    if !buf.is_empty() {
                        let e = FrameError::Truncated { missing: 0 };
                        head.borrow_mut().frame_error(None, &e);
                    }
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                let r = {
                    let mut h = head.borrow_mut();
                    h.begin();
                    let r = h.records(framing, &buf);
                    h.end_turn();
                    if let Err(e) = &r {
                        h.frame_error(None, e);
                    }
                    r
                };
                match r {
                    Ok(used) => {
                        buf.drain(..used);
                    }
                    Err(_) => break,
                }
                tokio::task::yield_now().await;
            }
        }
    }
    head.borrow_mut().end_of_input();
}

async fn generate_source(
    count: u64,
    make: Arc<dyn Fn(u64, &mut Vec<u8>) + Send + Sync>,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
) {
    let wake = Rc::new(Notify::new());
    let mut scratch = Vec::with_capacity(256);
    let mut i = 0;
    while i < count && !env.shutting.get() {
        room(&env, &wake).await;
        {
            let mut h = head.borrow_mut();
            h.begin();
            let end = (i + 1024).min(count);
            while i < end {
                scratch.clear();
                make(i, &mut scratch);
                h.record(&scratch);
                i += 1;
            }
            h.end_turn();
        }
        tokio::task::yield_now().await;
    }
    head.borrow_mut().end_of_input();
}

// ------------------------------------------------------------------------------------------
// Definitions, preparation, start

/// A pipeline as built, not yet bound.
pub(crate) trait PipelineDef: Send {
    fn name(&self) -> &str;
    /// Binds the listeners and makes the inboxes.
    fn prepare(
        self: Box<Self>,
        opts: &RunOptions,
        resumes: &Arc<Vec<Arc<Notify>>>,
    ) -> io::Result<Arc<Prep>>;
    /// Starts the pipeline's tasks on this worker; returns its head and the task that ends
    /// when the pipeline has ended here.
    fn start(
        &self,
        prep: &Prep,
        env: &Rc<Env>,
    ) -> io::Result<(Rc<RefCell<dyn Process>>, tokio::task::JoinHandle<()>)>;
}

pub(crate) struct Def<T, D, C, KF, K, U, P, O> {
    pub(crate) name: String,
    pub(crate) source: Source,
    pub(crate) decode: D,
    pub(crate) chain: C,
    pub(crate) key: KF,
    pub(crate) step: U,
    pub(crate) post: P,
    pub(crate) sink: Sink<O>,
    pub(crate) _t: PhantomData<fn() -> (T, K)>,
}

/// A pipeline bound (listeners open) and ready to start on each worker.
pub(crate) struct Prep {
    name: String,
    def: Mutex<Box<dyn PipelineDef>>,
    source: Source,
    metrics: Arc<PipeMetrics>,
    shared: Arc<dyn Any + Send + Sync>,
    /// The source's server, for a TCP source: one share per worker, taken by the worker.
    servers: Mutex<Vec<Option<ServerWorker>>>,
    /// Stops the source's server (its accept loops, then its connections).
    server_shutdown: Option<ShutdownHandle>,
    addr: Option<SocketAddr>,
    file: Option<std::fs::File>,
    resumes: Arc<Vec<Arc<Notify>>>,
}

impl<T, E, D, C, KF, K, U, P> PipelineDef for Def<T, D, C, KF, K, U, P, P::Out>
where
    T: 'static,
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
    C: Step<T>,
    C::Out: Send,
    KF: FnMut(&C::Out) -> K + Clone + Send + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    U: Stateful<K, C::Out>,
    P: Step<U::Out>,
    P::Out: Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn prepare(
        self: Box<Self>,
        opts: &RunOptions,
        resumes: &Arc<Vec<Arc<Notify>>>,
    ) -> io::Result<Arc<Prep>> {
        let workers = opts.workers;
        let mut names = Vec::new();
        self.chain.names(&mut names);
        let metrics = Arc::new(PipeMetrics::new(&self.name, names, workers));
        let mut servers = Vec::new();
        let mut server_shutdown = None;
        let mut bound = None;
        if let Source::Tcp { addr, .. } = &self.source {
            // Every worker's listener shares the port (SO_REUSEPORT), and so would another
            // process's that got there first, taking some of the connections: refuse a port
            // anything listens on already.
            if addr.port() != 0 {
                drop(StdListener::bind(addr).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("pipeline {}: {addr} is taken: {e}", self.name),
                    )
                })?);
            }
            // The source is a server of the runtime's, on the pipeline's workers: one
            // SO_REUSEPORT listener each, its accept loop, drain and counters. The pipeline
            // bounds its source connections itself (one over is closed at once, with a
            // warning), so the server's own bound (which leaves them in the backlog) is off.
            let config = canter_rt::Config::builder()
                .addr(*addr)
                .workers(workers)
                .backlog(1024)
                .max_connections(usize::MAX)
                .drain_timeout(opts.drain_timeout)
                .defer_accept(false)
                .build()
                .map_err(io::Error::from)?;
            let server = canter_rt::Server::bind(config).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("pipeline {}: listen on {addr}: {e}", self.name),
                )
            })?;
            bound = Some(server.local_addr());
            server_shutdown = Some(server.shutdown_handle());
            servers = server.into_workers().into_iter().map(Some).collect();
        }
        let file = match &self.sink {
            Sink::File { path, .. } => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("sink file {}: {e}", path.display()))
                    })?,
            ),
            _ => None,
        };
        let shared: Arc<Shared<K, C::Out>> = Arc::new(Shared {
            inboxes: (0..workers)
                .map(|_| Inbox {
                    queue: Mutex::new(Vec::new()),
                    notify: Notify::new(),
                    gauge: Arc::new(Gauge {
                        pending: AtomicUsize::new(0),
                        blocked: AtomicU64::new(0),
                    }),
                })
                .collect(),
        });
        Ok(Arc::new(Prep {
            name: self.name.clone(),
            source: self.source.clone(),
            metrics,
            shared,
            servers: Mutex::new(servers),
            server_shutdown,
            addr: bound,
            file,
            resumes: resumes.clone(),
            def: Mutex::new(self),
        }))
    }

    fn start(
        &self,
        prep: &Prep,
        env: &Rc<Env>,
    ) -> io::Result<(Rc<RefCell<dyn Process>>, tokio::task::JoinHandle<()>)> {
        let (decode, chain, key, step, post, sink) = (
            self.decode.clone(),
            self.chain.clone(),
            self.key.clone(),
            self.step.clone(),
            self.post.clone(),
            self.sink.clone(),
        );
        let shared = prep
            .shared
            .clone()
            .downcast::<Shared<K, C::Out>>()
            .map_err(|_| io::Error::other("pipeline inbox of another type"))?;
        let me = env.me;
        let metrics = prep.metrics.clone();
        let flushed = Rc::new(Notify::new());
        let mut sink_buf = None;
        let sink = match sink {
            Sink::Tcp { addr, encode } => {
                let buf = Rc::new(RefCell::new(SinkBuf::new(
                    env.opts.sink_high_water,
                    metrics.clone(),
                    me,
                )));
                env.sinks.borrow_mut().push(buf.clone());
                tokio::task::spawn_local(tcp_sink(addr, buf.clone(), env.clone(), flushed.clone()));
                sink_buf = Some(buf.clone());
                SinkOut::Buf {
                    encode,
                    buf,
                    count: 0,
                }
            }
            Sink::File { encode, .. } => {
                let file = prep
                    .file
                    .as_ref()
                    .ok_or_else(|| io::Error::other("sink file not open"))?
                    .try_clone()?;
                let buf = Rc::new(RefCell::new(SinkBuf::new(
                    env.opts.sink_high_water,
                    metrics.clone(),
                    me,
                )));
                let wake = Rc::new(Notify::new());
                buf.borrow_mut().driver = Some(Waiter::Task(wake.clone()));
                env.sinks.borrow_mut().push(buf.clone());
                tokio::task::spawn_local(file_sink(
                    file,
                    buf.clone(),
                    env.clone(),
                    wake,
                    flushed.clone(),
                ));
                sink_buf = Some(buf.clone());
                SinkOut::Buf {
                    encode,
                    buf,
                    count: 0,
                }
            }
            Sink::Collect(to) => SinkOut::Collect {
                local: Vec::new(),
                segs: VecDeque::new(),
                to,
                count: 0,
            },
            Sink::Discard => SinkOut::Discard { count: 0 },
        };
        let tail = Rc::new(RefCell::new(TailInst {
            store: env.store(&step.state()),
            step,
            post,
            sink,
            metrics: metrics.clone(),
            me,
            _x: PhantomData,
        }));
        for (w, inbox) in shared.inboxes.iter().enumerate() {
            if w != me {
                env.gauges.borrow_mut().push(inbox.gauge.clone());
            }
        }
        let head: Rc<RefCell<dyn Process>> = Rc::new(RefCell::new(Head {
            decode,
            chain,
            key,
            tail: tail.clone(),
            out: (0..env.workers).map(|_| Vec::new()).collect(),
            shared: shared.clone(),
            me,
            workers: env.workers,
            read_ns: 0,
            records: 0,
            rejected: 0,
            frame_errors: 0,
            log: RateLog::default(),
            metrics: metrics.clone(),
            counts: Vec::new(),
            _t: PhantomData,
        }));
        match &prep.source {
            Source::Tcp { framing, .. } => {
                let server = lock(&prep.servers)
                    .get_mut(me)
                    .and_then(Option::take)
                    .ok_or_else(|| io::Error::other("no listener for this worker"))?;
                tokio::task::spawn_local(serve_source(server, head.clone(), env.clone(), *framing));
            }
            Source::File { path, framing } if me == 0 => {
                tokio::task::spawn_local(file_source(
                    path.clone(),
                    *framing,
                    head.clone(),
                    env.clone(),
                ));
            }
            Source::Generate { count, make } if me == 0 => {
                tokio::task::spawn_local(generate_source(
                    *count,
                    make.clone(),
                    head.clone(),
                    env.clone(),
                ));
            }
            _ => {}
        }
        let expected = if prep.finite() { 1 } else { env.workers };
        let done = tokio::task::spawn_local(drain(
            shared,
            tail,
            env.clone(),
            expected,
            prep.resumes.clone(),
            sink_buf.map(|b| (b, flushed)),
        ));
        Ok((head, done))
    }
}

impl Prep {
    fn name(&self) -> &str {
        &self.name
    }

    fn metrics(&self) -> Arc<PipeMetrics> {
        self.metrics.clone()
    }

    fn source_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    fn finite(&self) -> bool {
        self.source.finite()
    }

    fn start(
        &self,
        env: &Rc<Env>,
    ) -> io::Result<(Rc<RefCell<dyn Process>>, tokio::task::JoinHandle<()>)> {
        lock(&self.def).start(self, env)
    }
}

/// Runs what other workers sent this one for the pipeline, until every source has ended; then
/// flushes windows and the sink.
async fn drain<K, X, Tl: TailOps<K, X>>(
    shared: Arc<Shared<K, X>>,
    tail: Rc<RefCell<Tl>>,
    env: Rc<Env>,
    expected: usize,
    resumes: Arc<Vec<Arc<Notify>>>,
    sink: Option<(Rc<RefCell<SinkBuf>>, Rc<Notify>)>,
) {
    let inbox = &shared.inboxes[env.me];
    let low = env.opts.inbox_capacity / 4;
    let wake = Rc::new(Notify::new());
    let mut ends = 0;
    loop {
        if env.sinks_full() {
            env.wait(Waiter::Task(wake.clone()));
            wake.notified().await;
            continue;
        }
        let batches = std::mem::take(&mut *lock(&inbox.queue));
        if batches.is_empty() {
            inbox.notify.notified().await;
            continue;
        }
        let mut n = 0;
        {
            let mut t = tail.borrow_mut();
            for b in batches {
                match b {
                    Batch::Data(v) => {
                        n += v.len();
                        for (k, x, ns) in v {
                            t.process(k, x, ns);
                        }
                    }
                    Batch::End => ends += 1,
                }
            }
            t.end_turn();
        }
        if n > 0 {
            inbox.release(n, low, &resumes);
        }
        if ends >= expected {
            break;
        }
        tokio::task::yield_now().await;
    }
    {
        let mut t = tail.borrow_mut();
        t.finish();
        t.end_turn();
    }
    if let Some((buf, flushed)) = sink {
        buf.borrow_mut().closing_since = Some(Instant::now());
        buf.borrow().wake_driver();
        flushed.notified().await;
    }
}

// ------------------------------------------------------------------------------------------
// Threads

struct ShutdownInner {
    flag: AtomicBool,
    notifies: Vec<Arc<Notify>>,
    /// The TCP sources' servers: their accept loops stop, their connections are told.
    servers: Vec<ShutdownHandle>,
}

/// Stops a running topology: sources stop reading, what is in flight is delivered (within the
/// drain timeout), then the workers end.
#[derive(Clone)]
pub struct Shutdown(Arc<ShutdownInner>);

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shutdown({})", self.0.flag.load(Ordering::Relaxed))
    }
}

impl Shutdown {
    /// Asks the workers to stop.
    pub fn shutdown(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        for server in &self.0.servers {
            server.shutdown();
        }
        for n in &self.0.notifies {
            n.notify_one();
        }
    }

    /// Stops the topology on SIGINT or SIGTERM (watched from a small thread), then runs
    /// `also` (to stop a metrics server, say).
    pub fn on_signals(&self, also: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let handle = self.clone();
        canter_rt::on_signals(move || {
            tracing::info!("shutting down: draining the pipelines");
            handle.shutdown();
            also();
        })
    }
}

/// A started topology.
pub struct Running {
    threads: Vec<JoinHandle<io::Result<()>>>,
    shutdown: Shutdown,
    metrics: Arc<Metrics>,
    addrs: Vec<(String, Option<SocketAddr>)>,
    sampler: Option<JoinHandle<()>>,
    stop_sampler: Arc<AtomicBool>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("workers", &self.threads.len())
            .field("sources", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Where a pipeline's TCP source listens.
    pub fn source_addr(&self, pipeline: &str) -> Option<SocketAddr> {
        self.addrs
            .iter()
            .find(|(n, _)| n == pipeline)
            .and_then(|(_, a)| *a)
    }

    /// The topology's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// A handle that stops the topology from any thread.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Whether every worker has ended.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Waits for the workers to end (finite sources all read and delivered, or a shutdown).
    pub fn wait(mut self) -> io::Result<()> {
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a pipeline worker panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        self.stop_sampler.store(true, Ordering::SeqCst);
        if let Some(s) = self.sampler.take() {
            let _ = s.join();
        }
        self.metrics.sample();
        result
    }
}

pub(crate) fn start(defs: Vec<Box<dyn PipelineDef>>, opts: RunOptions) -> io::Result<Running> {
    let workers = opts.workers.clamp(1, 64);
    let opts = RunOptions { workers, ..opts };
    if defs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no pipelines"));
    }
    let resumes: Arc<Vec<Arc<Notify>>> =
        Arc::new((0..workers).map(|_| Arc::new(Notify::new())).collect());
    let mut preps = Vec::new();
    for d in defs {
        preps.push(d.prepare(&opts, &resumes)?);
    }
    let metrics = Arc::new(Metrics::new(preps.iter().map(|p| p.metrics()).collect()));
    let shutdown = Shutdown(Arc::new(ShutdownInner {
        flag: AtomicBool::new(false),
        notifies: (0..workers).map(|_| Arc::new(Notify::new())).collect(),
        servers: preps
            .iter()
            .filter_map(|p| p.server_shutdown.clone())
            .collect(),
    }));
    // The workers' threads and event loops are the runtime's, pinned as its servers' are.
    let config = canter_rt::Config::builder()
        .workers(workers)
        .pin_workers(opts.pin)
        .build()
        .map_err(io::Error::from)?;
    let addrs = preps
        .iter()
        .map(|p| (p.name().to_owned(), p.source_addr()))
        .collect();
    let mut threads = Vec::new();
    for me in 0..workers {
        let preps = preps.clone();
        let opts = opts.clone();
        let resumes = resumes.clone();
        let stop = shutdown.0.notifies[me].clone();
        threads.push(canter_rt::spawn_worker(
            me,
            &config,
            format!("canter-pipeline-{me}"),
            move || worker(me, preps, opts, resumes, stop),
        )?);
    }
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (metrics, stop) = (metrics.clone(), stop_sampler.clone());
        std::thread::Builder::new()
            .name("canter-pipeline-metrics".into())
            .spawn(move || {
                let mut next = Instant::now() + Duration::from_secs(1);
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                    if Instant::now() >= next {
                        metrics.sample();
                        next += Duration::from_secs(1);
                    }
                }
            })?
    };
    Ok(Running {
        threads,
        shutdown,
        metrics,
        addrs,
        sampler: Some(sampler),
        stop_sampler,
    })
}

async fn worker(
    me: usize,
    preps: Vec<Arc<Prep>>,
    opts: RunOptions,
    resumes: Arc<Vec<Arc<Notify>>>,
    stop: Arc<Notify>,
) -> io::Result<()> {
    let drain_timeout = opts.drain_timeout;
    {
        let env = Rc::new(Env {
            me,
            workers: opts.workers,
            opts,
            stores: RefCell::new(HashMap::new()),
            sinks: RefCell::new(Vec::new()),
            gauges: RefCell::new(Vec::new()),
            waiters: RefCell::new(Vec::new()),
            sources: RefCell::new(Vec::new()),
            open_sources: Cell::new(0),
            tasks: RefCell::new(Vec::new()),
            shutting: Cell::new(false),
            resumes: resumes.clone(),
        });
        {
            let env = env.clone();
            let resume = env.resumes[me].clone();
            tokio::task::spawn_local(async move {
                loop {
                    resume.notified().await;
                    env.resume_all();
                }
            });
        }
        let mut heads = Vec::new();
        let mut dones = Vec::new();
        for p in &preps {
            let (head, done) = p.start(&env)?;
            heads.push((p.finite(), head));
            dones.push(done);
        }
        let stopped = Rc::new(Cell::new(false));
        {
            let (env, stopped) = (env.clone(), stopped.clone());
            tokio::task::spawn_local(async move {
                stop.notified().await;
                stopped.set(true);
                env.shutting.set(true);
                for t in env.tasks.borrow_mut().drain(..) {
                    t.abort();
                }
                for h in env.sources.borrow_mut().drain(..) {
                    h.wake();
                }
                // Every record read so far has been processed (this is one thread), and each
                // read's batches went out with it: the end markers follow them.
                for (finite, head) in &heads {
                    if !finite {
                        head.borrow_mut().end_of_input();
                    }
                }
                env.resume_all();
            });
        }
        let all = async {
            for d in dones {
                let _ = d.await;
            }
        };
        tokio::pin!(all);
        // Until the end, or a shutdown; then the drain is bounded.
        while !stopped.get() {
            tokio::select! {
                _ = &mut all => return Ok(()),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        if tokio::time::timeout(drain_timeout + Duration::from_secs(1), &mut all)
            .await
            .is_err()
        {
            tracing::warn!(worker = me, "pipelines did not drain in time at shutdown");
        }
        Ok(())
    }
}
