//! Checkpoints of a topology in a local directory: the file format, writing (atomic rename,
//! checksum, the last N kept, compaction) and finding the latest complete one at start.
//!
//! A checkpoint file holds, for one epoch, the keys of each keyed state changed since the base
//! checkpoint (a *delta*; a *full* file has no base and holds every key), and every TCP source
//! stream's position: how many of its records the state includes. Restoring epoch `n` applies
//! its chain in order: the full file it goes back to, then each delta up to `n`.
//!
//! ```text
//! file    = "CANTERCK" version:u32 kind:u8 (0 full, 1 delta) epoch:u64 base:u64 workers:u32
//!           positions:u32 { pipeline:str stream:u64 position:u64 }
//!           states:u32 { name:str entries:u64 bytes:u64 { key:bytes tag:u8 [state:bytes] } }
//!           crc32c:u32 (of everything before it)
//! str     = len:u16 then UTF-8;   bytes = len:u32 then the bytes;   integers big-endian
//! tag     = 1: the key's state follows; 0: the key was removed
//! ```
//! Files are named `{epoch:020}.full` or `{epoch:020}.delta`, written as `.{name}.tmp`,
//! synced, renamed and the directory synced: a crash leaves the previous checkpoint whole, and
//! a torn or corrupt file (its checksum fails) is passed over for the one before it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

const MAGIC: &[u8; 8] = b"CANTERCK";
const VERSION: u32 = 1;
/// The header's size: magic, version, kind, epoch, base, workers.
const HEADER: usize = 8 + 4 + 1 + 8 + 8 + 4;

/// Where and how often a topology checkpoints (see [`crate::pipeline::RunOptions::checkpoint`]).
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    /// The directory (created if missing); a topology started with the same one restores its
    /// latest complete checkpoint.
    pub dir: PathBuf,
    /// Time between checkpoints.
    pub interval: Duration,
    /// Checkpoints that stay restorable (older files are deleted).
    pub keep: usize,
}

impl CheckpointOptions {
    /// Checkpoints in `dir` every second, the last 3 kept.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointOptions {
            dir: dir.into(),
            interval: Duration::from_secs(1),
            keep: 3,
        }
    }

    /// Sets the time between checkpoints.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Sets how many checkpoints stay restorable.
    pub fn keep(mut self, keep: usize) -> Self {
        self.keep = keep.max(1);
        self
    }
}

/// Why a checkpoint file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Corrupt(pub(crate) String);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One keyed state's entries in a checkpoint, encoded (`key tag [state]` each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Entries {
    pub(crate) count: u64,
    pub(crate) bytes: Vec<u8>,
}

impl Entries {
    /// Appends a key and its state (`None`: removed), each encoded by `key`/`state`.
    pub(crate) fn push(
        &mut self,
        key: impl FnOnce(&mut Vec<u8>),
        state: Option<&dyn Fn(&mut Vec<u8>)>,
    ) {
        put_with_len(&mut self.bytes, key);
        match state {
            Some(s) => {
                self.bytes.push(1);
                put_with_len(&mut self.bytes, s);
            }
            None => self.bytes.push(0),
        }
        self.count += 1;
    }

    /// Appends another worker's entries of the same state.
    pub(crate) fn append(&mut self, other: &Entries) {
        self.bytes.extend_from_slice(&other.bytes);
        self.count += other.count;
    }

    /// The same entries with each key once (its last entry): what a failed checkpoint keeps
    /// for the next one stays bounded by the keys, however long writes fail.
    pub(crate) fn compacted(&self) -> Entries {
        let mut last: HashMap<&[u8], (usize, Option<&[u8]>)> = HashMap::new();
        for (i, (k, v)) in self.iter().enumerate() {
            last.insert(k, (i, v));
        }
        let mut order: Vec<_> = last.into_iter().collect();
        order.sort_by_key(|(_, (i, _))| *i);
        let mut out = Entries::default();
        for (k, (_, v)) in order {
            match v {
                Some(v) => out.push(
                    |b| b.extend_from_slice(k),
                    Some(&|b| b.extend_from_slice(v)),
                ),
                None => out.push(|b| b.extend_from_slice(k), None),
            }
        }
        out
    }

