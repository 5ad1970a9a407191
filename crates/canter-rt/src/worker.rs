//! Per-worker state shared by the connections of one event loop: the cached Date header, a
//! coarse clock, a pool of I/O buffers, and the registry used to drain connections on shutdown.
//! Nothing here is shared across threads.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;

use crate::server::Stats;

/// Size of a fresh read buffer.
pub(crate) const READ_BUF: usize = 8 * 1024;
/// `at + d`, saturating at a century ahead: a configured `Duration::MAX` means "no timeout",
/// not a panic.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(d.min(CENTURY)).unwrap_or(at)
}

/// Period of the worker's clock.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// Buffers kept for reuse per worker.
const POOL_MAX: usize = 256;
/// Connections per worker that may keep their (empty) buffers while they wait for the peer's
/// next request; see [`Worker::try_hold`].
const HOLD_MAX: usize = 256;

pub(crate) struct Worker {
    date: RefCell<[u8; 29]>,
    /// `Server: …\r\nDate: …\r\n`, rebuilt when the second changes.
    preamble: RefCell<Vec<u8>>,
    server: String,
    stats: Arc<Stats>,
    now: Cell<Instant>,
    second: Cell<u64>,
    pool: RefCell<Vec<BytesMut>>,
    draining: Cell<bool>,
    conns: RefCell<Slab>,
    /// Connections holding empty buffers through a wait, at most [`HOLD_MAX`].
    held: Cell<usize>,
    /// Ticks so far: a connection that started holding in an earlier tick gives its buffers back.
    epoch: Cell<u64>,
    /// Connections to wake at the next tick so that they can give their buffers back.
    holders: RefCell<Vec<usize>>,
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
    pub(crate) fn new(server: &str, stats: Arc<Stats>) -> Worker {
        let w = Worker {
            date: RefCell::new([0; 29]),
            preamble: RefCell::new(Vec::new()),
            server: server.to_owned(),
            stats,
            now: Cell::new(Instant::now()),
            second: Cell::new(u64::MAX),
            pool: RefCell::new(Vec::new()),
            draining: Cell::new(false),
            conns: RefCell::new(Slab::default()),
            held: Cell::new(0),
            epoch: Cell::new(0),
            holders: RefCell::new(Vec::new()),
        };
        w.tick();
        w
    }

    /// Refreshes the clock, and the Date header when the second changed; called every
    /// [`TICK`] by the worker's ticker.
    pub(crate) fn tick(&self) {
        self.now.set(Instant::now());
        self.epoch.set(self.epoch.get().wrapping_add(1));
        let mut holders = std::mem::take(&mut *self.holders.borrow_mut());
        if !holders.is_empty() {
            let conns = self.conns.borrow();
            for id in holders.drain(..) {
                if let Some(Some(waker)) = conns.slots.get(id) {
                    waker.wake_by_ref();
                }
            }
            // Keep the allocation for the next tick's list (unless a wake-up listed someone).
            let mut list = self.holders.borrow_mut();
            if list.is_empty() {
                *list = holders;
            }
        }
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
        let mut preamble = self.preamble.borrow_mut();
        preamble.clear();
        preamble.extend_from_slice(canter_h1::OK_LINE);
        preamble.extend_from_slice(b"Server: ");
        preamble.extend_from_slice(self.server.as_bytes());
        preamble.extend_from_slice(b"\r\nDate: ");
        preamble.extend_from_slice(&cached[..]);
        preamble.extend_from_slice(b"\r\n");
    }

    /// Runs `f` with the preformatted `HTTP/1.1 200 OK\r\nServer: …\r\nDate: …\r\n` block.
    pub(crate) fn with_preamble<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.preamble.borrow())
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

    /// The number of the current tick.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Asks whether one more connection may keep its empty buffers while it waits for the
    /// peer, instead of returning them to the pool now and taking them back for the next
    /// request (on a busy connection that round trip costs about as much as parsing the
    /// request). At most [`HOLD_MAX`] connections per worker hold at once, so the memory held
    /// is bounded; each one is woken at the next tick (see [`Worker::wake_at_tick`]) and gives
    /// its buffers back if it is still waiting. Pair every `true` with [`Worker::unhold`].
    pub(crate) fn try_hold(&self) -> bool {
        let held = self.held.get();
        if held >= HOLD_MAX {
            return false;
        }
        self.held.set(held + 1);
        true
    }

    /// Ends a hold granted by [`Worker::try_hold`].
    pub(crate) fn unhold(&self) {
        self.held.set(self.held.get().saturating_sub(1));
    }

    /// Wakes connection `id` at the next tick.
    pub(crate) fn wake_at_tick(&self, id: usize) {
        self.holders.borrow_mut().push(id);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn woken(c: &Arc<Count>) -> usize {
        c.0.load(Ordering::Relaxed)
    }

    #[test]
    fn holds_are_bounded() {
        let w = Worker::new("t", Arc::default());
        for _ in 0..HOLD_MAX {
            assert!(w.try_hold());
        }
        assert!(!w.try_hold(), "more than HOLD_MAX holds granted");
        w.unhold();
        assert!(w.try_hold(), "a hold given back can be granted again");
        assert!(!w.try_hold());
    }

    #[test]
    fn tick_wakes_each_listed_connection_once_and_advances_the_epoch() {
        let w = Worker::new("t", Arc::default());
        let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let ia = w.register();
        w.set_waker(ia, Waker::from(a.clone()));
        let ib = w.register();
        w.set_waker(ib, Waker::from(b.clone()));

        let e0 = w.epoch();
        w.wake_at_tick(ia);
        w.tick();
        assert_eq!(w.epoch(), e0 + 1);
        assert_eq!(
            (woken(&a), woken(&b)),
            (1, 0),
            "only the listed connection is woken"
        );

        // The list is emptied by the tick: the next tick wakes nobody.
        w.tick();
        assert_eq!((woken(&a), woken(&b)), (1, 0));

        // A connection that closed meanwhile is skipped; its slot may be reused later.
        w.wake_at_tick(ib);
        w.unregister(ib);
        w.tick();
        assert_eq!((woken(&a), woken(&b)), (1, 0));
        assert_eq!(w.epoch(), e0 + 3);
    }
}
