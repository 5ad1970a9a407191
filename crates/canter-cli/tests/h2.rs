//! `canter serve` over HTTP/2: h2spec (strict, over h2c and TLS), every demo route compared
//! between HTTP/1.1 and HTTP/2 with curl (prior knowledge and ALPN), and a scripted client for
//! what curl cannot show (a pending handler does not hold the connection's other streams).
//!
//! h2spec is built with Go on first use (`go install`, into the target directory); Go and
//! curl are on every machine the suite runs on, and a missing one fails the test.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use canter_h2::hpack::{Decoder, Encoder, Indexing};
use canter_testkit::read_some;
use common::{curl, curl_any_status, need, random_bytes, Server, TempFile};

const H2SPEC: &str = "github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible";

/// The h2spec binary, built once per test run.
fn h2spec() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tools");
        let bin = dir.join("h2spec");
        if bin.exists() {
            return bin;
        }
        let out = Command::new("go")
            .args(["install", H2SPEC])
            .env("GOBIN", &dir)
            .output()
            .unwrap_or_else(|e| panic!("go is needed to build h2spec and could not run: {e}"));
        assert!(
            out.status.success() && bin.exists(),
            "go install {H2SPEC} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
    .clone()
}

/// Runs h2spec in strict mode against `port`; returns (passed, failed, report).
fn run_h2spec(port: u16, tls: bool) -> (u32, u32, String) {
    let mut cmd = Command::new(h2spec());
    cmd.args([
        "--strict",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-o",
        "5",
    ]);
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd.output().expect("run h2spec");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = report
        .lines()
        .find(|l| l.contains(" tests, "))
        .unwrap_or_else(|| panic!("no summary in h2spec's report:\n{report}"));
    let count = |what: &str| -> u32 {
        summary
            .split(", ")
            .find_map(|p| p.strip_suffix(what).map(|n| n.trim().parse().unwrap()))
            .unwrap_or(0)
    };
    (count(" passed"), count(" failed"), report)
}

