//! Compressed static files (`ServeDir::compress`, `canter serve --static DIR --compress`): curl
//! `--compressed`, Python's zlib, brotli and zstandard decoders, a file changed on disk, a cache
//! filled past its limit, files streamed because they are too large to keep, and precompressed
//! siblings (fresh ones only) before any of it.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use canter::middleware::Compression;
use canter::{Router, ServeDir, StaticCompression};
use common::{curl, Client, InProcess, Server};

/// Text that compresses well but not trivially: lines of a small JavaScript file, varied.
fn script(lines: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut x = seed;
    for i in 0..lines {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        writeln!(
            out,
            "function f{i}(a, b) {{ return a * {} + b - {}; }} // {}",
            x >> 40,
            (x >> 20) & 0xffff,
            ["alpha", "beta", "gamma", "delta"][(x >> 60) as usize % 4]
        )
        .unwrap();
    }
    out
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("static_compression-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// brotli and zstandard for Python, installed once per run with pip into the target directory.
fn python_decoders() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-decoders");
        if dir.join("brotli.py").exists() && dir.join("zstandard").exists() {
            return dir;
        }
        let out = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&dir)
            .args(["brotli==1.1.0", "zstandard==0.23.0"])
            .output()
            .unwrap_or_else(|e| panic!("python3 is needed and could not run: {e}"));
        assert!(
            out.status.success(),
            "pip install brotli zstandard failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .clone()
}

#[test]
fn python_decodes_each_representation_and_sees_changes() {
    let site = python_decoders();
    let dir = fresh_dir("python");
    std::fs::write(dir.join("big.js"), script(3000, 1)).unwrap();
    let server = Server::start_with(&["--static", dir.to_str().unwrap(), "--compress"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/static_compress.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(server.addr().port().to_string())
        .arg(&dir)
        .env("PYTHONPATH", &site)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
}

#[test]
fn curl_compressed_downloads_the_file() {
    let dir = fresh_dir("curl");
    let big = script(3000, 2);
    std::fs::write(dir.join("big.js"), &big).unwrap();
    std::fs::write(dir.join("small.js"), b"var a = 1;\n").unwrap();
    std::fs::write(dir.join("logo.png"), script(3000, 3)).unwrap();
    let server = Server::start_with(&["--static", dir.to_str().unwrap(), "--compress"]);
    for _ in 0..2 {
        let out = curl(&[
            "--compressed",
            "-D",
            "/dev/stderr",
            &server.url("/static/big.js"),
        ]);
        let head = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
        assert!(head.contains("content-encoding: "), "{head}");
        assert!(head.contains("vary: accept-encoding"), "{head}");
        assert_eq!(out.stdout, big);
    }
    // Too small, or not a compressible type: as it is (and an image never varies).
    for path in ["/static/small.js", "/static/logo.png"] {
        let out = curl(&["--compressed", "-D", "/dev/stderr", &server.url(path)]);
        let head = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
        assert!(!head.contains("content-encoding"), "{path}: {head}");
        assert!(!head.contains("vary"), "{path}: {head}");
    }
}

/// Fetches `path` with `Accept-Encoding: accept` and returns (Content-Encoding, decoded body).
fn fetch_decoded(c: &mut Client, path: &str, accept: &str) -> (Option<String>, Vec<u8>) {
    c.send(format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: {accept}\r\n\r\n"
    ));
    let r = c.response();
    assert_eq!(r.status, 200, "{r:?}");
    let coding = r.header("content-encoding").map(str::to_owned);
    let body = match coding.as_deref() {
        None => r.body.clone(),
        Some("gzip") => {
            let mut d = flate2::read::GzDecoder::new(&r.body[..]);
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut d, &mut out).unwrap();
            out
        }
        Some("br") => {
            let mut out = Vec::new();
            brotli::BrotliDecompress(&mut &r.body[..], &mut out).unwrap();
            out
        }
        Some("zstd") => zstd::stream::decode_all(&r.body[..]).unwrap(),
        Some(other) => panic!("{other}"),
    };
    (coding, body)
}

#[test]
fn a_cache_filled_past_its_limit_and_files_too_large_to_keep() {
    let dir = fresh_dir("cache");
    let files: Vec<Vec<u8>> = (0..8).map(|i| script(1500, 10 + i)).collect();
    for (i, f) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("f{i}.js")), f).unwrap();
    }
    let huge = script(20_000, 99);
    std::fs::write(dir.join("huge.js"), &huge).unwrap();
    let root = dir.clone();
    // Each copy is some 15 KB: the 40 KB cache holds two or three of the eight at a time.
    let compression = StaticCompression::new(Compression::new())
        .cache_bytes(40_000)
        .max_entry(256 * 1024);
    let server = InProcess::start(move |_| {
        Router::new().serve_dir("/s", ServeDir::new(&root).compress(compression.clone()))
    });
    let mut c = server.client();
    for round in 0..3 {
        for (i, f) in files.iter().enumerate() {
            for accept in ["gzip", "br", "zstd"] {
                let (coding, body) = fetch_decoded(&mut c, &format!("/s/f{i}.js"), accept);
                assert_eq!(coding.as_deref(), Some(accept), "round {round} f{i}");
                assert!(body == *f, "round {round} f{i} {accept}");
            }
        }
    }
    // Larger than an entry may be: compressed as it is sent (chunked), every coding.
    for accept in ["gzip", "br", "zstd"] {
        c.send(format!(
            "HEAD /s/huge.js HTTP/1.1\r\nHost: x\r\nAccept-Encoding: {accept}\r\n\r\n"
        ));
        let head = c.response_to(true);
        assert_eq!(head.header("content-encoding"), Some(accept), "{head:?}");
        let (coding, body) = fetch_decoded(&mut c, "/s/huge.js", accept);
        assert_eq!(coding.as_deref(), Some(accept));
        assert!(body == huge, "{accept}: {} bytes", body.len());
    }
}

