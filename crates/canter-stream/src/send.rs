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
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SendArgs {
    /// Generate the records instead of reading them from a file.
    #[command(subcommand)]
    pub generate: Option<Generate>,
    /// Where to send (a framed TCP source).
    #[arg(long, required = true)]
    pub to: Option<SocketAddr>,
    /// Framed records to send (4-byte big-endian length, then the record; as `canter receive
    /// --out` writes them).
    #[arg(long, value_name = "FILE", required = true)]
    pub file: Option<PathBuf>,
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

/// Record generators of `canter send`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Generate {
    /// Market Spread's NBBO and order streams (half each), sent to the two sources and/or
    /// written with the expected results to --write-dir.
    MarketSpread(MarketSpreadArgs),
}

/// CLI arguments of `canter send market-spread`.
#[derive(clap::Args, Debug, Clone)]
pub struct MarketSpreadArgs {
    /// The NBBO source (needs --orders too).
    #[arg(long, requires = "orders")]
    pub nbbo: Option<SocketAddr>,
    /// The order source (needs --nbbo too).
    #[arg(long, requires = "nbbo")]
    pub orders: Option<SocketAddr>,
    /// Symbols quoted and ordered.
    #[arg(long, default_value_t = 1_000)]
    pub symbols: usize,
    /// Share of orders whose symbol's spread rejects them.
    #[arg(long, default_value_t = 0.1)]
    pub reject_share: f64,
    /// Input records in all, half quotes and half orders.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: u64,
    /// Write nbbo.bin, orders.bin and expected.bin (the results, timestamps 0) to this
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub write_dir: Option<PathBuf>,
    /// Records per second over both streams (default: as fast as they are taken).
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// Records per write.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub batch: usize,
    /// Seed of the generator (the same seed gives the same records).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What `canter send market-spread` did.
#[derive(Debug, Clone, Serialize)]
pub struct MarketSpreadReport {
    /// The NBBO stream (none when only writing files).
    pub nbbo: Option<Report>,
    /// The order stream.
    pub orders: Option<Report>,
    /// Results the orders must produce.
    pub expected_results: u64,
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
pub fn run(args: &SendArgs) -> Result<Report, SendError> {
    let (Some(to), Some(file)) = (args.to, args.file.as_ref()) else {
        return Err(SendError::Usage("give --to and --file"));
    };
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

/// Runs `canter send market-spread`.
pub fn run_market_spread(args: &MarketSpreadArgs) -> Result<MarketSpreadReport, SendError> {
    if args.write_dir.is_none() && args.nbbo.is_none() {
        return Err(SendError::Usage(
            "give --nbbo and --orders, or --write-dir, or both",
        ));
    }
    if !(0.0..=1.0).contains(&args.reject_share) {
        return Err(SendError::Usage("--reject-share is a share: from 0 to 1"));
    }
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(SendError::Usage("--rate must be above 0"));
    }
    let g = crate::market_spread::generate(args.symbols, args.reject_share, args.count, args.seed);
    if let Some(dir) = &args.write_dir {
        fs::create_dir_all(dir).map_err(|e| SendError::File(dir.clone(), e))?;
        for (name, data) in [
            ("nbbo.bin", &g.nbbo),
            ("orders.bin", &g.orders),
            ("expected.bin", &g.expected),
        ] {
            let path = dir.join(name);
            fs::write(&path, data).map_err(|e| SendError::File(path, e))?;
        }
    }
    let mut report = MarketSpreadReport {
        nbbo: None,
        orders: None,
        expected_results: g.expected_count,
    };
    let (Some(nbbo_to), Some(orders_to)) = (args.nbbo, args.orders) else {
        return Ok(report);
    };
    let all = |data: &[u8]| {
        frame::frames(data, usize::MAX)
            .map_err(|e| SendError::Frames(PathBuf::from("generated"), e.to_string()))
    };
    let nbbo_frames = all(&g.nbbo)?;
    let order_frames = all(&g.orders)?;
    let mut nbbo = connect(nbbo_to)?;
    let mut orders = connect(orders_to)?;
    // Every symbol's first quote goes first, and a moment ahead of the orders, so that no order
    // meets a symbol still in its initial state (the results would then depend on timing).
    let first = g.nbbo_count.min(args.symbols as u64) as usize;
    let head = first.min(nbbo_frames.len());
    if head > 0 {
        nbbo.write_all(&g.nbbo[..nbbo_frames[head - 1].end])
            .map_err(|e| SendError::Io(nbbo_to, e))?;
        nbbo.flush().map_err(|e| SendError::Io(nbbo_to, e))?;
        thread::sleep(Duration::from_millis(200));
    }
    let pace = Pace {
        rate: args.rate.map(|r| r / 2.0),
        batch: args.batch,
        repeat: false,
        duration: None,
    };
    let (nbbo_report, orders_report) = thread::scope(|scope| {
        let rest = &nbbo_frames[head..];
        let quotes = scope.spawn(|| pace.send(&mut nbbo, &g.nbbo, rest));
        let sent = pace.send(&mut orders, &g.orders, &order_frames);
        (quotes.join(), sent)
    });
    let mut nbbo_report = match nbbo_report {
        Ok(r) => r.map_err(|e| SendError::Io(nbbo_to, e))?,
        Err(_) => return Err(SendError::Usage("the NBBO sender thread panicked")),
    };
    nbbo_report.records += head as u64;
    report.nbbo = Some(nbbo_report);
    report.orders = Some(orders_report.map_err(|e| SendError::Io(orders_to, e))?);
    let _ = nbbo.shutdown(Shutdown::Write);
    let _ = orders.shutdown(Shutdown::Write);
    Ok(report)
}

/// How records are paced onto a connection.
#[derive(Debug, Clone, Copy)]
struct Pace {
    rate: Option<f64>,
    batch: usize,
    repeat: bool,
    duration: Option<Duration>,
}

impl Pace {
    /// Sends `frames` (ranges of `data`, consecutive) on `stream`: batch by batch, each batch
    /// at its due time when there is a rate, or at once when the sender is behind.
    fn send(
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
