//! Checkpoints of a group of processes: the first process's coordinator starts each checkpoint
//! for the whole group, gathers every process's part (its workers' snapshots, merged) and
//! writes the one file; the coordinator of each other process relays: it triggers its workers
//! when told, sends their part, and acknowledges its sources once the file is durable.
//!
//! They talk over a Unix socket in the group's directory, in frames of a little-endian `u32`
//! length, a kind byte and a body. A part travels as a checkpoint file's own encoding (with
//! its checksum), so it is read back exactly as the file is.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::checkpoint::{Entries, Snapshot};
use super::super::metrics::Metrics;
use super::ckpt::{merge_states, Coord, Part, Peers};
use super::lock;

/// The coordinators' socket in the group's directory.
pub(super) fn socket_path(dir: &Path) -> PathBuf {
    dir.join("checkpoints.sock")
}

/// A process after the first: its number, and the epoch of the checkpoint it restored.
const HELLO: u8 = 1;
/// Start checkpoint (epoch).
const TRIGGER: u8 = 2;
/// A process's part: whether every worker of it answered, then a snapshot.
const PART: u8 = 3;
/// The checkpoint is durable: a snapshot with its epoch and the streams' positions.
const DURABLE: u8 = 4;
/// The largest frame taken (a part holds the keys a process changed in one interval).
const MAX_FRAME: usize = 1 << 30;

fn write_frame(s: &mut UnixStream, kind: u8, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len() + 1)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "checkpoint part too large"))?;
    let mut b = Vec::with_capacity(body.len() + 5);
    b.extend_from_slice(&len.to_le_bytes());
    b.push(kind);
    b.extend_from_slice(body);
    s.write_all(&b)
}

/// Reads one frame; `Ok(None)` when the read timed out before a frame began.
fn read_frame(s: &mut UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match s.read(&mut len[..1]) {
        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    }
    // A frame has begun: the rest comes whatever the read timeout.
    read_all(s, &mut len[1..])?;
    let len = u32::from_le_bytes(len) as usize;
    if !(1..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a checkpoint frame of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    read_all(s, &mut body)?;
    let kind = body.remove(0);
    Ok(Some((kind, body)))
}

fn read_all(s: &mut UnixStream, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match s.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn positions_map(p: &[(Arc<str>, u64, u64)]) -> BTreeMap<(String, u64), u64> {
    let mut m = BTreeMap::new();
    for (pipe, stream, pos) in p {
        let at = m.entry((pipe.to_string(), *stream)).or_insert(0);
        *at = (*at).max(*pos);
    }
    m
}

/// The first process's side: the other processes' coordinators.
pub(super) struct Followers {
    listener: UnixListener,
    /// The processes connected (by number), each with its stream.
    conns: BTreeMap<usize, UnixStream>,
    /// Processes after the first.
    expected: usize,
    restored: u64,
    /// The parts the links' readers hand on.
    parts: Sender<Part>,
    received: Receiver<Part>,
    waiting_logged: Option<Instant>,
}

impl Followers {
    /// Listens at `path` for the coordinators of processes `1..processes`.
    pub(super) fn bind(path: &Path, processes: usize, restored: u64) -> io::Result<Followers> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("checkpoint socket {}: {e}", path.display()),
            )
        })?;
        listener.set_nonblocking(true)?;
        let (parts, received) = std::sync::mpsc::channel();
        Ok(Followers {
            listener,
            conns: BTreeMap::new(),
            expected: processes.saturating_sub(1),
            restored,
            parts,
            received,
            waiting_logged: None,
        })
    }

    fn admit_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if let Err(e) = self.admit(s) {
                        tracing::error!(error = %e, "a process of the group could not join the checkpoints");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "checkpoint socket: accept failed");
                    break;
                }
            }
        }
    }
}

impl Peers for Followers {
    fn count(&self) -> usize {
        self.expected
    }

