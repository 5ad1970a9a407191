//! The pipeline on one worker: head (decode, steps, route) and tail (state, steps, sink), and the framing that splits a read into records.

use std::cell::RefCell;
use std::fmt::Display;
use std::hash::Hash;

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::metrics::PipeMetrics;
use super::super::state::{is_local, owner, Emit, Stateful, Store, Timers};
use super::super::step::Step;
use super::super::Framing;
use crate::frame::{self, FrameError};

use super::barrier::{Batch, Rid};
use super::env::Shared;
use super::input::Input;
use super::now_ns;
use super::sink::SinkOut;
use super::wait::RateLog;
use super::wire::{self, LinkBuf};

pub(crate) trait Process {
    fn begin(&mut self);
    fn record(&mut self, rec: &[u8]);
    /// Runs every complete record at the start of `buf`; returns the bytes they took.
    fn records(&mut self, framing: Framing, buf: &[u8]) -> Result<usize, FrameError>;
    fn end_turn(&mut self);
    fn frame_error(&mut self, peer: Option<SocketAddr>, e: &dyn Display);
    fn end_of_input(&mut self);
    /// Where the next record comes from (its stream and position); each record moves it on.
    fn set_origin(&mut self, origin: Rid);
    fn origin(&self) -> Rid;
    /// Sends checkpoint `epoch`'s barrier to the other workers' inboxes of this pipeline.
    fn barrier(&mut self, epoch: u64);
}

pub(super) trait TailOps<K, T> {
    fn process(&mut self, key: K, item: T, read_ns: u64, origin: Rid);
    fn end_turn(&mut self);
    fn finish(&mut self);
    /// The pipeline has ended on this worker: the readers of the channels its sink writes
    /// end too.
    fn close(&mut self);
    /// The earliest wake-up a key asked for (ns since the Unix epoch).
    fn next_wake(&self) -> Option<u64>;
    /// Runs the wake-ups due at `now_ns`.
    fn wake(&mut self, now_ns: u64);
    /// Asks every key of the state for its wake-up (after a restore).
    fn rearm(&mut self);
}

pub(super) struct TailInst<K, U: Stateful<K, X>, X, P: Step<U::Out>> {
    pub(super) store: Rc<RefCell<Store<K, U::State>>>,
    pub(super) step: U,
    pub(super) post: P,
    pub(super) sink: SinkOut<P::Out>,
    pub(super) metrics: Arc<PipeMetrics>,
    pub(super) me: usize,
    /// The read time and origin of the last item processed (for what the steps after the
    /// stateful one hand on at the end of the turn).
    pub(super) last: (u64, Rid),
    /// The keys' wake-ups (steps with [`Stateful::TIMERS`]), and how the drain task hears of
    /// one earlier than it sleeps for.
    pub(super) timers: Timers<K>,
    pub(super) timer_wake: Rc<tokio::sync::Notify>,
    pub(super) _x: PhantomData<fn(X)>,
}

impl<K, X, U, P> TailOps<K, X> for TailInst<K, U, X, P>
where
    K: Hash + Eq + Clone,
    U: Stateful<K, X>,
    P: Step<U::Out>,
{
    // Always inlined into the head's routing: with the end of a read's flush a second caller,
    // it became a call of its own, 13 instructions a record more on Market Spread (callgrind).
    #[inline(always)]
    fn process(&mut self, key: K, item: X, read_ns: u64, origin: Rid) {
        self.last = (read_ns, origin);
        let TailInst {
            store,
            step,
            post,
            sink,
            ..
        } = self;
        let mut store = store.borrow_mut();
        let mut slot = store.slot(key);
        let mut index = 0u32;
        let mut out = |o| {
            post.push(o, &mut |o| {
                sink.write(o, read_ns, origin, index);
                index = index.wrapping_add(1);
            })
        };
        let mut emit = Emit::new(&mut out, read_ns);
        step.update(&mut slot.get_mut().0, item, &mut emit);
        let gone = emit.discarded();
        if U::TIMERS {
            let at = if gone {
                None
            } else {
                step.wake_at(slot.key(), &slot.get().0)
            };
            if self.timers.set(slot.key(), at) {
                self.timer_wake.notify_one();
            }
        }
        if gone {
            slot.remove_entry();
        }
    }

    fn end_turn(&mut self) {
        let (read_ns, origin) = self.last;
        let TailInst { post, sink, .. } = self;
        let mut index = 0u32;
        post.flush(&mut |o| {
            sink.write(o, read_ns, origin, index);
            index = index.wrapping_add(1);
        });
        self.sink.end_turn(&self.metrics, self.me);
        let m = &self.metrics.workers[self.me];
        m.sink.store(self.sink.count(), Ordering::Relaxed);
        m.late.store(self.step.late(), Ordering::Relaxed);
        m.dropped.store(self.step.dropped(), Ordering::Relaxed);
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
        let mut gone = Vec::new();
        for (key, (st, _)) in store.map.iter_mut() {
            let mut out = |o| post.push(o, &mut |o| sink.write(o, 0, Rid::default(), 0));
            let mut emit = Emit::new(&mut out, 0);
            step.finish(key, st, &mut emit);
            if emit.discarded() {
                gone.push(key.clone());
            }
        }
        for key in gone {
            store.map.remove(&key);
        }
        post.flush(&mut |o| sink.write(o, 0, Rid::default(), 0));
    }

    fn close(&mut self) {
        self.sink.close();
    }

    fn next_wake(&self) -> Option<u64> {
        if U::TIMERS {
            self.timers.next()
        } else {
            None
        }
    }

    fn rearm(&mut self) {
        if !U::TIMERS {
            return;
        }
        let TailInst {
            store,
            step,
            timers,
            ..
        } = self;
        for (key, (st, _)) in store.borrow().map.iter() {
            let at = step.wake_at(key, st);
            timers.set(key, at);
        }
    }

    fn wake(&mut self, now_ns: u64) {
        if !U::TIMERS {
            return;
        }
        let TailInst {
            store,
            step,
            post,
            sink,
            timers,
            ..
        } = self;
        let mut store = store.borrow_mut();
        let mut index = 0u32;
        for key in timers.take_due(now_ns) {
            let Some((st, _)) = store.map.get_mut(&key) else {
                continue;
            };
            let mut out = |o| {
                post.push(o, &mut |o| {
                    sink.write(o, now_ns, Rid::default(), index);
                    index = index.wrapping_add(1);
                })
            };
            let mut emit = Emit::new(&mut out, now_ns);
            step.notify(&key, st, now_ns, &mut emit);
            if emit.discarded() {
                store.map.remove(&key);
            } else {
                let at = step.wake_at(&key, st);
                timers.set(&key, at);
            }
        }
    }
}

