//! The runtime's files form layers: each imports (`crate::module`) only from layers below its
//! own, so no two files import each other and nothing below knows what is built on it (the core
//! knows no protocol; HTTP/1.1 and HTTP/2 know each other only through the module above both
//! that chooses between them). A file added to `src/` must be given a layer here.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. A module may import from any layer below its own, never from its own or above.
const LAYERS: &[(&str, &[&str])] = &[
    ("system calls", &["syscall"]),
    ("leaf data", &["stats", "transport", "ws"]),
    (
        "worker state, TLS, WebSocket broadcast",
        &["worker", "tls", "ws_hub"],
    ),
    ("connection parts", &["proxy", "output", "body", "outbound"]),
    (
        "settings, the link, services",
        &["config", "link", "service"],
    ),
    ("the accept loop", &["server", "log_bridge"]),
    (
        "custom protocols; HTTP state; WebSocket's handshake and driver",
        &["proto", "http_state", "ws_upgrade", "ws_driver"],
    ),
    ("WebSocket over HTTP/2", &["ws_h2"]),
    ("protocol drivers", &["http1", "h2", "framing"]),
    ("choosing HTTP/1.1 or HTTP/2", &["http_serve"]),
];

/// The module names a file imports with `crate::name` or `crate::{name, …}`, outside its
/// tests and comments.
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
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap();
            for item in group[..end].split(',') {
                found.push(item.trim().split("::").next().unwrap().to_owned());
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.extension().is_none_or(|e| e != "rs") || name == "lib" {
            continue;
        }
        let Some(&mine) = layer_of.get(name.as_str()) else {
            wrong.push(format!("{name}.rs is in no layer"));
            continue;
        };
        for import in imports(&std::fs::read_to_string(&path).unwrap()) {
            // Items of the crate root (lib.rs: the peer's address) and re-exports are not
            // modules; every module path is checked.
            let Some(&theirs) = layer_of.get(import.as_str()) else {
                continue;
            };
            if theirs >= mine {
                wrong.push(format!(
                    "{name} ({}) imports {import} ({})",
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

/// Re-exports would hide an import from the check above: inside the crate, modules name each
/// other by their paths, not by what `lib.rs` re-exports.
#[test]
fn no_file_imports_through_the_crate_roots_re_exports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if name == "lib" {
            continue;
        }
        for import in imports(&std::fs::read_to_string(&path).unwrap()) {
            if import.starts_with(|c: char| c.is_ascii_uppercase()) {
                wrong.push(format!("{name}: crate::{import}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
