//! ARCHITECTURE.md names files a newcomer opens next: every one it names must exist. A name is
//! the end of a path in the repository (`link.rs`, `canter-rt/src/core/link.rs`, `tests/layers.rs`
//! in its crate); one that starts with `../` is beside the repository (the shared tools).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const KINDS: [&str; 7] = [".rs", ".md", ".py", ".sh", ".toml", ".json", ".svg"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file of the repository (outside build output and hidden folders), as a path from the
/// root with a leading slash.
fn files(root: &Path, dir: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            files(root, &entry.path(), found);
        } else {
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().to_string_lossy();
            found.insert(format!("/{relative}"));
        }
    }
}

/// The file names and paths in backticks in `text`.
fn cited(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, piece) in text.split('`').enumerate() {
        // Odd pieces are inside backticks.
        if i % 2 == 0 {
            continue;
        }
        for word in piece.split([' ', '(', ')', ',', ':']) {
            let word = word.trim_end_matches('.');
            let plain = word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
            // `req.json()` is a call, not a file.
            let call = piece.contains(&format!("{word}("));
            if plain && !call && KINDS.iter().any(|k| word.ends_with(k)) {
                out.push(word.to_owned());
            }
        }
    }
    out
}

#[test]
fn every_file_architecture_md_names_exists() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut all = BTreeSet::new();
    files(&root, &root, &mut all);
    let names = cited(&text);
    assert!(names.len() > 30, "{names:?}");
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| match name.strip_prefix("../") {
            Some(_) => !root.join(name).exists(),
            None => !all.iter().any(|path| path.ends_with(&format!("/{name}"))),
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}

#[test]
fn the_first_diagram_names_every_crate() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let diagram = text.split("```").nth(1).unwrap();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            diagram.contains(&format!("crates/{name} ")),
            "the diagram leaves out crates/{name}:\n{diagram}"
        );
    }
    assert!(diagram.contains("python/"), "{diagram}");
}
