//! The built-in demo app served by `canter serve`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use canter_rt::http::{header, HeaderValue, Method, StatusCode};
use canter_rt::{Body, BodyStream, Reply, Request, Response, Service};
use serde::Serialize;

const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain");
const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// Largest body `POST /echo` accepts.
pub const ECHO_LIMIT: usize = 16 * 1024 * 1024;
/// Largest `n` for `GET /bytes/{n}`.
pub const BYTES_LIMIT: u64 = 1 << 30;

const INDEX: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>canter</title></head>
<body>
<h1>canter demo</h1>
<ul>
<li><a href="/plaintext">GET /plaintext</a> — Hello, World!</li>
<li><a href="/json">GET /json</a> — a JSON message, serialized per request</li>
<li>POST /echo — the request body back (up to 16 MiB, Content-Length or chunked)</li>
<li><a href="/bytes/1024">GET /bytes/{n}</a> — n bytes, streamed (up to 1 GiB)</li>
</ul>
</body></html>
"#;

#[derive(Serialize)]
struct Message<'a> {
    message: &'a str,
}

/// The demo application.
#[derive(Debug, Default, Clone, Copy)]
pub struct Demo;

impl Service for Demo {
    fn call(&self, mut req: Request) -> Reply {
        let path = req.path();
        let get = matches!(*req.method(), Method::GET | Method::HEAD);
        match path {
            "/plaintext" if get => plaintext().into(),
            "/json" if get => json().into(),
            "/" if get => Response::html(INDEX).into(),
            "/echo" if *req.method() == Method::POST => Reply::future(async move {
                match req.body_mut().collect(ECHO_LIMIT).await {
                    Ok(body) => Response::new(StatusCode::OK)
                        .with_header(header::CONTENT_TYPE, OCTET_STREAM)
                        .with_body(body),
                    Err(e) => error(
                        StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
                        &e.to_string(),
                    ),
                }
            }),
            _ if get && path.starts_with("/bytes/") => bytes(&path["/bytes/".len()..]).into(),
            "/plaintext" | "/json" | "/" | "/echo" => method_not_allowed(path).into(),
            _ if path.starts_with("/bytes/") => method_not_allowed(path).into(),
            _ => error(StatusCode::NOT_FOUND, "no such endpoint").into(),
        }
    }
}

/// The TechEmpower plaintext response: `text/plain` without a charset, so its bytes match the
/// peers' in the benchmark suite.
fn plaintext() -> Response {
    Response::new(StatusCode::OK)
        .with_header(header::CONTENT_TYPE, TEXT_PLAIN)
        .with_body("Hello, World!")
}

fn json() -> Response {
    match serde_json::to_vec(&Message {
        message: "Hello, World!",
    }) {
        Ok(body) => Response::json_bytes(body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn bytes(n: &str) -> Response {
    match n.parse::<u64>() {
        Ok(n) if n <= BYTES_LIMIT => Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTET_STREAM)
            .with_body(Body::stream(Some(n), Repeat { left: n })),
        Ok(_) => error(StatusCode::BAD_REQUEST, "n is larger than 1 GiB"),
        Err(_) => error(StatusCode::BAD_REQUEST, "n must be a non-negative integer"),
    }
}

fn method_not_allowed(path: &str) -> Response {
    let allow = if path == "/echo" { "POST" } else { "GET, HEAD" };
    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        .with_header(header::ALLOW, HeaderValue::from_static(allow))
}

fn error(status: StatusCode, message: &str) -> Response {
    Response::text(format!("{message}\n")).with_status(status)
}

static FILL: [u8; 64 * 1024] = [b'x'; 64 * 1024];

/// `left` bytes of `x`, handed out in 64 KiB pieces that borrow one static buffer (no copy).
struct Repeat {
    left: u64,
}

impl BodyStream for Repeat {
    fn poll_next(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(FILL.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Bytes::from_static(&FILL[..n]))))
    }
}
