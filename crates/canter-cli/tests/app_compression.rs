//! The Compression layer over real sockets: each coding decoded by real clients (curl,
//! Python's gzip module) and by the reference libraries, Accept-Encoding negotiation, the
//! responses left alone, HEAD, validators, streamed bodies that must arrive piece by piece, and
//! the demo's `--compress` flag.
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use canter::middleware::{Coding, Compression};
use canter::rt::http::{header, HeaderValue, StatusCode};
use canter::rt::{Body, BodyStream, Response};
use canter::{get, Router};
use canter_testkit::{Client, Response as Reply};
use common::{fetch, InProcess};
use tokio::sync::Notify;

const CODINGS: [Coding; 3] = [Coding::Gzip, Coding::Brotli, Coding::Zstd];

/// `n` bytes of text that compresses the way real text does (repeats, but not trivially).
fn text(n: usize) -> Bytes {
    let words = [
        "stream", "canter", "gallop", "window", "header", "buffer", "socket",
    ];
    let mut out = String::new();
    let mut i = 0usize;
    while out.len() < n {
        out.push_str(&format!(
            "{i}: {} {} {}\n",
            words[i % 7],
            words[(i / 7) % 7],
            words[(i * 3 + 1) % 7]
        ));
        i += 1;
    }
    out.truncate(n);
    Bytes::from(out)
}

fn plain(body: Bytes) -> Response {
    Response::text(body)
}

/// Pieces handed out one per poll.
struct Pieces(Vec<Bytes>);

impl BodyStream for Pieces {
    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        if self.0.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(self.0.remove(0))))
    }
}

/// A first piece, then nothing until the test opens the gate (at most 10 s), then a second.
struct Gated {
    first: Option<Bytes>,
    wait: Option<Pin<Box<dyn Future<Output = ()>>>>,
    second: Option<Bytes>,
}

impl BodyStream for Gated {
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        if let Some(wait) = &mut self.wait {
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
        }
        Poll::Ready(self.second.take().map(Ok))
    }
}

/// One piece, then an error.
struct Failing(bool);

impl BodyStream for Failing {
    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        if std::mem::replace(&mut self.0, true) {
            Poll::Ready(Some(Err(io::Error::other("source failed"))))
        } else {
            Poll::Ready(Some(Ok(text(8192))))
        }
    }
}

fn gated_pieces() -> (Bytes, Bytes) {
    let all = text(6000);
    (all.slice(..3000), all.slice(3000..))
}

