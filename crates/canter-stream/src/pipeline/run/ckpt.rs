//! Checkpoints while the topology runs: each worker's part (barriers out, alignment, the
//! snapshot of the keys changed since the last one and of its source streams' positions) and
//! the coordinator thread that starts each checkpoint, gathers the parts, writes the file and
//! acknowledges the senders.
//!
//! A checkpoint stops a worker's own sources from the moment it sends its barriers until its
//! inboxes are aligned (usually well under a millisecond: the other workers got the same
//! trigger); the snapshot itself copies only the changed keys' states. Writing the file, its
//! checksum and sync, pruning and compaction happen on the coordinator's thread.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::super::checkpoint::{CheckpointOptions, Dir, Entries, Restored, Snapshot};
use super::super::metrics::Metrics;
use super::lock;
use crate::failpoint::Failpoint;

/// Sends a pipeline head's barriers for a checkpoint (on this worker).
pub(super) type SendBarrier = Rc<dyn Fn(u64)>;

/// Streams a source keeps positions for (a hello for one more is refused).
const MAX_STREAMS: usize = 65_536;

/// A pipeline's source streams, across workers: where each stands, whether a connection
/// holds it, and what the last durable checkpoint acknowledged.
pub(crate) struct Streams {
    pub(super) name: Arc<str>,
    /// stream → (position, attached to a connection).
    table: Mutex<HashMap<u64, (u64, bool)>>,
    pub(super) acked: Mutex<HashMap<u64, u64>>,
}

impl Streams {
    pub(super) fn new(name: &str, restored: Option<&Restored>) -> Streams {
        let mut table = HashMap::new();
        if let Some(r) = restored {
            for ((p, stream), pos) in &r.positions {
                if p == name {
                    table.insert(*stream, (*pos, false));
                }
            }
        }
        Streams {
            name: name.into(),
            acked: Mutex::new(table.iter().map(|(s, (p, _))| (*s, *p)).collect()),
            table: Mutex::new(table),
        }
    }

    /// Gives `stream` to a new connection: the position to resume from, or why not now.
    pub(super) fn attach(&self, stream: u64, coord: &Coord) -> Result<u64, &'static str> {
        if coord.in_progress.load(Ordering::SeqCst) {
            return Err("a checkpoint is being taken");
        }
        let mut t = lock(&self.table);
        // Every stream's position stays in every checkpoint: their number is bounded.
        if t.len() >= MAX_STREAMS && !t.contains_key(&stream) {
            return Err("the source has as many streams as it keeps (65,536)");
        }
        let e = t.entry(stream).or_insert((0, false));
        if e.1 {
            return Err("the stream's previous connection is still open");
        }
        e.1 = true;
        Ok(e.0)
    }

    /// The stream's connection closed at `pos`.
    pub(super) fn detach(&self, stream: u64, pos: u64) {
        lock(&self.table).insert(stream, (pos, false));
    }

    /// The stream's position in the last durable checkpoint.
    pub(super) fn acked(&self, stream: u64) -> u64 {
        lock(&self.acked).get(&stream).copied().unwrap_or(0)
    }

    /// A restored stream's position (for a file source).
    pub(super) fn position(&self, stream: u64) -> u64 {
        lock(&self.table).get(&stream).map_or(0, |e| e.0)
    }
}

/// What the workers and the coordinator share.
pub(crate) struct Coord {
    pub(super) workers: usize,
    /// The checkpoint each worker is asked for.
    pub(super) trigger: Vec<AtomicU64>,
    /// The last checkpoint made durable, per worker (its sources then send acknowledgements).
    pub(super) acks: Vec<AtomicU64>,
    /// Wakes each worker's checkpoint task.
    pub(super) wakes: Vec<Arc<Notify>>,
    /// From a checkpoint's trigger until every part came: streams are not attached meanwhile.
    pub(super) in_progress: AtomicBool,
    parts: Mutex<Sender<Part>>,
    pub(super) streams: Vec<Arc<Streams>>,
    pub(super) restored: Option<Restored>,
}

