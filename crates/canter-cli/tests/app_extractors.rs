//! The streaming extractors and responders over real sockets: NDJSON in (chunked, in several
//! writes, read back item by item) and out (incrementally), streamed bodies, the JSON depth
//! limit, multipart forms (raw and from curl), cookies (raw and curl's jar), each error status
//! (400, 413, 415, 422), and Python's http.client.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use canter::cookie::Cookie;
use canter::rt::http::StatusCode;
use canter::{
    get, post, Cookies, Json, JsonLines, Multipart, NdJson, Rejection, RouteLimits, Router, State,
    StreamBody,
};
use canter_testkit::chunked;
use common::{curl_any_status, need, run_py_checks, Client, InProcess, Response, TempFile};
use futures_core::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::Notify;

// ---- the app under test ----

#[derive(Deserialize, Serialize)]
struct Reading {
    value: i64,
}

async fn sum(mut lines: JsonLines<Reading>) -> Result<Json<Value>, Rejection> {
    let (mut count, mut sum) = (0, 0);
    while let Some(reading) = lines.next().await {
        sum += reading?.value;
        count += 1;
    }
    Ok(Json(json!({ "count": count, "sum": sum })))
}

async fn sum_short_lines(lines: JsonLines<Reading>) -> Result<Json<Value>, Rejection> {
    sum(lines.line_limit(100)).await
}

/// Each posted line back, as it arrives.
fn echo(lines: JsonLines<Value>) -> NdJson {
    NdJson::try_new(lines)
}

/// The first posted line back, then the end: the rest of the upload is never read.
fn first(lines: JsonLines<Value>) -> NdJson {
    NdJson::try_new(unfold(Some(lines), |lines| async move {
        let mut lines = lines?;
        let item = lines.next().await?;
        Some((item, None))
    }))
}

#[derive(Serialize)]
struct Tick {
    n: u32,
}

/// Item 0 at once, item 1 once `POST /gate` is called, then the end.
fn gated(State(gate): State<Arc<Notify>>) -> NdJson {
    NdJson::new(unfold(0, move |n| {
        let gate = gate.clone();
        async move {
            match n {
                0 => Some((Tick { n }, 1)),
                1 => {
                    gate.notified().await;
                    Some((Tick { n }, 2))
                }
                _ => None,
            }
        }
    }))
}

fn open_gate(State(gate): State<Arc<Notify>>) -> &'static str {
    gate.notify_one();
    "opened\n"
}

/// Ten ready items of 4 KiB each: gathered into fewer, larger pieces.
fn bulk() -> NdJson {
    NdJson::new(unfold(0u32, |n| async move {
        (n < 10).then(|| (json!({ "n": n, "pad": "p".repeat(4096) }), n + 1))
    }))
}

fn streamed() -> StreamBody<impl Stream<Item = Result<Bytes, io::Error>>> {
    StreamBody::new(unfold(0u32, |n| async move {
        (n < 3).then(|| (Ok(Bytes::from(format!("piece {n}\n"))), n + 1))
    }))
}

fn streamed_sized() -> StreamBody<impl Stream<Item = &'static str>> {
    StreamBody::new(unfold(0u32, |n| async move {
        (n < 2).then_some(("abcde", n + 1))
    }))
    .content_length(10)
}

fn streamed_failing() -> StreamBody<impl Stream<Item = Result<String, io::Error>>> {
    StreamBody::new(unfold(0u32, |n| async move {
        match n {
            0 => Some((Ok("before the failure\n".to_owned()), 1)),
            1 => Some((Err(io::Error::other("the source broke")), 2)),
            _ => None,
        }
    }))
}

fn depth(Json(v): Json<Value>) -> String {
    fn d(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(d).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(d).max().unwrap_or(0),
            _ => 0,
        }
    }
    format!("{}\n", d(&v))
}

