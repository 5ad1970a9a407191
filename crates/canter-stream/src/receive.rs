//! `canter receive`: accepts the sink connections of a pipeline and measures what arrives.
//!
//! Each record is counted, appended (framed, as received) to `--out` if given, and its
//! end-to-end latency taken from the timestamp it carries: a u64, big-endian, nanoseconds since
//! the Unix epoch (by default the record's last 8 bytes, as in Market Spread's results), against
//! the time the bytes were read. Latencies go into an HDR histogram (3 significant digits).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::frame::{self, DEFAULT_MAX_FRAME};
use crate::resend::{Dedupe, Seq};

/// What [`run`] listens on, when it stops and what it writes (`canter receive`'s flags, which
/// build it, document each field too).
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Address to listen on (port 0 picks a free one; the address is printed on stderr).
    pub listen: SocketAddr,
    /// Stop when this many records have arrived.
    pub expect: Option<u64>,
    /// Stop after this long even if `expect` was not reached.
    pub duration: Option<Duration>,
    /// Append every record to this file as it arrives, framed as received (written whenever
    /// the connections go quiet, at least once a second, and on every way out).
    pub out: Option<PathBuf>,
    /// Where each record's timestamp starts (u64 big-endian, ns since the Unix epoch);
    /// negative counts from the record's end (-8: its last 8 bytes).
    pub timestamp_offset: i64,
    /// Largest record accepted; a larger frame closes its connection with an error.
    pub max_frame: usize,
    /// A line of throughput and latency on stderr this often (zero: none).
    pub interval: Duration,
    /// Records carry a sequence header ([`crate::resend`], a checkpointing pipeline's sink):
    /// repeats are dropped and counted, each connection's frames are acknowledged, and
    /// `out` gets the records without their headers.
    pub dedupe: bool,
}

impl ReceiveOptions {
    /// Listening on `listen` until stopped by a signal, timestamps in each record's last 8
    /// bytes, a line on stderr every second.
    pub fn new(listen: SocketAddr) -> ReceiveOptions {
        ReceiveOptions {
            listen,
            expect: None,
            duration: None,
            out: None,
            timestamp_offset: -8,
            max_frame: DEFAULT_MAX_FRAME,
            interval: Duration::from_secs(1),
            dedupe: false,
        }
    }
}

/// Latency percentiles, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Records with a usable timestamp.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99.99th percentile.
    pub p9999: f64,
    /// Largest.
    pub max: f64,
}

/// What arrived.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Records received.
    pub records: u64,
    /// Record bytes received (frame headers excluded).
    pub bytes: u64,
    /// Seconds from the first record to the last.
    pub seconds: f64,
    /// Records per second over that time.
    pub rate: f64,
    /// End-to-end latency.
    pub latency_us: Percentiles,
    /// Records received in each second since the first.
    pub per_second: Vec<u64>,
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed for a broken or oversized frame.
    pub frame_errors: u64,
    /// Records too short to hold a timestamp, stamped in the future, or over an hour old.
    pub no_timestamp: u64,
    /// Whether --expect was reached (true without --expect).
    pub complete: bool,
    /// With --dedupe: results dropped as repeats (not counted in `records`).
    pub repeats: u64,
    /// With --dedupe: records too short for a sequence header (kept).
    pub no_sequence: u64,
}

struct Shared {
    first: Option<Instant>,
    last: Option<Instant>,
    records: u64,
    bytes: u64,
    latency: Histogram<u64>,
    per_second: Vec<u64>,
    connections: u64,
    frame_errors: u64,
    no_timestamp: u64,
    out: Option<BufWriter<File>>,
    dedupe: Dedupe,
    no_sequence: u64,
}

/// `--out` is written at least this often while records arrive without a pause.
const OUT_EVERY: Duration = Duration::from_secs(1);