    /// Each entry: key and state (`None`: removed).
    pub(crate) fn iter(&self) -> EntryIter<'_> {
        EntryIter {
            b: &self.bytes,
            left: self.count,
        }
    }
}

/// Writes `f`'s output after a 4-byte length.
pub(crate) fn put_with_len(out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    f(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// The entries of an [`Entries`], in order.
pub(crate) struct EntryIter<'a> {
    b: &'a [u8],
    left: u64,
}

impl<'a> Iterator for EntryIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let mut r = Reader(self.b);
        let key = r.bytes().ok()?;
        let state = match r.u8().ok()? {
            0 => None,
            _ => Some(r.bytes().ok()?),
        };
        self.b = r.0;
        self.left -= 1;
        Some((key, state))
    }
}

/// A checkpoint's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) epoch: u64,
    /// The checkpoint this one's entries apply on (`None`: a full snapshot).
    pub(crate) base: Option<u64>,
    /// Workers of the topology that wrote it.
    pub(crate) workers: u32,
    /// Every source stream's position: (pipeline, stream) → records included.
    pub(crate) positions: BTreeMap<(String, u64), u64>,
    /// Entries per keyed state, by the state's name.
    pub(crate) states: BTreeMap<String, Entries>,
}

impl Snapshot {
    /// The file's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let size: usize = self.states.values().map(|e| e.bytes.len() + 64).sum();
        let mut b = Vec::with_capacity(HEADER + 64 + size + 32 * self.positions.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.push(u8::from(self.base.is_some()));
        b.extend_from_slice(&self.epoch.to_be_bytes());
        b.extend_from_slice(&self.base.unwrap_or(0).to_be_bytes());
        b.extend_from_slice(&self.workers.to_be_bytes());
        b.extend_from_slice(&(self.positions.len() as u32).to_be_bytes());
        for ((pipeline, stream), pos) in &self.positions {
            put_str(&mut b, pipeline);
            b.extend_from_slice(&stream.to_be_bytes());
            b.extend_from_slice(&pos.to_be_bytes());
        }
        b.extend_from_slice(&(self.states.len() as u32).to_be_bytes());
        for (name, e) in &self.states {
            put_str(&mut b, name);
            b.extend_from_slice(&e.count.to_be_bytes());
            b.extend_from_slice(&(e.bytes.len() as u64).to_be_bytes());
            b.extend_from_slice(&e.bytes);
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Reads a file's bytes, checking its checksum first.
    pub(crate) fn decode(b: &[u8]) -> Result<Snapshot, Corrupt> {
        let corrupt = |what: &str| Corrupt(what.to_owned());
        if b.len() < HEADER + 4 {
            return Err(corrupt("shorter than a header (a torn write?)"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let mut want = [0u8; 4];
        want.copy_from_slice(crc);
        if crc32c::crc32c(body) != u32::from_be_bytes(want) {
            return Err(corrupt("checksum mismatch (a torn or damaged file)"));
        }
        let (epoch, base, workers) = header(body)?;
        let mut r = Reader(&body[HEADER..]);
        let bad = |_| corrupt("ends early");
        let mut positions = BTreeMap::new();
        for _ in 0..r.u32().map_err(bad)? {
            let pipeline = r.str().map_err(bad)?;
            let stream = r.u64().map_err(bad)?;
            let pos = r.u64().map_err(bad)?;
            positions.insert((pipeline, stream), pos);
        }
        let mut states = BTreeMap::new();
        for _ in 0..r.u32().map_err(bad)? {
            let name = r.str().map_err(bad)?;
            let count = r.u64().map_err(bad)?;
            let len = r.u64().map_err(bad)? as usize;
            let bytes = r.take(len).map_err(bad)?.to_vec();
            let entries = Entries { count, bytes };
            if entries.iter().count() as u64 != count {
                return Err(corrupt("a state's entries do not parse"));
            }
            states.insert(name, entries);
        }
        if !r.0.is_empty() {
            return Err(corrupt("bytes after the last state"));
        }
        Ok(Snapshot {
            epoch,
            base,
            workers,
            positions,
            states,
        })
    }
}

/// A file's epoch, base and workers, from its header.
fn header(b: &[u8]) -> Result<(u64, Option<u64>, u32), Corrupt> {
    if b.len() < HEADER || &b[..8] != MAGIC {
        return Err(Corrupt("not a checkpoint file".into()));
    }
    let mut r = Reader(&b[8..HEADER]);
    let bad = |_| Corrupt("short header".into());
    let version = r.u32().map_err(bad)?;
    if version != VERSION {
        return Err(Corrupt(format!("version {version}, not {VERSION}")));
    }
    let delta = r.u8().map_err(bad)? != 0;
    let epoch = r.u64().map_err(bad)?;
    let base = r.u64().map_err(bad)?;
    let workers = r.u32().map_err(bad)?;
    Ok((epoch, delta.then_some(base), workers))
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.extend_from_slice(&(s.len() as u16).to_be_bytes());
    b.extend_from_slice(s);
}

/// Reads what the writers here (big-endian numbers, [`put_with_len`]'s lengths) wrote; what is
/// left is `.0`.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ()> {
        if self.0.len() < n {
            return Err(());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, ()> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ()> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.take(2)?);
        Ok(u16::from_be_bytes(a))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, ()> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, ()> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, ()> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| ())
    }
}

/// A restorable checkpoint: its chain of snapshots, full first, and the latest positions.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    pub(crate) epoch: u64,
    pub(crate) workers: u32,
    pub(crate) chain: Vec<Snapshot>,
    pub(crate) positions: BTreeMap<(String, u64), u64>,
    /// Files passed over (torn, corrupt, or missing a link), with why.
    pub(crate) skipped: Vec<(PathBuf, String)>,
}

impl Restored {
    /// Each state's entries in the order they apply (the full snapshot's first).
    pub(crate) fn entries<'a>(&'a self, state: &'a str) -> impl Iterator<Item = &'a Entries> {
        self.chain.iter().filter_map(move |s| s.states.get(state))
    }

