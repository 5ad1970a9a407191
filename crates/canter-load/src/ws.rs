//! WebSocket connection driver (`ws://`, `wss://`): one task per connection upgrades once, then
//! sends messages and waits for their echoes.
//!
//! The client is canter-ws's engine in the client role: every frame is masked with a fresh key
//! (a per-connection xorshift generator: a load tool needs keys the server cannot predict no
//! more than it needs them secret), pings are answered, and permessage-deflate is offered with
//! `--ws-deflate`. A message's latency runs from the write of its batch (closed loop) or from
//! its slot (open loop) to the read that completed its echo; `requests` counts echoes and
//! `status` counts the handshakes' answers (101 for each connection upgraded, another code for
//! each refused).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use canter_rt::Stream;
use canter_ws::deflate::{self, DeflateConfig};
use canter_ws::{Connection, Event, Limits, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::h1::{ConnConfig, ThreadShared, CONNECT_BACKOFF};
use crate::schedule::{corrected_latency, RateSchedule};
use crate::stats::ErrorKind;
use crate::target::WsPlan;

/// Room made for each read.
const READ_BUF: usize = 64 * 1024;
/// Largest handshake response head.
const MAX_HEAD: usize = 16 * 1024;

/// How waiting for echoes ended.
enum Outcome {
    Done,
    /// The connection failed or was closed; `n` messages got no echo.
    Failed(ErrorKind, u64),
    Stopped,
}

struct Conn<'a> {
    cfg: &'a ConnConfig,
    plan: &'a WsPlan,
    shared: &'a ThreadShared,
    stream: Option<Stream>,
    engine: Option<Connection>,
    input: BytesMut,
    out: Vec<u8>,
    now: Instant,
    seed: u32,
}