pub(super) struct Head<T, D, C: Step<T>, KF, K, Tl> {
    pub(super) decode: D,
    pub(super) chain: C,
    pub(super) key: KF,
    pub(super) tail: Rc<RefCell<Tl>>,
    pub(super) out: Vec<Vec<(K, C::Out, u64, Rid)>>,
    pub(super) shared: Arc<Shared<K, C::Out>>,
    pub(super) me: usize,
    /// `me` across the group of processes, the group's first worker of this process, and the
    /// group's workers in all (`me`, 0 and the workers without a group).
    pub(super) gid: usize,
    pub(super) base: usize,
    pub(super) total: usize,
    /// This pipeline's place in the topology, and the links to the other processes' workers.
    pub(super) pipe: u16,
    pub(super) links: Vec<Option<Rc<RefCell<LinkBuf>>>>,
    pub(super) log_wire: RateLog,
    pub(super) read_ns: u64,
    pub(super) records: u64,
    pub(super) rejected: u64,
    pub(super) frame_errors: u64,
    pub(super) log: RateLog,
    pub(super) metrics: Arc<PipeMetrics>,
    pub(super) counts: Vec<u64>,
    /// The next record's origin.
    pub(super) origin: Rid,
    /// The input has ended here (no more barriers go out).
    pub(super) ended: bool,
    /// The topology's shutdown was asked for (an end of input sent then says so on links).
    pub(super) stopping: Arc<std::sync::atomic::AtomicBool>,
    /// A pipeline reading a channel: the channel's writers on this worker that have not
    /// ended (its input ends here with the last).
    pub(super) writers_left: usize,
    pub(super) _t: PhantomData<fn() -> T>,
}