#[test]
fn fresh_precompressed_siblings_come_first() {
    let dir = fresh_dir("siblings");
    let text = script(2000, 5);
    std::fs::write(dir.join("app.js"), &text).unwrap();
    // zstd sibling made from the file: fresh; the gzip one is older than the file: stale.
    let zst = zstd::stream::encode_all(&text[..], 19).unwrap();
    std::fs::write(dir.join("app.js.zst"), &zst).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"stale content").unwrap();
    std::fs::write(dir.join("app.js.gz"), gz.finish().unwrap()).unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(dir.join("app.js.gz"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let server = Server::start_with(&["--static", dir.to_str().unwrap(), "--compress"]);
    let mut c = server.client();
    c.send("GET /static/app.js HTTP/1.1\r\nHost: x\r\nAccept-Encoding: zstd, gzip\r\n\r\n");
    let r = c.response();
    assert_eq!(r.header("content-encoding"), Some("zstd"));
    assert_eq!(r.body, zst, "the sibling's own bytes");
    // The stale gzip sibling is not served: gzip is compressed from the file itself.
    let (coding, body) = fetch_decoded(&mut c, "/static/app.js", "gzip");
    assert_eq!(coding.as_deref(), Some("gzip"));
    assert!(body == text);
}

/// A precompressed sibling that appears next to a file already served compressed is served
/// within a second (files without siblings are not probed again for that long).
#[test]
fn a_sibling_added_later_is_served_within_a_second() {
    let dir = fresh_dir("later");
    let text = script(2000, 6);
    std::fs::write(dir.join("app.js"), &text).unwrap();
    let server = Server::start_with(&["--static", dir.to_str().unwrap(), "--compress"]);
    let mut c = server.client();
    let (coding, body) = fetch_decoded(&mut c, "/static/app.js", "gzip");
    assert_eq!(coding.as_deref(), Some("gzip"));
    assert!(body == text);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&text).unwrap();
    let sibling = gz.finish().unwrap();
    std::fs::write(dir.join("app.js.gz"), &sibling).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    c.send("GET /static/app.js HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n");
    let r = c.response();
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.body, sibling, "the sibling's own bytes");
}
