//! The workers' threads, a running topology and its shutdown.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use canter_rt::ShutdownHandle;
use tokio::sync::Notify;

use super::super::checkpoint::{CheckpointOptions, Dir, Restored};
use super::super::metrics::Metrics;
use super::super::RunOptions;
use super::ckpt::{self, Coord, WorkerCkpt};
use super::ckpt_group;
use super::ckpt_task;
use super::def::{PipelineDef, Prep};
use super::env::Env;
use super::link;
use super::wire;
use std::os::unix::net::UnixListener as StdUnixListener;

pub(super) struct ShutdownInner {
    /// Set before any worker is told: a worker that sees another's end of input after a
    /// shutdown sees the shutdown too (see [`Env::stop_requested`](super::env::Env)).
    pub(super) flag: Arc<AtomicBool>,
    /// The stop is not the end of the input ([`Shutdown::interrupt`]).
    pub(super) interrupted: Arc<AtomicBool>,
    pub(super) notifies: Vec<Arc<Notify>>,
    /// The TCP sources' servers: their accept loops stop, their connections are told.
    pub(super) servers: Vec<ShutdownHandle>,
    /// Stops the checkpoints.
    pub(super) checkpoints: Option<(Arc<AtomicBool>, Arc<Coord>)>,
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
        if let Some((stop, coord)) = &self.0.checkpoints {
            stop.store(true, Ordering::SeqCst);
            coord.wake_all();
        }
        for server in &self.0.servers {
            server.shutdown();
        }
        for n in &self.0.notifies {
            n.notify_one();
        }
    }

    /// Stops the topology as [`Shutdown::shutdown`] does, but not as the end of its input: final
    /// aggregations, `emit="final"` joins, open windows and end-of-input hooks emit nothing
    /// (what a stop by a signal leaves behind, as in Bytewax: only what came out before it).
    /// A topology that checkpoints keeps them in its checkpoint as on any shutdown.
    pub fn interrupt(&self) {
        self.0.interrupted.store(true, Ordering::SeqCst);
        self.shutdown();
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
    checkpointer: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
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
        if let Some((t, stop)) = self.checkpointer.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = t.join();
        }
        self.metrics.sample();
        result
    }
}

/// Counts each channel's writers for its readers; refuses a channel written and never read
/// (its records would vanish).
fn wire_channels(mut defs: Vec<Box<dyn PipelineDef>>) -> io::Result<Vec<Box<dyn PipelineDef>>> {
    let mut writers: std::collections::HashMap<u64, (usize, String)> = Default::default();
    for d in &defs {
        for id in d.writes() {
            let w = writers.entry(id).or_insert((0, d.name().to_owned()));
            w.0 += 1;
        }
    }
    let read: std::collections::HashSet<u64> = defs.iter().filter_map(|d| d.reads()).collect();
    if let Some((_, (_, name))) = writers.iter().find(|(id, _)| !read.contains(id)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pipeline {name}: it writes a channel no pipeline of the topology reads"),
        ));
    }
    for d in &mut defs {
        if let Some(id) = d.reads() {
            d.set_writers(writers.get(&id).map_or(0, |w| w.0));
        }
    }
    Ok(defs)
}

