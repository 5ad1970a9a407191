//! HTTP/2 connection driver: one task per connection, up to `-m` streams in flight on it.
//!
//! A client made for load: the request's header block is encoded with HPACK indexing, so that
//! after the first request every field is a one-byte reference, and a block that comes out the
//! same twice is reused as is. Frames are parsed where they lie in the read buffer; everything
//! a turn produces (new requests, SETTINGS and PING acknowledgements, WINDOW_UPDATEs) leaves in
//! one write. The client's windows are 1 GiB, topped up as responses arrive, so the server is
//! never held back by them. The socket is read while a write waits, so a server that stops
//! reading until its answers are taken cannot deadlock the pair.

use std::collections::HashMap;
use std::future::poll_fn;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use canter_h2::hpack::{Decoder, Encoder, Indexing};
use canter_h2::{ErrorCode, DEFAULT_MAX_FRAME, MAX_STREAM_ID, PREFACE};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::h1::{ConnConfig, ThreadShared, CONNECT_BACKOFF};
use crate::schedule::{corrected_latency, RateSchedule};
use crate::stats::ErrorKind;
use crate::target::H2Request;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The client's receive windows, connection and stream (2^30 - 1, as h2load uses).
const WINDOW: u32 = (1 << 30) - 1;
/// Largest frame the client accepts (SETTINGS_MAX_FRAME_SIZE it advertises).
const MAX_FRAME: u32 = 1 << 20;
/// Largest header block accepted from the server (it can be spread over CONTINUATIONs).
const MAX_BLOCK: usize = 1 << 20;
/// Initial read buffer.
const READ_BUF: usize = 64 * 1024;

/// A request in flight.
struct Open {
    /// When its HEADERS were queued for the write that sent them.
    sent: Instant,
    /// Open loop: the slot's intended time and when the connection could take it.
    slot: Option<(Instant, Instant)>,
    /// `:status` of the final response head, once it arrived.
    status: Option<u16>,
    /// DATA bytes received since the stream's window was last topped up.
    unacked: u32,
}

/// How the connection ended.
enum End {
    /// The run is over (time, or the request budget spent).
    Stopped,
    /// Drop it and connect again: an error (counted), or the server's GOAWAY.
    Reconnect,
}

/// Drives one connection until the run ends or the budget is spent.
pub async fn run_connection(cfg: &ConnConfig, shared: &ThreadShared, index: usize) {
    let Some(request) = cfg.h2.as_ref() else {
        return;
    };
    let schedule = cfg
        .rate
        .map(|(rate, conns)| RateSchedule::new(rate, conns, index));
    let mut slots = 0u64;
    loop {
        let now = Instant::now();
        if cfg.end.is_some_and(|e| now >= e) {
            return;
        }
        let mut c = Conn::new(cfg, shared, request, now);
        let Some(stream) = c.connect().await else {
            continue;
        };
        match c.run(stream, schedule.as_ref(), &mut slots).await {
            End::Stopped => return,
            End::Reconnect => {
                if c.sent_none {
                    // Nothing was answered on this connection: do not spin on a server that
                    // refuses everything.
                    tokio::time::sleep(CONNECT_BACKOFF).await;
                }
            }
        }
    }
}

/// One HTTP/2 connection's state.
struct Conn<'a> {
    cfg: &'a ConnConfig,
    shared: &'a ThreadShared,
    request: &'a H2Request,
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    dec: Decoder,
    enc: Encoder,
    /// The last header block encoded, and whether it can be sent again as is.
    block: Vec<u8>,
    block_stable: bool,
    open: HashMap<u32, Open, BuildHasherDefault<canter_h2::StreamIdHasher>>,
    next_id: u32,
    /// Streams allowed at once: `-m`, lowered by the server's SETTINGS_MAX_CONCURRENT_STREAMS.
    /// Zero until the server's first SETTINGS arrived.
    max_open: usize,
    settings_seen: bool,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    /// Bytes received on the connection since its window was last topped up.
    conn_unacked: u32,
    /// The server sent GOAWAY: no new streams.
    goaway: bool,
    /// A header block being assembled from CONTINUATION frames: stream, END_STREAM, bytes.
    partial: Option<(u32, bool, Vec<u8>)>,
    /// When the timer must fire: the oldest request's timeout, or the end of the run. Never
    /// later than the real deadline; re-checked when it fires.
    due: Instant,
    now: Instant,
    connected_at: Instant,
    /// Open loop: since when a due slot has waited for a free stream.
    blocked: bool,
    /// No response completed on this connection.
    sent_none: bool,
    /// Set when a due request could not be claimed: the budget is spent.
    budget_spent: bool,
}

