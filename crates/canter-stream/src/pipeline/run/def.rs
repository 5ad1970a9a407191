//! A pipeline as defined, prepared (its source's server bound, its inboxes made) and started on each worker; the drain of what other workers send.

use super::clock;
use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Display;
use std::hash::Hash;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use canter_rt::{ServerWorker, ShutdownHandle};
use tokio::sync::Notify;

use super::super::metrics::PipeMetrics;
use super::super::state::{is_local, Stateful};
use super::super::step::Step;
use super::super::{RunOptions, Sink, Source};

use super::super::checkpoint::Restored;
use super::barrier::{Batch, Gate, Rid};
use super::ckpt::Streams;
use super::ckpt_task;
use super::env::{Env, Inbox, Shared, WireIn};
use super::input::Input;
use super::lock;
use super::process::{Head, Process, TailInst, TailOps};
use super::sink::{file_sink, tcp_sink, Forward, SinkOut};
use super::sink_buf::SinkBuf;
use super::source::{file_source, generate_source, serve_source};
use super::wait::{Gauge, RateLog, Waiter};
use super::wire::{self, Wire};

/// A pipeline as built, not yet bound.
pub(crate) trait PipelineDef: Send {
    fn name(&self) -> &str;
    /// Binds the listeners and makes the inboxes of the topology's pipeline `index`.
    fn prepare(
        self: Box<Self>,
        index: usize,
        opts: &RunOptions,
        resumes: &Arc<Vec<Arc<Notify>>>,
        restored: Option<&Restored>,
    ) -> io::Result<Arc<Prep>>;
    /// The channels its sink writes.
    fn writes(&self) -> Vec<u64>;
    /// The channel it reads, if it reads one.
    fn reads(&self) -> Option<u64>;
    /// Sets how many pipelines write the channel it reads.
    fn set_writers(&mut self, n: usize);
    /// Starts the pipeline's tasks on this worker; returns its head and the task that ends
    /// when the pipeline has ended here.
    fn start(
        &self,
        prep: &Prep,
        env: &Rc<Env>,
    ) -> io::Result<(Rc<RefCell<dyn Process>>, tokio::task::JoinHandle<()>)>;
}

pub(crate) struct Def<T, D, C: Step<T>, KF, K, U, P, O> {
    pub(crate) name: String,
    pub(crate) source: Source,
    pub(crate) decode: D,
    pub(crate) chain: C,
    pub(crate) key: KF,
    pub(crate) wire: Option<Arc<dyn Wire<K, <C as Step<T>>::Out>>>,
    pub(crate) step: U,
    pub(crate) post: P,
    pub(crate) sink: Sink<O>,
    pub(crate) _t: PhantomData<fn() -> (T, K)>,
}

/// A pipeline bound (listeners open) and ready to start on each worker.
pub(crate) struct Prep {
    /// The pipeline's place in its topology (the same in every process of a group).
    pub(super) index: u16,
    pub(super) name: String,
    pub(super) def: Mutex<Box<dyn PipelineDef>>,
    pub(super) source: Source,
    pub(super) metrics: Arc<PipeMetrics>,
    pub(super) shared: Arc<dyn Any + Send + Sync>,
    /// The same inboxes, for the links from the other processes of a group.
    pub(super) wire_in: Arc<dyn WireIn + Send + Sync>,
    /// The source's server, for a TCP source: one share per worker, taken by the worker.
    pub(super) servers: Mutex<Vec<Option<ServerWorker>>>,
    /// Stops the source's server (its accept loops, then its connections).
    pub(super) server_shutdown: Option<ShutdownHandle>,
    pub(super) addr: Option<SocketAddr>,
    pub(super) file: Option<std::fs::File>,
    pub(super) resumes: Arc<Vec<Arc<Notify>>>,
    /// The keyed state's name, and whether it can be checkpointed.
    /// Its keyed state's name, whether it has a codec, and its identity.
    pub(super) state: (String, bool, u64),
    /// The source's streams (their positions), when the topology checkpoints.
    pub(super) streams: Option<Arc<Streams>>,
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

