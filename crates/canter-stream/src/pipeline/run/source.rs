//! Sources on one worker: a TCP source's connections (on the runtime's server), a file, a generator.

use std::cell::RefCell;
use std::io::Read;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use canter_rt::proto::{self, Conn, Protocol, Settings};
use canter_rt::ServerWorker;
use tokio::sync::Notify;

use super::super::Framing;
use super::barrier::Rid;
use super::ckpt::Streams;
use super::env::Env;
use super::process::Process;
use super::wait::{RateLog, Waiter};
use crate::frame::FrameError;
use crate::resend;

/// A source connection: frames in, the pipeline run inline.
pub(super) struct SourceConn {
    pub(super) head: Rc<RefCell<dyn Process>>,
    pub(super) env: Rc<Env>,
    pub(super) framing: Framing,
    pub(super) peer: SocketAddr,
    /// Counted in [`Env::open_sources`] (it was not over the bound when it opened).
    pub(super) counted: bool,
    /// Rate-limits the warnings of refused connections, for the worker.
    pub(super) refusals: Rc<RefCell<RateLog>>,
    /// The source's streams, when the topology checkpoints (a connection may then open with
    /// a hello, see [`crate::resend`]).
    pub(super) streams: Option<Arc<Streams>>,
    /// Whether the connection's first bytes were looked at for a hello.
    pub(super) greeted: bool,
    /// The stream this connection carries (0: none) and the position of its next record.
    pub(super) stream: u64,
    pub(super) pos: u64,
    /// The last acknowledgement sent.
    pub(super) acked: u64,
}

impl SourceConn {
    pub(super) fn hold(&self, conn: &mut Conn<'_>) {
        conn.mute();
        self.env.wait(Waiter::Conn(conn.handle()));
    }

    /// Reads a hello at the start of the connection, if there is one: the stream is attached
    /// and told where to resume. False: not yet (more bytes needed, or the connection was
    /// refused).
    fn greet(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) -> bool {
        let (Some(streams), Some(ck)) = (&self.streams, &self.env.ckpt) else {
            self.greeted = true;
            return true;
        };
        if !matches!(self.framing, Framing::LengthPrefixed { .. }) {
            self.greeted = true;
            return true;
        }
        match resend::parse_hello(input) {
            None => {
                self.greeted = true;
                tracing::debug!(peer = %self.peer, "source connection without a hello: no positions");
                true
            }
            Some(None) => false,
            Some(Some(stream)) => {
                let _ = input.split_to(resend::HELLO_LEN);
                self.greeted = true;
                let attached = if stream == 0 {
                    Err("stream 0 is not a stream id")
                } else {
                    streams.attach(stream, &ck.coord)
                };
                match attached {
                    Ok(pos) => {
                        self.stream = stream;
                        self.pos = pos;
                        self.acked = streams.acked(stream);
                        ck.position(&streams.name, stream, pos, true);
                        let _ = conn.send(resend::message(resend::RESUME, pos).to_vec());
                        tracing::debug!(peer = %self.peer, stream, pos, "source stream attached");
                        true
                    }
                    Err(why) => {
                        tracing::info!(peer = %self.peer, stream, why, "source stream refused for now; the sender tries again");
                        input.clear();
                        conn.close();
                        false
                    }
                }
            }
        }
    }
}

impl Protocol for SourceConn {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        // Each connection may hold up to a frame of input: their number is bounded.
        if self.env.open_sources.get() >= self.env.opts.max_source_connections {
            if let Some(held) = self.refusals.borrow_mut().allow() {
                let peer = self.peer;
                tracing::warn!(%peer, held, "source connection refused: at max_source_connections");
            }
            conn.close();
            return;
        }
        self.env.open_sources.set(self.env.open_sources.get() + 1);
        self.counted = true;
        let mut sources = self.env.sources.borrow_mut();
        sources.retain(|h| !h.is_closed());
        sources.push(conn.handle());
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        if self.env.shutting.get() {
            conn.close();
            return;
        }
        if self.env.must_wait() {
            self.hold(conn);
            return;
        }
        if !self.greeted && self.streams.is_some() && !self.greet(conn, input) {
            return;
        }
        let mut head = self.head.borrow_mut();
        head.begin();
        head.set_origin(Rid {
            stream: self.stream,
            pos: self.pos,
        });
        let result = head.records(self.framing, input);
        if self.stream != 0 {
            self.pos = head.origin().pos;
            if let (Some(ck), Some(streams)) = (&self.env.ckpt, &self.streams) {
                ck.position(&streams.name, self.stream, self.pos, true);
            }
        }
        match result {
            Ok(used) => {
                let _ = input.split_to(used);
            }
            Err(e) => {
                head.frame_error(Some(conn.peer_addr()), &e);
                input.clear();
                conn.close();
            }
        }
        head.end_turn();
        drop(head);
        if !conn.is_closing() && self.env.must_wait() {
            self.hold(conn);
        }
    }

    fn on_wake(&mut self, conn: &mut Conn<'_>) {
        if self.stream != 0 {
            if let Some(streams) = &self.streams {
                let acked = streams.acked(self.stream);
                if acked > self.acked {
                    self.acked = acked;
                    let _ = conn.send(resend::message(resend::ACK, acked).to_vec());
                }
            }
        }
        if self.env.shutting.get() {
            conn.close();
        } else if conn.is_muted() {
            if self.env.must_wait() {
                self.env.wait(Waiter::Conn(conn.handle()));
            } else {
                conn.unmute();
            }
        }
    }

    fn on_shutdown(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    fn on_close(&mut self, why: &proto::Close) {
        if self.counted {
            self.env.open_sources.set(self.env.open_sources.get() - 1);
        }
        if self.stream != 0 {
            if let (Some(streams), Some(ck)) = (&self.streams, &self.env.ckpt) {
                ck.position(&streams.name, self.stream, self.pos, false);
                streams.detach(self.stream, self.pos);
            }
        }
        tracing::debug!(peer = %self.peer, %why, "source connection closed");
    }
}