/// Every case passes over TLS. Over h2c on the plain port, which speaks HTTP/1.1 to whatever
/// is not the HTTP/2 preface, one case cannot pass by design: 3.5/2 sends
/// `INVALID CONNECTION PREFACE\r\n\r\n`, a request line of three fields like h1spec's
/// `A B C`, and gets HTTP/1.1's 400 (as from nginx on a port that takes both) where h2spec
/// wants a silent close. Its report must name that case and no other.
#[test]
fn h2spec_strict_passes_over_h2c_and_tls() {
    let server = Server::start_with(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    for (port, tls) in [(server.port, false), (server.tls_port(), true)] {
        let (passed, failed, report) = run_h2spec(port, tls);
        let failures = report.split("Failures:").nth(1).unwrap_or_default();
        let expected = if tls { (146, 0) } else { (145, 1) };
        assert_eq!(
            (passed, failed),
            expected,
            "h2spec --strict (tls: {tls}):\n{report}\n{}",
            server.log()
        );
        if !tls {
            assert!(
                failures.contains("× 2: Sends invalid connection preface")
                    && failures.contains("HTTP/1.1 header"),
                "{report}"
            );
        }
    }
}

/// What a response looks like to compare across protocols.
#[derive(Debug, PartialEq)]
struct Seen {
    status: String,
    content_type: String,
    body: Vec<u8>,
}

/// One request with curl: `proto` is `--http1.1`, `--http2-prior-knowledge` or `--http2`.
fn fetch(proto: &str, url: &str, extra: &[&str]) -> (Seen, String) {
    let mut args = vec![
        proto,
        "-k",
        "-o",
        "-",
        "-w",
        "\n%{http_code} %{http_version} %{content_type}",
    ];
    args.extend_from_slice(extra);
    args.push(url);
    let out = curl_any_status(&args);
    let all = out.stdout;
    let cut = all.iter().rposition(|&b| b == b'\n').unwrap();
    let (body, meta) = (
        all[..cut].to_vec(),
        String::from_utf8_lossy(&all[cut + 1..]).into_owned(),
    );
    let mut parts = meta.splitn(3, ' ');
    let status = parts.next().unwrap().to_owned();
    let version = parts.next().unwrap().to_owned();
    let content_type = parts.next().unwrap_or("").to_owned();
    (
        Seen {
            status,
            content_type,
            body,
        },
        version,
    )
}

#[test]
fn every_route_answers_the_same_over_http1_and_http2() {
    need("curl");
    let dir = TempDir::new("h2-static");
    let page = random_bytes(300_000, 7);
    std::fs::write(dir.path().join("blob.bin"), &page).unwrap();
    std::fs::write(
        dir.path().join("index.html"),
        "<h1>static</h1>\n".repeat(200),
    )
    .unwrap();
    let server = Server::start_with(&[
        "--tls-addr",
        "127.0.0.1:0",
        "--tls-self-signed",
        "--static",
        dir.path().to_str().unwrap(),
    ]);
    let upload = TempFile::new("h2-upload", &random_bytes(700_000, 3));
    let upload_arg = format!("@{}", upload.path().display());
    let json_arg = r#"{"name": "widget", "qty": 3}"#;
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("/", vec![]),
        ("/plaintext", vec![]),
        ("/json", vec![]),
        ("/hello/w%C3%B6rld", vec![]),
        ("/page?name=%3Cb%3E", vec![]),
        ("/bytes/1048576", vec![]),
        ("/bytes/0", vec![]),
        ("/nope", vec![]),
        ("/plaintext", vec!["-X", "DELETE"]),
        ("/plaintext", vec!["-I"]),
        ("/echo", vec!["--data-binary", &upload_arg]),
        (
            "/echo",
            vec!["--data-binary", "", "-H", "content-type: text/plain"],
        ),
        (
            "/api/items",
            vec![
                "-H",
                "content-type: application/json",
                "--data-binary",
                json_arg,
            ],
        ),
        ("/api/items/999999", vec![]),
        ("/static/blob.bin", vec![]),
        ("/static/blob.bin", vec!["-r", "1000-1999"]),
        ("/static/index.html", vec!["--compressed"]),
        ("/static/missing", vec![]),
    ];
    let plain = |p: &str| server.url(p);
    let tls = |p: &str| format!("https://127.0.0.1:{}{}", server.tls_port(), p);
    for (path, extra) in &cases {
        let (h1, v1) = fetch("--http1.1", &plain(path), extra);
        let (h2c, v2) = fetch("--http2-prior-knowledge", &plain(path), extra);
        let (h2, v3) = fetch("--http2", &tls(path), extra);
        assert_eq!(
            (v1.as_str(), v2.as_str(), v3.as_str()),
            ("1.1", "2", "2"),
            "{path} {extra:?}"
        );
        if path.starts_with("/api/items") && extra.is_empty() {
            assert_eq!(h1, h2c);
        } else if *path == "/api/items" {
            // Each POST creates an item: same status and type, a new id each time.
            assert_eq!(
                (&h1.status, &h1.content_type),
                (&h2c.status, &h2c.content_type)
            );
            assert_eq!(
                (&h1.status, &h1.content_type),
                (&h2.status, &h2.content_type)
            );
            assert_eq!(h1.status, "201");
            continue;
        }
        if extra.contains(&"-I") {
            // The "body" is the head as curl prints it, which differs by protocol.
            for h in [&h2c, &h2] {
                assert_eq!((&h1.status, &h1.content_type), (&h.status, &h.content_type));
                let head = String::from_utf8_lossy(&h.body).to_lowercase();
                assert!(head.contains("content-length: 13\r\n"), "{head}");
            }
            continue;
        }
        assert_eq!(h1, h2c, "{path} {extra:?}: HTTP/1.1 and h2c differ");
        assert_eq!(h1, h2, "{path} {extra:?}: HTTP/1.1 and h2 over TLS differ");
    }
    // A sample of exact answers, so "the same" is also right.
    let (echo, _) = fetch(
        "--http2-prior-knowledge",
        &plain("/echo"),
        &["--data-binary", &upload_arg],
    );
    assert_eq!(echo.body, std::fs::read(upload.path()).unwrap());
    let (blob, _) = fetch("--http2", &tls("/static/blob.bin"), &[]);
    assert_eq!(blob.body, page);
    let (big, _) = fetch("--http2-prior-knowledge", &plain("/bytes/1048576"), &[]);
    assert_eq!(big.body.len(), 1 << 20);
}