impl<'a> Conn<'a> {
    fn new(
        cfg: &'a ConnConfig,
        shared: &'a ThreadShared,
        request: &'a H2Request,
        now: Instant,
    ) -> Conn<'a> {
        Conn {
            cfg,
            shared,
            request,
            rbuf: vec![0; READ_BUF],
            start: 0,
            end: 0,
            out: Vec::with_capacity(16 * 1024),
            dec: Decoder::new(4096),
            enc: Encoder::new(4096),
            block: Vec::new(),
            block_stable: false,
            open: HashMap::default(),
            next_id: 1,
            max_open: 0,
            settings_seen: false,
            peer_max_frame: DEFAULT_MAX_FRAME as usize,
            peer_initial_window: 65_535,
            send_window: 65_535,
            conn_unacked: 0,
            goaway: false,
            partial: None,
            due: deadline(cfg, now + cfg.timeout),
            now,
            connected_at: now,
            blocked: false,
            sent_none: true,
            budget_spent: false,
        }
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

    /// Connects (TLS with ALPN `h2` for https) and queues the preface, SETTINGS and the
    /// connection window's top-up. `None`: failed, counted, and a short back-off has passed.
    async fn connect(&mut self) -> Option<canter_rt::Stream> {
        let now = Instant::now();
        let within = deadline(self.cfg, now + self.cfg.timeout).saturating_duration_since(now);
        let res = match &self.cfg.tls {
            None => canter_rt::connect(self.cfg.addr, within).await,
            Some((tls, name)) => canter_rt::connect_tls(self.cfg.addr, name, tls, within).await,
        };
        self.now = Instant::now();
        let res = res.and_then(|s| {
            if s.is_tls() && s.alpn_protocol() != Some(b"h2") {
                Err(std::io::Error::other(
                    "the server did not agree to h2 by ALPN",
                ))
            } else {
                Ok(s)
            }
        });
        match res {
            Ok(s) => {
                self.connected_at = self.now;
                self.out.extend_from_slice(PREFACE);
                put_head(&mut self.out, 18, SETTINGS, 0, 0);
                for (id, value) in [(0x2u16, 0u32), (0x4, WINDOW), (0x5, MAX_FRAME)] {
                    self.out.extend_from_slice(&id.to_be_bytes());
                    self.out.extend_from_slice(&value.to_be_bytes());
                }
                put_head(&mut self.out, 4, WINDOW_UPDATE, 0, 0);
                self.out.extend_from_slice(&(WINDOW - 65_535).to_be_bytes());
                Some(s)
            }
            Err(e) => {
                if self.cfg.end.is_some_and(|e| self.now >= e) {
                    return None;
                }
                crate::explain::connect_failed(self.cfg.addr, &e);
                self.error(ErrorKind::Connect, 1);
                let until = deadline(self.cfg, self.now + CONNECT_BACKOFF);
                tokio::time::sleep_until(until.into()).await;
                None
            }
        }
    }

