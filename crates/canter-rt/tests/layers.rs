//! The runtime's files form layers: each imports (`crate::module`) only from layers below its
//! own, so no two files import each other and nothing below knows what is built on it (the core
//! knows no protocol; HTTP/1.1 and HTTP/2 know each other only through the module above both
//! that chooses between them). The layers live in folders (`core/`, `httpd/`, `quic/`, `ws/`, `proto/`); a
//! file added below `src/` must be given a layer here.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. A module may import from any layer below its own, never from its own or above.
/// Modules are named by their paths below the crate root (`core::worker`: `src/core/worker.rs`;
/// `ws`: `src/ws/mod.rs`).
const LAYERS: &[(&str, &[&str])] = &[
    ("system calls", &["core::syscall"]),
    (
        "leaf data",
        &["core::stats", "core::transport", "ws", "quic::route"],
    ),
    (
        "worker state, its connection set, TLS, WebSocket broadcast",
        &["core::worker", "core::tcp_loop", "core::tls", "ws::hub"],
    ),
    (
        "connection parts",
        &[
            "core::proxy",
            "core::output",
            "httpd::body",
            "core::outbound",
        ],
    ),
    (
        "settings, the link, services",
        &["core::config", "core::link", "httpd::service"],
    ),
    ("QUIC endpoints", &["quic::endpoint"]),
    ("the accept loop", &["core::server", "core::log_bridge"]),
    (
        "custom protocols; HTTP state; WebSocket's handshake and driver",
        &["proto", "httpd::state", "ws::upgrade", "ws::driver"],
    ),
    ("WebSocket over HTTP/2", &["ws::h2"]),
    (
        "protocol drivers",
        &["httpd::http1", "httpd::h2", "httpd::h3", "proto::framing"],
    ),
    ("choosing HTTP/1.1 or HTTP/2", &["httpd::serve"]),
];

/// Folders whose `mod.rs` only names the folder's files (`mod`/`pub mod` lines, their
/// attributes and docs): the layers' rooms, in no layer themselves.
const FOLDERS: &[&str] = &["core", "httpd", "quic"];

/// Every `.rs` file below `src/` but `lib.rs`, with its module path.
fn modules() -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let join = |name: &str| {
                if prefix.is_empty() {
                    name.to_owned()
                } else {
                    format!("{prefix}::{name}")
                }
            };
            if path.is_dir() {
                walk(&path, &join(&stem), out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                match (prefix.is_empty(), stem.as_str()) {
                    (true, "lib") => {}
                    (false, "mod") => out.push((prefix.to_owned(), path)),
                    _ => out.push((join(&stem), path)),
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "",
        &mut out,
    );
    out.sort();
    out
}

/// The module paths of every name in LAYERS and FOLDERS.
fn known() -> BTreeSet<&'static str> {
    LAYERS
        .iter()
        .flat_map(|(_, mods)| mods.iter().copied())
        .chain(FOLDERS.iter().copied())
        .collect()
}

/// The module a `crate::` path names: its longest prefix that is a module, and what follows.
fn resolve<'a>(path: &'a str, known: &BTreeSet<&str>) -> Option<(String, &'a str)> {
    let parts: Vec<&str> = path.split("::").map(str::trim).collect();
    (1..=parts.len()).rev().find_map(|k| {
        let m = parts[..k].join("::");
        known
            .contains(m.as_str())
            .then(|| (m, parts.get(k).copied().unwrap_or("")))
    })
}

/// The paths a file names with `crate::path` or `crate::{path, …}`, outside its tests and
/// comments.
fn imports(source: &str) -> Vec<String> {
    let mut parts = source.splitn(2, "#[cfg(test)]");
    let code = parts.next().unwrap();
    if let Some(tests) = parts.next() {
        // Test code may import anything, and it stands last, in `mod tests`: nothing after it
        // escapes the check.
        let head: String = tests.chars().take(120).collect();
        assert!(
            head.contains("mod tests {"),
            "code after a #[cfg(test)] item: {head}"
        );
    }
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    let path_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let path: String = rest.chars().take_while(|&c| path_char(c)).collect();
        if let Some(group) = rest[path.len()..].strip_prefix('{') {
            // Items at the group's own depth; a nested group counts by the path before it.
            let (mut depth, mut item) = (0usize, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(format!("{path}{}", item.trim().trim_end_matches(':')));
                        item.clear();
                    }
                    c if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            found.push(format!("{path}{}", item.trim().trim_end_matches(':')));
        } else {
            found.push(path.trim_end_matches(':').to_owned());
        }
    }
    found
}

#[test]
fn every_file_imports_only_from_layers_below_its_own() {
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, mods))| mods.iter().map(move |m| (*m, i)))
        .collect();
    let known = known();
    let mut wrong = Vec::new();
    for (name, path) in modules() {
        let source = std::fs::read_to_string(&path).unwrap();
        if FOLDERS.contains(&name.as_str()) {
            let stray = source.lines().map(str::trim).find(|l| {
                !(l.is_empty()
                    || l.starts_with("//")
                    || l.starts_with("#[")
                    || l.starts_with("mod ")
                    || l.starts_with("pub mod ")
                    || l.starts_with("pub(crate) mod "))
            });
            if let Some(line) = stray {
                wrong.push(format!(
                    "{name}/mod.rs holds more than its files' names: {line}"
                ));
            }
            continue;
        }
        let Some(&mine) = layer_of.get(name.as_str()) else {
            wrong.push(format!("{name} ({}) is in no layer", path.display()));
            continue;
        };
        for import in imports(&source) {
            // Items of the crate root (lib.rs: the peer's address) and re-exports are not
            // modules; every module path is checked.
            let Some((module, _)) = resolve(&import, &known) else {
                continue;
            };
            if module == name {
                continue;
            }
            let Some(&theirs) = layer_of.get(module.as_str()) else {
                wrong.push(format!(
                    "{name} imports {import} through the folder {module}"
                ));
                continue;
            };
            if theirs >= mine {
                wrong.push(format!(
                    "{name} ({}) imports {module} ({})",
                    LAYERS[mine].0, LAYERS[theirs].0
                ));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// Every layer's module is a file that exists: a name left in LAYERS after its file moved would
/// check nothing.
#[test]
fn every_layer_names_files_that_exist() {
    let files: BTreeSet<String> = modules().into_iter().map(|(m, _)| m).collect();
    let missing: Vec<&str> = known()
        .into_iter()
        .filter(|m| !files.contains(*m))
        .collect();
    assert!(missing.is_empty(), "no such file: {missing:?}");
}

/// Re-exports would hide an import from the check above: inside the crate, modules name each
/// other by their paths, not by what `lib.rs` (or a folder's `mod.rs`) re-exports.
#[test]
fn no_file_imports_through_the_crate_roots_re_exports() {
    let known = known();
    let mut wrong = Vec::new();
    for (name, path) in modules() {
        for import in imports(&std::fs::read_to_string(&path).unwrap()) {
            let through_root = import.starts_with(|c: char| c.is_ascii_uppercase());
            let through_folder = resolve(&import, &known).is_some_and(|(m, next)| {
                FOLDERS.contains(&m.as_str()) && !next.starts_with(|c: char| c.is_ascii_lowercase())
            });
            if through_root || through_folder {
                wrong.push(format!("{name}: crate::{import}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