fn app(gate: Arc<Notify>) -> Router {
    Router::new()
        .route("/text", get(|| plain(text(20_000))))
        .route("/small", get(|| plain(text(100))))
        .route("/big", get(|| plain(text(1 << 20))))
        .route(
            "/json",
            get(|| Response::json_bytes(format!("[{}]", r#"{"id":1,"name":"x"},"#.repeat(200)))),
        )
        .route(
            "/png",
            get(|| {
                Response::new(StatusCode::OK)
                    .with_header(header::CONTENT_TYPE, HeaderValue::from_static("image/png"))
                    .with_body(text(8192))
            }),
        )
        .route(
            "/untyped",
            get(|| Response::new(StatusCode::OK).with_body(text(8192))),
        )
        .route(
            "/no-transform",
            get(|| {
                plain(text(8192)).with_header(
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("max-age=60, No-Transform"),
                )
            }),
        )
        .route(
            "/encoded",
            get(|| {
                plain(Bytes::from(gzip(&text(8192))))
                    .with_header(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"))
            }),
        )
        .route(
            "/partial",
            get(|| {
                plain(text(8192))
                    .with_status(StatusCode::PARTIAL_CONTENT)
                    .with_header(
                        header::CONTENT_RANGE,
                        HeaderValue::from_static("bytes 0-8191/100000"),
                    )
            }),
        )
        .route(
            "/not-modified",
            get(|| {
                Response::new(StatusCode::NOT_MODIFIED)
                    .with_header(header::ETAG, HeaderValue::from_static("\"v1\""))
            }),
        )
        .route(
            "/etag",
            get(|| {
                plain(text(8192))
                    .with_header(header::ETAG, HeaderValue::from_static("\"v1\""))
                    .with_header(header::VARY, HeaderValue::from_static("Origin"))
                    .with_header(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"))
            }),
        )
        .route(
            "/stream",
            get(|| {
                let all = text(100_000);
                let pieces = (0..10)
                    .map(|i| all.slice(i * 10_000..(i + 1) * 10_000))
                    .collect();
                plain(Bytes::new()).with_body(Body::stream(None, Pieces(pieces)))
            }),
        )
        .route(
            "/stream-known",
            get(|| {
                let all = text(50_000);
                let pieces = vec![all.slice(..20_000), all.slice(20_000..)];
                plain(Bytes::new()).with_body(Body::stream(Some(50_000), Pieces(pieces)))
            }),
        )
        .route(
            "/stream-small",
            get(|| plain(Bytes::new()).with_body(Body::stream(Some(10), Pieces(vec![text(10)])))),
        )
        .route(
            "/failing",
            get(|| plain(Bytes::new()).with_body(Body::stream(None, Failing(false)))),
        )
        .route(
            "/gated",
            get(move || {
                let gate = gate.clone();
                let (first, second) = gated_pieces();
                let wait = Box::pin(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), gate.notified()).await;
                });
                Response::new(StatusCode::OK)
                    .with_header(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/x-ndjson"),
                    )
                    .with_body(Body::stream(
                        None,
                        Gated {
                            first: Some(first),
                            wait: Some(wait),
                            second: Some(second),
                        },
                    ))
            }),
        )
}

fn server() -> (InProcess, Arc<Notify>) {
    let gate = Arc::new(Notify::new());
    let shared = gate.clone();
    let running = InProcess::start(move |_| app(shared.clone()).layer(Compression::new()));
    (running, gate)
}

fn accept(coding: &str) -> String {
    format!("Accept-Encoding: {coding}\r\n")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Decodes a whole body with the coding's reference library.
fn decode(coding: Coding, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        Coding::Gzip => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap();
        }
        Coding::Brotli => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        _ => out = zstd::stream::decode_all(data).unwrap(),
    }
    out
}

/// What a client can decode from the first bytes of a body: everything up to where the
/// decoder needs more input.
fn decode_prefix(coding: Coding, data: &[u8]) -> Vec<u8> {
    let mut decoder: Box<dyn Read + '_> = match coding {
        Coding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
        Coding::Brotli => Box::new(brotli::Decompressor::new(data, 4096)),
        _ => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
    };
    let mut out = Vec::new();
    let mut buf = [0; 4096];
    while let Ok(n @ 1..) = decoder.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn assert_untouched(r: &Reply, body: &[u8]) {
    assert_eq!(r.header("content-encoding"), None, "{r:?}");
    assert_eq!(r.header("vary"), None, "{r:?}");
    assert_eq!(r.body, body, "{r:?}");
}

#[test]
fn each_coding_round_trips_through_every_body_path() {
    let (server, _gate) = server();
    let cases: [(&str, Bytes); 5] = [
        ("/text", text(20_000)),
        (
            "/json",
            Bytes::from(format!("[{}]", r#"{"id":1,"name":"x"},"#.repeat(200))),
        ),
        ("/big", text(1 << 20)),
        ("/stream", text(100_000)),
        ("/stream-known", text(50_000)),
    ];
    for coding in CODINGS {
        for (path, expected) in &cases {
            let r = fetch(server.addr, "GET", path, &accept(coding.as_str()));
            assert_eq!(r.status, 200, "{path} {r:?}");
            assert_eq!(
                r.header("content-encoding"),
                Some(coding.as_str()),
                "{path} {r:?}"
            );
            assert_eq!(r.header("vary"), Some("accept-encoding"), "{path} {r:?}");
            assert!(
                r.body.len() < expected.len() / 3,
                "{path} {coding:?}: {} bytes",
                r.body.len()
            );
            assert_eq!(decode(coding, &r.body), expected[..], "{path} {coding:?}");
            // Bodies compressed in one go keep a Content-Length; the others are chunked.
            let chunked = matches!(*path, "/big" | "/stream" | "/stream-known");
            assert_eq!(
                r.header("transfer-encoding").is_some(),
                chunked,
                "{path} {r:?}"
            );
            assert_eq!(
                r.header("content-length").is_none(),
                chunked,
                "{path} {r:?}"
            );
        }
    }
}

fn curl_features() -> Option<String> {
    let out = Command::new("curl").arg("-V").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.starts_with("Features:"))
        .map(str::to_owned)
}

/// `curl --compressed` with `accept_encoding` as the only offer; (decoded body, head).
fn curl_get(url: &str, accept_encoding: Option<&str>) -> (Vec<u8>, String) {
    let ae = accept_encoding.map(|ae| format!("Accept-Encoding: {ae}"));
    let mut args = vec!["--compressed", "-D", "/dev/stderr"];
    if let Some(ae) = &ae {
        args.extend(["-H", ae]);
    }
    args.push(url);
    let out = common::curl(&args);
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).to_lowercase(),
    )
}