/// Runs `canter receive` until --expect records arrived, --duration passed, or SIGINT or SIGTERM
/// came.
pub fn run(args: &ReceiveOptions) -> io::Result<Report> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        canter_rt::on_signals(move || stop.store(true, std::sync::atomic::Ordering::Relaxed))?;
    }
    let listener = TcpListener::bind(args.listen)?;
    eprintln!("canter receive: listening on {}", listener.local_addr()?);
    let out = match &args.out {
        Some(path) => Some(BufWriter::with_capacity(
            1 << 20,
            OpenOptions::new().create(true).append(true).open(path)?,
        )),
        None => None,
    };
    let latency = Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let shared = Arc::new(Mutex::new(Shared {
        first: None,
        last: None,
        records: 0,
        bytes: 0,
        latency,
        per_second: Vec::new(),
        connections: 0,
        frame_errors: 0,
        no_timestamp: 0,
        out,
        dedupe: Dedupe::default(),
        no_sequence: 0,
    }));
    {
        let shared = shared.clone();
        let args = args.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = shared.clone();
                let args = args.clone();
                thread::spawn(move || serve(stream, &shared, &args));
            }
        });
    }
    let started = Instant::now();
    let mut next_line = started + args.interval;
    let mut last_count = 0;
    // Records as of the last turn, and when `--out` was last written.
    let (mut seen, mut written) = (0, started);
    // When SIGINT or SIGTERM came.
    let mut signalled = None;
    loop {
        thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        let (records, complete, quiet) = {
            let mut s = lock(&shared);
            let quiet = s.records == seen;
            // Write what `--out` holds once the connections went quiet for a turn, and at
            // least every OUT_EVERY: a reader of the file sees the records as they come.
            if quiet || now - written >= OUT_EVERY {
                written = now;
                if let Some(out) = s.out.as_mut() {
                    if let Err(e) = out.flush() {
                        eprintln!("canter receive: cannot write --out: {e}");
                        s.out = None;
                    }
                }
            }
            seen = s.records;
            (
                s.records,
                args.expect.is_some_and(|n| s.records >= n),
                quiet,
            )
        };
        // On a signal, what the connections still have to read is taken first (until a quiet
        // turn, for OUT_EVERY at most), so that the report and the file hold what was sent
        // before it.
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            let since = *signalled.get_or_insert(now);
            if quiet || now - since >= OUT_EVERY {
                break;
            }
        }
        if complete || args.duration.is_some_and(|d| now - started >= d) {
            break;
        }
        if !args.interval.is_zero() && now >= next_line {
            let s = lock(&shared);
            eprintln!(
                "{:>6.1}s {:>12} records {:>12.0}/s  p50 {:.1} us  p99 {:.1} us  p99.99 {:.1} us",
                (now - started).as_secs_f64(),
                records,
                (records - last_count) as f64 / args.interval.as_secs_f64(),
                s.latency.value_at_quantile(0.5) as f64 / 1e3,
                s.latency.value_at_quantile(0.99) as f64 / 1e3,
                s.latency.value_at_quantile(0.9999) as f64 / 1e3,
            );
            last_count = records;
            next_line += args.interval;
        }
    }
    let mut s = lock(&shared);
    if let Some(out) = s.out.as_mut() {
        out.flush()?;
    }
    let seconds = match (s.first, s.last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let us = |q: f64| s.latency.value_at_quantile(q) as f64 / 1e3;
    Ok(Report {
        records: s.records,
        bytes: s.bytes,
        seconds,
        rate: if seconds > 0.0 {
            s.records as f64 / seconds
        } else {
            0.0
        },
        latency_us: Percentiles {
            count: s.latency.len(),
            p50: us(0.5),
            p90: us(0.9),
            p99: us(0.99),
            p999: us(0.999),
            p9999: us(0.9999),
            max: s.latency.max() as f64 / 1e3,
        },
        per_second: s.per_second.clone(),
        connections: s.connections,
        frame_errors: s.frame_errors,
        no_timestamp: s.no_timestamp,
        complete: args.expect.is_none_or(|n| s.records >= n),
        repeats: s.dedupe.repeats,
        no_sequence: s.no_sequence,
    })
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // A connection thread that panicked leaves the counts as they were: keep reporting them.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads one connection to its end, accounting each chunk of whole frames under the lock.
fn serve(mut stream: TcpStream, shared: &Mutex<Shared>, args: &ReceiveOptions) {
    let peer = stream.peer_addr().ok();
    lock(shared).connections += 1;
    let mut buf = vec![0u8; 256 * 1024];
    let mut filled = 0;
    // Frames received on this connection (acknowledged with --dedupe), and the records kept
    // of a chunk (with --dedupe, without their headers).
    let mut frames = 0u64;
    let mut kept = Vec::new();
    loop {
        if filled == buf.len() {
            // One frame larger than the buffer (within --max-frame): grow to hold it.
            buf.resize(buf.len() * 2, 0);
        }
        let n = match stream.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        filled += n;
        let now = Instant::now();
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut s = lock(shared);
        let first = *s.first.get_or_insert(now);
        let second = (now - first).as_secs() as usize;
        let before = s.records;
        kept.clear();
        let used = {
            let s = &mut *s;
            frame::split(&buf[..filled], args.max_frame, |mut record| {
                frames += 1;
                if args.dedupe {
                    match Seq::split(record) {
                        Some((seq, rest)) => {
                            if !s.dedupe.keep(&seq) {
                                return;
                            }
                            record = rest;
                        }
                        None => s.no_sequence += 1,
                    }
                    frame::encode(record, &mut kept);
                }
                s.records += 1;
                s.bytes += record.len() as u64;
                // Latencies over the histogram's hour are not timestamps either.
                let recorded = match timestamp(record, args.timestamp_offset) {
                    Some(ts) if ts <= now_ns => s.latency.record((now_ns - ts).max(1)).is_ok(),
                    _ => false,
                };
                if !recorded {
                    s.no_timestamp += 1;
                }
            })
        };
        let used = match used {
            Ok(used) => used,
            Err(e) => {
                s.frame_errors += 1;
                eprintln!("canter receive: closing the connection from {peer:?}: {e}");
                return;
            }
        };
        if used > 0 {
            s.last = Some(now);
            if s.per_second.len() <= second {
                s.per_second.resize(second + 1, 0);
            }
            // Records in this chunk, all counted in the second they were read.
            let records = s.records - before;
            s.per_second[second] += records;
            let chunk = if args.dedupe { &kept[..] } else { &buf[..used] };
            if let Some(out) = s.out.as_mut() {
                if let Err(e) = out.write_all(chunk) {
                    eprintln!("canter receive: cannot write --out: {e}");
                    s.out = None;
                }
            }
        }
        drop(s);
        if args.dedupe && used > 0 && stream.write_all(&frames.to_be_bytes()).is_err() {
            break;
        }
        buf.copy_within(used..filled, 0);
        filled -= used;
    }
}

/// The timestamp at `offset` in `record` (negative: from its end), if the record holds one.
fn timestamp(record: &[u8], offset: i64) -> Option<u64> {
    let start = if offset < 0 {
        record.len().checked_sub(offset.unsigned_abs() as usize)?
    } else {
        offset as usize
    };
    let bytes = record.get(start..start.checked_add(8)?)?;
    let mut ts = [0u8; 8];
    ts.copy_from_slice(bytes);
    Some(u64::from_be_bytes(ts))
}

#[cfg(test)]
mod tests {
    use super::timestamp;

    #[test]
    fn timestamps_from_either_end() {
        let mut record = vec![0xaa; 3];
        record.extend_from_slice(&42u64.to_be_bytes());
        assert_eq!(timestamp(&record, -8), Some(42));
        assert_eq!(timestamp(&record, 3), Some(42));
        assert_eq!(timestamp(&record, 4), None);
        assert_eq!(timestamp(&record[..7], -8), None);
        assert_eq!(timestamp(&record, -100), None);
    }
}