    fn writes(&self) -> Vec<u64> {
        self.sink.channels()
    }

    fn reads(&self) -> Option<u64> {
        match self.source {
            Source::Channel { id, .. } => Some(id),
            _ => None,
        }
    }

    fn set_writers(&mut self, n: usize) {
        if let Source::Channel { writers, .. } = &mut self.source {
            *writers = n;
        }
    }

    fn prepare(
        self: Box<Self>,
        index: usize,
        opts: &RunOptions,
        resumes: &Arc<Vec<Arc<Notify>>>,
        restored: Option<&Restored>,
    ) -> io::Result<Arc<Prep>> {
        let workers = opts.workers;
        if let Source::File { path, .. } = &self.source {
            // Read by the first process: a file it cannot open fails the start, naming it.
            if opts.group.as_ref().is_none_or(|g| g.process == 0) {
                if let Err(e) = std::fs::File::open(path) {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("pipeline {}: input file {}: {e}", self.name, path.display()),
                    ));
                }
            }
        }
        if opts.group.is_some() && !is_local::<K>() && self.wire.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pipeline {}: its records cross processes (RunOptions::group) and it has no \
                     Wire to carry them (Keyed::wire)",
                    self.name
                ),
            ));
        }
        let mut names = Vec::new();
        self.chain.names(&mut names);
        let metrics = Arc::new(PipeMetrics::new(&self.name, names, workers));
        let mut servers = Vec::new();
        let mut server_shutdown = None;
        let mut bound = None;
        if let Source::Tcp { addr, .. } = &self.source {
            // The source is a server of the runtime's, on the pipeline's workers: one
            // SO_REUSEPORT listener each, its accept loop, drain and counters. The pipeline
            // bounds its source connections itself (one over is closed at once, with a
            // warning), so the server's own bound (which leaves them in the backlog) is off. A
            // port another process listens on is refused (the runtime checks), except in a
            // group, whose processes share it: whoever starts them checks it first.
            let config = canter_rt::Config::builder()
                .addr(*addr)
                .reuse_port(opts.group.is_some())
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
        if let (
            Sink::File {
                lines: true, path, ..
            },
            Some(_),
        ) = (&self.sink, &opts.checkpoint)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pipeline {}: the file sink {} writes lines, which have no room for the \
                     sequence header checkpoints put on each result",
                    self.name,
                    path.display()
                ),
            ));
        }
        let file = match &self.sink {
            Sink::File { path, .. } => Some(
                open_sink_file(path, restored.is_none() && opts.group.is_none()).map_err(|e| {
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
                    closed: AtomicBool::new(false),
                })
                .collect(),
            wire: self.wire.clone(),
        });
        let state = self.step.state();
        let state = (state.name.to_string(), state.codec.is_some(), state.id);
        let streams = opts
            .checkpoint
            .as_ref()
            .map(|_| Arc::new(Streams::new(&self.name, restored)));
        Ok(Arc::new(Prep {
            index: u16::try_from(index)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many pipelines"))?,
            state,
            streams,
            name: self.name.clone(),
            source: self.source.clone(),
            metrics,
            wire_in: shared.clone(),
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
        let seq = env.ckpt.as_ref().map(|_| me as u32);
        let sink = match sink {
            Sink::Tcp { addr, encode } => {
                let buf = Rc::new(RefCell::new(SinkBuf::new(
                    env.opts.sink_high_water,
                    metrics.clone(),
                    me,
                )));
                buf.borrow_mut().sequenced = seq.is_some();
                env.sinks.borrow_mut().push(buf.clone());
                tokio::task::spawn_local(tcp_sink(addr, buf.clone(), env.clone(), flushed.clone()));
                sink_buf = Some(buf.clone());
                SinkOut::Buf {
                    encode,
                    buf,
                    count: 0,
                    seq,
                }
            }
            Sink::File { encode, lines, .. } => {
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
                buf.borrow_mut().lines = lines;
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
                    seq,
                }
            }
            Sink::Collect(to) => SinkOut::Collect {
                local: Vec::new(),
                segs: VecDeque::new(),
                to,
                count: 0,
            },
            Sink::Discard => SinkOut::Discard { count: 0 },
            Sink::Channel(c) => SinkOut::Channel {
                out: vec![Forward::new(c.id, c.clone)],
                pred: None,
                env: env.clone(),
                count: 0,
            },
            Sink::Branch { pred, yes, no } => SinkOut::Channel {
                out: vec![
                    Forward::new(yes.id, yes.clone),
                    Forward::new(no.id, no.clone),
                ],
                pred: Some(pred),
                env: env.clone(),
                count: 0,
            },
        };
        let timer_wake = Rc::new(Notify::new());
        let tail = Rc::new(RefCell::new(TailInst {
            store: env.store(&step.state()),
            step,
            post,
            sink,
            metrics: metrics.clone(),
            me,
            last: (0, Rid::default()),
            timers: Default::default(),
            timer_wake: timer_wake.clone(),
            _x: PhantomData,
        }));
        for (w, inbox) in shared.inboxes.iter().enumerate() {
            if w != me {
                env.gauges.borrow_mut().push(inbox.gauge.clone());
            }
        }
        let head = Rc::new(RefCell::new(Head {
            decode,
            chain,
            key,
            tail: tail.clone(),
            out: (0..env.total).map(|_| Vec::new()).collect(),
            shared: shared.clone(),
            me,
            gid: env.gid,
            base: env.base,
            total: env.total,
            pipe: prep.index,
            links: env.links.clone(),
            stopping: env.stopping.clone(),
            log_wire: RateLog::default(),
            read_ns: 0,
            records: 0,
            rejected: 0,
            frame_errors: 0,
            log: RateLog::default(),
            metrics: metrics.clone(),
            counts: Vec::new(),
            origin: Rid::default(),
            ended: false,
            writers_left: match &prep.source {
                Source::Channel { writers, .. } => *writers,
                _ => 0,
            },
            _t: PhantomData,
        }));
        if let Source::Channel { id, .. } = &prep.source {
            let input: Rc<RefCell<dyn Input<T>>> = head.clone();
            env.read_channel(*id, input);
        }
        let head: Rc<RefCell<dyn Process>> = head;
        match &prep.source {
            Source::Tcp { framing, .. } => {
                let server = lock(&prep.servers)
                    .get_mut(me)
                    .and_then(Option::take)
                    .ok_or_else(|| io::Error::other("no listener for this worker"))?;
                tokio::task::spawn_local(serve_source(
                    server,
                    head.clone(),
                    env.clone(),
                    *framing,
                    prep.streams.clone(),
                ));
            }
            Source::File { path, framing } if env.gid == 0 => {
                tokio::task::spawn_local(file_source(
                    path.clone(),
                    *framing,
                    head.clone(),
                    env.clone(),
                    prep.streams.clone(),
                ));
            }
            Source::Generate { count, make } if env.gid == 0 => {
                tokio::task::spawn_local(generate_source(
                    *count,
                    make.clone(),
                    head.clone(),
                    env.clone(),
                    prep.streams.clone(),
                ));
            }
            _ => {}
        }
        // Ends from: the one worker reading a finite source; every worker reading a TCP
        // source or a channel (once every writer of the channel has ended there).
        let expected = match &prep.source {
            Source::Channel { .. } => env.total,
            s if s.finite() => 1,
            _ => env.total,
        };
        let writes = self.sink.channels();
        let done = tokio::task::spawn_local(drain(
            shared,
            tail,
            timer_wake,
            env.clone(),
            Wiring { expected, writes },
            prep.resumes.clone(),
            sink_buf.map(|b| (b, flushed)),
        ));
        Ok((head, done))
    }
}

