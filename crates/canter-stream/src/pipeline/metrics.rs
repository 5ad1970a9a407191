//! Metrics per pipeline, step and worker: counts, throughput over time, and HDR latency
//! histograms from source read to sink write.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies tracked up to an hour, in ns, 3 significant figures.
const MAX_NS: u64 = 3_600_000_000_000;
/// Seconds of history kept for the live page.
const HISTORY: usize = 600;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("1 ns to an hour at 3 figures is valid")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A topology's checkpoints so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CheckpointTotals {
    /// Checkpoints written (durable).
    pub completed: u64,
    /// Checkpoints that could not be written (the directory full, read-only, gone...); the
    /// pipeline keeps running and the next checkpoint carries their changes.
    pub failed: u64,
    /// Checkpoints whose workers did not all answer in time (at the end of the input).
    pub abandoned: u64,
    /// The last completed checkpoint's epoch.
    pub last_epoch: u64,
    /// Keys in the last completed checkpoint (changed since the one before).
    pub last_keys: u64,
    /// The last completed checkpoint file's size.
    pub last_bytes: u64,
    /// From the last checkpoint's start until every worker had taken its snapshot, in µs.
    pub last_align_us: u64,
    /// Writing the last checkpoint's file (and syncing it), in µs.
    pub last_write_us: u64,
    /// The checkpoint the topology started from (0: none).
    pub restored_epoch: u64,
}

#[derive(Default)]
pub(crate) struct CheckpointCounters {
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) last_epoch: AtomicU64,
    pub(crate) last_keys: AtomicU64,
    pub(crate) last_bytes: AtomicU64,
    pub(crate) last_align_us: AtomicU64,
    pub(crate) last_write_us: AtomicU64,
    pub(crate) restored_epoch: AtomicU64,
}

/// Latencies of one pipeline on one worker.
pub(crate) struct Latency {
    total: Histogram<u64>,
    interval: Histogram<u64>,
}

impl Latency {
    /// Records `count` records read at `read_ns` and written at `now_ns`.
    pub(crate) fn record(&mut self, now_ns: u64, read_ns: u64, count: u64) {
        let v = now_ns.saturating_sub(read_ns).clamp(1, MAX_NS);
        let _ = self.total.record_n(v, count);
        let _ = self.interval.record_n(v, count);
    }
}

/// One worker's counters for one pipeline (written by that worker only).
pub(crate) struct WorkerCounters {
    pub(crate) source: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) frame_errors: AtomicU64,
    pub(crate) sink: AtomicU64,
    pub(crate) late: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) steps: Vec<AtomicU64>,
    pub(crate) latency: Mutex<Latency>,
}

/// One pipeline's metrics.
pub(crate) struct PipeMetrics {
    pub(crate) name: String,
    pub(crate) steps: Vec<String>,
    pub(crate) workers: Vec<WorkerCounters>,
}

impl PipeMetrics {
    pub(crate) fn new(name: &str, steps: Vec<String>, workers: usize) -> Self {
        PipeMetrics {
            name: name.to_owned(),
            workers: (0..workers)
                .map(|_| WorkerCounters {
                    source: AtomicU64::new(0),
                    rejected: AtomicU64::new(0),
                    frame_errors: AtomicU64::new(0),
                    sink: AtomicU64::new(0),
                    late: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                    steps: steps.iter().map(|_| AtomicU64::new(0)).collect(),
                    latency: Mutex::new(Latency {
                        total: histogram(),
                        interval: histogram(),
                    }),
                })
                .collect(),
            steps,
        }
    }

    fn sum(&self, f: impl Fn(&WorkerCounters) -> &AtomicU64) -> u64 {
        self.workers.iter().map(|w| f(w).load(Relaxed)).sum()
    }

    fn totals(&self) -> Totals {
        Totals {
            source_records: self.sum(|w| &w.source),
            rejected_input: self.sum(|w| &w.rejected),
            frame_errors: self.sum(|w| &w.frame_errors),
            sink_records: self.sum(|w| &w.sink),
            late_records: self.sum(|w| &w.late),
            dropped_windows: self.sum(|w| &w.dropped),
        }
    }

    fn latency(&self, interval: bool) -> Histogram<u64> {
        let mut all = histogram();
        for w in &self.workers {
            let mut l = lock(&w.latency);
            let _ = all.add(if interval { &l.interval } else { &l.total });
            if interval {
                l.interval.reset();
            }
        }
        all
    }
}

