//! Per-thread statistics, merging and the final [`Report`].

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency tracked by the histogram (1 hour, in microseconds).
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Kind of error counted during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Connecting failed.
    Connect = 0,
    /// Reading failed or the connection closed with requests outstanding.
    Read = 1,
    /// Writing failed.
    Write = 2,
    /// A request got no response within `--timeout`.
    Timeout = 3,
    /// The response could not be parsed (HTTP/2: a protocol error by the server).
    Parse = 4,
    /// HTTP/2: the server reset the stream (RST_STREAM other than REFUSED_STREAM, which is
    /// retried).
    Reset = 5,
}

/// Statistics collected by one worker thread.
pub struct ThreadStats {
    /// Latency histogram in microseconds.
    pub hist: Histogram<u64>,
    /// Completed responses.
    pub requests: u64,
    /// Bytes read from sockets.
    pub bytes_read: u64,
    /// Error counters indexed by [`ErrorKind`].
    pub errors: [u64; 6],
    /// Response counts indexed by status code (0..=999).
    pub status: Box<[u64; 1000]>,
}

impl Default for ThreadStats {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadStats {
    /// Empty statistics.
    pub fn new() -> Self {
        ThreadStats {
            hist: new_histogram(),
            requests: 0,
            bytes_read: 0,
            errors: [0; 6],
            status: Box::new([0; 1000]),
        }
    }

    /// Records one completed response.
    #[inline]
    pub fn record(&mut self, status: u16, latency: Duration) {
        self.requests += 1;
        if let Some(slot) = self.status.get_mut(usize::from(status)) {
            *slot += 1;
        }
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.hist.saturating_record(us);
    }

    /// Records one echoed WebSocket message: a completed exchange, with no status of its own.
    #[inline]
    pub fn message(&mut self, latency: Duration) {
        self.requests += 1;
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.hist.saturating_record(us);
    }

    /// Counts the status of a WebSocket handshake's answer (101 for an upgrade), not as a
    /// completed exchange.
    pub fn handshake(&mut self, status: u16) {
        if let Some(slot) = self.status.get_mut(usize::from(status)) {
            *slot += 1;
        }
    }

    /// Counts an error.
    #[inline]
    pub fn error(&mut self, kind: ErrorKind, n: u64) {
        self.errors[kind as usize] += n;
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &ThreadStats) {
        // Both histograms share bounds, so `add` cannot fail.
        let _ = self.hist.add(&other.hist);
        self.requests += other.requests;
        self.bytes_read += other.bytes_read;
        for (a, b) in self.errors.iter_mut().zip(other.errors.iter()) {
            *a += b;
        }
        for (a, b) in self.status.iter_mut().zip(other.status.iter()) {
            *a += b;
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

/// Errors by kind, as reported.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Errors {
    /// Failed connection attempts.
    pub connect: u64,
    /// Read failures and connections closed with requests outstanding.
    pub read: u64,
    /// Write failures.
    pub write: u64,
    /// Requests without a response within the timeout.
    pub timeout: u64,
    /// Unparseable responses.
    pub parse: u64,
    /// Streams reset by the server (HTTP/2).
    pub reset: u64,
}

impl Errors {
    /// Sum of all errors.
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout + self.parse + self.reset
    }
}

/// Latency summary in microseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p99_9: u64,
    /// 99.99th percentile.
    pub p99_99: u64,
    /// Maximum.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// Summarises a histogram of microsecond values.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            p99_99: h.value_at_quantile(0.9999),
            max: h.max(),
            mean: (h.mean() * 100.0).round() / 100.0,
        }
    }
}

/// Result of a load test; serialised as the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Target URL.
    pub url: String,
    /// Number of connections.
    pub connections: usize,
    /// Number of worker threads.
    pub threads: usize,
    /// `http/1.1` or `h2`.
    pub protocol: &'static str,
    /// Requests written per batch per connection (HTTP/1.1).
    pub pipeline: usize,
    /// Concurrent streams per connection (HTTP/2), `null` for HTTP/1.1.
    pub streams: Option<usize>,
    /// Target rate in requests/s for open-loop runs, `null` for closed loop.
    pub rate: Option<f64>,
    /// Measured duration in seconds (excluding warm-up).
    pub duration_s: f64,
    /// Completed responses.
    pub requests: u64,
    /// Completed responses per second.
    pub rps: f64,
    /// Bytes read from the server.
    pub bytes_read: u64,
    /// Errors by kind.
    pub errors: Errors,
    /// Response counts by status code.
    pub status: BTreeMap<String, u64>,
    /// Latency percentiles in microseconds.
    pub latency_us: Latency,
}

/// Run parameters echoed into the report.
pub struct RunInfo {
    /// Target URL.
    pub url: String,
    /// Number of connections.
    pub connections: usize,
    /// Number of worker threads.
    pub threads: usize,
    /// `http/1.1` or `h2`.
    pub protocol: &'static str,
    /// Pipeline depth.
    pub pipeline: usize,
    /// HTTP/2 streams per connection.
    pub streams: Option<usize>,
    /// Open-loop rate.
    pub rate: Option<f64>,
}