impl Prep {
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn metrics(&self) -> Arc<PipeMetrics> {
        self.metrics.clone()
    }

    pub(super) fn source_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    pub(super) fn finite(&self) -> bool {
        self.source.finite()
    }

    /// The channel this pipeline reads, if it reads one.
    pub(super) fn reads(&self) -> Option<u64> {
        match self.source {
            Source::Channel { id, .. } => Some(id),
            _ => None,
        }
    }

    pub(super) fn start(
        &self,
        env: &Rc<Env>,
    ) -> io::Result<(Rc<RefCell<dyn Process>>, tokio::task::JoinHandle<()>)> {
        lock(&self.def).start(self, env)
    }
}

/// Where a drain's pipeline sits in the topology.
pub(super) struct Wiring {
    /// The end markers that end its input.
    expected: usize,
    /// The channels its sink writes.
    writes: Vec<u64>,
}

/// Runs what other workers sent this one for the pipeline, until every source has ended; then
/// flushes windows and the sink. With checkpoints, the inbox's batches pass its [`Gate`]:
/// those behind a barrier wait for this worker's snapshot.
pub(super) async fn drain<K: 'static, X: 'static, Tl: TailOps<K, X>>(
    shared: Arc<Shared<K, X>>,
    tail: Rc<RefCell<Tl>>,
    timer_wake: Rc<Notify>,
    env: Rc<Env>,
    wiring: Wiring,
    resumes: Arc<Vec<Arc<Notify>>>,
    sink: Option<(Rc<RefCell<SinkBuf>>, Rc<Notify>)>,
) {
    let Wiring { expected, writes } = wiring;
    let inbox = &shared.inboxes[env.me];
    let low = env.opts.inbox_capacity / 4;
    let wake = Rc::new(Notify::new());
    let mut gate: Gate<Batch<K, X>> = Gate::default();
    if let Some(ck) = &env.ckpt {
        ck.join(wake.clone(), &writes);
    }
    let mut ends = 0;
    let mut wired = Vec::new();
    let mut log = RateLog::default();
    if env.ckpt.is_some() {
        // The state restored from a checkpoint (in before any task ran) asks for its
        // wake-ups again.
        tail.borrow_mut().rearm();
    }
    loop {
        if let Some(ck) = &env.ckpt {
            if let Some(epoch) = ck.pending() {
                if gate.reported < epoch && gate.aligned(epoch, env.gid, env.total) {
                    gate.reported = epoch;
                    ckpt_task::aligned(&env, &writes);
                }
            }
            // The snapshot is taken (or the worker is stopping): what waited runs first.
            if gate.holding() && (ck.done.get() >= gate.epoch || env.shutting.get()) {
                let held = gate.release();
                let mut q = lock(&inbox.queue);
                q.splice(0..0, held);
            }
        }
        if env.sinks_full() {
            env.wait(Waiter::Task(wake.clone()));
            wake.notified().await;
            continue;
        }
        // Keys' wake-ups that are due run first (steps with timers only); not between this
        // inbox's alignment and the worker's snapshot, whose state and output they would split.
        let frozen = env
            .ckpt
            .as_ref()
            .and_then(|c| c.pending())
            .is_some_and(|e| gate.reported >= e);
        let next = if frozen {
            None
        } else {
            tail.borrow().next_wake()
        };
        if let Some(at) = next {
            let now = super::now_ns();
            if at <= now {
                let mut t = tail.borrow_mut();
                t.wake(now);
                t.end_turn();
            }
        }
        let batches = std::mem::take(&mut *lock(&inbox.queue));
        if batches.is_empty() {
            let sleep = (!frozen)
                .then(|| tail.borrow().next_wake())
                .flatten()
                .map(|at| std::time::Duration::from_nanos(at.saturating_sub(super::now_ns())));
            tokio::select! {
                () = inbox.notify.notified() => {}
                () = wake.notified() => {}
                () = timer_wake.notified() => {}
                () = async {
                    match sleep {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            continue;
        }
        let mut n = 0;
        {
            let mut t = tail.borrow_mut();
            for b in batches {
                let b = if env.ckpt.is_some() {
                    match gate.admit(b) {
                        Some(b) => b,
                        None => continue,
                    }
                } else {
                    b
                };
                match b {
                    Batch::Data(_, v) => {
                        n += v.len();
                        for (k, x, ns, origin) in v {
                            t.process(k, x, ns, origin);
                        }
                    }
                    Batch::End(_) => ends += 1,
                    Batch::Barrier(..) => {}
                    Batch::Wire(from, records, bytes) => {
                        n += records;
                        unwire(
                            &shared, &mut *t, from, records, &bytes, &mut wired, &mut log,
                        );
                    }
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
    inbox
        .closed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    {
        let mut t = tail.borrow_mut();
        // A shutdown of a topology that checkpoints is not the end of its input: what the
        // steps hold (open windows, final aggregations) stays in the checkpoint and goes on
        // after a restart, instead of coming out now and again then. Asked of the whole
        // topology, not this worker's notice: the ends that made this drain stop may come
        // from a worker that saw the shutdown before this one did.
        // An interrupted topology (a stop by a signal) was not at the end of its input either,
        // checkpoints or not: its finals would be counts of part of it.
        let interrupted = env.interrupted.load(std::sync::atomic::Ordering::SeqCst);
        if !(interrupted || env.ckpt.is_some() && env.stop_requested()) {
            t.finish();
        }
        t.end_turn();
        t.close();
    }
    // After what the end put out went to the channels' readers: a barrier of theirs that
    // waited for this drain follows it.
    ckpt_task::leave(
        &env,
        env.ckpt
            .as_ref()
            .and_then(|c| c.pending())
            .is_some_and(|e| gate.reported >= e),
        &writes,
    );
    if let Some((buf, flushed)) = sink {
        buf.borrow_mut().closing_since = Some(clock());
        buf.borrow().wake_driver();
        flushed.notified().await;
    }
}

/// Opens a file sink's file for appending; `fresh` (a run that resumes no checkpoint) starts a
/// regular file afresh, as Bytewax's `FileSink` does, so that a second run does not double
/// the output. `/dev/stdout` and `/dev/stderr` are the process's own descriptors (a duplicate
/// of 1 or 2, which shares their file offset: opened by name, a redirected file would get an
/// offset of its own, and the program's other writes would overwrite the records), never cut.
fn open_sink_file(path: &std::path::Path, fresh: bool) -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    if path == std::path::Path::new("/dev/stdout") {
        return Ok(io::stdout().as_fd().try_clone_to_owned()?.into());
    }
    if path == std::path::Path::new("/dev/stderr") {
        return Ok(io::stderr().as_fd().try_clone_to_owned()?.into());
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if fresh && file.metadata()?.is_file() {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Runs a batch that came from worker `from` of another process.
fn unwire<K: 'static, X: 'static, Tl: TailOps<K, X>>(
    shared: &Shared<K, X>,
    t: &mut Tl,
    from: usize,
    records: usize,
    bytes: &[u8],
    items: &mut Vec<(K, X)>,
    log: &mut RateLog,
) {
    let Some(wire) = &shared.wire else {
        return;
    };
    let decoded = match wire::split_body(bytes, records) {
        Some((times, batch)) => {
            items.clear();
            match wire.decode(batch, items) {
                Ok(()) if items.len() == records => {
                    for ((k, x), ns) in items.drain(..).zip(times) {
                        t.process(k, x, ns, Rid::default());
                    }
                    Ok(())
                }
                Ok(()) => Err(format!("{} items for {records}", items.len())),
                Err(e) => Err(e),
            }
        }
        None => Err("shorter than its read times".to_owned()),
    };
    if let Err(e) = decoded {
        items.clear();
        if let Some(held) = log.allow() {
            tracing::error!(
                from, records, error = %e, held,
                "a batch from another process did not decode; its records are lost"
            );
        }
    }
}
