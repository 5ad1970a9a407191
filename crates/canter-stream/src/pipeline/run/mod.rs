//! Running a topology: one thread per worker, each with its own single-threaded event loop.
//!
//! On each worker, every source connection is a connection actor (`canter_rt::proto`) whose
//! protocol decodes frames and runs the pipeline's fused steps inline. A record whose key the
//! worker owns goes straight on to the stateful step and the sink buffer in the same call; one
//! whose key lives elsewhere joins that worker's batch, handed over at the end of the read.
//! The sink of each pipeline on each worker is a buffer. A TCP sink's buffer is written to its
//! socket by the source connection that produced the records, at the end of each read, so a
//! result does not wait for the rest of the worker's turn; the sink's own task writes only what
//! the socket had no room for, resumes the sources, and reconnects. A file sink's task writes
//! its file.
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

mod barrier;
mod ckpt;
mod ckpt_group;
mod ckpt_task;
mod def;
mod env;
mod input;
mod link;
mod process;
mod sink;
mod sink_buf;
mod source;
mod threads;
mod wait;
mod wire;

pub(crate) use def::{Def, PipelineDef};
pub(crate) use threads::start;
pub use threads::{Running, Shutdown};
pub use wire::{Group, Wire};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Now, in ns since the Unix epoch.
pub(super) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The time now, through tokio's clock: `Instant::now()` in a build without tokio's
/// `test-util`, and the paused, virtual clock in the unit tests that pause it (the sinks'
/// timeouts are tested without waiting for them).
#[inline]
fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}