/// Serves a TCP source on this worker: the runtime's accept loop for the source's server,
/// each connection a [`SourceConn`], until shutdown.
pub(super) async fn serve_source(
    server: ServerWorker,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    framing: Framing,
    streams: Option<Arc<Streams>>,
) {
    let built = Settings::builder()
        .read_budget(env.opts.read_budget)
        .read_size((256 * 1024).min(env.opts.read_budget).max(1024))
        .max_input(match framing {
            Framing::LengthPrefixed { max } | Framing::Lines { max } => max + 64 * 1024,
        })
        .build();
    let settings = match built {
        Ok(settings) => settings,
        Err(e) => {
            tracing::error!(error = %e, "source connection settings");
            return;
        }
    };
    let refusals = Rc::new(RefCell::new(RateLog::default()));
    let make = {
        let env = env.clone();
        move |peer| SourceConn {
            head: head.clone(),
            env: env.clone(),
            framing,
            peer,
            counted: false,
            refusals: refusals.clone(),
            streams: streams.clone(),
            greeted: false,
            stream: 0,
            pos: 0,
            acked: 0,
        }
    };
    if let Err(e) = server.serve_protocol(Some(settings), make).await {
        tracing::error!(error = %e, "source listener failed");
    }
}

/// Waits until the sources may read.
pub(super) async fn room(env: &Env, wake: &Rc<Notify>) {
    while env.must_wait() {
        env.wait(Waiter::Task(wake.clone()));
        wake.notified().await;
    }
}

/// The stream id of a file or generated source (its position: records read).
const LOCAL_STREAM: u64 = 1;

/// Where a file or generated source starts: after the records its restored checkpoint holds.
fn local_start(env: &Env, streams: &Option<Arc<Streams>>) -> u64 {
    match (streams, &env.ckpt) {
        (Some(s), Some(ck)) => {
            let pos = s.position(LOCAL_STREAM);
            ck.position(&s.name, LOCAL_STREAM, pos, true);
            pos
        }
        _ => 0,
    }
}

/// Records where a file or generated source stands, for checkpoints.
fn local_position(env: &Env, streams: &Option<Arc<Streams>>, head: &dyn Process) {
    if let (Some(s), Some(ck)) = (streams, &env.ckpt) {
        ck.position(&s.name, LOCAL_STREAM, head.origin().pos, true);
    }
}

pub(super) async fn file_source(
    path: std::path::PathBuf,
    framing: Framing,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    streams: Option<Arc<Streams>>,
) {
    let wake = Rc::new(Notify::new());
    let mut skip = local_start(&env, &streams);
    head.borrow_mut().set_origin(Rid {
        stream: if streams.is_some() { LOCAL_STREAM } else { 0 },
        pos: skip,
    });
    match std::fs::File::open(&path) {
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "source file cannot be opened")
        }
        Ok(file) => {
            let mut feed = Feed::new(file);
            let mut buf: Vec<u8> = Vec::new();
            let mut end = false;
            while !env.shutting.get() && !end {
                room(&env, &wake).await;
                if env.shutting.get() {
                    break;
                }
                let n = match feed.read(&mut buf, &env).await {
                    Ok(Some(n)) => n,
                    // The shutdown came while the input was awaited.
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "source file read failed");
                        break;
                    }
                };
                if n == 0 {
                    if buf.is_empty() {
                        break;
                    }
                    if !matches!(framing, Framing::Lines { .. }) {
                        let e = FrameError::Truncated { missing: 0 };
                        head.borrow_mut().frame_error(None, &e);
                        break;
                    }
                    // The last line of a text file need not end with a newline: it is a
                    // record all the same.
                    buf.push(b'\n');
                    end = true;
                }
                if skip > 0 {
                    // Records a restored checkpoint holds already.
                    let used = skip_records(framing, &buf, skip);
                    skip -= used.0;
                    buf.drain(..used.1);
                }
                let r = {
                    let mut h = head.borrow_mut();
                    h.begin();
                    let r = h.records(framing, &buf);
                    h.end_turn();
                    if let Err(e) = &r {
                        h.frame_error(None, e);
                    }
                    local_position(&env, &streams, &*h);
                    r
                };
                match r {
                    Ok(used) => {
                        buf.drain(..used);
                    }
                    Err(_) => break,
                }
                tokio::task::yield_now().await;
            }
        }
    }
    head.borrow_mut().end_of_input();
}