    /// The names of the states the checkpoint holds.
    pub(crate) fn state_names(&self) -> std::collections::BTreeSet<&str> {
        self.chain
            .iter()
            .flat_map(|s| s.states.keys().map(String::as_str))
            .collect()
    }
}

/// The checkpoint directory.
#[derive(Debug)]
pub(crate) struct Dir {
    path: PathBuf,
    keep: usize,
}

/// A file in the directory: its epoch and whether it is full.
fn parse_name(name: &str) -> Option<(u64, bool)> {
    let (num, ext) = name.split_once('.')?;
    if num.len() != 20 {
        return None;
    }
    let epoch = num.parse().ok()?;
    match ext {
        "full" => Some((epoch, true)),
        "delta" => Some((epoch, false)),
        _ => None,
    }
}

fn file_name(epoch: u64, full: bool) -> String {
    format!("{epoch:020}.{}", if full { "full" } else { "delta" })
}

impl Dir {
    /// The directory at `path`, created if missing.
    pub(crate) fn open(path: &Path, keep: usize) -> io::Result<Dir> {
        fs::create_dir_all(path)?;
        Ok(Dir {
            path: path.to_owned(),
            keep: keep.max(1),
        })
    }

    /// The checkpoint files present: epoch → (delta?, full?).
    fn files(&self) -> io::Result<BTreeMap<u64, (bool, bool)>> {
        let mut files = BTreeMap::new();
        for e in fs::read_dir(&self.path)? {
            let e = e?;
            if let Some((epoch, full)) = e.file_name().to_str().and_then(parse_name) {
                let f: &mut (bool, bool) = files.entry(epoch).or_default();
                if full {
                    f.1 = true;
                } else {
                    f.0 = true;
                }
            }
        }
        Ok(files)
    }

    /// Writes a snapshot: to a temporary file, synced, renamed, the directory synced.
    pub(crate) fn write(&self, snap: &Snapshot) -> io::Result<u64> {
        self.write_with(snap, &mut || {})
    }

