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

use canter_load::parse_duration;
use serde::Serialize;

use crate::frame::{self, DEFAULT_MAX_FRAME};

/// CLI arguments of `canter send`.
#[derive(clap::Args, Debug, Clone)]
pub struct SendArgs {
    /// Where to send (a framed TCP source).
    #[arg(long)]
    pub to: SocketAddr,
    /// Framed records to send (4-byte big-endian length, then the record; as `canter receive
    /// --out` writes them).
    #[arg(long, value_name = "FILE")]
    pub file: PathBuf,
    /// Records per second (default: as fast as the connection takes them).
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// Records per write.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batch: usize,
    /// Start over at the end of the file (until --duration).
    #[arg(long)]
    pub repeat: bool,
    /// Stop after this long (`30s`).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Largest record accepted in the file.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
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

/// Runs `canter send`.
pub fn run(args: &SendArgs) -> Result<Report, SendError> {
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(SendError::Usage("--rate must be above 0"));
    }
    if args.repeat && args.duration.is_none() {
        return Err(SendError::Usage("--repeat needs --duration"));
    }
    let data = fs::read(&args.file).map_err(|e| SendError::File(args.file.clone(), e))?;
    let frames = frame::frames(&data, args.max_frame)
        .map_err(|e| SendError::Frames(args.file.clone(), e.to_string()))?;
    if frames.is_empty() {
        return Err(SendError::Frames(args.file.clone(), "no records".into()));
    }
    let mut stream = connect(args.to)?;
    let batch = args.batch.max(1);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut next = 0;
    let mut max_lag = Duration::ZERO;
    loop {
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if next == frames.len() {
            if !args.repeat {
                break;
            }
            next = 0;
        }
        let n = batch.min(frames.len() - next);
        if let Some(rate) = args.rate {
            let due = started + Duration::from_secs_f64(sent as f64 / rate);
            let now = Instant::now();
            match due.checked_duration_since(now) {
                Some(wait) if !wait.is_zero() => thread::sleep(wait),
                _ => max_lag = max_lag.max(now - due),
            }
        }
        // Consecutive frames are contiguous in the file: one write per batch.
        let bytes = &data[frames[next].start..frames[next + n - 1].end];
        stream
            .write_all(bytes)
            .map_err(|e| SendError::Io(args.to, e))?;
        sent += n as u64;
        next += n;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stream.shutdown(Shutdown::Write);
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

/// Connects, retrying for up to 5 s while the receiving side starts.
fn connect(to: SocketAddr) -> Result<TcpStream, SendError> {
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
