//! Per-worker state shared by the connections of one event loop, whatever their protocol: the
//! cached Date header, a coarse clock, a pool of I/O buffers, and the registry used to drain
//! connections on shutdown. Nothing here is shared across threads, and nothing here is one
//! protocol's (HTTP/1.1's preformatted response block is cached by its driver, `http1.rs`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime};

use crate::core::stats::Stats;
use bytes::BytesMut;

/// Size of a fresh read buffer.
pub(crate) const READ_BUF: usize = 8 * 1024;
/// `at + d`, saturating at a century ahead: a configured `Duration::MAX` means "no timeout",
/// not a panic.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(d.min(CENTURY)).unwrap_or(at)
}

/// A worker's event coalescing (see [`crate::Config::coalesce`]): the state lives in the
/// worker thread, the hooks that read it are called by the runtime around each blocking wait.
#[derive(Clone, Copy)]
pub(crate) struct Coalesce {
    delay: Duration,
    /// A wait for events shorter than this means the worker is busy.
    busy_below: Duration,
}

thread_local! {
    /// When the worker began its current wait for events, and whether its last wait was short.
    static WAIT: Cell<(Option<Instant>, bool)> = const { Cell::new((None, false)) };
    /// The counters of the worker that runs on this thread: what a fault noticed outside the
    /// connection's own code (a library's log record) is counted into.
    static STATS: RefCell<Option<Arc<Stats>>> = const { RefCell::new(None) };
}

/// Makes `stats` the counters of this thread's server worker, for [`fault_on_this_thread`]. Set
/// by the accept loop's worker only: the throwaway workers of `proto::run` and
/// `serve_connection` leave a thread's counters as they are.
pub(crate) fn count_faults_into(stats: Arc<Stats>) {
    STATS.with(|current| *current.borrow_mut() = Some(stats));
}

/// Counts a client fault into the counters of the server worker that runs on this thread;
/// nothing on a thread that runs none.
pub(crate) fn fault_on_this_thread(kind: crate::core::stats::ClientFault) {
    STATS.with(|stats| {
        if let Some(stats) = stats.borrow().as_ref() {
            stats.fault(kind);
        }
    });
}

impl Coalesce {
    pub(crate) fn new(delay: Duration) -> Coalesce {
        Coalesce {
            delay,
            busy_below: delay.saturating_mul(10),
        }
    }

    /// Before the wait: a busy worker sleeps first, so that events arriving meanwhile need
    /// no wake-up and are taken together.
    pub(crate) fn before_park(&self) {
        let (_, busy) = WAIT.get();
        if busy {
            std::thread::sleep(self.delay);
        }
        WAIT.set((Some(Instant::now()), busy));
    }

    /// After the wait: busy if it was short (events were there, or came soon).
    pub(crate) fn after_unpark(&self) {
        if let (Some(since), _) = WAIT.get() {
            WAIT.set((None, since.elapsed() < self.busy_below));
        }
    }
}

/// Period of the worker's clock.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// Buffers kept for reuse per worker.
const POOL_MAX: usize = 256;

/// The time now, through tokio's clock: the same as `Instant::now()` in a build without tokio's
/// `test-util` feature, and the paused, virtual clock in tests that pause it (timeouts are then
/// tested without waiting for them).
#[inline]
pub(crate) fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}

pub(crate) struct Worker {
    date: RefCell<[u8; 29]>,
    stats: Arc<Stats>,
    now: Cell<Instant>,
    second: Cell<u64>,
    pool: RefCell<Vec<BytesMut>>,
    draining: Cell<bool>,
    conns: RefCell<Slab>,
    /// The worker runs on a server's event loop (a `LocalSet`): a connection may hand its
    /// transport to a task of its own ([`Worker::spawns`]).
    spawns: Cell<bool>,
    /// Bytes the worker's WebSocket connections hold in messages still being assembled
    /// (`WsConfig::worker_budget`).
    ws_assembling: Cell<usize>,
}

/// Wakers of live connections, so draining can wake the idle ones. A slot per connection,
/// registered once per connection (not per request).
#[derive(Default)]
struct Slab {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
    live: usize,
}

impl Worker {
    /// The server's counters.
    pub(crate) fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Counts a client fault (see [`crate::core::stats::ClientFault`]); the caller logs it at DEBUG.
    #[cold]
    pub(crate) fn fault(&self, kind: crate::core::stats::ClientFault) {
        self.stats.fault(kind);
    }

    /// A worker counting into `stats`.
    pub(crate) fn new(stats: Arc<Stats>) -> Worker {
        let w = Worker {
            date: RefCell::new([0; 29]),
            stats,
            now: Cell::new(clock()),
            second: Cell::new(u64::MAX),
            pool: RefCell::new(Vec::new()),
            draining: Cell::new(false),
            conns: RefCell::new(Slab::default()),
            spawns: Cell::new(false),
            ws_assembling: Cell::new(0),
        };
        w.tick();
        w
    }

    /// A WebSocket connection's bytes held in messages being assembled go from `was` to `now`:
    /// false (and nothing counted) when that growth would take the worker's total past
    /// `budget`. Shrinking always counts.
    #[cfg_attr(not(feature = "ws"), allow(dead_code))]
    pub(crate) fn ws_hold(&self, was: usize, now: usize, budget: usize) -> bool {
        let others = self.ws_assembling.get().saturating_sub(was);
        if now > was && others + now > budget {
            return false;
        }
        self.ws_assembling.set(others + now);
        self.stats.ws_assembling(was, now);
        true
    }