/// Every field: name, file name, content type, size, and the text of non-file fields.
async fn upload(mut form: Multipart) -> Result<Json<Value>, Rejection> {
    let mut out = Vec::new();
    while let Some(mut field) = form.next_field().await? {
        let mut entry = json!({
            "name": field.name(),
            "file_name": field.file_name(),
            "content_type": field.content_type(),
        });
        if field.file_name().is_some() {
            let (mut size, mut sum) = (0usize, 0u64);
            while let Some(chunk) = field.chunk().await? {
                size += chunk.len();
                sum += chunk.iter().map(|&b| u64::from(b)).sum::<u64>();
            }
            entry["size"] = json!(size);
            entry["sum"] = json!(sum);
        } else {
            entry["text"] = json!(field.text().await?);
        }
        out.push(entry);
    }
    Ok(Json(Value::Array(out)))
}

async fn upload_strict(form: Multipart) -> Result<Json<Value>, Rejection> {
    upload(form.field_limit(1000).max_fields(3)).await
}

/// Reads only the field named `want`, skipping the others unread.
async fn pick(mut form: Multipart) -> Result<String, Rejection> {
    let mut found = String::new();
    while let Some(field) = form.next_field().await? {
        if field.name() == Some("want") {
            found = field.text().await?;
        }
    }
    Ok(found)
}

fn show_cookies(cookies: Cookies) -> Json<Value> {
    let map: serde_json::Map<String, Value> = cookies
        .iter()
        .map(|(n, v)| (n.to_owned(), Value::from(v)))
        .collect();
    Json(Value::Object(map))
}

