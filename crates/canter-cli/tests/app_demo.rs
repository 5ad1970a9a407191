//! The demo's router endpoints over real sockets: `/hello/{name}`, `/api/items`, `/page`, and
//! each extractor error (400, 413, 415, 422) with its JSON body; 405 with `Allow`, HEAD, the
//! nested `/api` router and the fallback.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::thread;

use common::{assert_standard_headers, Client, Response, Server};
use serde_json::Value;

fn request(
    c: &mut Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    c.send(bytes);
    c.response()
}

fn post_json(c: &mut Client, body: &str) -> Response {
    request(
        c,
        "POST",
        "/api/items",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

/// Asserts a JSON error body `{"error": "...", "status": N}` and returns the message.
fn json_error(r: &Response, status: u16) -> String {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["status"], status, "{r:?}");
    v["error"].as_str().unwrap().to_owned()
}

#[test]
fn hello_percent_decodes() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/hello/world");
    assert_eq!((r.status, r.text()), (200, "Hello, world!"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_standard_headers(&r);
    let r = c.get("/hello/J%C3%BCrgen");
    assert_eq!((r.status, r.text()), (200, "Hello, Jürgen!"));
    let r = c.get("/hello/a%20b%2Fc");
    assert_eq!(r.text(), "Hello, a b/c!");
    // Not UTF-8 once decoded: 400 with a JSON error.
    let r = c.get("/hello/%FF");
    assert!(json_error(&r, 400).contains("name"), "{r:?}");
    // Two segments do not match one parameter: the fallback.
    let r = c.get("/hello/a/b");
    assert_eq!((r.status, r.text()), (404, "no such endpoint\n"));
}

#[test]
fn head_on_a_get_route() {
    let server = Server::start();
    let mut c = server.client();
    c.send("HEAD /hello/x HTTP/1.1\r\nHost: x\r\n\r\nGET /hello/y HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.head_response();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("9"));
    // No body bytes came with the HEAD response: the next one parses.
    assert_eq!(c.response().text(), "Hello, y!");
}

#[test]
fn method_not_allowed_on_router_routes() {
    let server = Server::start();
    let mut c = server.client();
    c.send("DELETE /hello/x HTTP/1.1\r\nHost: x\r\n\r\n");
    let r = c.response();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    let r = c.get("/api/items");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = request(&mut c, "POST", "/api/items/1", &[], b"");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    assert!(!r.closes());
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn fallback_for_unknown_paths() {
    let server = Server::start();
    let mut c = server.client();
    for (method, path) in [
        ("GET", "/nope"),
        ("POST", "/api"),
        ("PUT", "/api/nope"),
        ("GET", "/hello"),
    ] {
        let r = request(&mut c, method, path, &[], b"");
        assert_eq!(
            (r.status, r.text()),
            (404, "no such endpoint\n"),
            "{method} {path}"
        );
    }
}

#[test]
fn items_create_and_fetch_through_the_nested_router() {
    let server = Server::start();
    let mut c = server.client();
    let r = post_json(&mut c, r#"{"name": "widget", "qty": 3}"#);
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let item: Value = serde_json::from_slice(&r.body).unwrap();
    let id = item["id"].as_u64().unwrap();
    assert_eq!(item["name"], "widget");
    assert_eq!(item["qty"], 3);
    assert_eq!(
        r.header("location"),
        Some(format!("/api/items/{id}").as_str())
    );
    // Ids are unique across requests.
    let r = post_json(&mut c, r#"{"name": "gadget", "qty": -1}"#);
    let second: Value = serde_json::from_slice(&r.body).unwrap();
    assert_ne!(second["id"].as_u64().unwrap(), id);
    // Fetched on fresh connections (which may land on the other worker): the store is global.
    for _ in 0..4 {
        let mut c = server.client();
        let r = c.get(&format!("/api/items/{id}"));
        assert_eq!(r.status, 200, "{r:?}");
        let got: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(got, item);
    }
    let r = c.get("/api/items/999999999");
    assert!(json_error(&r, 404).contains("999999999"));
    let r = c.get("/api/items/abc");
    json_error(&r, 400);
    // Media types with parameters, in any case, and +json suffixes are JSON.
    for ct in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.item+json",
    ] {
        let r = request(
            &mut c,
            "POST",
            "/api/items",
            &[("Content-Type", ct)],
            br#"{"name":"a","qty":1}"#,
        );
        assert_eq!(r.status, 201, "{ct}: {r:?}");
    }
}

#[test]
fn items_extractor_errors() {
    let server = Server::start();
    let mut c = server.client();
    // Malformed JSON: 400.
    let msg = json_error(&post_json(&mut c, r#"{"name": "x", "qty": "#), 400);
    assert!(msg.contains("invalid JSON"), "{msg}");
    json_error(&post_json(&mut c, "not json"), 400);
    // Well-formed but the wrong types or shape: 422.
    let msg = json_error(&post_json(&mut c, r#"{"name": "x", "qty": "three"}"#), 422);
    assert!(msg.contains("invalid type"), "{msg}");
    let msg = json_error(&post_json(&mut c, r#"{"name": "x"}"#), 422);
    assert!(msg.contains("qty"), "{msg}");
    json_error(&post_json(&mut c, "[1, 2]"), 422);
    // Nesting past the JSON depth limit (64 levels by default) is refused with 400 before
    // deserializing, wherever it is: in an ignored field, or where the type has no room for
    // it. Within the limit, an ignored field is skipped.
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let extra = |n: usize| format!(r#"{{"name": "x", "qty": 1, "extra": {}}}"#, nested(n));
    assert_eq!(post_json(&mut c, &extra(63)).status, 201);
    let msg = json_error(&post_json(&mut c, &extra(100_000)), 400);
    assert!(msg.contains("nested deeper than 64 levels"), "{msg}");
    json_error(&post_json(&mut c, &nested(100_000)), 400);
    // A top-level array where an object belongs is the wrong shape.
    json_error(&post_json(&mut c, &nested(10)), 422);
    // Wrong or missing Content-Type: 415, before the body is read.
    let body = br#"{"name": "x", "qty": 1}"#;
    let r = request(
        &mut c,
        "POST",
        "/api/items",
        &[("Content-Type", "text/plain")],
        body,
    );
    assert!(json_error(&r, 415).contains("application/json"));
    let r = request(&mut c, "POST", "/api/items", &[], body);
    json_error(&r, 415);
    let r = request(
        &mut c,
        "POST",
        "/api/items",
        &[("Content-Type", "application/jsonx")],
        body,
    );
    json_error(&r, 415);
    // Still in sync after all of them.
    assert_eq!(c.get("/plaintext").text(), "Hello, World!");
}

#[test]
fn items_body_over_one_mib_is_413() {
    let server = Server::start();
    let two_mib = format!(r#"{{"name": "{}", "qty": 1}}"#, "x".repeat(2 << 20));
    // Declared length over the limit: refused before the body is read.
    let mut c = server.client();
    c.send(format!(
        "POST /api/items HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        two_mib.len()
    ));
    let r = c.response();
    assert!(json_error(&r, 413).contains("too large"), "{r:?}");
    // Chunked, so the size shows only while reading: 413 once past 1 MiB.
    let mut c = server.client();
    let mut writer = c.stream.try_clone().unwrap();
    let body = two_mib.clone();
    let t = thread::spawn(move || {
        let head = "POST /api/items HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                    Transfer-Encoding: chunked\r\n\r\n";
        let _ = writer.write_all(head.as_bytes());
        for piece in body.as_bytes().chunks(64 * 1024) {
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(piece);
            chunk.extend_from_slice(b"\r\n");
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = writer.write_all(b"0\r\n\r\n");
    });
    let r = c.response();
    json_error(&r, 413);
    drop(c);
    t.join().unwrap();
    // The server is fine.
    assert_eq!(server.client().get("/plaintext").text(), "Hello, World!");
}

#[test]
fn page_is_built_per_request_and_escaped() {
    let server = Server::start();
    let mut c = server.client();
    let r = c.get("/page?name=%3Cscript%3Ealert(1)%3C%2Fscript%3E");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let html = r.text();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        html.contains("Hello, &lt;script&gt;alert(1)&lt;/script&gt;!"),
        "{html}"
    );
    assert!(!html.contains("<script>"), "{html}");
    let r = c.get("/page?name=J%C3%BCrgen+%26+Co");
    assert!(r.text().contains("Hello, Jürgen &amp; Co!"), "{}", r.text());
    let r = c.get("/page");
    assert!(r.text().contains("Hello, stranger!"), "{}", r.text());
}

#[test]
fn bytes_route_keeps_its_old_edges() {
    let server = Server::start();
    let mut c = server.client();
    // `/bytes/{*n}` takes the rest of the path, as sent (not percent-decoded), like the
    // hand-written demo did; an empty or odd `n` is 400, never 404.
    for path in ["/bytes/", "/bytes/1/2", "/bytes/%31", "/bytes/-1"] {
        let r = c.get(path);
        assert_eq!(
            (r.status, r.text()),
            (400, "n must be a non-negative integer\n"),
            "{path}"
        );
    }
    assert_eq!(c.get("/bytes/3").body, b"xxx");
    assert_eq!(c.get("/bytes").status, 404);
}