    fn collect(
        &mut self,
        epoch: u64,
        deadline: Instant,
        stop: &AtomicBool,
        pending: &mut BTreeMap<String, Entries>,
    ) -> (BTreeMap<(String, u64), u64>, bool) {
        let (mut got, mut complete) = (0, true);
        let mut positions = Vec::new();
        while got < self.expected {
            match self.received.recv_timeout(Duration::from_millis(20)) {
                Ok(p) => {
                    merge_states(pending, p.states);
                    if p.epoch == epoch {
                        got += 1;
                        complete &= p.complete;
                        positions.extend(p.positions);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                        break;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        (positions_map(&positions), complete && got == self.expected)
    }

    fn ready(&mut self) -> bool {
        self.admit_all();
        let ready = self.conns.len() == self.expected;
        if !ready
            && self
                .waiting_logged
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            self.waiting_logged = Some(Instant::now());
            tracing::info!(
                connected = self.conns.len(),
                expected = self.expected,
                "checkpoints wait for every process of the group"
            );
        }
        ready
    }

    /// A process that cannot be told is dropped (the checkpoint will miss its part).
    fn trigger(&mut self, epoch: u64) {
        self.send(TRIGGER, &epoch.to_le_bytes());
    }

    fn durable(&mut self, epoch: u64, positions: &BTreeMap<(String, u64), u64>) {
        let snap = Snapshot {
            epoch,
            positions: positions.clone(),
            ..Snapshot::default()
        };
        self.send(DURABLE, &snap.encode());
    }
}

impl Followers {
    fn admit(&mut self, mut s: UnixStream) -> io::Result<()> {
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        let Some((HELLO, body)) = read_frame(&mut s)? else {
            return Err(bad("no hello".into()));
        };
        let word = |i: usize| -> io::Result<u64> {
            let b: [u8; 8] = body
                .get(i..i + 8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| bad("a short hello".into()))?;
            Ok(u64::from_le_bytes(b))
        };
        let (process, restored) = (word(0)? as usize, word(8)?);
        if process == 0 || process > self.expected {
            return Err(bad(format!(
                "process {process} of a group of {}",
                self.expected + 1
            )));
        }
        if restored != self.restored {
            return Err(bad(format!(
                "process {process} restored checkpoint {restored}, the first process {}: \
                 start every process of the group on the same checkpoint directory",
                self.restored
            )));
        }
        s.set_read_timeout(None)?;
        let reader = s.try_clone()?;
        let parts = self.parts.clone();
        std::thread::Builder::new()
            .name(format!("canter-ckpt-from-{process}"))
            .spawn(move || read_parts(reader, process, parts))?;
        tracing::debug!(process, "a process of the group joined the checkpoints");
        self.conns.insert(process, s);
        Ok(())
    }

    fn send(&mut self, kind: u8, body: &[u8]) {
        let mut lost = Vec::new();
        for (p, s) in &mut self.conns {
            if let Err(e) = write_frame(s, kind, body) {
                tracing::error!(process = p, error = %e, "lost the checkpoint link to a process of the group");
                lost.push(*p);
            }
        }
        for p in lost {
            self.conns.remove(&p);
        }
    }
}

/// Reads a process's parts and hands them to the coordinator.
fn read_parts(mut s: UnixStream, process: usize, parts: Sender<Part>) {
    loop {
        let frame = match read_frame(&mut s) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::warn!(process, error = %e, "checkpoint link from a process of the group lost");
                }
                return;
            }
        };
        let (PART, body) = frame else {
            tracing::warn!(process, kind = frame.0, "unexpected checkpoint frame");
            continue;
        };
        let Some((&complete, snap)) = body.split_first() else {
            continue;
        };
        match Snapshot::decode(snap) {
            Ok(snap) => {
                let part = Part {
                    epoch: snap.epoch,
                    positions: snap
                        .positions
                        .into_iter()
                        .map(|((p, s), pos)| (Arc::from(p.as_str()), s, pos))
                        .collect(),
                    states: snap.states.into_iter().collect(),
                    complete: complete == 1,
                };
                if parts.send(part).is_err() {
                    return;
                }
            }
            Err(e) => tracing::error!(process, error = %e, "a checkpoint part did not decode"),
        }
    }
}

