//! The server against curl (the test fails when curl cannot run).

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Command;

use common::{curl, curl_with_stdin, need, random_bytes, Server, TempFile, CURL_MAX_TIME};

#[test]
fn curl_plaintext_and_json() {
    need("curl");
    let server = Server::start();
    let out = curl(&[&server.url("/plaintext")]);
    assert_eq!(out.stdout, b"Hello, World!");
    let out = curl(&[&server.url("/json")]);
    assert_eq!(out.stdout, br#"{"message":"Hello, World!"}"#);
    let out = curl(&["-I", &server.url("/plaintext")]);
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
    assert!(head.contains("\r\ncontent-length: 13\r\n"), "{head}");
    assert!(head.contains("\r\nserver: canter\r\n"), "{head}");
}

#[test]
fn curl_chunked_upload_round_trips() {
    need("curl");
    let server = Server::start();
    let data = random_bytes(1 << 20, 42);
    let out = curl_with_stdin(
        &[
            "--http1.1",
            "-v",
            "-T",
            "-",
            "-X",
            "POST",
            &server.url("/echo"),
        ],
        data.clone(),
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
    need("curl");
    let server = Server::start();
    let data = random_bytes(2 << 20, 9);
    let file = TempFile::new("expect.bin", &data);
    let at = format!("@{}", file.path().display());
    let out = curl(&[
        "-v",
        "-H",
        "Expect: 100-continue",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &at,
        &server.url("/echo"),
    ]);
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
    need("curl");
    let server = Server::start();
    let out = curl(&[&server.url("/bytes/10000000")]);
    assert_eq!(out.stdout.len(), 10_000_000);
    assert!(out.stdout.iter().all(|&b| b == b'x'));
}

#[test]
fn curl_reuses_the_connection() {
    need("curl");
    let server = Server::start();
    let out = curl(&[
        "-v",
        &server.url("/plaintext"),
        &server.url("/json"),
        &server.url("/plaintext"),
    ]);
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
    need("curl");
    let server = Server::start();
    let data = vec![b'z'; 17 << 20];
    let file = TempFile::new("big.bin", &data);
    let at = format!("@{}", file.path().display());
    // Not `common::curl`: curl may fail sending the rest of the upload once the server has
    // answered and closed, and only the status curl saw matters here.
    let out = Command::new("curl")
        .args([
            "--max-time",
            CURL_MAX_TIME,
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