#[test]
fn curl_decodes_each_coding() {
    let features = curl_features().expect("curl is needed by this test and could not run");
    let (server, _gate) = server();
    for (coding, feature) in [
        (Coding::Gzip, "libz"),
        (Coding::Brotli, "brotli"),
        (Coding::Zstd, "zstd"),
    ] {
        assert!(
            features.split_whitespace().any(|f| f == feature),
            "this curl lacks {feature}, needed to check {coding:?}: {features}"
        );
        for (path, expected) in [("/text", text(20_000)), ("/stream", text(100_000))] {
            let url = format!("http://{}{path}", server.addr);
            let (body, head) = curl_get(&url, Some(coding.as_str()));
            assert!(
                head.contains(&format!("content-encoding: {}\r\n", coding.as_str())),
                "{head}"
            );
            assert_eq!(body, expected[..], "{path} {coding:?}");
        }
    }
    // Plain `--compressed` offers all it supports; the server's preference picks.
    if features.contains("zstd") {
        let url = format!("http://{}/text", server.addr);
        let (body, head) = curl_get(&url, None);
        assert!(head.contains("content-encoding: zstd\r\n"), "{head}");
        assert_eq!(body, text(20_000)[..]);
    }
}

#[test]
fn python_gzip_module_decodes() {
    let (server, _gate) = server();
    for path in ["/text", "/big", "/stream"] {
        let r = fetch(server.addr, "GET", path, &accept("gzip"));
        let out = common::run_python(
            &[
                "-c",
                "import gzip, sys; sys.stdout.buffer.write(gzip.decompress(sys.stdin.buffer.read()))",
            ],
            Some(r.body.clone()),
        );
        assert!(out.status.success(), "python3: {out:?}");
        let expected = decode(Coding::Gzip, &r.body);
        assert_eq!(out.stdout, expected, "{path}");
        assert!(expected.len() >= 20_000, "{path}");
    }
}

#[test]
fn negotiation() {
    let (server, _gate) = server();
    for (headers, expected) in [
        ("", None),
        ("Accept-Encoding: \r\n", None),
        ("Accept-Encoding: gzip\r\n", Some("gzip")),
        ("Accept-Encoding: GZIP\r\n", Some("gzip")),
        ("Accept-Encoding: x-gzip\r\n", Some("gzip")),
        ("Accept-Encoding: br\r\n", Some("br")),
        ("Accept-Encoding: zstd\r\n", Some("zstd")),
        // Equal weights: the server's preference (zstd, br, gzip).
        ("Accept-Encoding: gzip, deflate, br, zstd\r\n", Some("zstd")),
        ("Accept-Encoding: gzip, br\r\n", Some("br")),
        // Weights first.
        ("Accept-Encoding: gzip;q=0.5, zstd;q=0.4\r\n", Some("gzip")),
        ("Accept-Encoding: br;q=1.0, zstd;q=0.999\r\n", Some("br")),
        // q=0 refuses.
        ("Accept-Encoding: zstd;q=0, br;q=0, gzip\r\n", Some("gzip")),
        ("Accept-Encoding: zstd;q=0, br;q=0, gzip;q=0\r\n", None),
        // `*` and identity.
        ("Accept-Encoding: *\r\n", Some("zstd")),
        ("Accept-Encoding: *;q=0\r\n", None),
        ("Accept-Encoding: *;q=0.5, zstd;q=0\r\n", Some("br")),
        ("Accept-Encoding: identity\r\n", None),
        ("Accept-Encoding: identity;q=0\r\n", None),
        ("Accept-Encoding: identity;q=0, *\r\n", Some("zstd")),
        ("Accept-Encoding: identity, gzip;q=0.5\r\n", None),
        (
            "Accept-Encoding: identity;q=0.1, gzip;q=0.5\r\n",
            Some("gzip"),
        ),
        // Unknown codings only, and malformed weights.
        ("Accept-Encoding: deflate, compress, x-custom\r\n", None),
        ("Accept-Encoding: gzip;q=2, br;q=-1\r\n", None),
        // Several fields make one list.
        (
            "Accept-Encoding: br;q=0\r\nAccept-Encoding: gzip\r\n",
            Some("gzip"),
        ),
    ] {
        let r = fetch(server.addr, "GET", "/text", headers);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), expected, "{headers:?}");
        // Compressible either way: caches must keep the variants apart.
        assert_eq!(r.header("vary"), Some("accept-encoding"), "{headers:?}");
        match expected {
            None => assert_eq!(r.body, text(20_000)[..], "{headers:?}"),
            Some(name) => {
                let coding = CODINGS.into_iter().find(|c| c.as_str() == name).unwrap();
                assert_eq!(decode(coding, &r.body), text(20_000)[..], "{headers:?}");
            }
        }
    }
}