fn login(cookies: Cookies) -> (Cookies, (StatusCode, &'static str)) {
    let session = Cookie::build(("session", "s3cr3t"))
        .path("/")
        .http_only(true);
    let cookies = cookies.set(session).set(Cookie::new("theme", "dark"));
    (cookies, (StatusCode::CREATED, "logged in\n"))
}

fn logout(cookies: Cookies) -> (Cookies, &'static str) {
    (cookies.remove(Cookie::build("session").path("/")), "bye\n")
}

fn bad_cookie() -> (Cookies, &'static str) {
    (
        Cookies::new().set(Cookie::new("bad", "has space")),
        "never\n",
    )
}

fn app(gate: Arc<Notify>) -> Router {
    let small = RouteLimits {
        max_body: Some(1000),
        ..RouteLimits::default()
    };
    Router::new()
        .route("/ndjson/sum", post(sum))
        .route("/ndjson/small", post(sum).limits(small))
        .route("/ndjson/short-lines", post(sum_short_lines))
        .route("/ndjson/echo", post(echo))
        .route("/ndjson/first", post(first))
        .route("/ndjson/gated", get(gated))
        .route("/ndjson/bulk", get(bulk))
        .route("/gate", post(open_gate))
        .route("/stream", get(streamed))
        .route("/stream/sized", get(streamed_sized))
        .route("/stream/failing", get(streamed_failing))
        .route("/json/depth", post(depth))
        .route("/upload", post(upload))
        .route("/upload/strict", post(upload_strict))
        .route("/upload/small", post(upload).limits(small))
        .route("/upload/pick", post(pick))
        .route("/cookies", get(show_cookies))
        .route("/cookies/login", post(login))
        .route("/cookies/logout", post(logout))
        .route("/cookies/bad", get(bad_cookie))
        .with_state(gate)
}

// ---- harness ----

/// The app of this file on an in-process server.
fn start() -> InProcess {
    InProcess::start(|_| app(Arc::new(Notify::new())))
}

/// The JSON error body of a rejection: its status and message.
fn error_of(r: &Response) -> (u16, String) {
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("not a JSON error body ({e}): {r:?}"));
    assert_eq!(v["status"], r.status, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    (r.status, v["error"].as_str().unwrap_or_default().to_owned())
}

fn json_of(r: &Response) -> Value {
    assert_eq!(r.status, 200, "{r:?}");
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

/// One CRLF-terminated line (without the CRLF).
fn read_line(c: &mut Client) -> Vec<u8> {
    loop {
        if let Some(i) = c.buffered().windows(2).position(|w| w == b"\r\n") {
            let mut line = c.read_exact_bytes(i + 2);
            line.truncate(i);
            return line;
        }
        assert!(c.fill().unwrap() > 0, "EOF inside a line");
    }
}

/// The data of the next chunk of a chunked body; `None` for the last chunk (trailers read).
fn read_chunk(c: &mut Client) -> Option<Vec<u8>> {
    let size = String::from_utf8(read_line(c)).unwrap();
    let size = usize::from_str_radix(size.trim(), 16).unwrap();
    if size == 0 {
        while !read_line(c).is_empty() {}
        return None;
    }
    let data = c.read_exact_bytes(size);
    assert_eq!(c.read_exact_bytes(2), b"\r\n");
    Some(data)
}

/// Reads chunks until `lines` complete NDJSON lines have arrived (more may come in the same
/// chunk); returns them parsed.
fn read_items(c: &mut Client, lines: usize) -> Vec<Value> {
    let mut data = Vec::new();
    while data.iter().filter(|&&b| b == b'\n').count() < lines {
        data.extend(read_chunk(c).expect("the body ended early"));
    }
    data.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// A chunk of a chunked request body.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// A stream from an async step function (a small `futures::stream::unfold`).
fn unfold<S, T, F, Fut>(state: S, step: F) -> impl Stream<Item = T>
where
    S: Unpin,
    F: FnMut(S) -> Fut + Unpin,
    Fut: Future<Output = Option<(T, S)>>,
{
    struct Unfold<S, F, Fut> {
        state: Option<S>,
        step: F,
        running: Option<Pin<Box<Fut>>>,
    }

    impl<S: Unpin, T, F, Fut> Stream for Unfold<S, F, Fut>
    where
        F: FnMut(S) -> Fut + Unpin,
        Fut: Future<Output = Option<(T, S)>>,
    {
        type Item = T;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            let this = self.get_mut();
            if this.running.is_none() {
                let Some(state) = this.state.take() else {
                    return Poll::Ready(None);
                };
                this.running = Some(Box::pin((this.step)(state)));
            }
            let next = this.running.as_mut().unwrap().as_mut().poll(cx);
            match next {
                Poll::Pending => Poll::Pending,
                Poll::Ready(next) => {
                    this.running = None;
                    Poll::Ready(next.map(|(item, state)| {
                        this.state = Some(state);
                        item
                    }))
                }
            }
        }
    }

    Unfold {
        state: Some(state),
        step,
        running: None,
    }
}

const NDJSON: (&str, &str) = ("Content-Type", "application/x-ndjson");
const CHUNKED: (&str, &str) = ("Transfer-Encoding", "chunked");
/// The head of an NDJSON upload to the echo route, its body to follow in chunks.
const NDJSON_ECHO: &str = "POST /ndjson/echo HTTP/1.1\r\nHost: x\r\n\
    Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";

// ---- NDJSON in ----

#[test]
fn ndjson_streams_in_over_chunks_and_writes() {
    let server = start();
    let mut c = server.client();
    c.send(
        "POST /ndjson/sum HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson; charset=utf-8\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
    );
    // Lines split across chunks and across writes, a CRLF line end, an empty line, and a
    // last line without a line end.
    let pieces: [&[u8]; 7] = [
        b"{\"value\":",
        b" 1}\n{\"val",
        b"ue\":2}\r\n\n",
        b"  \n{\"value\"",
        b":3}\n",
        b"{\"value\":-10",
        b"0}",
    ];
    for p in pieces {
        c.send(chunk(p));
        thread::sleep(Duration::from_millis(5));
    }
    c.send("0\r\n\r\n");
    let r = c.response();
    assert_eq!(json_of(&r), json!({ "count": 4, "sum": -94 }));

    // The same connection goes on; a Content-Length body in one write.
    let body = b"{\"value\":5}\n{\"value\":6}\n";
    c.send(format!(
        "POST /ndjson/sum HTTP/1.1\r\nHost: x\r\nContent-Type: application/jsonl\r\nContent-Length: {}\r\n\r\n",
        body.len()
    ));
    c.send(body);
    assert_eq!(json_of(&c.response()), json!({ "count": 2, "sum": 11 }));
}

#[test]
fn ndjson_in_and_out_item_by_item() {
    let server = start();
    let mut c = server.client();
    c.send(NDJSON_ECHO);
    c.send(chunk(b"{\"n\":1}\n"));
    let head = c.response_head();
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(head.header("transfer-encoding"), Some("chunked"));
    // Each item comes back before the next one is sent.
    assert_eq!(read_items(&mut c, 1), [json!({ "n": 1 })]);
    c.send(chunk(b"{\"n\":"));
    thread::sleep(Duration::from_millis(20));
    c.send(chunk(b"2, \"s\": \"a\\nb\"}\n"));
    assert_eq!(read_items(&mut c, 1), [json!({ "n": 2, "s": "a\nb" })]);
    c.send(chunk(b"[3]\n"));
    assert_eq!(read_items(&mut c, 1), [json!([3])]);
    c.send("0\r\n\r\n");
    assert_eq!(read_chunk(&mut c), None);
    // The stream read the whole upload: the head did not announce a close, and the same
    // connection takes the next request.
    assert_eq!(head.header("connection"), None, "{head:?}");
    c.send(NDJSON_ECHO);
    c.send(chunk(b"{\"again\":true}\n"));
    c.send("0\r\n\r\n");
    assert_eq!(c.response_head().status, 200);
    assert_eq!(read_items(&mut c, 1), [json!({ "again": true })]);
    assert_eq!(read_chunk(&mut c), None);
}

#[test]
fn streamed_response_to_an_upload_nobody_reads_drains_it_after() {
    let server = start();
    let mut c = server.client();
    // The handler never takes the body. What has arrived of it is small, so the connection is
    // not given up: the rest is read and dropped once the response has gone out (within the
    // same 64 KiB bound as a Content-Length body), and the connection serves the next request.
    c.send("GET /stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    c.send(chunk(&[b'x'; 1000]));
    let head = c.response_head();
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("connection"), None, "{head:?}");
    let mut body = Vec::new();
    while let Some(piece) = read_chunk(&mut c) {
        body.extend(piece);
    }
    assert_eq!(body, b"piece 0\npiece 1\npiece 2\n");
    c.send(chunk(&[b'y'; 2000]));
    c.send("0\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.response_head();
    assert_eq!(head.status, 200, "{head:?}");
    let mut body = Vec::new();
    while let Some(piece) = read_chunk(&mut c) {
        body.extend(piece);
    }
    assert_eq!(body, b"piece 0\npiece 1\npiece 2\n");
}

#[test]
fn streamed_response_leaving_a_large_upload_unread_closes_after_it() {
    let server = start();
    let mut c = server.client();
    // The stream answers from the first line alone and never reads the rest: a body this size
    // is not worth draining, so the connection closes once the response has gone out whole.
    c.send(
        "POST /ndjson/first HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
    );
    c.send(chunk(b"{\"n\":1}\n"));
    let filler = vec![b' '; 16 * 1024];
    for _ in 0..8 {
        c.send(chunk(&filler));
    }
    let head = c.response_head();
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(read_items(&mut c, 1), [json!({ "n": 1 })]);
    assert_eq!(read_chunk(&mut c), None);
    c.expect_closed();
}

#[test]
fn ndjson_echo_cut_short_by_a_bad_line() {
    let server = start();
    let mut c = server.client();
    c.send(NDJSON_ECHO);
    c.send(chunk(b"{\"ok\":true}\n{not json}\n"));
    let head = c.response_head();
    assert_eq!(head.status, 200);
    assert_eq!(read_items(&mut c, 1), [json!({ "ok": true })]);
    // No last chunk: the connection closes mid-body, so the client knows it is incomplete.
    c.expect_closed();
}

#[test]
fn ndjson_in_errors() {
    let server = start();
    let post = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        error_of(&server.request("POST", path, headers, body))
    };

    // 415: another declared type, or none.
    for ct in [
        &[("Content-Type", "application/json")][..],
        &[("Content-Type", "application/json-seq")][..],
        &[],
    ] {
        let (status, msg) = post("/ndjson/sum", ct, b"{\"value\":1}\n");
        assert_eq!(status, 415, "{ct:?}: {msg}");
        assert!(msg.contains("application/x-ndjson"), "{msg}");
    }

    // 400: a malformed line, with its number (empty lines count).
    let (status, msg) = post("/ndjson/sum", &[NDJSON], b"{\"value\":1}\n\n{\"value\":}\n");
    assert_eq!(status, 400, "{msg}");
    assert!(msg.starts_with("line 3, column 10: "), "{msg}");

    // 422: a well-formed line of the wrong type.
    let (status, msg) = post(
        "/ndjson/sum",
        &[NDJSON],
        b"{\"value\":1}\n{\"value\":\"two\"}\n",
    );
    assert_eq!(status, 422, "{msg}");
    assert!(msg.starts_with("line 2, column "), "{msg}");
    assert!(msg.contains("invalid type"), "{msg}");

    // 400: a line nested deeper than the JSON depth limit.
    let deep = format!("{{\"value\":1}}\n{}{}\n", "[".repeat(65), "]".repeat(65));
    let (status, msg) = post("/ndjson/sum", &[NDJSON], deep.as_bytes());
    assert_eq!(status, 400, "{msg}");
    assert_eq!(msg, "line 2: nested deeper than 64 levels");

    // 413: a line over the line limit (100 bytes on this route), complete or not.
    let long = format!("{{\"value\":1}}\n{{\"value\":1{}}}\n", " ".repeat(100));
    let (status, msg) = post("/ndjson/short-lines", &[NDJSON], long.as_bytes());
    assert_eq!(status, 413, "{msg}");
    assert_eq!(msg, "line 2: longer than 100 bytes");
    let endless = " ".repeat(5000);
    let (status, msg) = post(
        "/ndjson/short-lines",
        &[NDJSON, CHUNKED],
        &chunked(&[endless.into_bytes()]),
    );
    assert_eq!(status, 413, "{msg}");
    assert_eq!(msg, "line 1: longer than 100 bytes");

    // 413: the whole body over the route's limit (1000 bytes), declared or chunked.
    let line = b"{\"value\":1}\n".repeat(100);
    let (status, _) = post("/ndjson/small", &[NDJSON], &line);
    assert_eq!(status, 413);
    let pieces: Vec<Vec<u8>> = line.chunks(100).map(<[u8]>::to_vec).collect();
    let (status, msg) = post("/ndjson/small", &[NDJSON, CHUNKED], &chunked(&pieces));
    assert_eq!(status, 413, "{msg}");
    // Within the limit, the same lines are summed.
    let r = server.request("POST", "/ndjson/small", &[NDJSON], &line[..960]);
    assert_eq!(json_of(&r), json!({ "count": 80, "sum": 80 }));
}

// ---- NDJSON out and streamed bodies ----

#[test]
fn ndjson_out_arrives_before_the_stream_ends() {
    let server = start();
    let mut c = server.client();
    c.send("GET /ndjson/gated HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.response_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(read_items(&mut c, 1), [json!({ "n": 0 })]);
    // The stream is waiting for the gate: nothing more, not even the end of the body.
    c.expect_silence(Duration::from_millis(300), "the gated stream");
    let r = server.request("POST", "/gate", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(read_items(&mut c, 1), [json!({ "n": 1 })]);
    assert_eq!(read_chunk(&mut c), None);
    // Keep-alive after a streamed body.
    let r = c.get("/stream/sized");
    assert_eq!(r.body, b"abcdeabcde");
}

#[test]
fn ndjson_out_gathers_ready_items() {
    let server = start();
    let mut c = server.client();
    c.send("GET /ndjson/bulk HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.response_head().status, 200);
    // Ten ready items of about 4 KiB: sent in pieces of about 16 KiB, not one chunk each.
    let mut chunks = Vec::new();
    while let Some(data) = read_chunk(&mut c) {
        chunks.push(data);
    }
    assert!(chunks.len() < 5, "{} chunks", chunks.len());
    assert!(
        chunks.iter().all(|c| c.ends_with(b"\n")),
        "a chunk ends mid-line"
    );
    let body = chunks.concat();
    let lines: Vec<Value> = body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["n"], i);
    }
}

#[test]
fn stream_bodies_chunked_sized_and_failing() {
    let server = start();
    let mut c = server.client();
    let r = c.get("/stream");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.text(), "piece 0\npiece 1\npiece 2\n");
    let r = c.get("/stream/sized");
    assert_eq!(r.header("content-length"), Some("10"));
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(r.body, b"abcdeabcde");

    // An error item: the piece before it is sent, then the connection closes with no last
    // chunk.
    c.send("GET /stream/failing HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = c.response_head();
    assert_eq!(head.status, 200);
    assert_eq!(read_chunk(&mut c).unwrap(), b"before the failure\n");
    c.expect_closed();
}

// ---- the JSON depth limit ----

#[test]
fn json_depth_limit_default_and_configured() {
    let server = start();
    let json = [("Content-Type", "application/json")];
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let r = server.request("POST", "/json/depth", &json, nested(64).as_bytes());
    assert_eq!((r.status, r.text()), (200, "64\n"));
    let r = server.request("POST", "/json/depth", &json, nested(65).as_bytes());
    assert_eq!(
        error_of(&r),
        (
            400,
            "invalid JSON body: nested deeper than 64 levels".to_owned()
        )
    );
    // Far past serde_json's own limit: still the same clear 400.
    let r = server.request("POST", "/json/depth", &json, nested(100_000).as_bytes());
    assert_eq!(error_of(&r).0, 400);
    // Brackets in strings do not count.
    let r = server.request("POST", "/json/depth", &json, br#"{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}"#);
    assert_eq!((r.status, r.text()), (200, "1\n"));

    let strict = InProcess::start(|_| {
        Router::new()
            .route("/json/depth", post(depth))
            .json_depth_limit(3)
    });
    let r = strict.request("POST", "/json/depth", &json, br#"{"a":[{"b":1}]}"#);
    assert_eq!((r.status, r.text()), (200, "3\n"));
    let r = strict.request("POST", "/json/depth", &json, br#"{"a":[{"b":[]}]}"#);
    assert_eq!(
        error_of(&r),
        (
            400,
            "invalid JSON body: nested deeper than 3 levels".to_owned()
        )
    );
}

// ---- multipart ----

const BOUNDARY: &str = "XyZ-boundary-42";

fn form_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// A part: name, file name, content type, data.
type Part<'a> = (&'a str, Option<&'a str>, Option<&'a str>, &'a [u8]);

/// A multipart body made of `parts`.
fn multipart_body(parts: &[Part<'_>]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, file, ct, data) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(file) = file {
            disposition.push_str(&format!("; filename=\"{file}\""));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\n");
        if let Some(ct) = ct {
            body.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
        }
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// Bytes whose sum is easy to check, with CRs, LFs and dashes that look like boundaries.
fn file_data(n: usize) -> Vec<u8> {
    let pattern = format!("\r\n--{}\r\n", &BOUNDARY[..10]);
    pattern.bytes().cycle().take(n).collect()
}

#[test]
fn multipart_raw_in_one_write_and_byte_by_byte() {
    let server = start();
    let data = file_data(100_000);
    let body = multipart_body(&[
        ("title", None, None, "héllo wörld".as_bytes()),
        (
            "doc",
            Some("notes.bin"),
            Some("application/octet-stream"),
            &data,
        ),
        ("empty", None, None, b""),
    ]);
    let expected = json!([
        { "name": "title", "file_name": null, "content_type": null, "text": "héllo wörld" },
        { "name": "doc", "file_name": "notes.bin", "content_type": "application/octet-stream",
          "size": data.len(), "sum": data.iter().map(|&b| u64::from(b)).sum::<u64>() },
        { "name": "empty", "file_name": null, "content_type": null, "text": "" },
    ]);
    let ct = form_type();
    let r = server.request("POST", "/upload", &[("Content-Type", &ct)], &body);
    assert_eq!(json_of(&r), expected);

    // Chunked, in small pieces and several writes.
    let mut c = server.client();
    c.send(format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ));
    for (i, piece) in body.chunks(997).enumerate() {
        c.send(chunk(piece));
        if i % 20 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    c.send("0\r\n\r\n");
    assert_eq!(json_of(&c.response()), expected);

    // One byte per chunk through the head of the form.
    let small = multipart_body(&[
        ("a", None, None, b"1"),
        ("b", None, Some("text/plain"), b"two"),
    ]);
    let pieces: Vec<Vec<u8>> = small.iter().map(|&b| vec![b]).collect();
    let r = server.request(
        "POST",
        "/upload",
        &[("Content-Type", &ct), CHUNKED],
        &chunked(&pieces),
    );
    assert_eq!(
        json_of(&r),
        json!([
            { "name": "a", "file_name": null, "content_type": null, "text": "1" },
            { "name": "b", "file_name": null, "content_type": "text/plain", "text": "two" },
        ])
    );

    // Fields left unread are skipped.
    let body = multipart_body(&[
        ("skip", Some("big.bin"), None, &data),
        ("want", None, None, b"found"),
        ("after", None, None, b"x"),
    ]);
    let r = server.request("POST", "/upload/pick", &[("Content-Type", &ct)], &body);
    assert_eq!((r.status, r.text()), (200, "found"));
}

#[test]
fn multipart_errors() {
    let server = start();
    let ct = form_type();
    let body = multipart_body(&[("a", None, None, b"1")]);
    let post = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        error_of(&server.request("POST", path, headers, body))
    };

    // 415: no Content-Type, another type, a malformed one.
    for headers in [
        &[][..],
        &[("Content-Type", "text/plain")][..],
        &[("Content-Type", "multipart/mixed; boundary=x")][..],
        &[("Content-Type", "not a media type")][..],
    ] {
        let (status, msg) = post("/upload", headers, &body);
        assert_eq!(status, 415, "{headers:?}: {msg}");
        assert_eq!(msg, "expected Content-Type: multipart/form-data");
    }
    // 400: no boundary, an empty or too long one.
    let (status, msg) = post("/upload", &[("Content-Type", "multipart/form-data")], &body);
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("boundary"), "{msg}");
    let long = format!("multipart/form-data; boundary={}", "b".repeat(71));
    assert_eq!(post("/upload", &[("Content-Type", &long)], &body).0, 400);
    let empty = "multipart/form-data; boundary=\"\"";
    assert_eq!(post("/upload", &[("Content-Type", empty)], &body).0, 400);

    // 400: malformed bodies.
    let truncated = &body[..body.len() - 8];
    let (status, msg) = post("/upload", &[("Content-Type", &ct)], truncated);
    assert_eq!(status, 400, "{msg}");
    assert!(msg.starts_with("malformed multipart body"), "{msg}");
    let (status, _) = post("/upload", &[("Content-Type", &ct)], b"no boundary anywhere");
    assert_eq!(status, 400);
    let bad_header =
        format!("--{BOUNDARY}\r\nContent-Disposition form-data\r\n\r\nx\r\n--{BOUNDARY}--\r\n");
    assert_eq!(
        post("/upload", &[("Content-Type", &ct)], bad_header.as_bytes()).0,
        400
    );
    // A part head longer than 16 KiB (a header that never ends).
    let endless = format!("--{BOUNDARY}\r\nX-Pad: {}", "p".repeat(100_000));
    let (status, msg) = post("/upload", &[("Content-Type", &ct)], endless.as_bytes());
    assert_eq!(
        (status, msg.as_str()),
        (400, "multipart part head longer than 16384 bytes")
    );

    // 413: a field over the field limit (1000 bytes on /upload/strict).
    let big = multipart_body(&[("a", Some("f"), None, &[b'x'; 1001])]);
    let (status, msg) = post("/upload/strict", &[("Content-Type", &ct)], &big);
    assert_eq!(status, 413, "{msg}");
    assert_eq!(msg, "multipart field `a` larger than 1000 bytes");
    let ok = multipart_body(&[("a", Some("f"), None, &[b'x'; 1000])]);
    assert_eq!(
        server
            .request("POST", "/upload/strict", &[("Content-Type", &ct)], &ok)
            .status,
        200
    );
    // 413: more fields than allowed (3 on /upload/strict).
    let four = multipart_body(&[
        ("a", None, None, b"1"),
        ("b", None, None, b"2"),
        ("c", None, None, b"3"),
        ("d", None, None, b"4"),
    ]);
    let (status, msg) = post("/upload/strict", &[("Content-Type", &ct)], &four);
    assert_eq!(
        (status, msg.as_str()),
        (413, "more than 3 multipart fields")
    );
    // 413: the whole body over the limit (1000 bytes on /upload/small), declared or chunked.
    let large = multipart_body(&[("a", Some("f"), None, &[b'x'; 2000])]);
    assert_eq!(
        post("/upload/small", &[("Content-Type", &ct)], &large).0,
        413
    );
    let pieces: Vec<Vec<u8>> = large.chunks(300).map(<[u8]>::to_vec).collect();
    let (status, msg) = post(
        "/upload/small",
        &[("Content-Type", &ct), CHUNKED],
        &chunked(&pieces),
    );
    assert_eq!(status, 413, "{msg}");
}

#[test]
fn multipart_from_curl() {
    need("curl");
    let server = start();
    let data = file_data(300_000);
    let file = TempFile::new("upload.txt", &data);
    let at = format!("file=@{};type=text/plain", file.path().display());
    let out = curl_any_status(&[
        "-F",
        "name=canter",
        "-F",
        &at,
        "-F",
        "n=42",
        &server.url("/upload"),
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let file_name = file.path().file_name().unwrap().to_str().unwrap();
    assert_eq!(
        v,
        json!([
            { "name": "name", "file_name": null, "content_type": null, "text": "canter" },
            { "name": "file", "file_name": file_name, "content_type": "text/plain",
              "size": data.len(), "sum": data.iter().map(|&b| u64::from(b)).sum::<u64>() },
            { "name": "n", "file_name": null, "content_type": null, "text": "42" },
        ])
    );
    // Over the field limit: curl gets the 413 and its JSON body.
    let out = curl_any_status(&["-F", &at, &server.url("/upload/strict")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], 413, "{v}");
}

// ---- cookies ----

#[test]
fn cookies_raw() {
    let server = start();
    // Every Cookie field is read; malformed pairs are skipped, not a 400; the first of a
    // name wins.
    let r = server.request(
        "GET",
        "/cookies",
        &[
            ("Cookie", "a=1; broken; =nameless; b=two words"),
            ("Cookie", "c=\"quoted\"; a=again"),
        ],
        b"",
    );
    assert_eq!(
        json_of(&r),
        json!({ "a": "1", "b": "two words", "c": "\"quoted\"" })
    );
    let r = server.request("GET", "/cookies", &[], b"");
    assert_eq!(json_of(&r), json!({}));

    let r = server.request("POST", "/cookies/login", &[], b"");
    assert_eq!(r.status, 201, "{r:?}");
    let set: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(set, ["session=s3cr3t; HttpOnly; Path=/", "theme=dark"]);

    let r = server.request(
        "POST",
        "/cookies/logout",
        &[("Cookie", "session=s3cr3t")],
        b"",
    );
    let set = r.header("set-cookie").unwrap();
    assert!(
        set.starts_with("session=; Path=/; Max-Age=0; Expires="),
        "{set}"
    );
    // Nothing to remove: no Set-Cookie.
    let r = server.request("POST", "/cookies/logout", &[], b"");
    assert_eq!(r.header("set-cookie"), None);

    let r = server.request("GET", "/cookies/bad", &[], b"");
    let (status, msg) = error_of(&r);
    assert_eq!(
        (status, msg.as_str()),
        (500, "cannot set cookie `bad`: invalid value")
    );
}

#[test]
fn cookies_with_curl_jar() {
    need("curl");
    let server = start();
    let out = curl_any_status(&["-b", "x=1; junk; y=2", &server.url("/cookies")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({ "x": "1", "y": "2" }));

    let jar = TempFile::new("jar.txt", b"");
    let jar_path = jar.path().to_str().unwrap();
    curl_any_status(&["-c", jar_path, "-X", "POST", &server.url("/cookies/login")]);
    let saved = std::fs::read_to_string(jar.path()).unwrap();
    assert!(saved.contains("session\ts3cr3t"), "{saved}");
    assert!(saved.contains("#HttpOnly_"), "{saved}");
    assert!(saved.contains("theme\tdark"), "{saved}");
    let out = curl_any_status(&["-b", jar_path, &server.url("/cookies")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({ "session": "s3cr3t", "theme": "dark" }));
    curl_any_status(&[
        "-b",
        jar_path,
        "-c",
        jar_path,
        "-X",
        "POST",
        &server.url("/cookies/logout"),
    ]);
    let out = curl_any_status(&["-b", jar_path, &server.url("/cookies")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({ "theme": "dark" }));
}

// ---- Python's http.client ----

#[test]
fn python_http_client_streams_ndjson() {
    let server = start();
    run_py_checks(
        "extractors.py",
        server.addr.port(),
        &[
            "ok ndjson chunked upload",
            "ok ndjson echo line by line",
            "ok ndjson 422",
            "ok multipart",
            "ok cookies",
            "ALL OK",
        ],
        String::new,
    );
}