impl<T, E, D, C, KF, K, Tl> Process for Head<T, D, C, KF, K, Tl>
where
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E>,
    C: Step<T>,
    C::Out: 'static,
    KF: FnMut(&C::Out) -> K,
    K: Hash + 'static,
    Tl: TailOps<K, C::Out>,
{
    fn begin(&mut self) {
        self.read_ns = now_ns();
    }

    #[inline]
    fn record(&mut self, rec: &[u8]) {
        self.records += 1;
        let origin = self.origin;
        self.origin.pos += 1;
        match (self.decode)(rec) {
            Ok(item) => {
                let Head {
                    chain,
                    key,
                    tail,
                    out,
                    gid,
                    total,
                    read_ns,
                    ..
                } = self;
                let (gid, total, read_ns) = (*gid, *total, *read_ns);
                chain.push(item, &mut |x| {
                    route(key, tail, out, gid, total, x, read_ns, origin)
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
        {
            // What the steps held back for a batch call: routed as the read's last records.
            let Head {
                chain,
                key,
                tail,
                out,
                gid,
                total,
                read_ns,
                origin,
                ..
            } = self;
            let (gid, total, read_ns, origin) = (*gid, *total, *read_ns, *origin);
            chain.flush(&mut |x| route(key, tail, out, gid, total, x, read_ns, origin));
        }
        for (w, batch) in self.out.iter_mut().enumerate() {
            if batch.is_empty() {
                continue;
            }
            match &self.links[w] {
                None => {
                    let full = std::mem::replace(batch, Vec::with_capacity(batch.len()));
                    self.shared.inboxes[w - self.base].push(Batch::Data(self.gid, full));
                }
                Some(link) => send(
                    &mut link.borrow_mut(),
                    self.pipe,
                    std::mem::take(batch),
                    &self.shared,
                    &mut self.log_wire,
                ),
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
        self.ended = true;
        for inbox in &self.shared.inboxes {
            inbox.push(Batch::End(self.gid));
        }
        // A shutdown's end is not the input's: the other processes' workers hear which.
        let stopped = u32::from(self.stopping.load(Ordering::SeqCst));
        for link in self.links.iter().flatten() {
            let mut l = link.borrow_mut();
            let at = wire::begin_frame(&mut l.data, wire::END, self.pipe, stopped);
            wire::end_frame(&mut l.data, at);
            l.wake.notify_one();
        }
    }

    fn set_origin(&mut self, origin: Rid) {
        self.origin = origin;
    }

    fn origin(&self) -> Rid {
        self.origin
    }

    fn barrier(&mut self, epoch: u64) {
        if self.ended {
            return;
        }
        // Every record read so far went out with its read: the barrier follows them, on this
        // process's inboxes and on the links to the other processes' workers.
        for (w, inbox) in self.shared.inboxes.iter().enumerate() {
            if w != self.me && !inbox.closed.load(Ordering::SeqCst) {
                inbox.push(Batch::Barrier(self.gid, epoch));
            }
        }
        for link in self.links.iter().flatten() {
            let mut l = link.borrow_mut();
            if l.dead {
                continue;
            }
            let at = wire::begin_frame(&mut l.data, wire::BARRIER, self.pipe, 0);
            l.data.extend_from_slice(&epoch.to_le_bytes());
            wire::end_frame(&mut l.data, at);
            l.wake.notify_one();
        }
    }
}

impl<T, E, D, C, KF, K, Tl> Input<T> for Head<T, D, C, KF, K, Tl>
where
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E>,
    C: Step<T>,
    C::Out: 'static,
    KF: FnMut(&C::Out) -> K,
    K: Hash + 'static,
    Tl: TailOps<K, C::Out>,
{
    fn items(&mut self, items: &mut Vec<(T, u64)>) {
        if items.is_empty() {
            return;
        }
        {
            let Head {
                chain,
                key,
                tail,
                out,
                gid,
                total,
                records,
                origin,
                ..
            } = self;
            let (gid, total, origin) = (*gid, *total, *origin);
            for (item, read_ns) in items.drain(..) {
                *records += 1;
                chain.push(item, &mut |x| {
                    route(key, tail, out, gid, total, x, read_ns, origin)
                });
            }
        }
        self.end_turn();
    }

    fn end(&mut self) {
        self.writers_left = self.writers_left.saturating_sub(1);
        if self.writers_left == 0 && !self.ended {
            self.end_of_input();
        }
    }
}

/// Hands an item to its key's owner: this worker's tail at once, or the owner's batch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn route<K: Hash + 'static, X, KF: FnMut(&X) -> K, Tl: TailOps<K, X>>(
    key: &mut KF,
    tail: &RefCell<Tl>,
    out: &mut [Vec<(K, X, u64, Rid)>],
    gid: usize,
    total: usize,
    x: X,
    read_ns: u64,
    origin: Rid,
) {
    let k = key(&x);
    let w = if is_local::<K>() {
        gid
    } else {
        owner(&k, total)
    };
    if w == gid {
        tail.borrow_mut().process(k, x, read_ns, origin);
    } else {
        out[w].push((k, x, read_ns, origin));
    }
}

/// Encodes a batch for a worker of another process onto its link.
fn send<K: 'static, X: 'static>(
    link: &mut LinkBuf,
    pipe: u16,
    batch: Vec<(K, X, u64, Rid)>,
    shared: &Shared<K, X>,
    log: &mut RateLog,
) {
    let n = batch.len();
    let (Some(wire), false) = (&shared.wire, link.dead) else {
        link.dropped += n as u64;
        return;
    };
    let at = wire::begin_frame(&mut link.data, wire::DATA, pipe, n as u32);
    let mut items = Vec::with_capacity(n);
    for (k, x, ns, _) in batch {
        link.data.extend_from_slice(&ns.to_le_bytes());
        items.push((k, x));
    }
    match wire.encode(items, &mut link.data) {
        Ok(()) => {
            wire::end_frame(&mut link.data, at);
            link.wake.notify_one();
        }
        Err(e) => {
            link.data.truncate(at);
            link.dropped += n as u64;
            if let Some(held) = log.allow() {
                tracing::error!(
                    records = n, error = %e, held,
                    "a batch for another process did not encode; its records are lost"
                );
            }
        }
    }
}

pub(super) fn split(
    framing: Framing,
    buf: &[u8],
    each: impl FnMut(&[u8]),
) -> Result<usize, FrameError> {
    match framing {
        Framing::LengthPrefixed { max } => frame::split(buf, max, each),
        Framing::Lines { max } => split_lines(buf, max, each),
    }
}

/// Splits the complete lines at the start of `buf` (`\n` or `\r\n` ended).
pub(super) fn split_lines(
    buf: &[u8],
    max: usize,
    mut each: impl FnMut(&[u8]),
) -> Result<usize, FrameError> {
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