#[test]
fn responses_left_alone() {
    let (server, _gate) = server();
    let all = "Accept-Encoding: gzip, br, zstd\r\n";
    assert_untouched(&fetch(server.addr, "GET", "/small", all), &text(100));
    assert_untouched(&fetch(server.addr, "GET", "/stream-small", all), &text(10));
    assert_untouched(&fetch(server.addr, "GET", "/png", all), &text(8192));
    assert_untouched(&fetch(server.addr, "GET", "/untyped", all), &text(8192));
    assert_untouched(
        &fetch(server.addr, "GET", "/no-transform", all),
        &text(8192),
    );
    let r = fetch(server.addr, "GET", "/partial", all);
    assert_eq!(r.status, 206);
    assert_untouched(&r, &text(8192));
    let r = fetch(server.addr, "GET", "/not-modified", all);
    assert_eq!(r.status, 304);
    assert_untouched(&r, b"");
    // Already encoded by the handler: passed through once, not encoded again.
    let r = fetch(server.addr, "GET", "/encoded", all);
    assert_eq!(r.count("content-encoding"), 1, "{r:?}");
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("vary"), None, "{r:?}");
    assert_eq!(decode(Coding::Gzip, &r.body), text(8192)[..]);
}

#[test]
fn head_gets_the_headers_of_get() {
    let (server, _gate) = server();
    for coding in CODINGS {
        let ae = accept(coding.as_str());
        let get = fetch(server.addr, "GET", "/text", &ae);
        let head = fetch(server.addr, "HEAD", "/text", &ae);
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        for name in ["content-encoding", "vary", "content-length", "content-type"] {
            assert_eq!(
                head.header(name),
                get.header(name),
                "{name}: {head:?} vs {get:?}"
            );
        }
        assert_eq!(
            head.header("content-length"),
            Some(get.body.len().to_string().as_str())
        );
        // A streamed body: the same coding, no length announced.
        let head = fetch(server.addr, "HEAD", "/stream", &ae);
        assert_eq!(
            head.header("content-encoding"),
            Some(coding.as_str()),
            "{head:?}"
        );
        assert_eq!(head.header("content-length"), None, "{head:?}");
    }
    // Uncompressed HEAD: the uncompressed length, and Vary still.
    let head = fetch(server.addr, "HEAD", "/text", "");
    assert_eq!(head.header("content-length"), Some("20000"));
    assert_eq!(head.header("content-encoding"), None);
    assert_eq!(head.header("vary"), Some("accept-encoding"));
}

#[test]
fn validators_ranges_and_vary() {
    let (server, _gate) = server();
    let r = fetch(server.addr, "GET", "/etag", &accept("gzip"));
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("etag"), Some("W/\"v1\""), "{r:?}");
    assert_eq!(r.header("accept-ranges"), None, "{r:?}");
    let vary: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(vary, ["Origin", "accept-encoding"], "{r:?}");
    // Uncompressed: the strong tag and ranges stay.
    let r = fetch(server.addr, "GET", "/etag", "");
    assert_eq!(r.header("etag"), Some("\"v1\""));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.count("vary"), 2, "{r:?}");
}

/// Reads one line (without its CRLF) from the client's buffer and socket.
fn read_line(c: &mut Client) -> String {
    loop {
        if let Some(i) = c.buffered().windows(2).position(|w| w == b"\r\n") {
            let line = c.read_exact_bytes(i + 2);
            return String::from_utf8(line[..i].to_vec()).unwrap();
        }
        assert!(c.fill().unwrap() > 0, "EOF in a chunk size line");
    }
}