impl Report {
    /// Builds the report from merged statistics.
    pub fn build(info: RunInfo, stats: &ThreadStats, elapsed: Duration) -> Report {
        let secs = elapsed.as_secs_f64();
        let rps = if secs > 0.0 {
            stats.requests as f64 / secs
        } else {
            0.0
        };
        let status = stats
            .status
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(code, &n)| (code.to_string(), n))
            .collect();
        Report {
            url: info.url,
            connections: info.connections,
            threads: info.threads,
            protocol: info.protocol,
            pipeline: info.pipeline,
            streams: info.streams,
            rate: info.rate,
            duration_s: (secs * 1000.0).round() / 1000.0,
            requests: stats.requests,
            rps: (rps * 100.0).round() / 100.0,
            bytes_read: stats.bytes_read,
            errors: Errors {
                connect: stats.errors[ErrorKind::Connect as usize],
                read: stats.errors[ErrorKind::Read as usize],
                write: stats.errors[ErrorKind::Write as usize],
                timeout: stats.errors[ErrorKind::Timeout as usize],
                parse: stats.errors[ErrorKind::Parse as usize],
                reset: stats.errors[ErrorKind::Reset as usize],
            },
            status,
            latency_us: Latency::from_histogram(&stats.hist),
        }
    }

    /// Human-readable, wrk-like rendering.
    pub fn to_human(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let secs = self.duration_s.max(1e-9);
        // A WebSocket run counts echoed messages, all on upgraded (101) connections.
        let ws = self.protocol == "websocket";
        let (what, per) = if ws {
            ("messages received", "Messages/sec:")
        } else {
            ("requests", "Requests/sec:")
        };
        let _ = writeln!(
            s,
            "  {} {what} in {:.2}s, {} read",
            self.requests,
            self.duration_s,
            fmt_bytes(self.bytes_read as f64)
        );
        let _ = writeln!(s, "{per} {:>12.2}", self.rps);
        let _ = writeln!(
            s,
            "Transfer/sec: {:>12}",
            fmt_bytes(self.bytes_read as f64 / secs)
        );
        let l = &self.latency_us;
        let _ = writeln!(s, "Latency distribution:");
        for (name, v) in [
            ("p50", l.p50),
            ("p90", l.p90),
            ("p99", l.p99),
            ("p99.9", l.p99_9),
            ("p99.99", l.p99_99),
            ("max", l.max),
        ] {
            let _ = writeln!(s, "  {name:>7} {:>10}", fmt_us(v as f64));
        }
        let _ = writeln!(s, "  {:>7} {:>10}", "mean", fmt_us(l.mean));
        let _ = writeln!(s, "Status codes:");
        if self.status.is_empty() {
            let _ = writeln!(s, "  (none)");
        }
        for (code, n) in &self.status {
            let _ = writeln!(s, "  {code}: {n}");
        }
        let non2xx: u64 = self
            .status
            .iter()
            .filter(|(c, _)| !c.starts_with('2'))
            .map(|(_, n)| n)
            .sum();
        if non2xx > 0 && !ws {
            let _ = writeln!(s, "  Non-2xx responses: {non2xx}");
        }
        let e = &self.errors;
        let _ = writeln!(
            s,
            "Errors: connect {}, read {}, write {}, timeout {}, parse {}, reset {}",
            e.connect, e.read, e.write, e.timeout, e.parse, e.reset
        );
        s
    }
}

/// Formats a byte count like wrk (`12.34MB`).
pub fn fmt_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2}{}", UNITS[i])
}

/// Formats microseconds with an adaptive unit (`850us`, `1.25ms`, `2.00s`).
pub fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_from_known_values() {
        let mut t = ThreadStats::new();
        // 1..=10_000 us, one each.
        for us in 1..=10_000u64 {
            t.record(200, Duration::from_micros(us));
        }
        let l = Latency::from_histogram(&t.hist);
        // 3 significant figures: values within 0.1%.
        let close = |got: u64, want: u64| {
            let tol = (want as f64 * 0.001).max(1.0);
            assert!((got as f64 - want as f64).abs() <= tol, "{got} vs {want}");
        };
        close(l.p50, 5_000);
        close(l.p90, 9_000);
        close(l.p99, 9_900);
        close(l.p99_9, 9_990);
        close(l.p99_99, 9_999);
        close(l.max, 10_000);
        assert!((l.mean - 5000.5).abs() < 5.0, "{}", l.mean);
        assert_eq!(t.requests, 10_000);
    }

    #[test]
    fn merge_and_report() {
        let mut a = ThreadStats::new();
        let mut b = ThreadStats::new();
        for _ in 0..99 {
            a.record(200, Duration::from_micros(100));
        }
        b.record(503, Duration::from_millis(50));
        b.error(ErrorKind::Timeout, 2);
        b.bytes_read = 1000;
        a.merge(&b);
        let info = RunInfo {
            url: "http://127.0.0.1/".into(),
            connections: 2,
            threads: 2,
            protocol: "http/1.1",
            pipeline: 1,
            streams: None,
            rate: None,
        };
        let r = Report::build(info, &a, Duration::from_secs(2));
        assert_eq!(r.requests, 100);
        assert_eq!(r.rps, 50.0);
        assert_eq!(r.status.get("200"), Some(&99));
        assert_eq!(r.status.get("503"), Some(&1));
        assert_eq!(r.errors.timeout, 2);
        assert_eq!(r.latency_us.p50, 100);
        assert_eq!(r.latency_us.p99, 100);
        // 50 ms recorded with 3 significant figures.
        assert!((49_950..=50_050).contains(&r.latency_us.max));
        let json = serde_json::to_value(&r).expect("json");
        for key in [
            "url",
            "connections",
            "threads",
            "pipeline",
            "rate",
            "duration_s",
            "requests",
            "rps",
            "bytes_read",
            "errors",
            "status",
            "latency_us",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        assert!(json["rate"].is_null());
        assert!(json["latency_us"]["p99_99"].is_u64());
        assert!(json["errors"]["parse"].is_u64());
        assert!(r.to_human().contains("Non-2xx responses: 1"));
    }
}
