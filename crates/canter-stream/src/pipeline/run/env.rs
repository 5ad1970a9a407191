//! What one worker shares among its pipelines' tasks, and the inboxes of batches from other workers.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::Hash;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use canter_rt::proto::Handle;
use tokio::sync::Notify;

use super::super::state::{KeyedState, Snap, Store};
use super::super::RunOptions;

pub(super) use super::barrier::Batch;
use super::ckpt::WorkerCkpt;
use super::input::Input;
use super::lock;
use super::sink_buf::SinkBuf;
use super::wait::{Gauge, Waiter};
use super::wire::{LinkBuf, Wire};

/// What one worker shares among its pipelines' tasks.
pub(crate) struct Env {
    pub(super) me: usize,
    pub(super) workers: usize,
    /// This worker's number across a group of processes (`me` without one), the group's
    /// first worker of this process, and the group's workers in all.
    pub(super) gid: usize,
    pub(super) base: usize,
    pub(super) total: usize,
    /// Links to the workers of the other processes of a group, by their number.
    pub(super) links: Vec<Option<Rc<RefCell<LinkBuf>>>>,
    pub(super) opts: RunOptions,
    pub(super) stores: RefCell<HashMap<u64, Rc<dyn Any>>>,
    pub(super) sinks: RefCell<Vec<Rc<RefCell<SinkBuf>>>>,
    /// Inboxes on other workers that this worker feeds.
    pub(super) gauges: RefCell<Vec<Arc<Gauge>>>,
    pub(super) waiters: RefCell<Vec<Waiter>>,
    pub(super) sources: RefCell<Vec<Handle>>,
    /// Source connections open on this worker.
    pub(super) open_sources: Cell<usize>,
    pub(super) tasks: RefCell<Vec<tokio::task::JoinHandle<()>>>,
    /// This worker has seen the shutdown (its sources stop reading).
    pub(super) shutting: Cell<bool>,
    /// The topology's shutdown was asked for (set before any worker is told).
    pub(super) stopping: Arc<AtomicBool>,
    /// That shutdown is not the end of the input (a stop by a signal): nothing is finished.
    pub(super) interrupted: Arc<AtomicBool>,
    /// A worker of another process of the group ended its input for a shutdown (or its link
    /// was lost): that is not the end of the input either.
    pub(super) peer_stopped: Cell<bool>,
    pub(super) resumes: Arc<Vec<Arc<Notify>>>,
    /// Checkpoints on this worker (none when the topology does not checkpoint).
    pub(super) ckpt: Option<WorkerCkpt>,
    /// This worker's parts of the keyed states that checkpoints copy.
    pub(super) snaps: RefCell<Vec<Rc<RefCell<dyn Snap>>>>,
    /// The heads of the pipelines reading each channel on this worker (each an
    /// `Rc<RefCell<dyn Input<T>>>`), by channel.
    pub(super) channels: RefCell<HashMap<u64, Vec<Rc<dyn Any>>>>,
}

impl Env {
    /// Worker `me`'s environment, empty: its pipelines fill it as they start.
    pub(super) fn new(
        me: usize,
        opts: RunOptions,
        resumes: Arc<Vec<Arc<Notify>>>,
        ckpt: Option<WorkerCkpt>,
        (stopping, interrupted): (Arc<AtomicBool>, Arc<AtomicBool>),
    ) -> Env {
        let workers = opts.workers;
        let (base, total) = match &opts.group {
            Some(g) => (g.process * workers, g.processes * workers),
            None => (0, workers),
        };
        let links = (0..total)
            .map(|g| {
                (!(base..base + workers).contains(&g))
                    .then(|| Rc::new(RefCell::new(LinkBuf::new(opts.sink_high_water))))
            })
            .collect();
        Env {
            me,
            workers,
            gid: base + me,
            base,
            total,
            links,
            opts,
            stores: RefCell::new(HashMap::new()),
            sinks: RefCell::new(Vec::new()),
            gauges: RefCell::new(Vec::new()),
            waiters: RefCell::new(Vec::new()),
            sources: RefCell::new(Vec::new()),
            open_sources: Cell::new(0),
            tasks: RefCell::new(Vec::new()),
            shutting: Cell::new(false),
            stopping,
            interrupted,
            peer_stopped: Cell::new(false),
            resumes,
            ckpt,
            snaps: RefCell::new(Vec::new()),
            channels: RefCell::new(HashMap::new()),
        }
    }

