//! Rate-limited logging, and what waits for room: a source connection or a task, and the gauge of an inbox that other workers feed.

use super::clock;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use canter_rt::proto::Handle;
use tokio::sync::Notify;

/// Allows a log line at most once a second, counting what it held back.
#[derive(Default)]
pub(super) struct RateLog {
    pub(super) last: Option<Instant>,
    pub(super) held: u64,
}

impl RateLog {
    /// `Some(lines held back since the last one)` when a line may be written now.
    pub(super) fn allow(&mut self) -> Option<u64> {
        let now = clock();
        if self.last.is_some_and(|t| now - t < Duration::from_secs(1)) {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

/// Something to wake once a sink or an inbox has room again.
#[derive(Clone)]
pub(super) enum Waiter {
    Conn(Handle),
    Task(Rc<Notify>),
}

impl Waiter {
    pub(super) fn wake(&self) {
        match self {
            Waiter::Conn(h) => h.wake(),
            Waiter::Task(n) => n.notify_one(),
        }
    }
}

/// Records in flight into one worker's inbox of one pipeline, and which workers wait for room.
pub(crate) struct Gauge {
    pub(super) pending: AtomicUsize,
    pub(super) blocked: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_line_a_second_with_the_count_of_those_held_back() {
        let mut log = RateLog::default();
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(log.allow(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(log.allow(), Some(3));
        assert_eq!(log.allow(), None);
    }
}
