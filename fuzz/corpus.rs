//! The files of a fuzz corpus (`fuzz/corpus/<target>/`), sorted: for the stable replay tests of
//! canter-h1 and canter-ws, which include this file with `#[path = ...] mod corpus;`.

use std::path::{Path, PathBuf};

/// Every file of `target`'s corpus; panics on an empty or unreadable one.
pub fn files(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    files
}