/// The other processes of a group, as the first process's coordinator sees them (their
/// coordinators, over the group's checkpoint socket).
pub(super) trait Peers: Send {
    /// How many processes beside this one.
    fn count(&self) -> usize;
    /// Takes the connections that came; whether every process is connected.
    fn ready(&mut self) -> bool;
    /// Tells every process to start checkpoint `epoch`.
    fn trigger(&mut self, epoch: u64);
    /// Waits (until `deadline`, or `stop`) for every other process's part of checkpoint
    /// `epoch`: their positions (merged), their states added to `pending` (a late part's
    /// too), and whether every process answered with every worker's part.
    fn collect(
        &mut self,
        epoch: u64,
        deadline: Instant,
        stop: &AtomicBool,
        pending: &mut BTreeMap<String, Entries>,
    ) -> (BTreeMap<(String, u64), u64>, bool);
    /// Tells every process that checkpoint `epoch` is durable, with the streams' positions.
    fn durable(&mut self, epoch: u64, positions: &BTreeMap<(String, u64), u64>);
}

/// One worker's part of a checkpoint (or, in a group, one process's).
pub(super) struct Part {
    pub(super) epoch: u64,
    pub(super) positions: Vec<(Arc<str>, u64, u64)>,
    pub(super) states: Vec<(String, Entries)>,
    /// A process's part: whether every worker of it answered (a worker's: true).
    pub(super) complete: bool,
}

impl Coord {
    pub(super) fn new(
        workers: usize,
        streams: Vec<Arc<Streams>>,
        restored: Option<Restored>,
        parts: Sender<Part>,
    ) -> Coord {
        Coord {
            workers,
            trigger: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            acks: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            wakes: (0..workers).map(|_| Arc::new(Notify::new())).collect(),
            in_progress: AtomicBool::new(false),
            parts: Mutex::new(parts),
            streams,
            restored,
        }
    }

    /// Wakes every worker's checkpoint task (at shutdown, so that it ends).
    pub(super) fn wake_all(&self) {
        for w in &self.wakes {
            w.notify_one();
        }
    }
}

/// One worker's checkpoint state.
pub(crate) struct WorkerCkpt {
    pub(super) coord: Arc<Coord>,
    pub(super) parts: Sender<Part>,
    /// The checkpoint in progress here (or the last one).
    pub(super) epoch: Cell<u64>,
    /// The last checkpoint this worker took its snapshot for.
    pub(super) done: Cell<u64>,
    /// Inboxes not yet aligned for `epoch`.
    pub(super) waiting: Cell<usize>,
    /// Inboxes (pipelines' drains) still running here.
    pub(super) active: Cell<usize>,
    /// From the barriers out until the snapshot: this worker's sources wait.
    pub(super) aligning: Cell<bool>,
    drains: RefCell<Vec<Rc<Notify>>>,
    /// (pipeline, stream) → (position, attached here): the streams read on this worker.
    pub(super) positions: RefCell<HashMap<(Arc<str>, u64), (u64, bool)>>,
    /// The channels of the topology as this worker's checkpoints see them.
    pub(super) channels: RefCell<ChannelBarriers>,
}

/// A pipeline that reads a channel has no source of its own to send its barriers: on each
/// worker they go out once every pipeline writing the channel there is aligned (its drain has
/// run everything from before the checkpoint, and what that wrote went to the readers) or has
/// ended. Until then those writers' output still belongs before the checkpoint; after it, they
/// are held until the snapshot.
#[derive(Default)]
pub(crate) struct ChannelBarriers {
    /// channel → its writers' drains still running on this worker.
    live: HashMap<u64, usize>,
    /// channel → its writers not yet aligned for the checkpoint in progress (a channel leaves
    /// the map when its readers' barriers have gone out).
    left: HashMap<u64, usize>,
    /// channel → the heads of the pipelines reading it on this worker.
    pub(super) readers: HashMap<u64, Vec<SendBarrier>>,
}

impl ChannelBarriers {
    /// A checkpoint starts: every channel waits for its live writers (the readers of a
    /// channel with none left, returned, send their barriers now).
    pub(super) fn start(&mut self) -> Vec<SendBarrier> {
        self.left = self
            .readers
            .keys()
            .map(|id| (*id, self.live.get(id).copied().unwrap_or(0)))
            .collect();
        self.ready()
    }

