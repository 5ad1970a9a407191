//! HTTP/1.1 connection driver: one task per connection.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use canter_rt::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Sleep;

use crate::parse::{Event, ResponseParser};
use crate::schedule::{corrected_latency, RateSchedule};
use crate::stats::{ErrorKind, ThreadStats};

/// Initial read buffer size per connection.
const READ_BUF: usize = 16 * 1024;
/// Largest response head we buffer before calling it a parse error.
const MAX_HEAD: usize = 256 * 1024;
/// Pause after a failed connect before retrying.
pub(crate) const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Immutable configuration shared by all connections of a thread.
pub struct ConnConfig {
    /// Resolved loopback address.
    pub addr: SocketAddr,
    /// For https: the client settings and the server name to verify.
    pub tls: Option<(canter_rt::ClientTls, String)>,
    /// With `--h3`: the QUIC client settings and the server name.
    pub quic: Option<(quinn::ClientConfig, String)>,
    /// `--no-keepalive` with `--h3`: a new QUIC connection (a handshake) for every request.
    pub new_connection_per_request: bool,
    /// `pipeline` copies of the request, back to back.
    pub batch: Vec<u8>,
    /// Length of one request in `batch`.
    pub req_len: usize,
    /// Requests per batch.
    pub pipeline: usize,
    /// Requests are `HEAD` (responses have no body).
    pub head_only: bool,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Run start (schedule origin).
    pub start: Instant,
    /// Start of measurement (after warm-up).
    pub measure_start: Instant,
    /// End of the run, if time-bounded.
    pub end: Option<Instant>,
    /// Open-loop total rate and connection count, if any.
    pub rate: Option<(f64, usize)>,
    /// HTTP/2: concurrent streams per connection (`-m`).
    pub streams: usize,
    /// HTTP/2: the request as fields and body.
    pub h2: Option<crate::target::H2Request>,
    /// WebSocket: the upgrade request and the message.
    pub ws: Option<crate::target::WsPlan>,
}

/// Mutable state shared by all connections of a thread (single-threaded).
pub struct ThreadShared {
    /// Statistics of this thread.
    pub stats: RefCell<ThreadStats>,
    /// Remaining request budget of this thread (`-n`), if bounded.
    pub budget: Option<Cell<u64>>,
    /// Completed responses, read by the progress display.
    pub progress: Arc<AtomicU64>,
}

impl ThreadShared {
    pub(crate) fn claim(&self, want: u64) -> u64 {
        match &self.budget {
            None => want,
            Some(b) => {
                let n = b.get().min(want);
                b.set(b.get() - n);
                n
            }
        }
    }

    pub(crate) fn give_back(&self, n: u64) {
        if let Some(b) = &self.budget {
            b.set(b.get() + n);
        }
    }
}

/// How a batch of outstanding requests ended.
enum Outcome {
    /// All responses received; connection reusable.
    Done,
    /// The server announced close; `unanswered` requests got no response.
    Closed { unanswered: u64 },
    /// An error; the connection must be dropped.
    Failed(ErrorKind, u64),
    /// The run ended.
    Stopped,
}

/// Per-connection state.
struct Conn<'a> {
    cfg: &'a ConnConfig,
    shared: &'a ThreadShared,
    parser: ResponseParser,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    stream: Option<Stream>,
    /// Lazily re-armed wake-up for timeouts and the end of the run. Its
    /// deadline is never later than the real one (see `check_deadline`).
    timer: Pin<Box<Sleep>>,
    /// Timestamp of the most recent read batch / event.
    now: Instant,
    /// Responses received on the current connection.
    served: u64,
}

/// Drives one connection until the run ends or the budget is spent.
pub async fn run_connection(cfg: &ConnConfig, shared: &ThreadShared, index: usize) {
    let now = Instant::now();
    let mut c = Conn {
        cfg,
        shared,
        parser: ResponseParser::new(cfg.head_only),
        buf: vec![0; READ_BUF],
        start: 0,
        end: 0,
        stream: None,
        timer: Box::pin(tokio::time::sleep_until(
            c_deadline(cfg, now + cfg.timeout).into(),
        )),
        now,
        served: 0,
    };
    match cfg.rate {
        None => c.closed_loop().await,
        Some((rate, conns)) => c.open_loop(RateSchedule::new(rate, conns, index)).await,
    }
}

/// Handles the lazily armed timer having fired: returns the outcome if the
/// run ended or the requests sent at `sent` timed out, else re-arms the
/// timer for the earlier of the two. The timer's deadline is therefore never
/// later than the real one: `sent` only moves forward.
fn check_deadline(
    cfg: &ConnConfig,
    timer: Pin<&mut Sleep>,
    sent: Instant,
    outstanding: u64,
) -> Option<Outcome> {
    let now = Instant::now();
    if cfg.end.is_some_and(|e| now >= e) {
        return Some(Outcome::Stopped);
    }
    let due = sent + cfg.timeout;
    if now >= due {
        return Some(Outcome::Failed(ErrorKind::Timeout, outstanding));
    }
    timer.reset(c_deadline(cfg, due).into());
    None
}

