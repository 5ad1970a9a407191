//! Compressed static files: a bounded cache of compressed copies, shared by the workers, and a
//! file stream for the files too large to keep.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use canter_rt::BodyStream;

use crate::app::router::BuildPathHasher;
use crate::middleware::{Coding, Compression};

/// How [`ServeDir`](super::ServeDir) compresses files that have no precompressed sibling: the
/// codings, levels, types and minimum size of a [`Compression`], and a cache of compressed
/// copies.
///
/// - Files up to [`StaticCompression::max_entry`] (default 1 MiB) are compressed once, on the
///   first request that wants them in a coding, off the worker's thread, and kept in a cache
///   of at most [`StaticCompression::cache_bytes`] (default 64 MiB) shared by the workers; the
///   least recently used copies are evicted first. A copy is keyed by the file's path, size and
///   modification time and the coding: a changed file is compressed again, never served stale.
/// - Larger files are compressed as they are sent, with the connection's backpressure.
///
/// ```
/// use canter::middleware::Compression;
/// use canter::{ServeDir, StaticCompression};
///
/// let files = ServeDir::new("public").compress(
///     StaticCompression::new(Compression::new().br_level(6)).cache_bytes(16 << 20),
/// );
/// # let _ = files;
/// ```
#[derive(Debug, Clone)]
pub struct StaticCompression {
    /// Codings, types, minimum size, and the levels of files compressed as they are sent.
    pub(crate) compression: Compression,
    /// The same with the levels of cached copies.
    pub(crate) cached: Compression,
    pub(crate) max_entry: u64,
    pub(crate) cache: Arc<Mutex<Cache>>,
}

impl StaticCompression {
    /// Compresses as `compression` says, with a 64 MiB cache of copies of files up to 1 MiB.
    /// Cached copies are made once, so at higher levels than `compression`'s (gzip 9, br 9,
    /// zstd 15; see [`StaticCompression::cache_levels`]); fewer bytes to send on every request
    /// that follows.
    pub fn new(compression: Compression) -> StaticCompression {
        let cached = compression.clone().gzip_level(9).br_level(9).zstd_level(15);
        StaticCompression {
            compression,
            cached,
            max_entry: 1 << 20,
            cache: Arc::new(Mutex::new(Cache::new(64 << 20))),
        }
    }

    /// The levels of cached copies: gzip 0 to 9, brotli 0 to 11, zstd 1 to 22.
    pub fn cache_levels(mut self, gzip: u32, br: u32, zstd: i32) -> StaticCompression {
        self.cached = self.cached.gzip_level(gzip).br_level(br).zstd_level(zstd);
        self
    }

    /// The most bytes of compressed copies the cache holds.
    pub fn cache_bytes(mut self, bytes: usize) -> StaticCompression {
        self.cache = Arc::new(Mutex::new(Cache::new(bytes)));
        self
    }

    /// Files larger than this are compressed as they are sent instead of cached.
    pub fn max_entry(mut self, bytes: u64) -> StaticCompression {
        self.max_entry = bytes;
        self
    }

    /// The cached copy of `key`'s file in `coding`, if it is there and of this version.
    pub(crate) fn cached(&self, key: &Key) -> Option<Bytes> {
        self.cache.lock().ok()?.get(key)
    }

    /// Claims the making of `key`'s copy: false when another request is making it now (that
    /// one is answered identity instead of compressing the same file twice at once).
    pub(crate) fn claim(&self, key: &Key) -> bool {
        self.cache
            .lock()
            .is_ok_and(|mut cache| cache.making.insert((key.path.clone(), key.coding)))
    }