    /// Serves the connection: opens streams as the mode allows, writes, reads, until the run
    /// ends or the connection must be replaced.
    async fn run(
        &mut self,
        mut stream: canter_rt::Stream,
        schedule: Option<&RateSchedule>,
        slots: &mut u64,
    ) -> End {
        let mut pacer: Option<Pin<Box<Sleep>>> = None;
        let mut timer = Box::pin(tokio::time::sleep_until(self.due.into()));
        loop {
            self.now = Instant::now();
            if self.cfg.end.is_some_and(|e| self.now >= e) {
                return End::Stopped;
            }
            let mut next_slot = None;
            if self.settings_seen && !self.goaway {
                match schedule {
                    None => self.open_closed_loop(),
                    Some(s) => next_slot = self.open_on_schedule(s, slots),
                }
            }
            if self.open.is_empty() && self.out.is_empty() {
                if self.goaway {
                    return End::Reconnect;
                }
                if self.budget_spent {
                    return End::Stopped;
                }
            }
            if self.next_id > MAX_STREAM_ID - 2 && self.open.is_empty() {
                // Stream ids used up: a new connection starts them again.
                return End::Reconnect;
            }
            let wake = next_slot.map(|t: Instant| {
                let p = pacer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(t.into())));
                if p.deadline() != t.into() {
                    p.as_mut().reset(t.into());
                }
            });
            let paced = wake.is_some();
            if timer.deadline() != self.due.into() {
                timer.as_mut().reset(self.due.into());
            }
            let io = self.turn(&mut stream);
            let event = tokio::select! {
                biased;
                r = io => r,
                () = timer.as_mut() => Turn::Timer,
                () = async { match pacer.as_mut() { Some(p) => p.as_mut().await, None => std::future::pending().await } }, if paced => Turn::Paced,
            };
            self.now = Instant::now();
            match event {
                Turn::Read(0) => {
                    // Closed with requests outstanding: each is an error. Closed while idle
                    // (after GOAWAY, or an idle timeout): connect again, silently.
                    self.error(ErrorKind::Read, self.open.len() as u64);
                    return End::Reconnect;
                }
                Turn::Read(n) => {
                    self.end += n;
                    if self.measuring() {
                        self.shared.stats.borrow_mut().bytes_read += n as u64;
                    }
                    if let Err(kind) = self.frames() {
                        self.error(kind, (self.open.len() as u64).max(1));
                        self.open.clear();
                        return End::Reconnect;
                    }
                }
                Turn::Wrote => {}
                Turn::Failed(kind) => {
                    self.error(kind, (self.open.len() as u64).max(1));
                    return End::Reconnect;
                }
                Turn::Timer => {
                    if self.cfg.end.is_some_and(|e| self.now >= e) {
                        return End::Stopped;
                    }
                    let oldest = self.open.values().map(|o| o.sent).min();
                    match oldest {
                        Some(t) if self.now >= t + self.cfg.timeout => {
                            self.error(ErrorKind::Timeout, self.open.len() as u64);
                            return End::Reconnect;
                        }
                        Some(t) => self.rearm(t + self.cfg.timeout),
                        None => self.rearm(self.now + self.cfg.timeout),
                    }
                }
                Turn::Paced => {}
            }
        }
    }

    fn rearm(&mut self, t: Instant) {
        self.due = deadline(self.cfg, t);
    }

    /// Closed loop: keeps `max_open` streams in flight while the budget lasts.
    fn open_closed_loop(&mut self) {
        while self.open.len() < self.max_open && self.next_id <= MAX_STREAM_ID - 2 {
            if !self.body_fits() {
                return;
            }
            if self.shared.claim(1) == 0 {
                self.budget_spent = true;
                return;
            }
            self.start_stream(None);
        }
    }

    /// Open loop: starts the requests whose slots are due, as streams allow; returns when the
    /// next slot is due.
    fn open_on_schedule(&mut self, schedule: &RateSchedule, slots: &mut u64) -> Option<Instant> {
        loop {
            let intended = schedule.intended(self.cfg.start, *slots);
            if self.cfg.end.is_some_and(|e| intended >= e) {
                return None;
            }
            if intended > self.now {
                return Some(intended);
            }
            if self.open.len() >= self.max_open || !self.body_fits() {
                self.blocked = true;
                return None;
            }
            if self.shared.claim(1) == 0 {
                self.budget_spent = true;
                return None;
            }
            *slots += 1;
            // Ready when the slot came, unless the connection was not there yet or all its
            // streams were busy: then latency counts from the slot (coordinated omission).
            let ready = if std::mem::take(&mut self.blocked) {
                self.now
            } else {
                self.connected_at.max(intended)
            };
            self.start_stream(Some((intended, ready)));
        }
    }

    /// Whether the request body can go out now within the peer's windows.
    fn body_fits(&self) -> bool {
        let len = self.request.body.len() as i64;
        len == 0 || (len <= self.send_window && len <= self.peer_initial_window)
    }

    /// Queues HEADERS (and the body as DATA) for a new stream.
    fn start_stream(&mut self, slot: Option<(Instant, Instant)>) {
        let id = self.next_id;
        self.next_id += 2;
        if !self.block_stable {
            let mut block = Vec::with_capacity(self.block.len().max(64));
            self.enc.begin(&mut block);
            for (n, v) in &self.request.fields {
                self.enc.field(n, v, Indexing::Yes, &mut block);
            }
            self.block_stable = block == self.block;
            self.block = block;
        }
        let body = &self.request.body;
        let flags = END_HEADERS | if body.is_empty() { END_STREAM } else { 0 };
        // The block is small (the request's fields, indexed); a larger one than a frame takes
        // is split into CONTINUATION frames.
        let mut chunks = self.block.chunks(self.peer_max_frame).peekable();
        let first = chunks.next().unwrap_or(&[]);
        let more = chunks.peek().is_some();
        put_head(
            &mut self.out,
            first.len(),
            HEADERS,
            if more { flags & !END_HEADERS } else { flags },
            id,
        );
        self.out.extend_from_slice(first);
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            put_head(
                &mut self.out,
                chunk.len(),
                CONTINUATION,
                if last { END_HEADERS } else { 0 },
                id,
            );
            self.out.extend_from_slice(chunk);
        }
        if !body.is_empty() {
            let mut pieces = body.chunks(self.peer_max_frame).peekable();
            while let Some(piece) = pieces.next() {
                let last = pieces.peek().is_none();
                put_head(
                    &mut self.out,
                    piece.len(),
                    DATA,
                    if last { END_STREAM } else { 0 },
                    id,
                );
                self.out.extend_from_slice(piece);
            }
            self.send_window -= body.len() as i64;
        }
        if self.open.is_empty() {
            self.rearm(self.now + self.cfg.timeout);
        }
        self.open.insert(
            id,
            Open {
                sent: self.now,
                slot,
                status: None,
                unacked: 0,
            },
        );
    }

    /// Writes what is queued while reading what arrives; returns on the first read, or when
    /// the queue was written.
    async fn turn(&mut self, stream: &mut canter_rt::Stream) -> Turn {
        if self.end == self.rbuf.len() {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                // A frame larger than the buffer: grow it (frames are at most MAX_FRAME).
                let n = (self.rbuf.len() * 2).min(MAX_FRAME as usize + 9);
                if n == self.rbuf.len() {
                    return Turn::Failed(ErrorKind::Parse);
                }
                self.rbuf.resize(n, 0);
            }
        }
        let mut written = 0;
        let wrote_all = poll_fn(|cx| {
            while written < self.out.len() {
                match Pin::new(&mut *stream).poll_write(cx, &self.out[written..]) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Turn::Failed(ErrorKind::Write))
                    }
                    Poll::Ready(Ok(n)) => written += n,
                    Poll::Pending => break,
                }
            }
            if written == self.out.len() && written > 0 {
                if let Poll::Ready(Err(_)) = Pin::new(&mut *stream).poll_flush(cx) {
                    return Poll::Ready(Turn::Failed(ErrorKind::Write));
                }
            }
            let mut rb = ReadBuf::new(&mut self.rbuf[self.end..]);
            match Pin::new(&mut *stream).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => Poll::Ready(Turn::Read(rb.filled().len())),
                Poll::Ready(Err(e)) => {
                    crate::explain::connection_failed(self.cfg.addr, &e);
                    Poll::Ready(Turn::Failed(ErrorKind::Read))
                }
                Poll::Pending if written == self.out.len() && written > 0 => {
                    Poll::Ready(Turn::Wrote)
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        self.out.drain(..written);
        wrote_all
    }

    /// Handles every complete frame in the read buffer.
    fn frames(&mut self) -> Result<(), ErrorKind> {
        let mut done = 0u64;
        while self.end - self.start >= 9 {
            let h = &self.rbuf[self.start..self.start + 9];
            let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
            let (kind, flags) = (h[3], h[4]);
            let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & MAX_STREAM_ID;
            if len > MAX_FRAME as usize {
                return Err(ErrorKind::Parse);
            }
            if self.end - self.start < 9 + len {
                break;
            }
            let at = self.start + 9;
            self.start = at + len;
            if self.partial.is_some() && kind != CONTINUATION {
                return Err(ErrorKind::Parse);
            }
            match kind {
                DATA => {
                    self.conn_unacked += len as u32;
                    unpad(&self.rbuf[at..at + len], flags)?;
                    if let Some(o) = self.open.get_mut(&id) {
                        o.unacked += len as u32;
                        if o.unacked >= WINDOW / 2 && flags & END_STREAM == 0 {
                            put_head(&mut self.out, 4, WINDOW_UPDATE, 0, id);
                            self.out.extend_from_slice(&o.unacked.to_be_bytes());
                            o.unacked = 0;
                        }
                    }
                    if flags & END_STREAM != 0 {
                        done += u64::from(self.complete(id));
                    }
                }
                HEADERS => {
                    let mut p = unpad(&self.rbuf[at..at + len], flags)?;
                    if flags & PRIORITY != 0 {
                        p = p.get(5..).ok_or(ErrorKind::Parse)?;
                    }
                    let end_stream = flags & END_STREAM != 0;
                    if flags & END_HEADERS != 0 {
                        let block = p.to_vec();
                        done += u64::from(self.head(id, end_stream, &block)?);
                    } else {
                        self.partial = Some((id, end_stream, p.to_vec()));
                    }
                }
                CONTINUATION => {
                    let Some((sid, end_stream, mut block)) = self.partial.take() else {
                        return Err(ErrorKind::Parse);
                    };
                    if sid != id || block.len() + len > MAX_BLOCK {
                        return Err(ErrorKind::Parse);
                    }
                    block.extend_from_slice(&self.rbuf[at..at + len]);
                    if flags & END_HEADERS != 0 {
                        done += u64::from(self.head(id, end_stream, &block)?);
                    } else {
                        self.partial = Some((sid, end_stream, block));
                    }
                }
                SETTINGS if flags & ACK == 0 => {
                    if !len.is_multiple_of(6) {
                        return Err(ErrorKind::Parse);
                    }
                    let mut i = at;
                    let mut limited = false;
                    while i < at + len {
                        let b = &self.rbuf[i..i + 6];
                        let key = u16::from_be_bytes([b[0], b[1]]);
                        let v = u32::from_be_bytes([b[2], b[3], b[4], b[5]]);
                        match key {
                            0x1 => {
                                self.enc.set_max_table(v as usize);
                                self.block_stable = false;
                            }
                            0x3 => {
                                self.max_open = self.cfg.streams.min(v as usize);
                                limited = true;
                            }
                            0x4 => self.peer_initial_window = i64::from(v),
                            0x5 => self.peer_max_frame = v as usize,
                            _ => {}
                        }
                        i += 6;
                    }
                    if !std::mem::replace(&mut self.settings_seen, true) && !limited {
                        self.max_open = self.cfg.streams;
                    }
                    put_head(&mut self.out, 0, SETTINGS, ACK, 0);
                }
                PING if flags & ACK == 0 && len == 8 => {
                    put_head(&mut self.out, 8, PING, ACK, 0);
                    let payload: [u8; 8] = self.rbuf[at..at + 8].try_into().unwrap_or([0; 8]);
                    self.out.extend_from_slice(&payload);
                }
                GOAWAY if len >= 8 => {
                    let b = &self.rbuf[at..at + 8];
                    let last = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & MAX_STREAM_ID;
                    let code = ErrorCode(u32::from_be_bytes([b[4], b[5], b[6], b[7]]));
                    self.goaway = true;
                    // Streams above `last` were not processed: they go back to the budget and
                    // are sent again on the next connection.
                    let before = self.open.len();
                    self.open.retain(|&sid, _| sid <= last);
                    self.shared.give_back((before - self.open.len()) as u64);
                    if code != ErrorCode::NO_ERROR {
                        self.error(ErrorKind::Read, self.open.len() as u64);
                        self.open.clear();
                    }
                }
                RST_STREAM if len == 4 => {
                    let b = &self.rbuf[at..at + 4];
                    let code = ErrorCode(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                    if self.open.remove(&id).is_some() {
                        if code == ErrorCode::REFUSED_STREAM {
                            self.shared.give_back(1);
                        } else {
                            self.error(ErrorKind::Reset, 1);
                        }
                    }
                }
                WINDOW_UPDATE if len == 4 => {
                    let b = &self.rbuf[at..at + 4];
                    let inc = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & MAX_STREAM_ID;
                    if id == 0 {
                        self.send_window += i64::from(inc);
                    }
                }
                PUSH_PROMISE => return Err(ErrorKind::Parse),
                _ => {}
            }
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.conn_unacked >= WINDOW / 2 {
            put_head(&mut self.out, 4, WINDOW_UPDATE, 0, 0);
            self.out.extend_from_slice(&self.conn_unacked.to_be_bytes());
            self.conn_unacked = 0;
        }
        if done > 0 {
            self.shared
                .progress
                .fetch_add(done, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// A complete header block for stream `id`: keeps the decoder in step, notes `:status`;
    /// returns whether it completed a response.
    fn head(&mut self, id: u32, end_stream: bool, block: &[u8]) -> Result<bool, ErrorKind> {
        let mut status = None;
        self.dec
            .decode(block, MAX_BLOCK, |n, v| {
                if n == b":status" {
                    status = std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<u16>().ok());
                }
            })
            .map_err(|_| ErrorKind::Parse)?;
        if let Some(o) = self.open.get_mut(&id) {
            match status {
                // An interim response (100 Continue, 103 Early Hints): the final one follows.
                Some(s) if (100..200).contains(&s) => return Ok(false),
                Some(s) => o.status = Some(s),
                None if o.status.is_none() => return Err(ErrorKind::Parse),
                None => {} // trailers
            }
        }
        Ok(end_stream && self.complete(id))
    }

    /// Stream `id` ended: records its latency and status.
    fn complete(&mut self, id: u32) -> bool {
        let Some(o) = self.open.remove(&id) else {
            return false;
        };
        self.sent_none = false;
        if self.measuring() {
            let latency = match o.slot {
                None => self.now.saturating_duration_since(o.sent),
                Some((intended, ready)) => corrected_latency(intended, ready, o.sent, self.now),
            };
            self.shared
                .stats
                .borrow_mut()
                .record(o.status.unwrap_or(0), latency);
        }
        true
    }
}

/// What one turn of the connection's loop brought.
enum Turn {
    /// `n` bytes read (0: the server closed the connection).
    Read(usize),
    /// Everything queued was written.
    Wrote,
    /// The socket failed.
    Failed(ErrorKind),
    /// The timer fired (a request timeout, or the end of the run).
    Timer,
    /// The next open-loop slot is due.
    Paced,
}

/// The payload of a DATA or HEADERS frame without its padding.
fn unpad(p: &[u8], flags: u8) -> Result<&[u8], ErrorKind> {
    if flags & PADDED == 0 {
        return Ok(p);
    }
    let (&pad, rest) = p.split_first().ok_or(ErrorKind::Parse)?;
    rest.get(..rest.len().wrapping_sub(pad as usize))
        .filter(|_| (pad as usize) <= rest.len())
        .ok_or(ErrorKind::Parse)
}

fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    out.extend_from_slice(&[l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]);
}

fn deadline(cfg: &ConnConfig, t: Instant) -> Instant {
    match cfg.end {
        Some(e) if e < t => e,
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_removed_and_checked() {
        assert_eq!(unpad(b"abc", 0), Ok(&b"abc"[..]));
        assert_eq!(unpad(&[2, b'a', 0, 0], PADDED), Ok(&b"a"[..]));
        assert_eq!(unpad(&[3, b'a', 0], PADDED), Err(ErrorKind::Parse));
        assert_eq!(unpad(&[], PADDED), Err(ErrorKind::Parse));
    }
}
