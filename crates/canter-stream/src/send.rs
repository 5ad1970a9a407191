//! `canter send`: replays framed records from a file to a pipeline's source, paced.
//!
//! With `--rate N` the k-th batch is due at `start + k * batch / N`: a sender that falls behind
//! sends at once until it is back on schedule instead of stretching the schedule, so a slow
//! receiver shows as lag (reported) rather than as a lower offered rate (no coordinated
//! omission).

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::frame::{self, DEFAULT_MAX_FRAME};
use crate::resend;

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
    /// Speak the resend protocol ([`crate::resend`]) as this stream: keep what was sent until
    /// the pipeline acknowledges a checkpoint holding it, and after a lost connection connect
    /// again and send from where the pipeline says (`None`: plain records).
    pub resend: Option<u64>,
    /// With `resend`: how long to keep trying to reach the pipeline again after a lost
    /// connection, and to wait at the end for the acknowledgement of the last record.
    pub reconnect_for: Duration,
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
            resend: None,
            reconnect_for: Duration::from_secs(30),
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
    /// With the resend protocol: connections made again after one was lost.
    pub reconnects: u64,
    /// With the resend protocol: records sent again (the pipeline lost them in a crash, or
    /// the connection did before they were read).
    pub resent: u64,
    /// With the resend protocol: records the pipeline's checkpoints acknowledged.
    pub acked: u64,
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
    let pace = Pace {
        rate: args.rate,
        batch: args.batch,
        repeat: args.repeat,
        duration: args.duration,
    };
    if let Some(id) = args.resend {
        let mut session = Session::new(to, id, &data, &frames, args.reconnect_for)?;
        // Once through the file, what the pipeline holds already is not sent again.
        let held = match args.repeat {
            true => 0,
            false => (session.position() as usize).min(frames.len()),
        };
        let mut report = pace
            .drive(frames.len() - held, |_, n| session.write(n))
            .map_err(|e| SendError::Io(to, e))?;
        session.finish().map_err(|e| SendError::Io(to, e))?;
        session.report(&mut report);
        return Ok(report);
    }
    let mut stream = connect(to)?;
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
        self.drive(frames.len(), |next, n| {
            // Consecutive frames are contiguous: one write per batch.
            stream.write_all(&data[frames[next].start..frames[next + n - 1].end])
        })
    }

    /// Paces `count` records: `write(next, n)` sends records `next..next + n` (of `count`,
    /// from 0 again after the end when repeating).
    pub fn drive(
        &self,
        count: usize,
        mut write: impl FnMut(usize, usize) -> io::Result<()>,
    ) -> io::Result<Report> {
        let frames_len = count;
        let batch = self.batch.max(1);
        let started = Instant::now();
        let mut sent = 0u64;
        let mut next = 0;
        let mut max_lag = Duration::ZERO;
        loop {
            if self.duration.is_some_and(|d| started.elapsed() >= d) {
                break;
            }
            if next == frames_len {
                if !self.repeat || frames_len == 0 {
                    break;
                }
                next = 0;
            }
            let n = batch.min(frames_len - next);
            if let Some(rate) = self.rate {
                let due = started + Duration::from_secs_f64(sent as f64 / rate);
                let now = Instant::now();
                match due.checked_duration_since(now) {
                    Some(wait) if !wait.is_zero() => thread::sleep(wait),
                    _ => max_lag = max_lag.max(now - due),
                }
            }
            write(next, n)?;
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
            reconnects: 0,
            resent: 0,
            acked: 0,
        })
    }
}

/// A sender's side of the resend protocol ([`crate::resend`]) over records held in memory:
/// record `p` of the stream is `frames[p % frames.len()]`. Writes reconnect and resend as
/// the pipeline asks; [`Session::finish`] waits for the last record's acknowledgement.
pub struct Session<'a> {
    to: SocketAddr,
    id: u64,
    data: &'a [u8],
    frames: &'a [std::ops::Range<usize>],
    conn: Option<(TcpStream, Arc<Link>)>,
    /// Records written so far (the next one's position).
    sent: u64,
    reconnect_for: Duration,
    reconnects: u64,
    resent: u64,
    acked: u64,
}

/// What the reading half of a connection learnt.
#[derive(Default)]
struct Link {
    acked: AtomicU64,
    closed: AtomicBool,
}