    /// Keeps `data` as `key`'s copy (`None`: making it failed), ending the claim.
    pub(crate) fn keep(&self, key: Key, data: Option<Bytes>) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.making.remove(&(key.path.clone(), key.coding));
            if let Some(data) = data {
                cache.insert(key, data);
            }
        }
    }

    /// Whether `path` (at this size and time) was found without precompressed siblings less
    /// than [`NO_SIBLINGS_FOR`] ago.
    pub(crate) fn known_without_siblings(
        &self,
        path: &std::path::Path,
        size: u64,
        mtime_ns: u128,
    ) -> bool {
        self.cache.lock().is_ok_and(|cache| {
            cache.no_siblings.get(path).is_some_and(|&(s, m, at)| {
                s == size && m == mtime_ns && at.elapsed() < NO_SIBLINGS_FOR
            })
        })
    }

    /// Records that `path` (at this size and time) has no precompressed siblings now.
    pub(crate) fn without_siblings(&self, path: PathBuf, size: u64, mtime_ns: u128) {
        if let Ok(mut cache) = self.cache.lock() {
            if cache.no_siblings.len() >= NO_SIBLINGS_MAX {
                cache.no_siblings.clear();
            }
            cache
                .no_siblings
                .insert(path, (size, mtime_ns, Instant::now()));
        }
    }

    /// The bytes the cache holds now, and how many copies.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let copies = cache.entries.values().flatten().flatten().count();
        (cache.bytes, copies)
    }
}

/// Which copy: the file, its version and the coding.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    pub(crate) path: PathBuf,
    pub(crate) coding: Coding,
    pub(crate) size: u64,
    pub(crate) mtime_ns: u128,
}

#[derive(Debug)]
struct Entry {
    size: u64,
    mtime_ns: u128,
    data: Bytes,
    /// Its place in `Cache::order`.
    used: u64,
}

/// How long a file found without precompressed siblings is taken to still have none (its
/// version unchanged): the probes are skipped meanwhile. A sibling added later is served
/// within this time.
const NO_SIBLINGS_FOR: Duration = Duration::from_secs(1);
/// Files remembered as having no siblings, at most (the record is cleared when full).
const NO_SIBLINGS_MAX: usize = 16_384;

/// Copies by file and coding (one version each: a newer one replaces it), and their order of
/// use, least recent first. Looked up by the borrowed path: no allocation on a hit.
#[derive(Debug)]
pub(crate) struct Cache {
    entries: HashMap<PathBuf, [Option<Entry>; 3], BuildPathHasher>,
    order: BTreeMap<u64, (PathBuf, Coding)>,
    clock: u64,
    bytes: usize,
    limit: usize,
    /// Copies being made now.
    making: HashSet<(PathBuf, Coding), BuildPathHasher>,
    /// Files seen without precompressed siblings: their size, time and when.
    no_siblings: HashMap<PathBuf, (u64, u128, Instant), BuildPathHasher>,
}

fn slot(coding: Coding) -> usize {
    match coding {
        Coding::Zstd => 0,
        Coding::Brotli => 1,
        _ => 2,
    }
}

impl Cache {
    fn new(limit: usize) -> Cache {
        Cache {
            entries: HashMap::default(),
            order: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            limit,
            making: HashSet::default(),
            no_siblings: HashMap::default(),
        }
    }

    fn get(&mut self, key: &Key) -> Option<Bytes> {
        let slots = self.entries.get_mut(key.path.as_path())?;
        let entry = slots[slot(key.coding)].as_mut()?;
        if entry.size != key.size || entry.mtime_ns != key.mtime_ns {
            return None;
        }
        self.clock += 1;
        let id = self.order.remove(&entry.used)?;
        entry.used = self.clock;
        self.order.insert(self.clock, id);
        Some(entry.data.clone())
    }

    /// Takes out the copy of `path` in `coding`, if any.
    fn remove(&mut self, path: &std::path::Path, coding: Coding) {
        let Some(slots) = self.entries.get_mut(path) else {
            return;
        };
        if let Some(old) = slots[slot(coding)].take() {
            self.order.remove(&old.used);
            self.bytes -= old.data.len();
        }
        if slots.iter().all(Option::is_none) {
            self.entries.remove(path);
        }
    }

    fn insert(&mut self, key: Key, data: Bytes) {
        self.remove(&key.path, key.coding);
        if data.len() > self.limit {
            return;
        }
        while self.bytes + data.len() > self.limit {
            let Some((_, (path, coding))) = self.order.pop_first() else {
                break;
            };
            if let Some(slots) = self.entries.get_mut(&path) {
                if let Some(old) = slots[slot(coding)].take() {
                    self.bytes -= old.data.len();
                }
                if slots.iter().all(Option::is_none) {
                    self.entries.remove(&path);
                }
            }
        }
        self.clock += 1;
        self.bytes += data.len();
        self.order
            .insert(self.clock, (key.path.clone(), key.coding));
        self.entries.entry(key.path).or_default()[slot(key.coding)] = Some(Entry {
            size: key.size,
            mtime_ns: key.mtime_ns,
            data,
            used: self.clock,
        });
    }
}