    /// Marks the worker as a server's, whose event loop runs local tasks.
    pub(crate) fn allow_spawns(&self) {
        self.spawns.set(true);
    }

    /// Whether a connection may move to a task of its own (`tokio::task::spawn_local`): on a
    /// server's worker, not on the caller's task of [`crate::serve_connection`].
    #[cfg_attr(not(feature = "ws"), allow(dead_code))]
    pub(crate) fn spawns(&self) -> bool {
        self.spawns.get()
    }

    /// Refreshes the clock, and the Date header when the second changed; called every
    /// [`TICK`] by the worker's ticker.
    pub(crate) fn tick(&self) {
        self.now.set(clock());

        let wall = SystemTime::now();
        let second = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second == self.second.replace(second) {
            return;
        }
        let date = httpdate::fmt_http_date(wall);
        let mut cached = self.date.borrow_mut();
        if date.len() == cached.len() {
            cached.copy_from_slice(date.as_bytes());
        }
    }

    /// The second (since the Unix epoch) that [`Worker::date`] names: a cache of something
    /// derived from the date compares it to know when to refresh.
    #[inline]
    pub(crate) fn second(&self) -> u64 {
        self.second.get()
    }

    /// The IMF-fixdate of the current second.
    pub(crate) fn date(&self) -> [u8; 29] {
        *self.date.borrow()
    }

    /// A clock accurate to the ticker period, for timeouts.
    pub(crate) fn now(&self) -> Instant {
        self.now.get()
    }

    /// When a deadline computed from [`Worker::now`] has certainly passed: the coarse clock may
    /// lag the real one by up to one tick, so one tick is added (timeouts are never early, and
    /// late by at most a tick).
    pub(crate) fn expiry(deadline: Instant) -> Instant {
        later(deadline, TICK)
    }

    pub(crate) fn take_buf(&self) -> BytesMut {
        self.pool
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(READ_BUF))
    }

    /// Returns an empty buffer for reuse (only if it is still a plain, uniquely owned buffer).
    pub(crate) fn give_buf(&self, mut buf: BytesMut) {
        buf.clear();
        // Request heads are split off the front of the read buffer, which leaves it short of
        // its full capacity; with nothing left in it, this takes the whole allocation back
        // (no copy) when no head still shares it, so the buffer can be pooled instead of freed.
        buf.reserve(READ_BUF);
        if buf.capacity() >= READ_BUF && buf.capacity() <= 4 * READ_BUF {
            let mut pool = self.pool.borrow_mut();
            if pool.len() < POOL_MAX {
                pool.push(buf);
            }
        }
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.get()
    }

    /// Starts draining: idle connections close, busy ones close after their current exchange.
    pub(crate) fn drain(&self) {
        self.draining.set(true);
        let wakers: Vec<Waker> = self
            .conns
            .borrow()
            .slots
            .iter()
            .flatten()
            .cloned()
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    /// Counts a connection the moment it is accepted (before its task first runs, so the
    /// accept loop's limit sees it); its task installs its waker with [`Worker::set_waker`].
    pub(crate) fn register(&self) -> usize {
        let waker = Waker::noop().clone();
        self.stats.opened();
        let mut s = self.conns.borrow_mut();
        s.live += 1;
        match s.free.pop() {
            Some(i) => {
                s.slots[i] = Some(waker);
                i
            }
            None => {
                s.slots.push(Some(waker));
                s.slots.len() - 1
            }
        }
    }

    pub(crate) fn set_waker(&self, id: usize, waker: Waker) {
        if let Some(slot @ Some(_)) = self.conns.borrow_mut().slots.get_mut(id) {
            *slot = Some(waker);
        }
    }

    pub(crate) fn unregister(&self, id: usize) {
        let mut s = self.conns.borrow_mut();
        if let Some(slot) = s.slots.get_mut(id) {
            if slot.take().is_some() {
                self.stats.closed();
                s.live -= 1;
                s.free.push(id);
            }
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.conns.borrow().live
    }
}

/// A connection's place in its worker's registry. Created at accept and moved into the task,
/// it unregisters when dropped, even if the task never ran to completion (runtime shut down after
/// a drain timeout), so the counts stay true.
pub(crate) struct Registration {
    pub(crate) id: usize,
    pub(crate) worker: Rc<Worker>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.worker.unregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_sleeps_only_after_a_short_wait() {
        let c = Coalesce::new(Duration::from_millis(1));
        // Nothing measured yet: not busy, so the first wait begins at once.
        let t = Instant::now();
        c.before_park();
        c.after_unpark();
        assert!(WAIT.get().1, "a wait of {:?} counts as busy", t.elapsed());
        // Busy: the next wait begins after the delay (a sleep lasts at least that long).
        let t = Instant::now();
        c.before_park();
        assert!(t.elapsed() >= Duration::from_millis(1));
        // A wait longer than ten times the delay: idle again, and no sleep before the next.
        std::thread::sleep(Duration::from_millis(15));
        c.after_unpark();
        assert!(!WAIT.get().1);
        c.before_park();
        c.after_unpark();
        assert!(WAIT.get().1);
    }
}
