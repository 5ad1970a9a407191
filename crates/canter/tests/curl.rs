//! The server against curl (skipped when curl is not installed).

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::thread;

use common::{random_bytes, Server};

fn have_curl() -> bool {
    let ok = Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: curl not found");
    }
    ok
}

/// Runs curl with a 20 s overall limit and optional stdin; asserts it succeeded.
fn curl(args: &[&str], stdin: Option<Vec<u8>>) -> Output {
    let mut child = Command::new("curl")
        .args(["--max-time", "20", "--fail", "-s"])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    let writer = stdin.map(|data| {
        let mut pipe = child.stdin.take().unwrap();
        thread::spawn(move || pipe.write_all(&data))
    });
    let out = child.wait_with_output().expect("curl output");
    if let Some(w) = writer {
        w.join().unwrap().expect("write curl stdin");
    }
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, data: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("canter-test-{}-{name}", std::process::id()));
        std::fs::write(&path, data).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn curl_plaintext_and_json() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let out = curl(&[&server.url("/plaintext")], None);
    assert_eq!(out.stdout, b"Hello, World!");
    let out = curl(&[&server.url("/json")], None);
    assert_eq!(out.stdout, br#"{"message":"Hello, World!"}"#);
    let out = curl(&["-I", &server.url("/plaintext")], None);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    assert!(head.contains("\r\ncontent-length: 13\r\n"), "{head}");
    assert!(head.contains("\r\nserver: canter\r\n"), "{head}");
}

#[test]
fn curl_chunked_upload_round_trips() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let data = random_bytes(1 << 20, 42);
    let out = curl(
        &[
            "--http1.1",
            "-v",
            "-T",
            "-",
            "-X",
            "POST",
            &server.url("/echo"),
        ],
        Some(data.clone()),
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("Transfer-Encoding: chunked"),
        "curl did not upload chunked:\n{log}"
    );
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "echoed body differs");
}

#[test]
fn curl_expect_continue_with_a_file() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let data = random_bytes(2 << 20, 9);
    let file = TempFile::new("expect.bin", &data);
    let at = format!("@{}", file.0.display());
    let out = curl(
        &[
            "-v",
            "-H",
            "Expect: 100-continue",
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            &at,
            &server.url("/echo"),
        ],
        None,
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("HTTP/1.1 100 Continue"),
        "no 100 Continue seen by curl:\n{log}"
    );
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "echoed body differs");
}

#[test]
fn curl_large_download_length() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let out = curl(&[&server.url("/bytes/10000000")], None);
    assert_eq!(out.stdout.len(), 10_000_000);
    assert!(out.stdout.iter().all(|&b| b == b'x'));
}

#[test]
fn curl_reuses_the_connection() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let out = curl(
        &[
            "-v",
            &server.url("/plaintext"),
            &server.url("/json"),
            &server.url("/plaintext"),
        ],
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        r#"Hello, World!{"message":"Hello, World!"}Hello, World!"#
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("Re-using existing connection") || log.contains("Reusing existing connection"),
        "curl opened a new connection:\n{log}"
    );
    assert_eq!(
        log.matches("Trying 127.0.0.1").count(),
        1,
        "more than one connection:\n{log}"
    );
}

#[test]
fn curl_sees_413_for_a_too_large_upload() {
    if !have_curl() {
        return;
    }
    let server = Server::start();
    let data = vec![b'z'; 17 << 20];
    let file = TempFile::new("big.bin", &data);
    let at = format!("@{}", file.0.display());
    let out = Command::new("curl")
        .args([
            "--max-time",
            "20",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", "Expect:", "--data-binary", &at, &server.url("/echo")])
        .output()
        .expect("run curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "413");
}