/// Reads all of `file` (`len` bytes expected) and compresses it: for the blocking pool.
pub(crate) fn read_and_compress(
    mut file: File,
    len: u64,
    compression: &Compression,
    coding: Coding,
) -> io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(len as usize);
    file.read_to_end(&mut data)?;
    if data.len() as u64 != len {
        return Err(io::Error::other("file changed while it was read"));
    }
    compression.compress_bytes(coding, &data)
}

/// A file read in pieces as the connection pulls them (local files: each read is served from
/// the page cache, as `stat` and `open` are on the worker's thread already).
pub(crate) struct FileChunks {
    pub(crate) file: File,
    pub(crate) left: u64,
}

/// Bytes per piece.
const PIECE: usize = 64 * 1024;

impl BodyStream for FileChunks {
    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let mut buf = vec![0u8; (this.left as usize).min(PIECE)];
        match this.file.read(&mut buf) {
            Ok(0) => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file ended before its length",
            )))),
            Ok(n) => {
                buf.truncate(n);
                this.left -= n as u64;
                Poll::Ready(Some(Ok(Bytes::from(buf))))
            }
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &str, coding: Coding, size: u64, mtime_ns: u128) -> Key {
        Key {
            path: PathBuf::from(path),
            coding,
            size,
            mtime_ns,
        }
    }

    #[test]
    fn least_recently_used_leave_first_and_versions_replace() {
        let sc = StaticCompression::new(Compression::new()).cache_bytes(100);
        sc.keep(
            key("/a", Coding::Gzip, 1, 1),
            Some(Bytes::from(vec![0; 40])),
        );
        sc.keep(
            key("/b", Coding::Gzip, 1, 1),
            Some(Bytes::from(vec![1; 40])),
        );
        assert_eq!(sc.held(), (80, 2));
        // `/a` is used, so `/b` is the one to go when `/c` needs room.
        assert!(sc.cached(&key("/a", Coding::Gzip, 1, 1)).is_some());
        sc.keep(
            key("/c", Coding::Gzip, 1, 1),
            Some(Bytes::from(vec![2; 40])),
        );
        assert_eq!(sc.held(), (80, 2));
        assert!(sc.cached(&key("/b", Coding::Gzip, 1, 1)).is_none());
        assert!(sc.cached(&key("/a", Coding::Gzip, 1, 1)).is_some());
        // Another version of `/a` (size or time changed) is a miss, and replaces it.
        assert!(sc.cached(&key("/a", Coding::Gzip, 1, 2)).is_none());
        assert!(sc.cached(&key("/a", Coding::Gzip, 2, 1)).is_none());
        assert!(sc.cached(&key("/a", Coding::Brotli, 1, 1)).is_none());
        sc.keep(
            key("/a", Coding::Gzip, 1, 2),
            Some(Bytes::from(vec![3; 10])),
        );
        assert_eq!(sc.held(), (50, 2));
        assert!(sc.cached(&key("/a", Coding::Gzip, 1, 1)).is_none());
        assert_eq!(
            sc.cached(&key("/a", Coding::Gzip, 1, 2)).as_deref(),
            Some(&[3u8; 10][..])
        );
        // One request makes a copy at a time; a failed one can be tried again.
        let k = key("/e", Coding::Zstd, 1, 1);
        assert!(sc.claim(&k));
        assert!(!sc.claim(&k));
        sc.keep(k.clone(), None);
        assert!(sc.claim(&k));
        sc.keep(k.clone(), Some(Bytes::from_static(b"z")));
        assert!(sc.claim(&k), "made: the claim ended");
        assert_eq!(sc.cached(&k).as_deref(), Some(&b"z"[..]));
        sc.keep(k, None);
        assert_eq!(sc.held(), (51, 3));
        // Larger than the whole cache: not kept, nothing evicted.
        sc.keep(
            key("/d", Coding::Gzip, 1, 1),
            Some(Bytes::from(vec![4; 101])),
        );
        assert_eq!(sc.held(), (51, 3));
    }
}