    /// [`Dir::write`], calling `half` when half the temporary file is written (a fault
    /// test's failpoint).
    pub(crate) fn write_with(&self, snap: &Snapshot, half: &mut dyn FnMut()) -> io::Result<u64> {
        let bytes = snap.encode();
        let name = file_name(snap.epoch, snap.base.is_none());
        let tmp = self.path.join(format!(".{name}.tmp"));
        let result = (|| {
            let mut f = fs::File::create(&tmp)?;
            let (a, b) = bytes.split_at(bytes.len() / 2);
            f.write_all(a)?;
            half();
            f.write_all(b)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, self.path.join(&name))?;
            fs::File::open(&self.path)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| bytes.len() as u64)
    }

    /// The latest checkpoint whose whole chain reads back (checksums included), or `None` in
    /// an empty directory. Newer files that cannot be used are listed in `skipped`.
    pub(crate) fn latest(&self) -> io::Result<Option<Restored>> {
        let files = self.files()?;
        let mut skipped = Vec::new();
        let mut cache: HashMap<PathBuf, Result<Snapshot, String>> = HashMap::new();
        let mut load = |epoch: u64, full: bool| -> (PathBuf, Result<Snapshot, String>) {
            let path = self.path.join(file_name(epoch, full));
            let r = cache
                .entry(path.clone())
                .or_insert_with(|| match fs::read(&path) {
                    Ok(b) => Snapshot::decode(&b)
                        .map_err(|e| e.to_string())
                        .and_then(|s| {
                            if s.epoch == epoch && s.base.is_none() == full {
                                Ok(s)
                            } else {
                                Err("its header names another epoch or kind".into())
                            }
                        }),
                    Err(e) => Err(e.to_string()),
                })
                .clone();
            (path, r)
        };
        'candidates: for (&epoch, _) in files.iter().rev() {
            let mut chain = Vec::new();
            let mut at = epoch;
            loop {
                let (has_delta, has_full) = files.get(&at).copied().unwrap_or_default();
                if has_full {
                    match load(at, true) {
                        (_, Ok(s)) => {
                            chain.push(s);
                            break;
                        }
                        (path, Err(why)) => skipped.push((path, why)),
                    }
                }
                if !has_delta {
                    if !has_full {
                        let path = self.path.join(file_name(at, false));
                        skipped.push((path, format!("missing (needed by epoch {epoch})")));
                    }
                    continue 'candidates;
                }
                match load(at, false) {
                    (_, Ok(s)) => {
                        let base = s.base.unwrap_or(0);
                        chain.push(s);
                        if base >= at {
                            continue 'candidates;
                        }
                        at = base;
                    }
                    (path, Err(why)) => {
                        skipped.push((path, why));
                        continue 'candidates;
                    }
                }
            }
            chain.reverse();
            let last = chain.last().cloned().unwrap_or_default();
            skipped.dedup();
            return Ok(Some(Restored {
                epoch,
                workers: last.workers,
                positions: last.positions,
                chain,
                skipped,
            }));
        }
        Ok(None)
    }