    /// Whether the topology is stopping, seen on this worker or not yet: an end of input that
    /// another worker's shutdown sent can come before this worker's own notice of it (and a
    /// group's other processes say theirs on their links).
    pub(super) fn stop_requested(&self) -> bool {
        self.shutting.get() || self.stopping.load(Ordering::SeqCst) || self.peer_stopped.get()
    }

    /// Registers the head of a pipeline reading channel `id` on this worker.
    pub(super) fn read_channel<T: 'static>(&self, id: u64, head: Rc<RefCell<dyn Input<T>>>) {
        self.channels
            .borrow_mut()
            .entry(id)
            .or_default()
            .push(Rc::new(head));
    }

    /// The heads reading channel `id` on this worker (those of another record type, which the
    /// topology's typed channels rule out, are left out).
    pub(super) fn channel_readers<T: 'static>(&self, id: u64) -> Vec<Rc<RefCell<dyn Input<T>>>> {
        self.channels
            .borrow()
            .get(&id)
            .map(|v| {
                v.iter()
                    .filter_map(|a| a.clone().downcast::<Rc<RefCell<dyn Input<T>>>>().ok())
                    .map(|r| (*r).clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn store<K: Hash + Eq + Clone + 'static, S: 'static>(
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
        if self.ckpt.is_some() {
            s.borrow_mut().track();
            self.snaps.borrow_mut().push(s.clone());
        }
        s
    }

    pub(super) fn sinks_full(&self) -> bool {
        self.sinks.borrow().iter().any(|s| s.borrow().full())
    }

    /// Whether the sources must stop reading: a sink of this worker is full, or an inbox this
    /// worker feeds is (then this worker is marked as waiting for it).
    pub(super) fn must_wait(&self) -> bool {
        // A checkpoint a shutdown cut short is not written: nothing waits for it.
        if !self.shutting.get() && self.ckpt.as_ref().is_some_and(|c| c.aligning.get()) {
            return true;
        }
        if self.sinks_full() {
            return true;
        }
        if self.links.iter().flatten().any(|l| l.borrow().full()) {
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

    pub(super) fn wait(&self, w: Waiter) {
        self.waiters.borrow_mut().push(w);
    }

    /// Wakes everything that waited for room; each looks again.
    pub(super) fn resume_all(&self) {
        let ws = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in ws {
            w.wake();
        }
    }
}

pub(super) struct Inbox<K, T> {
    pub(super) queue: Mutex<Vec<Batch<K, T>>>,
    pub(super) notify: Notify,
    pub(super) gauge: Arc<Gauge>,
    /// Its drain has ended: checkpoint barriers are no longer sent to it.
    pub(super) closed: std::sync::atomic::AtomicBool,
}

impl<K, T> Inbox<K, T> {
    pub(super) fn push(&self, b: Batch<K, T>) {
        match &b {
            Batch::Data(_, v) => {
                self.gauge.pending.fetch_add(v.len(), Ordering::SeqCst);
            }
            Batch::Wire(_, n, _) => {
                self.gauge.pending.fetch_add(*n, Ordering::SeqCst);
            }
            _ => {}
        }
        lock(&self.queue).push(b);
        self.notify.notify_one();
    }

    pub(super) fn release(&self, n: usize, low: usize, resumes: &[Arc<Notify>]) {
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

pub(super) struct Shared<K, T> {
    pub(super) inboxes: Vec<Inbox<K, T>>,
    /// How the pipeline's records cross processes (in a group).
    pub(super) wire: Option<Arc<dyn Wire<K, T>>>,
}

/// A pipeline's inboxes as the links from other processes see them: encoded batches in.
pub(super) trait WireIn {
    /// Hands worker `to` (of this process) `records` encoded records from worker `from`.
    fn push_wire(&self, to: usize, from: usize, records: usize, bytes: Vec<u8>);
    /// Worker `from`'s input has ended.
    fn push_end(&self, to: usize, from: usize);
    /// Worker `from`'s barrier for checkpoint `epoch`.
    fn push_barrier(&self, to: usize, from: usize, epoch: u64);
    fn gauge(&self, to: usize) -> &Arc<Gauge>;
}

impl<K, T> WireIn for Shared<K, T> {
    fn push_wire(&self, to: usize, from: usize, records: usize, bytes: Vec<u8>) {
        self.inboxes[to].push(Batch::Wire(from, records, bytes));
    }

    fn push_end(&self, to: usize, from: usize) {
        self.inboxes[to].push(Batch::End(from));
    }

    fn push_barrier(&self, to: usize, from: usize, epoch: u64) {
        self.inboxes[to].push(Batch::Barrier(from, epoch));
    }

    fn gauge(&self, to: usize) -> &Arc<Gauge> {
        &self.inboxes[to].gauge
    }
}