/// The next chunk of a chunked body; `None` after the last one.
fn read_chunk(c: &mut Client) -> Option<Vec<u8>> {
    let size = usize::from_str_radix(read_line(c).trim(), 16).unwrap();
    if size == 0 {
        assert_eq!(read_line(c), "");
        return None;
    }
    let data = c.read_exact_bytes(size);
    assert_eq!(c.read_exact_bytes(2), b"\r\n");
    Some(data)
}

#[test]
fn streamed_pieces_arrive_before_the_stream_ends() {
    let (server, gate) = server();
    let (first, second) = gated_pieces();
    for coding in CODINGS {
        let mut c = Client::connect(server.addr);
        c.set_read_timeout(Duration::from_secs(5));
        c.send(format!(
            "GET /gated HTTP/1.1\r\nHost: x\r\n{}\r\n",
            accept(coding.as_str())
        ));
        let head = c.response_head();
        assert_eq!(
            head.header("content-encoding"),
            Some(coding.as_str()),
            "{head:?}"
        );
        assert_eq!(head.header("transfer-encoding"), Some("chunked"));
        // The gate is still closed: whatever arrives must already decode to the first piece.
        let mut received = Vec::new();
        while decode_prefix(coding, &received) != first[..] {
            let chunk = read_chunk(&mut c).expect("the body ended before the gate opened");
            received.extend(chunk);
            assert!(
                received.len() < 10_000,
                "{coding:?}: no decodable first piece"
            );
        }
        gate.notify_one();
        while let Some(chunk) = read_chunk(&mut c) {
            received.extend(chunk);
        }
        let mut all = first.to_vec();
        all.extend_from_slice(&second);
        assert_eq!(decode(coding, &received), all, "{coding:?}");
    }
}

#[test]
fn a_failing_stream_is_cut_short_not_ended() {
    let (server, _gate) = server();
    for coding in CODINGS {
        let mut c = Client::connect(server.addr);
        c.send(format!(
            "GET /failing HTTP/1.1\r\nHost: x\r\n{}\r\n",
            accept(coding.as_str())
        ));
        let head = c.response_head();
        assert_eq!(head.header("content-encoding"), Some(coding.as_str()));
        let rest = c.read_to_eof();
        assert!(
            !rest.ends_with(b"0\r\n\r\n"),
            "{coding:?}: the body was ended"
        );
    }
}

#[test]
fn settings() {
    let server = InProcess::start(|_| {
        Router::new()
            .route("/small", get(|| plain(text(100))))
            .route(
                "/custom",
                get(|| {
                    Response::new(StatusCode::OK)
                        .with_header(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/x-custom; v=1"),
                        )
                        .with_body(text(4096))
                }),
            )
            .layer(
                Compression::new()
                    .codings(&[Coding::Gzip])
                    .gzip_level(9)
                    .min_size(50)
                    .content_types(&["text/plain", "application/x-custom"]),
            )
    });
    let r = fetch(
        server.addr,
        "GET",
        "/small",
        "Accept-Encoding: zstd, br, gzip\r\n",
    );
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode(Coding::Gzip, &r.body), text(100)[..]);
    let r = fetch(server.addr, "GET", "/custom", "Accept-Encoding: gzip\r\n");
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    // Only gzip is offered.
    let r = fetch(
        server.addr,
        "GET",
        "/custom",
        "Accept-Encoding: br, zstd\r\n",
    );
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("vary"), Some("accept-encoding"));
}

#[test]
fn demo_compress_flag() {
    let long_name = "n".repeat(1500);
    let request =
        format!("GET /page?name={long_name} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n");
    let on = common::Server::start_with(&["--compress"]);
    let mut c = Client::connect(on.addr());
    c.send(&request);
    let r = c.response();
    assert_eq!(r.header("content-encoding"), Some("gzip"), "{r:?}");
    let page = String::from_utf8(decode(Coding::Gzip, &r.body)).unwrap();
    assert!(page.contains(&long_name), "{page}");
    // /json is below the minimum size: as it was.
    let r = c.get("/json");
    assert_eq!(r.header("content-encoding"), None);
    // Off by default.
    let off = common::Server::start();
    let mut c = Client::connect(off.addr());
    c.send(&request);
    let r = c.response();
    assert_eq!(r.header("content-encoding"), None, "{r:?}");
    assert_eq!(r.header("vary"), None, "{r:?}");
}