    /// The epochs each of the checkpoint `epoch`'s chain reads, from the files' headers.
    fn chain_of(&self, files: &BTreeMap<u64, (bool, bool)>, epoch: u64) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        let mut at = epoch;
        while let Some(&(delta, full)) = files.get(&at) {
            if full {
                out.push((at, true));
                break;
            }
            if !delta {
                break;
            }
            out.push((at, false));
            let mut head = [0u8; HEADER];
            let read = fs::File::open(self.path.join(file_name(at, false)))
                .and_then(|mut f| io::Read::read_exact(&mut f, &mut head));
            match read.ok().and_then(|()| header(&head).ok()) {
                Some((_, Some(base), _)) if base < at => at = base,
                _ => break,
            }
        }
        out
    }

    /// Deletes the files no chain of the last `keep` checkpoints reads, and stray temporary
    /// files. Returns the files deleted.
    pub(crate) fn prune(&self) -> io::Result<usize> {
        let files = self.files()?;
        let mut needed = std::collections::HashSet::new();
        for &epoch in files.keys().rev().take(self.keep) {
            needed.extend(self.chain_of(&files, epoch));
        }
        let mut deleted = 0;
        for (&epoch, &(delta, full)) in &files {
            for (kind, present) in [(false, delta), (true, full)] {
                if present && !needed.contains(&(epoch, kind)) {
                    fs::remove_file(self.path.join(file_name(epoch, kind)))?;
                    deleted += 1;
                }
            }
        }
        for e in fs::read_dir(&self.path)? {
            let e = e?;
            let name = e.file_name();
            if name.to_str().is_some_and(|n| n.ends_with(".tmp")) {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(deleted)
    }

    /// Writes checkpoint `epoch`'s chain as one full file (each key's last state; removed keys
    /// left out), so that later checkpoints no longer need the older files.
    pub(crate) fn compact(&self, epoch: u64) -> io::Result<u64> {
        let files = self.files()?;
        let chain = self.chain_of(&files, epoch);
        let mut snaps = Vec::new();
        for (e, full) in chain.into_iter().rev() {
            let b = fs::read(self.path.join(file_name(e, full)))?;
            snaps.push(Snapshot::decode(&b).map_err(|c| io::Error::other(c.to_string()))?);
        }
        let Some(last) = snaps.last() else {
            return Err(io::Error::other(format!(
                "no checkpoint {epoch} to compact"
            )));
        };
        let mut merged: BTreeMap<&str, HashMap<&[u8], Option<&[u8]>>> = BTreeMap::new();
        for s in &snaps {
            for (name, entries) in &s.states {
                let m = merged.entry(name).or_default();
                for (k, v) in entries.iter() {
                    m.insert(k, v);
                }
            }
        }
        let mut full = Snapshot {
            epoch,
            base: None,
            workers: last.workers,
            positions: last.positions.clone(),
            states: BTreeMap::new(),
        };
        for (name, m) in merged {
            let mut e = Entries::default();
            for (k, v) in m {
                if let Some(v) = v {
                    e.push(
                        |b| b.extend_from_slice(k),
                        Some(&|b| b.extend_from_slice(v)),
                    );
                }
            }
            full.states.insert(name.to_owned(), e);
        }
        self.write(&full)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn entries(kv: &[(&str, Option<&str>)]) -> Entries {
        let mut e = Entries::default();
        for (k, v) in kv {
            match v {
                Some(v) => e.push(
                    |b| b.extend_from_slice(k.as_bytes()),
                    Some(&|b: &mut Vec<u8>| b.extend_from_slice(v.as_bytes())),
                ),
                None => e.push(|b| b.extend_from_slice(k.as_bytes()), None),
            }
        }
        e
    }

    fn snap(epoch: u64, base: Option<u64>, kv: &[(&str, Option<&str>)]) -> Snapshot {
        let mut s = Snapshot {
            epoch,
            base,
            workers: 2,
            ..Snapshot::default()
        };
        s.positions.insert(("orders".into(), 7), epoch * 100);
        s.states.insert("symbols".into(), entries(kv));
        s
    }

    /// Each key's state after applying the chain.
    fn state_of(r: &Restored) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for e in r.entries("symbols") {
            for (k, v) in e.iter() {
                let k = String::from_utf8(k.to_vec()).unwrap();
                match v {
                    Some(v) => m.insert(k, String::from_utf8(v.to_vec()).unwrap()),
                    None => m.remove(&k),
                };
            }
        }
        m
    }

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("canter-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn a_snapshot_round_trips_and_any_changed_byte_is_caught() {
        let s = snap(
            3,
            Some(2),
            &[("AAPL", Some("x")), ("MSFT", None), ("", Some(""))],
        );
        let b = s.encode();
        assert_eq!(Snapshot::decode(&b).unwrap(), s);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(
                Snapshot::decode(&c).is_err(),
                "a flipped byte {i} was not caught"
            );
        }
        for cut in 0..b.len() {
            assert!(Snapshot::decode(&b[..cut]).is_err(), "cut at {cut} read");
        }
    }

    #[test]
    fn incremental_snapshots_apply_in_order_removals_included() {
        let dir = tmp("chain");
        let d = Dir::open(&dir, 3).unwrap();
        assert!(d.latest().unwrap().is_none(), "an empty directory has none");
        d.write(&snap(1, None, &[("a", Some("1")), ("b", Some("1"))]))
            .unwrap();
        d.write(&snap(2, Some(1), &[("a", Some("2"))])).unwrap();
        d.write(&snap(3, Some(2), &[("b", None), ("c", Some("3"))]))
            .unwrap();
        let r = d.latest().unwrap().unwrap();
        assert_eq!(r.epoch, 3);
        assert_eq!(r.chain.len(), 3);
        assert_eq!(r.positions[&("orders".to_owned(), 7)], 300);
        let want: BTreeMap<String, String> =
            [("a".into(), "2".into()), ("c".into(), "3".into())].into();
        assert_eq!(state_of(&r), want);
        // Compacted, the chain is one file with the same state.
        d.compact(3).unwrap();
        let r = d.latest().unwrap().unwrap();
        assert_eq!((r.epoch, r.chain.len()), (3, 1));
        assert_eq!(state_of(&r), want);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_latest_file_is_passed_over_for_the_one_before() {
        let dir = tmp("torn");
        let d = Dir::open(&dir, 3).unwrap();
        d.write(&snap(1, None, &[("a", Some("1"))])).unwrap();
        d.write(&snap(2, Some(1), &[("a", Some("2"))])).unwrap();
        d.write(&snap(3, Some(2), &[("a", Some("3"))])).unwrap();
        let path = dir.join(file_name(3, false));
        let b = fs::read(&path).unwrap();
        fs::write(&path, &b[..b.len() / 2]).unwrap();
        let r = d.latest().unwrap().unwrap();
        assert_eq!(r.epoch, 2);
        assert_eq!(state_of(&r)["a"], "2");
        assert_eq!(r.skipped.len(), 1, "{:?}", r.skipped);
        // A damaged link in the middle of a chain: back to the full one.
        let path = dir.join(file_name(2, false));
        let mut b = fs::read(&path).unwrap();
        b[HEADER + 3] ^= 1;
        fs::write(&path, &b).unwrap();
        let r = d.latest().unwrap().unwrap();
        assert_eq!(r.epoch, 1);
        assert_eq!(state_of(&r)["a"], "1");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_the_chains_of_the_last_n_are_kept() {
        let dir = tmp("prune");
        let d = Dir::open(&dir, 2).unwrap();
        d.write(&snap(1, None, &[("a", Some("1"))])).unwrap();
        for e in 2..=5 {
            d.write(&snap(e, Some(e - 1), &[("a", Some("x"))])).unwrap();
        }
        // Deltas all the way down: every file is still needed.
        assert_eq!(d.prune().unwrap(), 0);
        d.compact(5).unwrap();
        d.write(&snap(6, Some(5), &[("b", Some("6"))])).unwrap();
        // Epochs 6 and 5 need 5.full (and 6.delta): everything else goes.
        assert_eq!(d.prune().unwrap(), 5);
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec![file_name(5, true), file_name(6, false)]);
        let r = d.latest().unwrap().unwrap();
        assert_eq!(r.epoch, 6);
        assert_eq!(state_of(&r).len(), 2);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn compacting_entries_keeps_each_keys_last() {
        let mut e = entries(&[("a", Some("1")), ("b", Some("1")), ("a", Some("2"))]);
        e.append(&entries(&[("b", None), ("c", Some("3")), ("a", Some("4"))]));
        let c = e.compacted();
        assert_eq!(c.count, 3);
        let got: Vec<_> = c.iter().collect();
        assert_eq!(
            got,
            vec![
                (&b"b"[..], None),
                (&b"c"[..], Some(&b"3"[..])),
                (&b"a"[..], Some(&b"4"[..]))
            ]
        );
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_an_error() {
        // A file where the directory should be: nothing can be created under it.
        let file = tmp("notadir");
        fs::write(&file, b"x").unwrap();
        assert!(Dir::open(&file.join("sub"), 3).is_err());
        let dir = tmp("gone");
        let d = Dir::open(&dir, 3).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        fs::write(&dir, b"now a file").unwrap();
        assert!(d.write(&snap(1, None, &[])).is_err());
        let _ = fs::remove_file(&dir);
        let _ = fs::remove_file(&file);
    }
}