    /// A writer of `channels` is aligned (or ended, `gone`): the readers whose barriers may go
    /// out now.
    pub(super) fn writer_done(
        &mut self,
        channels: &[u64],
        pending: bool,
        gone: bool,
    ) -> Vec<SendBarrier> {
        for id in channels {
            if gone {
                if let Some(n) = self.live.get_mut(id) {
                    *n = n.saturating_sub(1);
                }
            }
            if pending {
                if let Some(n) = self.left.get_mut(id) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        self.ready()
    }

    fn ready(&mut self) -> Vec<SendBarrier> {
        let done: Vec<u64> = self
            .left
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(id, _)| *id)
            .collect();
        let mut heads = Vec::new();
        for id in done {
            self.left.remove(&id);
            heads.extend(self.readers.get(&id).into_iter().flatten().cloned());
        }
        heads
    }
}

impl WorkerCkpt {
    pub(super) fn new(coord: Arc<Coord>) -> WorkerCkpt {
        let parts = lock(&coord.parts).clone();
        WorkerCkpt {
            coord,
            parts,
            epoch: Cell::new(0),
            done: Cell::new(0),
            waiting: Cell::new(0),
            active: Cell::new(0),
            aligning: Cell::new(false),
            drains: RefCell::new(Vec::new()),
            positions: RefCell::new(HashMap::new()),
            channels: RefCell::new(ChannelBarriers::default()),
        }
    }

    /// Whether a checkpoint is in progress here and not yet snapshotted.
    pub(super) fn pending(&self) -> Option<u64> {
        let e = self.epoch.get();
        (e > self.done.get()).then_some(e)
    }

    /// A drain starts: it takes part in alignment (and its pipeline writes `channels`).
    pub(super) fn join(&self, wake: Rc<Notify>, channels: &[u64]) {
        self.active.set(self.active.get() + 1);
        self.drains.borrow_mut().push(wake);
        let mut c = self.channels.borrow_mut();
        for id in channels {
            *c.live.entry(*id).or_insert(0) += 1;
        }
    }

    pub(super) fn wake_drains(&self) {
        for d in self.drains.borrow().iter() {
            d.notify_one();
        }
    }

