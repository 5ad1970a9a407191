//! Records crossing processes: the codec a keyed pipeline gives ([`Wire`]), the group of processes a topology's workers are spread over ([`Group`]), and the frames on the links between workers.
//!
//! Each worker of a group listens on a Unix socket of its own in the group's directory
//! (`w<worker>.sock`, numbered across the group); each worker keeps one link to every worker of
//! the other processes. A link starts with a hello (magic, sender, receiver, workers in all) and
//! then carries frames: `u32` length of the rest, kind (`0` records, `1` end of the sender's
//! input, `2` the sender's goodbye), `u16` pipeline, `u32` records, and for records their read times (`u64` each) and the
//! pipeline's encoded batch. All integers are little-endian.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use tokio::sync::Notify;

/// How a keyed pipeline's keys and items cross processes ([`Keyed::wire`](super::super::Keyed::wire)),
/// when the topology's workers are spread over a [`Group`] of processes: the sending worker
/// encodes each batch bound for a worker of another process, the owner's worker decodes it.
pub trait Wire<K, T>: Send + Sync + 'static {
    /// Appends the batch `items` (consumed) to `out`.
    fn encode(&self, items: Vec<(K, T)>, out: &mut Vec<u8>) -> Result<(), String>;
    /// Decodes a batch `encode` wrote, appending its items to `out` in order.
    fn decode(&self, bytes: &[u8], out: &mut Vec<(K, T)>) -> Result<(), String>;
}

/// The processes a topology's workers are spread over ([`RunOptions::group`](super::super::RunOptions::group)).
///
/// Every process runs the same topology with the same number of workers; process `process`'s
/// workers are numbered `process × workers ..` across the group, and each key belongs to one
/// worker of the whole group. The processes' TCP sources share their ports (SO_REUSEPORT), a
/// file or generated source is read by the group's first worker only, and records whose key
/// lives in another process cross to it in batches over Unix sockets in `dir`, encoded by the
/// pipeline's [`Wire`]. With checkpoints, the group checkpoints as one: the first process
/// takes each checkpoint of every worker of the group into the one directory (every process
/// names the same), and a group started again with as many processes restores it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Group {
    /// This process's number, from 0.
    pub process: usize,
    /// Processes in the group.
    pub processes: usize,
    /// A directory all of them can reach, for the workers' sockets.
    pub dir: PathBuf,
}

impl Group {
    /// Process `process` of `processes`, their sockets in `dir`.
    pub fn new(process: usize, processes: usize, dir: impl Into<PathBuf>) -> Self {
        Group {
            process,
            processes,
            dir: dir.into(),
        }
    }
}

/// Where worker `gid` of a group listens.
pub(super) fn socket_path(dir: &Path, gid: usize) -> PathBuf {
    dir.join(format!("w{gid}.sock"))
}

/// A link's first bytes.
pub(super) const MAGIC: [u8; 4] = *b"CXW1";
/// The hello's length: magic, sender, receiver, workers in all (`u32` each).
pub(super) const HELLO: usize = 16;
/// A frame's header after its length: kind, pipeline, records.
pub(super) const HEADER: usize = 1 + 2 + 4;
/// The largest frame a worker takes: a bound on what one link makes it hold.
pub(super) const MAX_FRAME: usize = 256 << 20;
/// Frame kinds.
pub(super) const DATA: u8 = 0;
/// The sender's input has ended (records: 1 if for a shutdown, not the input's end).
pub(super) const END: u8 = 1;
/// The sender's worker has ended: the link closes cleanly after this.
pub(super) const BYE: u8 = 2;
/// A checkpoint's barrier (its epoch, a little-endian `u64`, in the body): the records before
/// it on the link belong before the checkpoint.
pub(super) const BARRIER: u8 = 3;

pub(super) fn hello(from: usize, to: usize, total: usize) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    for v in [from, to, total] {
        h.extend_from_slice(&(v as u32).to_le_bytes());
    }
    h
}

/// Starts a frame in `out`; returns where it starts, for [`end_frame`].
pub(super) fn begin_frame(out: &mut Vec<u8>, kind: u8, pipe: u16, records: u32) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&pipe.to_le_bytes());
    out.extend_from_slice(&records.to_le_bytes());
    at
}

/// Writes the length of the frame begun at `at`.
pub(super) fn end_frame(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// A frame as read: kind, pipeline, records, and the rest (read times and batch).
pub(super) struct Frame<'a> {
    pub(super) kind: u8,
    pub(super) pipe: u16,
    pub(super) records: u32,
    pub(super) body: &'a [u8],
}

/// The complete frame at the start of `buf` and the bytes it takes, `None` if more must come.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, String> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if !(HEADER..=MAX_FRAME).contains(&len) {
        return Err(format!("a frame of {len} bytes"));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let f = &buf[4..4 + len];
    Ok(Some((
        Frame {
            kind: f[0],
            pipe: u16::from_le_bytes([f[1], f[2]]),
            records: u32::from_le_bytes([f[3], f[4], f[5], f[6]]),
            body: &f[HEADER..],
        },
        4 + len,
    )))
}

/// Splits a records frame's body into its read times and the encoded batch.
pub(super) fn split_body(
    body: &[u8],
    records: usize,
) -> Option<(impl Iterator<Item = u64> + '_, &[u8])> {
    let n = records.checked_mul(8)?;
    if body.len() < n {
        return None;
    }
    let (times, batch) = body.split_at(n);
    let times = times.chunks_exact(8).map(|c| {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        u64::from_le_bytes(b)
    });
    Some((times, batch))
}

/// What one worker has for one worker of another process, waiting for the link's task.
pub(crate) struct LinkBuf {
    pub(super) data: Vec<u8>,
    /// Above this the sources wait.
    pub(super) high: usize,
    /// Wakes the link's task.
    pub(super) wake: Rc<Notify>,
    /// The worker has ended: the task writes what is left, then ends.
    pub(super) closing: bool,
    /// The link is lost: what comes is dropped (and counted).
    pub(super) dead: bool,
    pub(super) dropped: u64,
}

impl LinkBuf {
    pub(super) fn new(high: usize) -> Self {
        LinkBuf {
            data: Vec::new(),
            high,
            wake: Rc::new(Notify::new()),
            closing: false,
            dead: false,
            dropped: 0,
        }
    }

    pub(super) fn full(&self) -> bool {
        self.data.len() >= self.high
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_lengths_are_refused() {
        let mut out = Vec::new();
        let at = begin_frame(&mut out, DATA, 3, 2);
        out.extend_from_slice(&7u64.to_le_bytes());
        out.extend_from_slice(&9u64.to_le_bytes());
        out.extend_from_slice(b"batch");
        end_frame(&mut out, at);
        let at = begin_frame(&mut out, END, 3, 0);
        end_frame(&mut out, at);
        let (f, used) = parse(&out).unwrap().unwrap();
        assert_eq!((f.kind, f.pipe, f.records), (DATA, 3, 2));
        let (times, batch) = split_body(f.body, 2).unwrap();
        assert_eq!(times.collect::<Vec<_>>(), vec![7, 9]);
        assert_eq!(batch, b"batch");
        assert!(split_body(f.body, 3).is_none(), "read times past the body");
        let (f, used2) = parse(&out[used..]).unwrap().unwrap();
        assert_eq!((f.kind, f.records, used + used2), (END, 0, out.len()));
        assert!(parse(&out[..used - 1]).unwrap().is_none(), "incomplete");
        assert!(parse(&[1, 0, 0, 0, 0]).is_err(), "shorter than its header");
        assert!(parse(&u32::MAX.to_le_bytes()).is_err(), "past the bound");
    }
}