/// The coordinator of a process after the first: connects to the first process's, then
/// triggers this process's workers when told, sends their part, and acknowledges the sources
/// once told the checkpoint is durable; until `stop`.
pub(super) fn follow(
    coord: Arc<Coord>,
    path: PathBuf,
    process: usize,
    parts: Receiver<Part>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) {
    let restored = coord.restored.as_ref().map_or(0, |r| r.epoch);
    let started = Instant::now();
    let mut logged: Option<Instant> = None;
    let mut s = loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match UnixStream::connect(&path) {
            Ok(s) => break s,
            Err(e) => {
                if started.elapsed() > Duration::from_secs(30)
                    && logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
                {
                    logged = Some(Instant::now());
                    tracing::warn!(path = %path.display(), error = %e,
                        "waiting for the group's first process to take checkpoints");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(&(process as u64).to_le_bytes());
    hello.extend_from_slice(&restored.to_le_bytes());
    if let Err(e) = write_frame(&mut s, HELLO, &hello)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_millis(50))))
    {
        tracing::error!(error = %e, "the checkpoint link to the group's first process failed");
        return;
    }
    // Changes of checkpoints this process could not finish: carried by the next part.
    let mut pending: BTreeMap<String, Entries> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let (kind, body) = match read_frame(&mut s) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => {
                if !stop.load(Ordering::SeqCst) {
                    tracing::info!(error = %e, "the group's first process closed the checkpoint link: no more checkpoints here");
                }
                return;
            }
        };
        match kind {
            TRIGGER => {
                let Some(epoch) = body.get(..8).and_then(|b| b.try_into().ok()) else {
                    continue;
                };
                let epoch = u64::from_le_bytes(epoch);
                let (got, complete) = coord.gather(epoch, &parts, &stop, &mut pending);
                let snap = Snapshot {
                    epoch,
                    positions: got,
                    states: std::mem::take(&mut pending),
                    ..Snapshot::default()
                };
                let mut b = vec![u8::from(complete)];
                b.extend_from_slice(&snap.encode());
                if let Err(e) = write_frame(&mut s, PART, &b) {
                    tracing::error!(error = %e, "the checkpoint link to the group's first process failed");
                    return;
                }
            }
            DURABLE => match Snapshot::decode(&body) {
                Ok(snap) => {
                    // The group's checkpoint, in this process's metrics too.
                    let m = &metrics.checkpoints;
                    m.completed.fetch_add(1, Ordering::Relaxed);
                    m.last_epoch.store(snap.epoch, Ordering::Relaxed);
                    coord.durable(snap.epoch, &snap.positions)
                }
                Err(e) => tracing::error!(error = %e, "a durable notice did not decode"),
            },
            other => tracing::warn!(kind = other, "unexpected checkpoint frame"),
        }
    }
}

impl Coord {
    /// Triggers checkpoint `epoch` on this process's workers and waits (up to ten seconds, or
    /// `stop`) for their parts: their positions (merged), their states added to `pending`,
    /// and whether every worker answered.
    pub(super) fn gather(
        &self,
        epoch: u64,
        parts: &Receiver<Part>,
        stop: &AtomicBool,
        pending: &mut BTreeMap<String, Entries>,
    ) -> (BTreeMap<(String, u64), u64>, bool) {
        let started = Instant::now();
        self.in_progress.store(true, Ordering::SeqCst);
        for w in 0..self.workers {
            self.trigger[w].store(epoch, Ordering::SeqCst);
            self.wakes[w].notify_one();
        }
        let mut got = Vec::with_capacity(self.workers);
        while got.len() < self.workers {
            match parts.recv_timeout(Duration::from_millis(20)) {
                Ok(p) if p.epoch == epoch => got.push(p),
                Ok(late) => merge_states(pending, late.states),
                Err(RecvTimeoutError::Timeout) => {
                    if stop.load(Ordering::SeqCst) || started.elapsed() >= Duration::from_secs(10) {
                        break;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.in_progress.store(false, Ordering::SeqCst);
        let complete = got.len() == self.workers;
        let mut positions = Vec::new();
        for p in got {
            positions.extend(p.positions);
            merge_states(pending, p.states);
        }
        (positions_map(&positions), complete)
    }

    /// Checkpoint `epoch` is durable: the sources acknowledge `positions`, and the workers
    /// hear of it.
    pub(super) fn durable(&self, epoch: u64, positions: &BTreeMap<(String, u64), u64>) {
        for s in &self.streams {
            let mut acked = lock(&s.acked);
            for ((pipe, stream), pos) in positions {
                if **pipe == *s.name {
                    acked.insert(*stream, *pos);
                }
            }
        }
        for w in 0..self.workers {
            self.acks[w].store(epoch, Ordering::SeqCst);
            self.wakes[w].notify_one();
        }
    }
}