/// A pipeline's counts so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Records read from the source (decoded or not).
    pub source_records: u64,
    /// Records that did not decode (wrong size or type), counted and logged, not processed.
    pub rejected_input: u64,
    /// Broken frames (each closed its source connection).
    pub frame_errors: u64,
    /// Records handed to the sink.
    pub sink_records: u64,
    /// Items dropped as too late for their event-time window.
    pub late_records: u64,
    /// Windows dropped short at the end of the input (count windows that keep only full ones).
    pub dropped_windows: u64,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Records measured.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
    /// 99.99th.
    pub p9999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        Percentiles {
            count: h.len(),
            p50: us(0.5),
            p99: us(0.99),
            p999: us(0.999),
            p9999: us(0.9999),
            max: h.max() as f64 / 1e3,
        }
    }
}

/// One pipeline in one second of history.
#[derive(Debug, Clone, Serialize)]
pub struct PipeSample {
    /// Input records per second.
    pub in_rate: f64,
    /// Output records per second.
    pub out_rate: f64,
    /// Latency of the records written in that second.
    pub latency_us: Percentiles,
}

/// One second of history.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    /// Per pipeline, in the order they were added.
    pub pipelines: Vec<PipeSample>,
}

struct History {
    last_at: Instant,
    last: Vec<(u64, u64)>,
    samples: VecDeque<Sample>,
}

/// Metrics of a running topology, read by any thread.
pub struct Metrics {
    pub(crate) pipes: Vec<std::sync::Arc<PipeMetrics>>,
    started: Instant,
    history: Mutex<History>,
    pub(crate) checkpoints: CheckpointCounters,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("pipelines", &self.pipes.len())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct PipeView<'a> {
    name: &'a str,
    workers: usize,
    totals: Totals,
    steps: Vec<(&'a str, u64)>,
    latency_us: Percentiles,
}

#[derive(Serialize)]
struct View<'a> {
    uptime: f64,
    checkpoints: CheckpointTotals,
    pipelines: Vec<PipeView<'a>>,
    history: Vec<&'a Sample>,
}

impl Metrics {
    pub(crate) fn new(pipes: Vec<std::sync::Arc<PipeMetrics>>) -> Self {
        let now = Instant::now();
        Metrics {
            history: Mutex::new(History {
                last_at: now,
                last: vec![(0, 0); pipes.len()],
                samples: VecDeque::new(),
            }),
            pipes,
            started: now,
            checkpoints: CheckpointCounters::default(),
        }
    }

    /// Checkpoints so far (all zero when the topology does not checkpoint).
    pub fn checkpoints(&self) -> CheckpointTotals {
        let c = &self.checkpoints;
        CheckpointTotals {
            completed: c.completed.load(Relaxed),
            failed: c.failed.load(Relaxed),
            abandoned: c.abandoned.load(Relaxed),
            last_epoch: c.last_epoch.load(Relaxed),
            last_keys: c.last_keys.load(Relaxed),
            last_bytes: c.last_bytes.load(Relaxed),
            last_align_us: c.last_align_us.load(Relaxed),
            last_write_us: c.last_write_us.load(Relaxed),
            restored_epoch: c.restored_epoch.load(Relaxed),
        }
    }

    /// The names of the pipelines.
    pub fn pipelines(&self) -> Vec<&str> {
        self.pipes.iter().map(|p| p.name.as_str()).collect()
    }

    /// A pipeline's counts so far.
    pub fn totals(&self, pipeline: &str) -> Option<Totals> {
        self.pipes
            .iter()
            .find(|p| p.name == pipeline)
            .map(|p| p.totals())
    }

    /// A pipeline's latency percentiles since the start.
    pub fn latency(&self, pipeline: &str) -> Option<Percentiles> {
        self.pipes
            .iter()
            .find(|p| p.name == pipeline)
            .map(|p| Percentiles::of(&p.latency(false)))
    }