    /// Records where a stream read here stands.
    pub(super) fn position(&self, pipeline: &Arc<str>, stream: u64, pos: u64, attached: bool) {
        self.positions
            .borrow_mut()
            .insert((pipeline.clone(), stream), (pos, attached));
    }
}

/// The coordinator: a checkpoint every interval, until `stop`. In a group, this is the first
/// process's, and `followers` the other processes' coordinators: every checkpoint waits for
/// all of them, and holds all their workers' states.
pub(super) fn coordinate(
    coord: Arc<Coord>,
    opts: CheckpointOptions,
    parts: Receiver<Part>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    mut followers: Option<Box<dyn Peers>>,
) {
    let m = &metrics.checkpoints;
    let (mut epoch, mut written, mut positions) = match &coord.restored {
        Some(r) => (r.epoch, Some(r.epoch), r.positions.clone()),
        None => (0, None, BTreeMap::new()),
    };
    let mut dir: Option<Dir> = None;
    // Changes of checkpoints that could not be written: carried by the next one.
    let mut pending: BTreeMap<String, Entries> = BTreeMap::new();
    let (mut since_full, mut full_bytes, mut deltas) = (0u64, 0u64, 0u32);
    let mut last_error_log: Option<Instant> = None;
    let mut failpoint = Failpoint::from_env();
    let mut next = Instant::now() + opts.interval;
    'run: loop {
        loop {
            if stop.load(Ordering::SeqCst) {
                break 'run;
            }
            if Instant::now() >= next {
                break;
            }
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
        }
        next += opts.interval;
        if next < Instant::now() {
            next = Instant::now() + opts.interval;
        }
        if let Some(f) = &mut followers {
            if !f.ready() {
                continue;
            }
        }
        epoch += 1;
        let started = Instant::now();
        if let Some(f) = &mut followers {
            f.trigger(epoch);
        }
        let (mut got, mut complete) = coord.gather(epoch, &parts, &stop, &mut pending);
        if let Some(f) = &mut followers {
            let (theirs, all) = f.collect(
                epoch,
                started + Duration::from_secs(10),
                &stop,
                &mut pending,
            );
            for (k, pos) in theirs {
                let at = got.entry(k).or_insert(0);
                *at = (*at).max(pos);
            }
            complete &= all;
        }
        let align_us = started.elapsed().as_micros() as u64;
        if !complete {
            // The workers that answered cleared their lists of changed keys: their changes
            // (in `pending`) go with the next checkpoint.
            if !stop.load(Ordering::SeqCst) {
                m.abandoned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(epoch, "checkpoint abandoned: not every worker answered");
            }
            continue;
        }
        for (k, pos) in got {
            let at = positions.entry(k).or_insert(0);
            *at = (*at).max(pos);
        }
        failpoint.pass("checkpoint-parts");
        let snap = Snapshot {
            epoch,
            base: written,
            workers: (coord.workers * followers.as_ref().map_or(1, |f| f.count() + 1)) as u32,
            positions: positions.clone(),
            states: std::mem::take(&mut pending),
        };
        let keys: u64 = snap.states.values().map(|e| e.count).sum();
        let write_started = Instant::now();
        if dir.is_none() {
            dir = Dir::open(&opts.dir, opts.keep).ok();
        }
        let result = match &dir {
            Some(d) => d.write_with(&snap, &mut || failpoint.pass("checkpoint-write")),
            None => Dir::open(&opts.dir, opts.keep).map(|_| 0),
        };
        match result {
            Ok(bytes) => {
                written = Some(epoch);
                m.completed.fetch_add(1, Ordering::Relaxed);
                m.last_epoch.store(epoch, Ordering::Relaxed);
                m.last_keys.store(keys, Ordering::Relaxed);
                m.last_bytes.store(bytes, Ordering::Relaxed);
                m.last_align_us.store(align_us, Ordering::Relaxed);
                m.last_write_us.store(
                    write_started.elapsed().as_micros() as u64,
                    Ordering::Relaxed,
                );
                coord.durable(epoch, &positions);
                if let Some(f) = &mut followers {
                    f.durable(epoch, &positions);
                }
                if snap.base.is_none() {
                    full_bytes = bytes;
                    (since_full, deltas) = (0, 0);
                } else {
                    since_full += bytes;
                    deltas += 1;
                }
                if let Some(d) = &dir {
                    // Compact once the deltas outweigh the full file they build on (each
                    // byte is then rewritten a bounded number of times), or are many.
                    if since_full > full_bytes.max(1 << 20) || deltas >= 256 {
                        match d.compact(epoch) {
                            Ok(b) => {
                                full_bytes = b;
                                (since_full, deltas) = (0, 0);
                            }
                            Err(e) => {
                                tracing::warn!(epoch, error = %e, "checkpoint compaction failed")
                            }
                        }
                    }
                    if let Err(e) = d.prune() {
                        tracing::warn!(error = %e, "old checkpoints could not be deleted");
                    }
                }
            }
            Err(e) => {
                m.failed.fetch_add(1, Ordering::Relaxed);
                pending = snap
                    .states
                    .into_iter()
                    .map(|(name, e)| (name, e.compacted()))
                    .collect();
                dir = None;
                if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    last_error_log = Some(Instant::now());
                    tracing::error!(
                        epoch, dir = %opts.dir.display(), error = %e,
                        failed = m.failed.load(Ordering::Relaxed),
                        "checkpoint cannot be written; the pipeline keeps running and the next \
                         checkpoint carries these changes"
                    );
                }
            }
        }
    }
}

/// Adds a part's entries to what the next file carries (later entries apply after earlier).
pub(super) fn merge_states(into: &mut BTreeMap<String, Entries>, states: Vec<(String, Entries)>) {
    for (name, e) in states {
        into.entry(name).or_default().append(&e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_attach_once_at_a_time_and_their_number_is_bounded() {
        let (tx, _rx) = std::sync::mpsc::channel();
        let coord = Coord::new(1, Vec::new(), None, tx);
        let s = Streams::new("p", None);
        assert_eq!(s.attach(7, &coord), Ok(0));
        assert!(s.attach(7, &coord).is_err(), "its connection is still open");
        s.detach(7, 42);
        assert_eq!(s.attach(7, &coord), Ok(42), "resumes where it stood");
        coord.in_progress.store(true, Ordering::SeqCst);
        s.detach(7, 50);
        assert!(
            s.attach(7, &coord).is_err(),
            "not while a checkpoint is taken"
        );
        coord.in_progress.store(false, Ordering::SeqCst);
        for id in 100..100 + MAX_STREAMS as u64 - 1 {
            assert!(s.attach(id, &coord).is_ok());
        }
        assert!(
            s.attach(1, &coord).is_err(),
            "one stream more than the source keeps"
        );
        assert_eq!(s.attach(7, &coord), Ok(50), "a known one still comes back");
    }
}