#[test]
fn http1_requests_upgrade_to_h2c() {
    need("curl");
    let server = Server::start();
    // A GET with `Upgrade: h2c` gets 101 and its answer over HTTP/2 on stream 1; the
    // connection goes on in HTTP/2.
    let out = curl(&["-v", "--http2", &server.url("/hello/up")]);
    let trace = String::from_utf8_lossy(&out.stderr);
    assert!(
        trace.contains("< HTTP/1.1 101 Switching Protocols"),
        "{trace}"
    );
    assert!(trace.contains("< HTTP/2 200"), "{trace}");
    assert_eq!(out.stdout, b"Hello, up!");
    // HEAD upgrades too and has no body.
    let (head, version) = fetch("--http2", &server.url("/plaintext"), &["-I"]);
    assert_eq!((head.status.as_str(), version.as_str()), ("200", "2"));
    // A request with a body is served over HTTP/1.1 (the upgrade would have to carry it).
    let (echo, version) = fetch("--http2", &server.url("/echo"), &["--data-binary", "abc"]);
    assert_eq!(
        (echo.body.as_slice(), version.as_str()),
        (&b"abc"[..], "1.1")
    );
    // Over TLS the upgrade is not offered (ALPN decides there).
    let tls = Server::start_with(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    let raw = std::process::Command::new("curl")
        .args([
            "-sk",
            "--http1.1",
            "-H",
            "Upgrade: h2c",
            "-H",
            "HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA",
        ])
        .args([
            "-H",
            "Connection: Upgrade, HTTP2-Settings",
            "-w",
            " %{http_code} %{http_version}",
        ])
        .arg(format!("https://127.0.0.1:{}/plaintext", tls.tls_port()))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw.stdout),
        "Hello, World! 200 1.1"
    );
}

#[test]
fn items_created_over_http2_are_read_over_http1() {
    need("curl");
    let server = Server::start();
    let out = curl(&[
        "--http2-prior-knowledge",
        "-H",
        "content-type: application/json",
        "--data-binary",
        r#"{"name": "bolt", "qty": 9}"#,
        &server.url("/api/items"),
    ]);
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = created["id"].as_u64().unwrap();
    let out = curl(&["--http1.1", &server.url(&format!("/api/items/{id}"))]);
    let item: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(item["name"], "bolt");
}

/// A directory in the temporary directory; removed with its files on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("canter-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- a scripted client ----------------------------------------------------------------------