impl<'a> Session<'a> {
    /// Connects to `to` as stream `id` (retrying for up to `reconnect_for`).
    pub fn new(
        to: SocketAddr,
        id: u64,
        data: &'a [u8],
        frames: &'a [std::ops::Range<usize>],
        reconnect_for: Duration,
    ) -> Result<Session<'a>, SendError> {
        if id == 0 {
            return Err(SendError::Usage("a resend stream id is not 0"));
        }
        if frames.is_empty() {
            return Err(SendError::Usage("nothing to send"));
        }
        let mut s = Session {
            to,
            id,
            data,
            frames,
            conn: None,
            sent: 0,
            reconnect_for,
            reconnects: 0,
            resent: 0,
            acked: 0,
        };
        // A sender started again finds the pipeline holding its first records: it goes on
        // from there.
        s.connect(u64::MAX).map_err(|e| SendError::Io(to, e))?;
        Ok(s)
    }

    /// The next record's position: where the pipeline said to start, plus what was written.
    pub fn position(&self) -> u64 {
        self.sent
    }

    /// Connects and says hello until the pipeline answers with where to resume; sends again
    /// what it lacks of what was sent. Records up to `limit` may have been written in part
    /// when the last connection failed: the pipeline may hold some of them.
    fn connect(&mut self, limit: u64) -> io::Result<()> {
        let deadline = Instant::now() + self.reconnect_for;
        let mut last = None;
        while Instant::now() < deadline {
            match self.hello() {
                Ok((stream, link, from)) => {
                    if from > limit {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "the pipeline holds {from} records of stream {} and this sender \
                                 sent {}: is another sender using the id?",
                                self.id, limit
                            ),
                        ));
                    }
                    // Part of the last write arrived before the connection failed.
                    self.sent = self.sent.max(from);
                    self.acked = self.acked.max(from);
                    self.conn = Some((stream, link));
                    if from < self.sent {
                        let again = self.sent - from;
                        self.resent += again;
                        self.put(from, again)?;
                    }
                    return Ok(());
                }
                Err(e) => {
                    last = Some(e);
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::TimedOut)))
    }

    /// One connection's hello and the pipeline's `RESUME`.
    fn hello(&mut self) -> io::Result<(TcpStream, Arc<Link>, u64)> {
        let mut stream = TcpStream::connect_timeout(&self.to, Duration::from_secs(2))?;
        let _ = stream.set_nodelay(true);
        stream.write_all(&resend::hello(self.id))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut m = [0u8; resend::MESSAGE_LEN];
        stream.read_exact(&mut m).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("no answer to the hello (is the pipeline checkpointing?): {e}"),
            )
        })?;
        let (kind, from) = resend::parse_message(&m);
        if kind != resend::RESUME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the pipeline answered the hello with message kind {kind}"),
            ));
        }
        stream.set_read_timeout(None)?;
        let link = Arc::new(Link::default());
        link.acked.store(from, Ordering::SeqCst);
        let mut reader = stream.try_clone()?;
        let l = link.clone();
        thread::Builder::new()
            .name("canter-send-acks".into())
            .spawn(move || {
                let mut m = [0u8; resend::MESSAGE_LEN];
                while reader.read_exact(&mut m).is_ok() {
                    if let (resend::ACK, pos) = resend::parse_message(&m) {
                        l.acked.fetch_max(pos, Ordering::SeqCst);
                    }
                }
                l.closed.store(true, Ordering::SeqCst);
            })?;
        if self.conn.is_some() || self.sent > 0 {
            self.reconnects += 1;
        }
        Ok((stream, link, from))
    }

    /// Writes records `from..from + n` on the current connection.
    fn put(&mut self, from: u64, n: u64) -> io::Result<()> {
        let Some((stream, _)) = self.conn.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let len = self.frames.len() as u64;
        let mut p = from;
        while p < from + n {
            // A run of consecutive frames (up to the end of the data) in one write.
            let i = (p % len) as usize;
            let run = (from + n - p).min(len - i as u64) as usize;
            let (a, b) = (self.frames[i].start, self.frames[i + run - 1].end);
            stream.write_all(&self.data[a..b])?;
            p += run as u64;
        }
        Ok(())
    }

    /// Sends the next `n` records; after a lost connection, connects again and sends from
    /// where the pipeline says.
    pub fn write(&mut self, n: usize) -> io::Result<()> {
        let end = self.sent + n as u64;
        loop {
            self.note_acks();
            let alive = self
                .conn
                .as_ref()
                .is_some_and(|(_, l)| !l.closed.load(Ordering::SeqCst));
            if alive && self.put(self.sent, end - self.sent).is_ok() {
                self.sent = end;
                return Ok(());
            }
            self.conn = None;
            self.connect(end)?;
        }
    }

    fn note_acks(&mut self) {
        if let Some((_, l)) = &self.conn {
            self.acked = self.acked.max(l.acked.load(Ordering::SeqCst));
        }
    }

    /// Waits until a checkpoint holds every record sent (reconnecting and resending as
    /// needed), for up to `reconnect_for` without progress; then ends the stream.
    pub fn finish(&mut self) -> io::Result<()> {
        self.sync()?;
        if let Some((s, _)) = &self.conn {
            let _ = s.shutdown(Shutdown::Write);
        }
        Ok(())
    }

    /// Waits until a checkpoint holds every record sent (reconnecting and resending as
    /// needed), for up to `reconnect_for` without progress.
    pub fn sync(&mut self) -> io::Result<()> {
        let mut since = (Instant::now(), self.acked);
        loop {
            self.note_acks();
            if self.acked >= self.sent {
                return Ok(());
            }
            if self.acked != since.1 {
                since = (Instant::now(), self.acked);
            }
            if since.0.elapsed() > self.reconnect_for {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} of {} records acknowledged (is the pipeline checkpointing?)",
                        self.acked, self.sent
                    ),
                ));
            }
            if self
                .conn
                .as_ref()
                .is_none_or(|(_, l)| l.closed.load(Ordering::SeqCst))
            {
                self.conn = None;
                self.connect(self.sent)?;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Adds the session's counts to a report.
    pub fn report(&self, r: &mut Report) {
        r.reconnects = self.reconnects;
        r.resent = self.resent;
        r.acked = self.acked;
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