/// Drives one connection until the run ends or the budget is spent.
pub async fn run_connection(cfg: &ConnConfig, plan: &WsPlan, shared: &ThreadShared, index: usize) {
    let mut c = Conn {
        cfg,
        plan,
        shared,
        stream: None,
        engine: None,
        input: BytesMut::with_capacity(READ_BUF),
        out: Vec::with_capacity(plan.payload.len() + 16),
        now: Instant::now(),
        // Never zero (xorshift's fixed point); distinct per connection.
        seed: 0x9e37_79b9 ^ (index as u32).wrapping_mul(0x85eb_ca6b) | 1,
    };
    match cfg.rate {
        _ if plan.broadcast => {
            let rate = cfg.rate.map_or(1000.0, |(r, _)| r);
            c.broadcast((index == 0).then_some(rate)).await
        }
        None => c.closed_loop().await,
        Some((rate, conns)) => c.open_loop(RateSchedule::new(rate, conns, index)).await,
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

    /// The earlier of `t` and the end of the run.
    fn deadline(&self, t: Instant) -> Instant {
        match self.cfg.end {
            Some(e) if e < t => e,
            _ => t,
        }
    }

    /// Connects and upgrades, unless connected. False if that failed (the error is counted and
    /// a short back-off has elapsed) or the run ended.
    async fn ensure_open(&mut self) -> bool {
        if self.engine.is_some() {
            return true;
        }
        let until = self.deadline(Instant::now() + self.cfg.timeout);
        let opened = tokio::time::timeout_at(until.into(), self.open()).await;
        self.now = Instant::now();
        if self.stopped(self.now) {
            return false;
        }
        match opened {
            Ok(Ok(())) => true,
            Ok(Err(kind)) => {
                self.error(kind, 1);
                self.drop_connection();
                let until = self.deadline(self.now + CONNECT_BACKOFF);
                tokio::time::sleep_until(until.into()).await;
                self.now = Instant::now();
                false
            }
            Err(_) => {
                self.error(ErrorKind::Timeout, 1);
                self.drop_connection();
                false
            }
        }
    }

    async fn open(&mut self) -> Result<(), ErrorKind> {
        let within = self.cfg.timeout;
        let connected = match &self.cfg.tls {
            None => canter_rt::connect(self.cfg.addr, within).await,
            Some((tls, name)) => canter_rt::connect_tls(self.cfg.addr, name, tls, within).await,
        };
        let mut stream = connected.map_err(|e| {
            crate::explain::connect_failed(self.cfg.addr, &e);
            ErrorKind::Connect
        })?;
        stream
            .write_all(&self.plan.request)
            .await
            .map_err(|_| ErrorKind::Write)?;
        self.input.clear();
        let head = loop {
            if let Some(end) = self.input.windows(4).position(|w| w == b"\r\n\r\n") {
                break self.input.split_to(end + 4);
            }
            if self.input.len() > MAX_HEAD {
                return Err(ErrorKind::Parse);
            }
            self.input.reserve(4096);
            match stream.read_buf(&mut self.input).await {
                Ok(0) | Err(_) => return Err(ErrorKind::Read),
                Ok(_) => {}
            }
        };
        let head = String::from_utf8_lossy(&head);
        let status = head
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        self.shared.stats.borrow_mut().handshake(status);
        if !head.starts_with("HTTP/1.1 101") {
            crate::explain::ws_refused(head.lines().next().unwrap_or_default());
            return Err(ErrorKind::Parse);
        }
        let mut seed = self.seed;
        let keys = Box::new(move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed.to_le_bytes()
        });
        let mut engine = Connection::new(Role::Client { keys }, Limits::default());
        if self.plan.deflate {
            let answer = head.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("sec-websocket-extensions")
                    .then(|| value.trim().to_owned())
            });
            if let Some(answer) = answer {
                let agreed = deflate::client_agreed(&answer, DeflateConfig::default())
                    .map_err(|_| ErrorKind::Parse)?;
                engine = engine.with_deflate(agreed);
            }
        }
        self.seed = self.seed.rotate_left(7) ^ 0x5bd1_e995;
        self.stream = Some(stream);
        self.engine = Some(engine);
        Ok(())
    }

    fn drop_connection(&mut self) {
        self.stream = None;
        self.engine = None;
        self.input.clear();
    }

    /// Encodes `k` messages into the output.
    fn encode(&mut self, k: u64) -> Result<(), ErrorKind> {
        let Some(engine) = self.engine.as_mut() else {
            return Err(ErrorKind::Write);
        };
        self.out.clear();
        for _ in 0..k {
            let sent = if self.plan.binary {
                engine.send_binary(&self.plan.payload, &mut self.out)
            } else {
                // The plan's text payload is built from a `str`.
                let text = std::str::from_utf8(&self.plan.payload).unwrap_or_default();
                engine.send_text(text, &mut self.out)
            };
            sent.map_err(|_| ErrorKind::Write)?;
        }
        Ok(())
    }

    /// Writes the output, then reads until `k` echoes came; bounded by the timeout from `sent`
    /// and the end of the run.
    async fn exchange(
        &mut self,
        k: u64,
        sent: Instant,
        latency: impl Fn(Instant) -> Duration,
    ) -> Outcome {
        if let Err(kind) = self.encode(k) {
            return Outcome::Failed(kind, k);
        }
        let until = self.deadline(sent + self.cfg.timeout);
        let run = self.write_and_read(k, latency);
        match tokio::time::timeout_at(until.into(), run).await {
            Ok(outcome) => outcome,
            Err(_) if self.stopped(Instant::now()) => Outcome::Stopped,
            Err(_) => Outcome::Failed(ErrorKind::Timeout, k),
        }
    }

    async fn write_and_read(&mut self, k: u64, latency: impl Fn(Instant) -> Duration) -> Outcome {
        let (Some(stream), Some(engine)) = (self.stream.as_mut(), self.engine.as_mut()) else {
            return Outcome::Failed(ErrorKind::Write, k);
        };
        if stream.write_all(&self.out).await.is_err() {
            return Outcome::Failed(ErrorKind::Write, k);
        }
        let mut left = k;
        let mut done = 0;
        let mut pong = Vec::new();
        while left > 0 {
            match engine.poll(&mut self.input, &mut pong) {
                Ok(Some(Event::Text(_) | Event::Binary(_))) => {
                    left -= 1;
                    done += 1;
                    if self.now >= self.cfg.measure_start {
                        let lat = latency(self.now);
                        self.shared.stats.borrow_mut().message(lat);
                    }
                    continue;
                }
                Ok(Some(Event::Ping(_) | Event::Pong(_))) => {
                    if !pong.is_empty() {
                        if stream.write_all(&pong).await.is_err() {
                            return Outcome::Failed(ErrorKind::Write, left);
                        }
                        pong.clear();
                    }
                    continue;
                }
                Ok(Some(Event::Close(_))) => return Outcome::Failed(ErrorKind::Read, left),
                Ok(None) => {}
                Err(_) => return Outcome::Failed(ErrorKind::Parse, left),
            }
            if done > 0 {
                self.shared
                    .progress
                    .fetch_add(done, std::sync::atomic::Ordering::Relaxed);
                done = 0;
            }
            if self.input.capacity() - self.input.len() < READ_BUF / 2 {
                self.input.reserve(READ_BUF);
            }
            match stream.read_buf(&mut self.input).await {
                Ok(0) | Err(_) => return Outcome::Failed(ErrorKind::Read, left),
                Ok(n) => {
                    self.now = Instant::now();
                    if self.now >= self.cfg.measure_start {
                        self.shared.stats.borrow_mut().bytes_read += n as u64;
                    }
                }
            }
        }
        if done > 0 {
            self.shared
                .progress
                .fetch_add(done, std::sync::atomic::Ordering::Relaxed);
        }
        Outcome::Done
    }

    /// Applies an outcome; false when the run is over.
    fn finish(&mut self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Done => true,
            Outcome::Failed(kind, n) => {
                self.now = Instant::now();
                self.error(kind, n.max(1));
                self.drop_connection();
                true
            }
            Outcome::Stopped => false,
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
            if !self.ensure_open().await {
                continue;
            }
            let sent = Instant::now();
            self.now = sent;
            let outcome = self
                .exchange(k, sent, |now| now.saturating_duration_since(sent))
                .await;
            if !self.finish(outcome) {
                return;
            }
        }
    }

    /// Broadcast mode: listens until the run ends, recording each delivery with its latency
    /// from the publish (the send time travels in the message's first 8 bytes, nanoseconds
    /// since the run's start); with `publish`, also sends that many messages a second.
    async fn broadcast(&mut self, publish: Option<f64>) {
        let origin = self.cfg.start;
        let every = publish.map(|r| Duration::from_secs_f64(1.0 / r.max(1e-3)));
        let mut sent: u64 = 0;
        let mut pong = Vec::new();
        let mut pacer = Box::pin(tokio::time::sleep_until(origin.into()));
        loop {
            if self.stopped(Instant::now()) {
                return;
            }
            if !self.ensure_open().await {
                continue;
            }
            // What is due: the publisher's next message, or the end of the run.
            let next_send = every.map(|e| origin + e * (sent as u32));
            let wake = match (next_send, self.cfg.end) {
                (Some(s), Some(e)) => s.min(e),
                (Some(s), None) => s,
                (None, Some(e)) => e,
                (None, None) => Instant::now() + Duration::from_secs(3600),
            };
            pacer.as_mut().reset(wake.into());
            let (Some(stream), Some(engine)) = (self.stream.as_mut(), self.engine.as_mut()) else {
                continue;
            };
            if self.input.capacity() - self.input.len() < READ_BUF / 2 {
                self.input.reserve(READ_BUF);
            }
            tokio::select! {
                biased;
                read = stream.read_buf(&mut self.input) => match read {
                    Ok(0) | Err(_) => {
                        self.error(ErrorKind::Read, 1);
                        self.drop_connection();
                        continue;
                    }
                    Ok(n) => {
                        self.now = Instant::now();
                        let measuring = self.now >= self.cfg.measure_start;
                        if measuring {
                            self.shared.stats.borrow_mut().bytes_read += n as u64;
                        }
                        let mut delivered = 0;
                        loop {
                            match engine.poll(&mut self.input, &mut pong) {
                                Ok(Some(Event::Binary(b) | Event::Text(b))) => {
                                    delivered += 1;
                                    if measuring && b.len() >= 8 {
                                        let mut ns = [0u8; 8];
                                        ns.copy_from_slice(&b[..8]);
                                        let at = origin + Duration::from_nanos(u64::from_be_bytes(ns));
                                        let lat = self.now.saturating_duration_since(at);
                                        self.shared.stats.borrow_mut().message(lat);
                                    }
                                }
                                Ok(Some(Event::Close(_))) | Err(_) => {
                                    self.error(ErrorKind::Read, 1);
                                    self.drop_connection();
                                    break;
                                }
                                Ok(Some(_)) => {}
                                Ok(None) => break,
                            }
                        }
                        if !pong.is_empty() {
                            if let Some(stream) = self.stream.as_mut() {
                                let _ = stream.write_all(&pong).await;
                            }
                            pong.clear();
                        }
                        self.shared.progress.fetch_add(delivered, std::sync::atomic::Ordering::Relaxed);
                    }
                },
                () = pacer.as_mut() => {
                    let Some(at) = next_send else { continue };
                    if Instant::now() < at {
                        continue;
                    }
                    // The payload: the send time, then the message's padding.
                    let mut payload = self.plan.payload.clone();
                    if payload.len() < 8 {
                        payload.resize(8, 0);
                    }
                    let ns = u64::try_from(Instant::now().duration_since(origin).as_nanos())
                        .unwrap_or(u64::MAX);
                    payload[..8].copy_from_slice(&ns.to_be_bytes());
                    self.out.clear();
                    if engine.send_binary(&payload, &mut self.out).is_err()
                        || stream.write_all(&self.out).await.is_err()
                    {
                        self.error(ErrorKind::Write, 1);
                        self.drop_connection();
                    }
                    sent += 1;
                }
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
            k += 1;
            if !self.ensure_open().await {
                if self.stopped(self.now) {
                    return;
                }
                ready = self.now;
                continue;
            }
            let sent = Instant::now();
            self.now = sent;
            let outcome = self
                .exchange(1, sent, |now| corrected_latency(intended, ready, sent, now))
                .await;
            ready = self.now;
            if !self.finish(outcome) {
                return;
            }
        }
    }
}