struct H2Client {
    sock: TcpStream,
    enc: Encoder,
    dec: Decoder,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl H2Client {
    fn connect(server: &Server) -> H2Client {
        let sock = TcpStream::connect(server.addr()).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut c = H2Client {
            sock,
            enc: Encoder::new(4096),
            dec: Decoder::new(4096),
            buf: Vec::new(),
        };
        let mut hello = canter_h2::PREFACE.to_vec();
        hello.extend(frame(4, 0, 0, &[]));
        c.sock.write_all(&hello).unwrap();
        c
    }

    fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).unwrap();
    }

    fn request(&mut self, stream: u32, method: &str, path: &str, end_stream: bool) {
        let mut b = Vec::new();
        for (n, v) in [
            (":method", method),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
        ] {
            self.enc
                .field(n.as_bytes(), v.as_bytes(), Indexing::Yes, &mut b);
        }
        let flags = 0x4 | if end_stream { 0x1 } else { 0 };
        self.send(&frame(1, flags, stream, &b));
    }

    fn next(&mut self) -> Option<Frame> {
        loop {
            if self.buf.len() >= 9 {
                let len = (self.buf[0] as usize) << 16
                    | (self.buf[1] as usize) << 8
                    | self.buf[2] as usize;
                if self.buf.len() >= 9 + len {
                    let f = Frame {
                        kind: self.buf[3],
                        flags: self.buf[4],
                        stream: u32::from_be_bytes([
                            self.buf[5],
                            self.buf[6],
                            self.buf[7],
                            self.buf[8],
                        ]),
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16384];
            match read_some(&mut self.sock, &mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The status of a HEADERS frame.
    fn status(&mut self, f: &Frame) -> String {
        let mut status = String::new();
        self.dec
            .decode(&f.payload, 1 << 16, |n, v| {
                if n == b":status" {
                    status = String::from_utf8_lossy(v).into_owned();
                }
            })
            .unwrap();
        status
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn a_pending_handler_does_not_hold_the_other_streams() {
    let server = Server::start();
    let mut c = H2Client::connect(&server);
    // Stream 1: an echo whose body has not come yet, so its handler waits.
    c.request(1, "POST", "/echo", false);
    // Stream 3: a plain GET, answered while stream 1 waits.
    c.request(3, "GET", "/plaintext", true);
    let start = Instant::now();
    let mut got3 = false;
    while !got3 {
        let f = c.next().expect("connection closed");
        assert_ne!(f.stream, 1, "stream 1 answered before its body: {f:?}");
        if f.kind == 1 && f.stream == 3 {
            assert_eq!(c.status(&f), "200");
        }
        if f.kind == 0 && f.stream == 3 && f.flags & 1 != 0 {
            assert_eq!(f.payload, b"Hello, World!");
            got3 = true;
        }
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    // Now stream 1's body: its echo comes back.
    c.send(&frame(0, 1, 1, b"late body"));
    let mut body = Vec::new();
    loop {
        let f = c.next().expect("connection closed");
        if f.kind == 1 && f.stream == 1 {
            assert_eq!(c.status(&f), "200");
        }
        if f.kind == 0 && f.stream == 1 {
            body.extend_from_slice(&f.payload);
            if f.flags & 1 != 0 {
                break;
            }
        }
    }
    assert_eq!(body, b"late body");
}

#[test]
fn hundreds_of_requests_multiplexed_on_one_connection() {
    // (curl 7.88 cannot reuse an HTTP/2 connection with prior knowledge: it fails with
    // "Error in the HTTP2 framing layer" against any server, hyper included.)
    let server = Server::start();
    let mut c = H2Client::connect(&server);
    let mut bodies = std::collections::HashMap::new();
    let mut next = 1u32;
    let mut done = 0;
    for _ in 0..3 {
        // 100 at once (the server allows 128), all in one write.
        for _ in 0..100 {
            let path = format!("/hello/n{next}");
            c.request(next, "GET", &path, true);
            next += 2;
        }
        while done < (next - 1) / 2 {
            let f = c.next().expect("connection closed");
            match f.kind {
                1 => assert_eq!(c.status(&f), "200"),
                0 => {
                    bodies
                        .entry(f.stream)
                        .or_insert_with(Vec::new)
                        .extend_from_slice(&f.payload);
                    if f.flags & 1 != 0 {
                        done += 1;
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(bodies.len(), 300);
    for (id, body) in bodies {
        assert_eq!(String::from_utf8(body).unwrap(), format!("Hello, n{id}!"));
    }
}

#[test]
fn a_client_reset_cancels_the_pending_handler_and_the_connection_goes_on() {
    let server = Server::start();
    let mut c = H2Client::connect(&server);
    c.request(1, "POST", "/echo", false);
    c.send(&frame(3, 0, 1, &8u32.to_be_bytes())); // RST_STREAM CANCEL
    c.request(3, "GET", "/json", true);
    loop {
        let f = c.next().expect("connection closed");
        assert_ne!(f.stream, 1, "a reset stream was answered: {f:?}");
        if f.kind == 0 && f.stream == 3 && f.flags & 1 != 0 {
            assert_eq!(f.payload, br#"{"message":"Hello, World!"}"#);
            break;
        }
    }
}

#[test]
fn shutdown_sends_goaway_to_http2_clients() {
    let mut server = Server::start();
    let mut c = H2Client::connect(&server);
    c.request(1, "GET", "/plaintext", true);
    loop {
        let f = c.next().expect("connection closed");
        if f.kind == 0 && f.stream == 1 && f.flags & 1 != 0 {
            break;
        }
    }
    server.signal("TERM");
    let mut goaway = None;
    while let Some(f) = c.next() {
        if f.kind == 7 {
            goaway = Some(u32::from_be_bytes([
                f.payload[4],
                f.payload[5],
                f.payload[6],
                f.payload[7],
            ]));
        }
    }
    assert_eq!(goaway, Some(0), "no GOAWAY(NO_ERROR) before the close");
    assert!(server
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
}

/// Runs `canter load` with `args` and returns its JSON report.
fn canter_load(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["load", "--json", "--no-progress"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "canter load {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `canter load -m` speaks HTTP/2 to canter: h2c with prior knowledge and h2 by ALPN, GET and
/// POST with a body larger than a frame, closed and open loop; every request is answered 200
/// with no errors, and the bytes read match the responses' size. h2load agrees on the count.
#[test]
fn canter_load_speaks_http2() {
    need("h2load");
    let server = Server::start_with(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    let h2c = format!("http://127.0.0.1:{}", server.port);
    let tls = format!("https://127.0.0.1:{}", server.tls_port());
    let body = TempFile::new("h2-load-body", &random_bytes(40_000, 5));
    let body_arg = body.path().to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, u64)> = vec![
        (
            vec![
                "-n".into(),
                "5000".into(),
                "-c".into(),
                "2".into(),
                "-m".into(),
                "32".into(),
                format!("{h2c}/plaintext"),
            ],
            5000,
        ),
        (
            vec![
                "-n".into(),
                "3000".into(),
                "-c".into(),
                "3".into(),
                "-m".into(),
                "10".into(),
                "-k".into(),
                format!("{tls}/json"),
            ],
            3000,
        ),
        (
            vec![
                "-n".into(),
                "300".into(),
                "-c".into(),
                "2".into(),
                "-m".into(),
                "4".into(),
                "-X".into(),
                "POST".into(),
                "--body-file".into(),
                body_arg.clone(),
                format!("{h2c}/echo"),
            ],
            300,
        ),
        (
            vec![
                "-n".into(),
                "200".into(),
                "-c".into(),
                "1".into(),
                "-m".into(),
                "8".into(),
                format!("{h2c}/bytes/100000"),
            ],
            200,
        ),
    ];
    for (args, want) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report = canter_load(&args);
        assert_eq!(report["protocol"], "h2", "{report}");
        assert_eq!(
            report["requests"],
            *want,
            "{args:?}: {report}\n{}",
            server.log()
        );
        assert_eq!(report["status"]["200"], *want, "{args:?}: {report}");
        let errors: u64 = report["errors"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(errors, 0, "{args:?}: {report}");
    }
    // The echo and the 100,000-byte responses came back whole: at least their bodies' bytes.
    let report = canter_load(&[
        "-n",
        "50",
        "-m",
        "5",
        "-c",
        "1",
        &format!("{h2c}/bytes/100000"),
    ]);
    assert!(
        report["bytes_read"].as_u64().unwrap() >= 50 * 100_000,
        "{report}"
    );
    // Open loop: the rate is held with streams to spare.
    let report = canter_load(&[
        "-d",
        "1s",
        "--rate",
        "500",
        "-c",
        "2",
        "-m",
        "4",
        &format!("{h2c}/plaintext"),
    ]);
    let n = report["requests"].as_u64().unwrap();
    assert!((450..=550).contains(&n), "{report}");
    // h2load, the reference client, sees the same server the same way.
    let out = Command::new("h2load")
        .args([
            "-n",
            "2000",
            "-c",
            "2",
            "-m",
            "32",
            &format!("{h2c}/plaintext"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2000 succeeded, 0 failed"), "{text}");
}

/// The `h2` Python package (python-hyper's HTTP/2 stack), installed once per test run with
/// pip into the target directory; returns where.
fn python_h2() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-h2");
        if dir.join("h2").join("connection.py").exists() {
            return dir;
        }
        let out = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&dir)
            .arg("h2==4.1.0")
            .output()
            .unwrap_or_else(|e| panic!("python3 is needed to install h2 and could not run: {e}"));
        assert!(
            out.status.success(),
            "pip install h2 failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .clone()
}

/// Python's `h2` client: 30 multiplexed requests, uploads and downloads larger than either
/// side's windows, 404 and 405, `Upgrade: h2c`, and h2 over TLS (tests/py/h2client.py).
#[test]
fn python_h2_client() {
    let site = python_h2();
    let server = Server::start_with(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    let script = format!("{}/tests/py/h2client.py", env!("CARGO_MANIFEST_DIR"));
    let out = common::run_python(
        &[
            &script,
            &server.port.to_string(),
            &server.tls_port().to_string(),
            site.to_str().unwrap(),
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h2client.py failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    for check in [
        "ok 30 multiplexed requests",
        "ok POST /echo under flow control",
        "ok 404 and 405",
        "ok Upgrade: h2c",
        "ok h2 over TLS by ALPN",
        "ALL OK",
    ] {
        assert!(
            stdout.lines().any(|l| l == check),
            "missing {check:?} in:\n{stdout}"
        );
    }
}

/// An HTTP/2 client that reads slowly through a 4 KiB receive buffer, with windows open for the
/// whole body: the send buffer the kernel grew to megabytes keeps the socket unwritable past
/// the write timeout while the client reads all along. It gets every byte (the write timeout
/// judges the kernel's queue), as HTTP/1.1 clients do (`timeouts.rs`).
#[test]
fn a_slow_http2_reader_gets_every_byte() {
    let site = python_h2();
    let server = Server::start_with(&["--write-timeout", "1"]);
    let script = format!("{}/tests/py/h2_slow_reader.py", env!("CARGO_MANIFEST_DIR"));
    let out = common::run_python(
        &[
            &script,
            &server.port.to_string(),
            "5000000",
            "500000",
            site.to_str().unwrap(),
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout == "body 5000000\nended\n",
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
}

/// A client that asks for 100 streams of 64 MiB each (6.4 GiB in all) and then takes nothing:
/// first with a zero stream window (SETTINGS_INITIAL_WINDOW_SIZE 0, the server may not send
/// any DATA), then with a large window but never reading the socket. Either way the server's
/// memory stays bounded (bodies are pulled only while their stream's queue is short and the
/// socket keeps up), and the server goes on serving others.
#[test]
fn memory_stays_bounded_when_the_client_takes_nothing() {
    let server = Server::start_with(&["--workers", "1"]);
    let before = server.rss_kib();
    let mut held = Vec::new();
    for window in [0u32, (1 << 31) - 1] {
        let mut c = H2Client::connect(&server);
        let mut settings = vec![0, 4];
        settings.extend_from_slice(&window.to_be_bytes());
        c.send(&frame(4, 0, 0, &settings));
        // The connection window too, for the case that lets the server send.
        c.send(&frame(8, 0, 0, &((1u32 << 31) - 1 - 65_535).to_be_bytes()));
        for i in 0..100 {
            c.request(2 * i + 1, "GET", "/bytes/67108864", true);
        }
        held.push(c);
    }
    // Give the server time to fill whatever it would fill.
    std::thread::sleep(Duration::from_secs(2));
    let grown = server.rss_kib().saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "RSS grew by {grown} KiB for 12.8 GiB of requested, unread responses"
    );
    // Others are still served, by the same (single) worker.
    let (seen, _) = fetch(
        "--http2-prior-knowledge",
        &format!("http://{}/plaintext", server.addr()),
        &[],
    );
    assert_eq!(seen.status, "200");
    assert_eq!(seen.body, b"Hello, World!");
    drop(held);
}
