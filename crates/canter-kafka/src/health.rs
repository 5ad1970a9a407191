//! Which brokers answer: the connections of the clusters that share a [`Health`] report a
//! broker that does not (a connect that fails, a request that timed out) and one that answers
//! again, so an outage is said once, at once, with the broker and the error,
//! whatever the client was doing (an idle fetch or a flush retrying under load), and its end
//! too. Nothing is locked while every broker answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::addr::BrokerAddr;
use crate::error::Error;

/// How often an outage that goes on is said again.
const REPEAT: Duration = Duration::from_secs(30);

/// Brokers that do not answer, shared by the clusters of a program (its workers).
#[derive(Debug, Default)]
pub struct Health {
    failing: AtomicUsize,
    known: AtomicUsize,
    errors: AtomicU64,
    since: Mutex<HashMap<BrokerAddr, Outage>>,
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    said: Instant,
}

impl Health {
    /// A new one: every broker reachable.
    pub fn new() -> Health {
        Health::default()
    }

    /// Brokers not answering now.
    pub fn unreachable(&self) -> usize {
        self.failing.load(Ordering::Relaxed)
    }

    /// Brokers the last metadata listed that answer (as far as the last requests tell).
    pub fn reachable(&self) -> usize {
        self.known
            .load(Ordering::Relaxed)
            .saturating_sub(self.unreachable())
    }

    /// Failures seen (connects, requests).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub(crate) fn set_known(&self, n: usize) {
        self.known.store(n, Ordering::Relaxed);
    }

    /// `broker` did not answer: said at once the first time (WARN, the broker and the
    /// error), again every 30 s while it lasts. Errors a broker answers with (a leader that
    /// moved) are not outages and are not reported here.
    pub(crate) fn failure(&self, broker: &BrokerAddr, error: &Error) {
        if !matches!(
            error,
            Error::Io(_) | Error::Timeout(_) | Error::Unreachable(_)
        ) {
            return;
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match since.get_mut(broker) {
            None => {
                since.insert(
                    broker.clone(),
                    Outage {
                        since: now,
                        said: now,
                    },
                );
                self.failing.store(since.len(), Ordering::Relaxed);
                tracing::warn!(broker = %broker, error = %error, "kafka: broker unreachable; requests to it are retried");
            }
            Some(o) if now.duration_since(o.said) >= REPEAT => {
                o.said = now;
                tracing::warn!(broker = %broker, error = %error,
                    "kafka: broker still unreachable after {} s", now.duration_since(o.since).as_secs());
            }
            Some(_) => {}
        }
    }

    /// `broker` answered a request.
    #[inline]
    pub(crate) fn answered(&self, broker: &BrokerAddr) {
        if self.failing.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = since.remove(broker) {
            self.failing.store(since.len(), Ordering::Relaxed);
            tracing::info!(broker = %broker, "kafka: broker answers again after {:.1} s", o.since.elapsed().as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_outage_is_counted_until_the_broker_answers() {
        let h = Health::new();
        h.set_known(3);
        let a = BrokerAddr::parse("b1:9092").unwrap();
        let b = BrokerAddr::parse("b2:9092").unwrap();
        let io = || Error::Io(std::io::Error::other("refused"));
        h.failure(&a, &io());
        h.failure(&a, &io());
        h.failure(&b, &Error::Timeout("broker response"));
        assert_eq!((h.unreachable(), h.reachable(), h.errors()), (2, 1, 3));
        // A broker's own answer (NOT_LEADER) is not an outage.
        h.failure(&a, &Error::broker("Produce", 6, None));
        assert_eq!(h.errors(), 3);
        h.answered(&a);
        assert_eq!((h.unreachable(), h.reachable()), (1, 2));
        h.answered(&b);
        h.answered(&b);
        assert_eq!(h.unreachable(), 0);
    }
}
