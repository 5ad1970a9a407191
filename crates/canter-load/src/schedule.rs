//! Open-loop request schedule and coordinated-omission correction.

use std::time::{Duration, Instant};

/// Constant-rate schedule of one connection: request `k` is intended to be
/// sent at `phase + k * interval` after the run start.
///
/// The total rate is split evenly over connections and each connection is
/// phase-shifted by `interval * index / connections`, so the merged stream
/// of intended send times is evenly spaced at `1 / rate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateSchedule {
    interval: Duration,
    phase: Duration,
}

impl RateSchedule {
    /// Schedule for connection `index` of `connections` sharing `total_rate`
    /// requests per second.
    pub fn new(total_rate: f64, connections: usize, index: usize) -> Self {
        let connections = connections.max(1);
        let per_conn = total_rate / connections as f64;
        let interval = if per_conn > 0.0 && per_conn.is_finite() {
            Duration::from_secs_f64(1.0 / per_conn)
        } else {
            Duration::MAX
        };
        let phase = if interval == Duration::MAX {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(interval.as_secs_f64() * index as f64 / connections as f64)
        };
        RateSchedule { interval, phase }
    }

    /// Time between two requests of this connection.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Offset from the run start at which request `k` is intended to be sent.
    pub fn offset(&self, k: u64) -> Duration {
        let nanos = self.phase.as_nanos() + self.interval.as_nanos() * u128::from(k);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Intended send instant of request `k` for a run started at `start`.
    pub fn intended(&self, start: Instant, k: u64) -> Instant {
        start
            .checked_add(self.offset(k))
            .unwrap_or(start + Duration::from_secs(1 << 32))
    }
}

/// Coordinated-omission-corrected latency of one open-loop request.
///
/// * `intended`: the request's slot on the constant schedule;
/// * `ready`: when the connection became free to send it (the previous
///   response completed, or the connection was established);
/// * `sent`: when it was actually written; `received`: when its response
///   completed.
///
/// If the connection was still busy at the intended time (`ready >
/// intended`) the request was held back by the server, so its latency is
/// measured from the intended time, as wrk2 does: the queueing the server
/// caused is charged to the server. Otherwise the request went out on
/// schedule and latency is measured from the actual write, which keeps the
/// generator's own timer slack (tokio timers have 1 ms granularity) out of
/// the numbers.
pub fn corrected_latency(
    intended: Instant,
    ready: Instant,
    sent: Instant,
    received: Instant,
) -> Duration {
    let from = if ready > intended {
        intended.min(sent)
    } else {
        sent
    };
    received.saturating_duration_since(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_spacing_across_connections() {
        // 4 connections at 1000 req/s: each at 250/s (4ms), phases 0,1,2,3 ms.
        let scheds: Vec<_> = (0..4).map(|i| RateSchedule::new(1000.0, 4, i)).collect();
        assert_eq!(scheds[0].interval(), Duration::from_millis(4));
        let mut all: Vec<Duration> = Vec::new();
        for s in &scheds {
            for k in 0..250 {
                all.push(s.offset(k));
            }
        }
        all.sort();
        // 1000 requests within the first second, 1 ms apart.
        assert_eq!(all.len(), 1000);
        for (i, t) in all.iter().enumerate() {
            let want = Duration::from_millis(i as u64);
            let diff = t.abs_diff(want);
            assert!(diff < Duration::from_micros(1), "{i}: {t:?} vs {want:?}");
        }
        assert!(*all.last().expect("non-empty") < Duration::from_secs(1));
    }

    #[test]
    fn count_in_window_matches_rate() {
        let (rate, conns, window) = (20_000.0, 50usize, Duration::from_secs(3));
        let mut n = 0u64;
        for i in 0..conns {
            let s = RateSchedule::new(rate, conns, i);
            let mut k = 0;
            while s.offset(k) < window {
                k += 1;
            }
            n += k;
        }
        assert_eq!(n, 60_000);
    }

    #[test]
    fn co_correction_uses_intended_time() {
        let start = Instant::now();
        let s = RateSchedule::new(100.0, 1, 0); // every 10 ms
        let intended = s.intended(start, 5);
        assert_eq!(intended - start, Duration::from_millis(50));
        let ms = Duration::from_millis;
        // On time: connection idle before the slot, sent at the slot,
        // answered 2 ms later.
        let l = corrected_latency(intended, intended - ms(3), intended, intended + ms(2));
        assert_eq!(l, ms(2));
        // Idle connection but the generator's timer woke 1 ms late: the
        // generator's slack is not charged to the server.
        let l = corrected_latency(
            intended,
            intended - ms(3),
            intended + ms(1),
            intended + ms(3),
        );
        assert_eq!(l, ms(2));
        // Behind: the previous response stalled until 30 ms after the slot,
        // so the send happened 30 ms late; the server answered 2 ms after
        // the actual send, latency is 32 ms (from the intended time).
        let sent = intended + ms(30);
        let l = corrected_latency(intended, sent, sent, sent + ms(2));
        assert_eq!(l, ms(32));
    }

    #[test]
    fn stall_charges_every_queued_request() {
        // One connection at 1000/s; the server stalls 100 ms on request 0,
        // then answers instantly. Requests 1..=100 were due during the stall
        // and are sent back to back when it ends; their corrected latencies
        // decrease linearly from ~99 ms, as wrk2 reports.
        let start = Instant::now();
        let s = RateSchedule::new(1000.0, 1, 0);
        let stall_end = start + Duration::from_millis(100);
        let l0 = corrected_latency(s.intended(start, 0), start, start, stall_end);
        assert_eq!(l0, Duration::from_millis(100));
        for k in 1..=100u64 {
            // Each of these was due while the connection was busy.
            let l = corrected_latency(s.intended(start, k), stall_end, stall_end, stall_end);
            assert_eq!(l, Duration::from_millis(100 - k));
        }
    }
}