fn c_deadline(cfg: &ConnConfig, t: Instant) -> Instant {
    match cfg.end {
        Some(e) if e < t => e,
        _ => t,
    }
}

impl Conn<'_> {
    fn stopped(&self, now: Instant) -> bool {
        self.cfg.end.is_some_and(|e| now >= e)
    }

    fn measuring(&self) -> bool {
        self.now >= self.cfg.measure_start
    }

    fn error(&self, kind: ErrorKind, n: u64) {
        if kind == ErrorKind::Timeout && n > 0 {
            crate::explain::timed_out(self.cfg.timeout);
        }
        if self.measuring() && n > 0 {
            self.shared.stats.borrow_mut().error(kind, n);
        }
    }

    fn drop_connection(&mut self) {
        self.stream = None;
        self.served = 0;
        self.parser.reset();
        self.start = 0;
        self.end = 0;
    }

    /// Ensures a connection exists. Returns false if connecting failed (the
    /// error is counted and a short back-off has elapsed).
    async fn ensure_connected(&mut self) -> bool {
        if self.stream.is_some() {
            return true;
        }
        let now = Instant::now();
        let give_up = c_deadline(self.cfg, now + self.cfg.timeout);
        let within = give_up.saturating_duration_since(now);
        let res = match &self.cfg.tls {
            None => canter_rt::connect(self.cfg.addr, within).await,
            Some((tls, name)) => canter_rt::connect_tls(self.cfg.addr, name, tls, within).await,
        };
        self.now = Instant::now();
        if self.stopped(self.now) {
            return false;
        }
        match res {
            Ok(s) => {
                self.stream = Some(s);
                true
            }
            Err(e) => {
                crate::explain::connect_failed(self.cfg.addr, &e);
                self.error(ErrorKind::Connect, 1);
                let until = c_deadline(self.cfg, self.now + CONNECT_BACKOFF);
                tokio::time::sleep_until(until.into()).await;
                self.now = Instant::now();
                false
            }
        }
    }

    /// Writes `bytes`, bounded by the request timeout and the end of the
    /// run. `Err` carries the outcome to apply when the write did not
    /// complete.
    async fn write(&mut self, bytes: &[u8], sent: Instant, count: u64) -> Result<(), Outcome> {
        let Conn {
            cfg, stream, timer, ..
        } = self;
        let Some(stream) = stream.as_mut() else {
            return Err(Outcome::Failed(ErrorKind::Write, 1));
        };
        let fut = stream.write_all(bytes);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                r = &mut fut => {
                    return r.map_err(|_| Outcome::Failed(ErrorKind::Write, 1));
                }
                () = timer.as_mut() => {
                    if let Some(o) = check_deadline(cfg, timer.as_mut(), sent, count) {
                        return Err(o);
                    }
                }
            }
        }
    }

    async fn closed_loop(&mut self) {
        let pipeline = self.cfg.pipeline as u64;
        loop {
            if self.stopped(self.now) {
                return;
            }
            let k = self.shared.claim(pipeline);
            if k == 0 {
                return;
            }
            if !self.ensure_connected().await {
                continue;
            }
            let sent = Instant::now();
            self.now = sent;
            let len = self.cfg.req_len * k as usize;
            let batch = &self.cfg.batch[..len];
            if let Err(o) = self.write(batch, sent, k).await {
                self.now = Instant::now();
                if !self.finish_batch(o) {
                    return;
                }
                continue;
            }
            let outcome = self
                .read_responses(k, sent, |_, now| now.saturating_duration_since(sent))
                .await;
            if !self.finish_batch(outcome) {
                return;
            }
        }
    }

    async fn open_loop(&mut self, schedule: RateSchedule) {
        let origin = self.cfg.start;
        let mut k: u64 = 0;
        let mut ready = self.now;
        let mut pacer = Box::pin(tokio::time::sleep_until(origin.into()));
        loop {
            let intended = schedule.intended(origin, k);
            if self.stopped(intended) {
                return;
            }
            if self.shared.claim(1) == 0 {
                return;
            }
            if Instant::now() < intended {
                pacer.as_mut().reset(intended.into());
                pacer.as_mut().await;
            }
            // From here on the slot is used, unless the server closed the
            // connection without answering (then it is retried below).
            k += 1;
            if !self.ensure_connected().await {
                if self.stopped(self.now) {
                    return;
                }
                ready = self.now;
                continue;
            }
            let sent = Instant::now();
            self.now = sent;
            let req = &self.cfg.batch[..self.cfg.req_len];
            if let Err(o) = self.write(req, sent, 1).await {
                self.now = Instant::now();
                ready = self.now;
                if !self.finish_batch(o) {
                    return;
                }
                continue;
            }
            let outcome = self
                .read_responses(1, sent, |_, now| {
                    corrected_latency(intended, ready, sent, now)
                })
                .await;
            ready = self.now;
            if let Outcome::Closed { unanswered } = outcome {
                if unanswered > 0 {
                    // Retry the same slot on a fresh connection; its
                    // latency keeps counting from the intended time.
                    k -= 1;
                }
            }
            if !self.finish_batch(outcome) {
                return;
            }
        }
    }

    /// Applies a batch outcome; returns false when the run is over.
    fn finish_batch(&mut self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Done => true,
            Outcome::Closed { unanswered } => {
                self.shared.give_back(unanswered);
                self.drop_connection();
                true
            }
            Outcome::Failed(kind, n) => {
                self.error(kind, n);
                self.drop_connection();
                true
            }
            Outcome::Stopped => false,
        }
    }

    /// Reads until `outstanding` responses were parsed.
    async fn read_responses(
        &mut self,
        mut outstanding: u64,
        sent: Instant,
        latency: impl Fn(Instant, Instant) -> Duration,
    ) -> Outcome {
        // A reused keep-alive connection that the server closed while idle
        // shows up as EOF/reset before any byte of this batch arrives; that
        // is not an error: the batch is retried on a new connection.
        let reused = self.served > 0;
        let mut got_bytes = false;
        loop {
            // Parse whatever is buffered.
            let mut done_now: u64 = 0;
            let mut close = false;
            while self.start < self.end && outstanding > 0 {
                match self.parser.feed(&self.buf[self.start..self.end]) {
                    Ok(Event::NeedMore { consumed }) => {
                        self.start += consumed;
                        break;
                    }
                    Ok(Event::Complete {
                        consumed,
                        status,
                        close: c,
                    }) => {
                        self.start += consumed;
                        outstanding -= 1;
                        done_now += 1;
                        self.served += 1;
                        if self.measuring() {
                            let lat = latency(sent, self.now);
                            self.shared.stats.borrow_mut().record(status, lat);
                        }
                        if c {
                            close = true;
                            break;
                        }
                    }
                    Err(_) => {
                        self.note_progress(done_now);
                        return Outcome::Failed(ErrorKind::Parse, 1);
                    }
                }
            }
            self.note_progress(done_now);
            if close {
                return Outcome::Closed {
                    unanswered: outstanding,
                };
            }
            if outstanding == 0 {
                if self.start < self.end {
                    // Unsolicited bytes after the last expected response.
                    return Outcome::Failed(ErrorKind::Parse, 1);
                }
                self.start = 0;
                self.end = 0;
                return Outcome::Done;
            }
            // Make room.
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            } else if self.end == self.buf.len() {
                if self.start > 0 {
                    self.buf.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                } else if self.buf.len() < MAX_HEAD {
                    let n = (self.buf.len() * 2).min(MAX_HEAD);
                    self.buf.resize(n, 0);
                } else {
                    return Outcome::Failed(ErrorKind::Parse, 1);
                }
            }
            // Read more, or wake up on the timer.
            let Some(stream) = self.stream.as_mut() else {
                return Outcome::Failed(ErrorKind::Read, 1);
            };
            let res = tokio::select! {
                biased;
                r = stream.read(&mut self.buf[self.end..]) => Some(r),
                () = self.timer.as_mut() => None,
            };
            match res {
                None => {
                    self.now = Instant::now();
                    if let Some(o) =
                        check_deadline(self.cfg, self.timer.as_mut(), sent, outstanding)
                    {
                        return o;
                    }
                }
                Some(Ok(0)) => {
                    self.now = Instant::now();
                    return match self.parser.eof(self.end - self.start) {
                        Ok(Some(Event::Complete { status, .. })) => {
                            outstanding -= 1;
                            if self.measuring() {
                                let lat = latency(sent, self.now);
                                self.shared.stats.borrow_mut().record(status, lat);
                            }
                            self.note_progress(1);
                            Outcome::Closed {
                                unanswered: outstanding,
                            }
                        }
                        Ok(None) if reused && !got_bytes => Outcome::Closed {
                            unanswered: outstanding,
                        },
                        Ok(_) | Err(_) => Outcome::Failed(ErrorKind::Read, 1),
                    };
                }
                Some(Ok(n)) => {
                    self.now = Instant::now();
                    got_bytes = true;
                    self.end += n;
                    if self.measuring() {
                        self.shared.stats.borrow_mut().bytes_read += n as u64;
                    }
                }
                Some(Err(e)) => {
                    self.now = Instant::now();
                    if reused && !got_bytes && self.start == self.end {
                        return Outcome::Closed {
                            unanswered: outstanding,
                        };
                    }
                    crate::explain::connection_failed(self.cfg.addr, &e);
                    return Outcome::Failed(ErrorKind::Read, 1);
                }
            }
        }
    }

    #[inline]
    fn note_progress(&self, n: u64) {
        if n > 0 {
            self.shared.progress.fetch_add(n, Ordering::Relaxed);
        }
    }
}
