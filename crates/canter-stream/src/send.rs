//! `canter send`: replays framed records from a file to a pipeline's source, paced.
//!
//! With `--rate N` the k-th batch is due at `start + k * batch / N`: a sender that falls behind
//! sends at once until it is back on schedule instead of stretching the schedule, so a slow
//! receiver shows as lag (reported) rather than as a lower offered rate (no coordinated
//! omission).

use std::fs;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::frame::{self, DEFAULT_MAX_FRAME};

/// What [`run`] sends, where, and how fast (`canter send`'s flags, which build it, document
/// each field too).
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Where to send (a framed TCP source).
    pub to: SocketAddr,
    /// Framed records to send (4-byte big-endian length, then the record).
    pub file: PathBuf,
    /// Records per second (`None`: as fast as the connection takes them).
    pub rate: Option<f64>,
    /// Records per write.
    pub batch: usize,
    /// Start over at the end of the file (until `duration`).
    pub repeat: bool,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Largest record accepted in the file.
    pub max_frame: usize,
}

impl SendOptions {
    /// The records of `file` to `to`, once, as fast as they are taken, one per write.
    pub fn new(to: SocketAddr, file: impl Into<PathBuf>) -> SendOptions {
        SendOptions {
            to,
            file: file.into(),
            rate: None,
            batch: 1,
            repeat: false,
            duration: None,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// What was sent.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Records sent.
    pub records: u64,
    /// Seconds from the first write to the last.
    pub seconds: f64,
    /// Records per second achieved.
    pub rate: f64,
    /// The furthest the sender fell behind its schedule, in milliseconds (0 without --rate).
    pub max_lag_ms: f64,
}

/// Why `canter send` stopped early.
#[derive(Debug)]
pub enum SendError {
    /// The file cannot be read.
    File(PathBuf, io::Error),
    /// The file is not a sequence of frames, or holds none.
    Frames(PathBuf, String),
    /// Connecting or writing failed.
    Io(SocketAddr, io::Error),
    /// Flags that do not go together.
    Usage(&'static str),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::File(p, e) => write!(f, "{}: {e}", p.display()),
            SendError::Frames(p, e) => write!(f, "{}: {e}", p.display()),
            SendError::Io(a, e) => write!(f, "{a}: {e}"),
            SendError::Usage(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SendError {}

/// Runs `canter send` with a file.
pub fn run(args: &SendOptions) -> Result<Report, SendError> {
    let (to, file) = (args.to, &args.file);
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(SendError::Usage("--rate must be above 0"));
    }
    if args.repeat && args.duration.is_none() {
        return Err(SendError::Usage("--repeat needs --duration"));
    }
    let data = fs::read(file).map_err(|e| SendError::File(file.clone(), e))?;
    let frames = frame::frames(&data, args.max_frame)
        .map_err(|e| SendError::Frames(file.clone(), e.to_string()))?;
    if frames.is_empty() {
        return Err(SendError::Frames(file.clone(), "no records".into()));
    }
    let mut stream = connect(to)?;
    let pace = Pace {
        rate: args.rate,
        batch: args.batch,
        repeat: args.repeat,
        duration: args.duration,
    };
    let report = pace
        .send(&mut stream, &data, &frames)
        .map_err(|e| SendError::Io(to, e))?;
    let _ = stream.shutdown(Shutdown::Write);
    Ok(report)
}

/// How records are paced onto a connection: with a rate, the k-th batch is due at
/// `start + k * batch / rate` (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Records per second (`None`: as fast as the connection takes them).
    pub rate: Option<f64>,
    /// Records per write.
    pub batch: usize,
    /// Start over at the end of the frames (until `duration`).
    pub repeat: bool,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

impl Pace {
    /// Sends `frames` (ranges of `data`, consecutive) on `stream`: batch by batch, each batch
    /// at its due time when there is a rate, or at once when the sender is behind.
    pub fn send(
        &self,
        stream: &mut TcpStream,
        data: &[u8],
        frames: &[std::ops::Range<usize>],
    ) -> io::Result<Report> {
        let batch = self.batch.max(1);
        let started = Instant::now();
        let mut sent = 0u64;
        let mut next = 0;
        let mut max_lag = Duration::ZERO;
        loop {
            if self.duration.is_some_and(|d| started.elapsed() >= d) {
                break;
            }
            if next == frames.len() {
                if !self.repeat || frames.is_empty() {
                    break;
                }
                next = 0;
            }
            let n = batch.min(frames.len() - next);
            if let Some(rate) = self.rate {
                let due = started + Duration::from_secs_f64(sent as f64 / rate);
                let now = Instant::now();
                match due.checked_duration_since(now) {
                    Some(wait) if !wait.is_zero() => thread::sleep(wait),
                    _ => max_lag = max_lag.max(now - due),
                }
            }
            // Consecutive frames are contiguous: one write per batch.
            stream.write_all(&data[frames[next].start..frames[next + n - 1].end])?;
            sent += n as u64;
            next += n;
        }
        let seconds = started.elapsed().as_secs_f64();
        Ok(Report {
            records: sent,
            seconds,
            rate: if seconds > 0.0 {
                sent as f64 / seconds
            } else {
                0.0
            },
            max_lag_ms: max_lag.as_secs_f64() * 1e3,
        })
    }
}

/// Connects, retrying for up to 5 s while the receiving side starts.
pub fn connect(to: SocketAddr) -> Result<TcpStream, SendError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect(to) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) if Instant::now() >= deadline => return Err(SendError::Io(to, e)),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}