    /// Takes one second of history (the runner calls it every second).
    pub fn sample(&self) {
        let mut h = lock(&self.history);
        let now = Instant::now();
        let secs = (now - h.last_at).as_secs_f64().max(1e-3);
        let mut pipelines = Vec::with_capacity(self.pipes.len());
        for (i, p) in self.pipes.iter().enumerate() {
            let t = p.totals();
            let (src, sink) = h.last[i];
            h.last[i] = (t.source_records, t.sink_records);
            pipelines.push(PipeSample {
                in_rate: (t.source_records - src) as f64 / secs,
                out_rate: (t.sink_records - sink) as f64 / secs,
                latency_us: Percentiles::of(&p.latency(true)),
            });
        }
        h.last_at = now;
        h.samples.push_back(Sample {
            t: (now - self.started).as_secs_f64(),
            pipelines,
        });
        while h.samples.len() > HISTORY {
            h.samples.pop_front();
        }
    }

    /// Everything as JSON: totals, steps and latency per pipeline, and the history (one
    /// sample a second, the last ten minutes) that the live page draws.
    pub fn json(&self) -> String {
        let h = lock(&self.history);
        let view = View {
            uptime: self.started.elapsed().as_secs_f64(),
            checkpoints: self.checkpoints(),
            pipelines: self
                .pipes
                .iter()
                .map(|p| PipeView {
                    name: &p.name,
                    workers: p.workers.len(),
                    totals: p.totals(),
                    steps: p
                        .steps
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (s.as_str(), p.sum(|w| &w.steps[i])))
                        .collect(),
                    latency_us: Percentiles::of(&p.latency(false)),
                })
                .collect(),
            history: h.samples.iter().collect(),
        };
        serde_json::to_string(&view).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The Prometheus text exposition: counters per pipeline and worker, step counts, and the
    /// latency from source read to sink write as a summary.
    pub fn prometheus(&self) -> String {
        let mut s = String::with_capacity(4096);
        let counters: [(&str, &str, fn(&WorkerCounters) -> &AtomicU64); 6] = [
            (
                "canter_source_records_total",
                "Records read from a pipeline's source.",
                |w| &w.source,
            ),
            (
                "canter_sink_records_total",
                "Records a pipeline handed to its sink.",
                |w| &w.sink,
            ),
            (
                "canter_rejected_input_total",
                "Input records of the wrong size or type.",
                |w| &w.rejected,
            ),
            (
                "canter_frame_errors_total",
                "Broken frames (each closed its source connection).",
                |w| &w.frame_errors,
            ),
            (
                "canter_late_records_total",
                "Items too late for their event-time window.",
                |w| &w.late,
            ),
            (
                "canter_dropped_windows_total",
                "Windows dropped short at the end of the input.",
                |w| &w.dropped,
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            for p in &self.pipes {
                for (i, w) in p.workers.iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "{name}{{pipeline=\"{}\",worker=\"{i}\"}} {}",
                        p.name,
                        get(w).load(Relaxed)
                    );
                }
            }
        }
        let c = self.checkpoints();
        let name = "canter_checkpoints_total";
        let _ = writeln!(
            s,
            "# HELP {name} Checkpoints by result.\n# TYPE {name} counter\n\
             {name}{{result=\"completed\"}} {}\n{name}{{result=\"failed\"}} {}\n\
             {name}{{result=\"abandoned\"}} {}",
            c.completed, c.failed, c.abandoned
        );
        let name = "canter_step_records_total";
        let _ = writeln!(
            s,
            "# HELP {name} Items each stateless step took.\n# TYPE {name} counter"
        );
        for p in &self.pipes {
            for (j, step) in p.steps.iter().enumerate() {
                for (i, w) in p.workers.iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "{name}{{pipeline=\"{}\",step=\"{step}\",worker=\"{i}\"}} {}",
                        p.name,
                        w.steps[j].load(Relaxed)
                    );
                }
            }
        }
        let name = "canter_pipeline_latency_seconds";
        let _ = writeln!(
            s,
            "# HELP {name} From source read to sink write.\n# TYPE {name} summary"
        );
        for p in &self.pipes {
            let h = p.latency(false);
            for q in [0.5, 0.9, 0.99, 0.999, 0.9999] {
                let _ = writeln!(
                    s,
                    "{name}{{pipeline=\"{}\",quantile=\"{q}\"}} {:e}",
                    p.name,
                    h.value_at_quantile(q) as f64 / 1e9
                );
            }
            let _ = writeln!(s, "{name}_count{{pipeline=\"{}\"}} {}", p.name, h.len());
        }
        s
    }
}