pub(crate) fn start(defs: Vec<Box<dyn PipelineDef>>, opts: RunOptions) -> io::Result<Running> {
    let workers = opts.workers.clamp(1, 64);
    let opts = RunOptions { workers, ..opts };
    if defs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no pipelines"));
    }
    let mut listeners = match &opts.group {
        Some(g) => group_listeners(g, workers)?,
        None => Vec::new(),
    };
    let resumes: Arc<Vec<Arc<Notify>>> =
        Arc::new((0..workers).map(|_| Arc::new(Notify::new())).collect());
    let restored = match &opts.checkpoint {
        Some(c) => restore(c),
        None => None,
    };
    let defs = wire_channels(defs)?;
    let mut preps = Vec::new();
    for (i, d) in defs.into_iter().enumerate() {
        preps.push(d.prepare(i, &opts, &resumes, restored.as_ref())?);
    }
    if opts.checkpoint.is_some() {
        if let Some(p) = preps.iter().find(|p| !p.state.1) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pipeline {}: its keyed state {:?} has no codec, and the topology \
                     checkpoints (KeyedState::checkpointed)",
                    p.name(),
                    p.state.0
                ),
            ));
        }
        // A checkpoint holds each state under its name: two states of one name would mix.
        let mut names: std::collections::HashMap<&str, (u64, &str)> = Default::default();
        for p in &preps {
            let (name, _, id) = &p.state;
            match names.insert(name, (*id, p.name())) {
                Some((other, by)) if other != *id => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "pipelines {by} and {}: two keyed states named {name:?}, and the \
                             topology checkpoints (each state needs a name of its own)",
                            p.name()
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
    let metrics = Arc::new(Metrics::new(preps.iter().map(|p| p.metrics()).collect()));
    let restored_epoch = restored.as_ref().map_or(0, |r| r.epoch);
    metrics
        .checkpoints
        .restored_epoch
        .store(restored_epoch, Ordering::Relaxed);
    let (coord, checkpointer) = match &opts.checkpoint {
        Some(c) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let streams = preps.iter().filter_map(|p| p.streams.clone()).collect();
            let coord = Arc::new(Coord::new(workers, streams, restored, tx));
            let stop = Arc::new(AtomicBool::new(false));
            // In a group, the first process's coordinator takes the checkpoints of all; the
            // others' relay to it over the group's checkpoint socket.
            let group = opts
                .group
                .as_ref()
                .map(|g| (g.process, g.processes, ckpt_group::socket_path(&g.dir)));
            let t =
                {
                    let (coord, c, metrics, stop) =
                        (coord.clone(), c.clone(), metrics.clone(), stop.clone());
                    let thread =
                        std::thread::Builder::new().name("canter-pipeline-checkpoints".into());
                    match group {
                        Some((process, _, path)) if process > 0 => thread.spawn(move || {
                            ckpt_group::follow(coord, path, process, rx, metrics, stop)
                        })?,
                        Some((_, processes, path)) => {
                            let peers: Box<dyn ckpt::Peers> = Box::new(
                                ckpt_group::Followers::bind(&path, processes, restored_epoch)?,
                            );
                            thread.spawn(move || {
                                ckpt::coordinate(coord, c, rx, metrics, stop, Some(peers))
                            })?
                        }
                        None => thread
                            .spawn(move || ckpt::coordinate(coord, c, rx, metrics, stop, None))?,
                    }
                };
            (Some(coord), Some((t, stop)))
        }
        None => (None, None),
    };
    let shutdown = Shutdown(Arc::new(ShutdownInner {
        flag: Arc::new(AtomicBool::new(false)),
        interrupted: Arc::new(AtomicBool::new(false)),
        notifies: (0..workers).map(|_| Arc::new(Notify::new())).collect(),
        servers: preps
            .iter()
            .filter_map(|p| p.server_shutdown.clone())
            .collect(),
        checkpoints: checkpointer
            .as_ref()
            .zip(coord.as_ref())
            .map(|((_, stop), coord)| (stop.clone(), coord.clone())),
    }));
    // The workers' threads and event loops are the runtime's, pinned as its servers' are.
    let config = canter_rt::Config::builder()
        .workers(workers)
        .pin_workers(opts.pin)
        .park_hooks(opts.hooks.as_ref().map(|h| h.park.clone()))
        .build()
        .map_err(io::Error::from)?;
    let addrs = preps
        .iter()
        .map(|p| (p.name().to_owned(), p.source_addr()))
        .collect();
    let mut threads = Vec::new();
    let base = opts.group.as_ref().map_or(0, |g| g.process * workers);
    for me in 0..workers {
        let preps = preps.clone();
        let opts = opts.clone();
        let resumes = resumes.clone();
        let stop = (
            shutdown.0.notifies[me].clone(),
            shutdown.0.flag.clone(),
            shutdown.0.interrupted.clone(),
        );
        let coord = coord.clone();
        let listener = (!listeners.is_empty()).then(|| listeners.remove(0));
        // Numbered across the group (for pinning: the processes' workers on their own CPUs).
        threads.push(super::super::spawn_hooked(
            base + me,
            &config,
            format!("canter-pipeline-{}", base + me),
            opts.hooks.clone(),
            move || worker(me, preps, opts, resumes, stop, coord, listener),
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
        checkpointer,
    })
}

/// The latest complete checkpoint in the directory, logged; none (with an error line) when the
/// directory cannot be read: the topology then starts empty and keeps trying to checkpoint.
fn restore(c: &CheckpointOptions) -> Option<Restored> {
    let latest = Dir::open(&c.dir, c.keep).and_then(|d| d.latest());
    match latest {
        Ok(Some(r)) => {
            for (path, why) in &r.skipped {
                tracing::warn!(file = %path.display(), why, "checkpoint file passed over");
            }
            tracing::info!(
                epoch = r.epoch, files = r.chain.len(), streams = r.positions.len(),
                dir = %c.dir.display(), "restoring the latest checkpoint"
            );
            Some(r)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::error!(
                dir = %c.dir.display(), error = %e,
                "the checkpoint directory cannot be read: starting without a checkpoint"
            );
            None
        }
    }
}

pub(super) async fn worker(
    me: usize,
    preps: Vec<Arc<Prep>>,
    opts: RunOptions,
    resumes: Arc<Vec<Arc<Notify>>>,
    (stop, stopping, interrupted): (Arc<Notify>, Arc<AtomicBool>, Arc<AtomicBool>),
    coord: Option<Arc<Coord>>,
    listener: Option<StdUnixListener>,
) -> io::Result<()> {
    let drain_timeout = opts.drain_timeout;
    {
        let ckpt = coord.clone().map(WorkerCkpt::new);
        let env = Rc::new(Env::new(
            me,
            opts,
            resumes.clone(),
            ckpt,
            (stopping, interrupted),
        ));
        let mut link_tasks = Vec::new();
        if let (Some(listener), Some(g)) = (listener, env.opts.group.clone()) {
            let inboxes: link::Inboxes = Rc::new(preps.iter().map(|p| p.wire_in.clone()).collect());
            tokio::task::spawn_local(link::serve_links(listener, env.clone(), inboxes));
            for (to, buf) in env.links.iter().enumerate() {
                if let Some(buf) = buf {
                    link_tasks.push((
                        buf.clone(),
                        tokio::task::spawn_local(link::write_link(
                            wire::socket_path(&g.dir, to),
                            to,
                            buf.clone(),
                            env.clone(),
                        )),
                    ));
                }
            }
        }
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
            heads.push((p.finite(), p.reads(), head));
            dones.push(done);
        }
        // The stores exist now and no task has run yet: the restored state goes in first.
        if let Some(r) = coord.as_ref().and_then(|c| c.restored.as_ref()) {
            for snap in env.snaps.borrow().iter() {
                let mut snap = snap.borrow_mut();
                let name = snap.name().to_owned();
                let (mut applied, mut bad) = (0, 0);
                for entries in r.entries(&name) {
                    let (a, b) = snap.restore(entries, env.gid, env.total);
                    applied += a;
                    bad += b;
                }
                tracing::debug!(worker = me, state = snap.name(), applied, "state restored");
                if bad > 0 {
                    tracing::warn!(
                        worker = me,
                        state = snap.name(),
                        bad,
                        "restored entries that did not decode were left out"
                    );
                }
            }
            if me == 0 {
                // A state of the checkpoint no pipeline holds now (renamed, or its pipeline
                // removed) is not restored: said, not ignored.
                let held: std::collections::BTreeSet<String> = env
                    .snaps
                    .borrow()
                    .iter()
                    .map(|s| s.borrow().name().to_owned())
                    .collect();
                for name in r.state_names() {
                    if !held.contains(name) {
                        tracing::warn!(
                            state = name,
                            "the checkpoint holds a state no pipeline of this topology has: left \
                             out of the restore"
                        );
                    }
                }
            }
            if r.workers as usize != env.total && me == 0 {
                tracing::warn!(
                    was = r.workers,
                    now = env.total,
                    "restored a checkpoint of another number of workers: keys move to their new \
                     owners, but a receiver's dedupe by worker may let repeats through"
                );
            }
        }
        if env.ckpt.is_some() {
            let heads = heads.iter().map(|(_, r, h)| (*r, h.clone())).collect();
            tokio::task::spawn_local(ckpt_task::worker_task(env.clone(), heads));
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
                for (finite, _, head) in &heads {
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
        let mut ended = false;
        while !stopped.get() {
            tokio::select! {
                _ = &mut all => {
                    ended = true;
                    break;
                }
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        if !ended
            && tokio::time::timeout(drain_timeout + Duration::from_secs(1), &mut all)
                .await
                .is_err()
        {
            tracing::warn!(worker = me, "pipelines did not drain in time at shutdown");
        }
        if ended {
            ckpt_task::end_in_checkpoint(&env, &stopped).await;
        }
        // The links deliver what they hold (the other processes wait for this worker's ends).
        for (buf, _) in &link_tasks {
            let mut b = buf.borrow_mut();
            b.closing = true;
            b.wake.notify_one();
        }
        let links = async {
            for (_, t) in link_tasks {
                let _ = t.await;
            }
        };
        if tokio::time::timeout(drain_timeout, links).await.is_err() {
            tracing::warn!(
                worker = me,
                "group links did not deliver in time at shutdown"
            );
        }
        Ok(())
    }
}

/// The sockets of this process's workers in a group, after checking the group.
fn group_listeners(g: &super::wire::Group, workers: usize) -> io::Result<Vec<StdUnixListener>> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if g.processes == 0 || g.process >= g.processes {
        return Err(invalid(format!(
            "group: process {} of {}",
            g.process, g.processes
        )));
    }
    if g.processes * workers > 64 {
        return Err(invalid(format!(
            "group: {} processes of {workers} workers: at most 64 workers in all",
            g.processes
        )));
    }
    (0..workers)
        .map(|me| {
            let path = wire::socket_path(&g.dir, g.process * workers + me);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let l = StdUnixListener::bind(&path).map_err(|e| {
                io::Error::new(e.kind(), format!("group socket {}: {e}", path.display()))
            })?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .collect()
}