/// Where a file source's bytes come from. A regular file is read on the worker (a read of
/// one never waits for long); anything else (a pipe, a FIFO, a terminal: the standard input)
/// is read by a thread of its own, so that the worker's timers, its other pipelines and a
/// shutdown go on while the input is awaited.
enum Feed {
    Here(std::fs::File, Box<[u8]>),
    Thread(tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>),
}

/// How much one read of a file source takes.
const FEED_CHUNK: usize = 256 * 1024;

impl Feed {
    fn new(file: std::fs::File) -> Feed {
        if file.metadata().is_ok_and(|m| m.is_file()) {
            return Feed::Here(file, vec![0u8; FEED_CHUNK].into_boxed_slice());
        }
        // Two chunks in flight at most: the thread waits for the worker, as the worker's own
        // reads would (`room`).
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let reader = file.try_clone();
        let spawned = reader.map(|mut file| {
            std::thread::Builder::new()
                .name("canter-source-read".into())
                .spawn(move || loop {
                    let mut chunk = vec![0u8; FEED_CHUNK];
                    let r = match file.read(&mut chunk) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        r => r.map(|n| {
                            chunk.truncate(n);
                            chunk
                        }),
                    };
                    let last = !matches!(&r, Ok(c) if !c.is_empty());
                    if tx.blocking_send(r).is_err() || last {
                        break;
                    }
                })
        });
        match spawned {
            Ok(Ok(_)) => Feed::Thread(rx),
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(error = %e, "no thread to read the source: read on the worker");
                Feed::Here(file, vec![0u8; FEED_CHUNK].into_boxed_slice())
            }
        }
    }

    /// Appends the next bytes to `buf`: how many (0 at the end of the input), or None if the
    /// shutdown came first.
    async fn read(&mut self, buf: &mut Vec<u8>, env: &Env) -> std::io::Result<Option<usize>> {
        match self {
            Feed::Here(file, chunk) => {
                let n = file.read(chunk)?;
                buf.extend_from_slice(&chunk[..n]);
                Ok(Some(n))
            }
            Feed::Thread(rx) => loop {
                // The shutdown is looked for every 50 ms while nothing comes.
                match tokio::time::timeout(std::time::Duration::from_millis(50), rx.recv()).await {
                    Ok(Some(r)) => {
                        let chunk = r?;
                        buf.extend_from_slice(&chunk);
                        return Ok(Some(chunk.len()));
                    }
                    Ok(None) => return Ok(Some(0)),
                    Err(_) if env.shutting.get() => return Ok(None),
                    Err(_) => {}
                }
            },
        }
    }
}

pub(super) async fn generate_source(
    count: u64,
    make: Arc<dyn Fn(u64, &mut Vec<u8>) + Send + Sync>,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    streams: Option<Arc<Streams>>,
) {
    let wake = Rc::new(Notify::new());
    let mut scratch = Vec::with_capacity(256);
    let mut i = local_start(&env, &streams);
    head.borrow_mut().set_origin(Rid {
        stream: if streams.is_some() { LOCAL_STREAM } else { 0 },
        pos: i,
    });
    while i < count && !env.shutting.get() {
        room(&env, &wake).await;
        if env.shutting.get() {
            break;
        }
        {
            let mut h = head.borrow_mut();
            h.begin();
            let end = (i + 1024).min(count);
            while i < end {
                scratch.clear();
                make(i, &mut scratch);
                h.record(&scratch);
                i += 1;
            }
            h.end_turn();
            local_position(&env, &streams, &*h);
        }
        tokio::task::yield_now().await;
    }
    head.borrow_mut().end_of_input();
}

/// Skips up to `n` whole records at the start of `buf`: (records skipped, bytes they took).
/// A broken frame is left for the pipeline to report.
fn skip_records(framing: Framing, buf: &[u8], n: u64) -> (u64, usize) {
    let (mut skipped, mut at) = (0, 0);
    while skipped < n {
        let next = match framing {
            Framing::LengthPrefixed { max } => {
                let Some(len) = buf.get(at..at + 4) else {
                    break;
                };
                let mut l = [0u8; 4];
                l.copy_from_slice(len);
                let len = u32::from_be_bytes(l) as usize;
                if len > max || buf.len() - at - 4 < len {
                    break;
                }
                at + 4 + len
            }
            Framing::Lines { .. } => match buf[at..].iter().position(|&b| b == b'\n') {
                Some(i) => at + i + 1,
                None => break,
            },
        };
        at = next;
        skipped += 1;
    }
    (skipped, at)
}
