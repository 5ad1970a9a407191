//! Middleware over real sockets: request ids, CORS, timeouts, metrics, `from_fn`, layer order,
//! and the demo's `--access-log` and `--metrics` flags.
#![allow(clippy::unwrap_used)]

mod common;

use std::thread;
use std::time::{Duration, Instant};

use canter::middleware::{from_fn, Cors, Metrics, Next, RequestId, Timeout};
use canter::rt::http::{HeaderName, HeaderValue, Method, StatusCode};
use canter::rt::{Reply, Request};
use canter::{get, post, Extension, Router};
use common::{fetch, fetch_raw, metric, Client, InProcess};

fn tagged(tag: &'static str) -> impl Fn(Request, Next<'_>) -> Reply + 'static {
    move |req, next| {
        next.run(req).map(move |mut res| {
            res.append_header(
                HeaderName::from_static("x-order"),
                HeaderValue::from_static(tag),
            );
            res
        })
    }
}

#[test]
fn request_id_generated_echoed_and_extracted() {
    let server = InProcess::start(|_| {
        Router::new()
            .route(
                "/id",
                get(|Extension(id): Extension<RequestId>| id.as_str().to_owned()),
            )
            .route("/slow", get(|| async { "later" }))
            .layer(RequestId::layer())
    });
    // Generated: 32 hex digits, the same in the header and in the handler, new per request.
    let a = fetch(server.addr, "GET", "/id", "");
    let b = fetch(server.addr, "GET", "/id", "");
    let id_a = a.header("x-request-id").unwrap().to_owned();
    assert_eq!(id_a.len(), 32, "{a:?}");
    assert_eq!(a.text(), id_a);
    assert_ne!(b.header("x-request-id").unwrap(), id_a);
    // A sane client id is kept; a bad one is replaced.
    let c = fetch(server.addr, "GET", "/id", "X-Request-Id: trace-42\r\n");
    assert_eq!(c.header("x-request-id"), Some("trace-42"));
    assert_eq!(c.text(), "trace-42");
    let d = fetch(server.addr, "GET", "/id", "X-Request-Id: a<b\r\n");
    assert_eq!(d.header("x-request-id").unwrap().len(), 32);
    // Async replies get it too.
    let e = fetch(server.addr, "GET", "/slow", "X-Request-Id: async-1\r\n");
    assert_eq!((e.status, e.header("x-request-id")), (200, Some("async-1")));
}

#[test]
fn extension_without_its_layer_is_a_500() {
    let server = InProcess::start(|_| {
        Router::new().route(
            "/id",
            get(|Extension(id): Extension<RequestId>| id.as_str().to_owned()),
        )
    });
    let r = fetch(server.addr, "GET", "/id", "");
    assert_eq!(r.status, 500);
    assert!(r.text().contains("RequestId"), "{r:?}");
}

#[test]
fn layers_run_outermost_last_added() {
    let server = InProcess::start(|_| {
        Router::new()
            .route("/", get(|| "hi"))
            .layer(from_fn(tagged("inner")))
            .layer(from_fn(tagged("outer")))
    });
    let r = fetch(server.addr, "GET", "/", "");
    let order: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("x-order"))
        .map(|(_, v)| v.as_str())
        .collect();
    // The inner layer sees the response first.
    assert_eq!(order, ["inner", "outer"]);
}

#[test]
fn from_fn_can_answer_without_the_router() {
    let server = InProcess::start(|_| {
        Router::new().route("/", get(|| "secret")).layer(from_fn(
            |req: Request, next: Next<'_>| -> Reply {
                if req.header("x-api-key") == Some(&b"k"[..]) {
                    next.run(req)
                } else {
                    canter::rt::Response::new(StatusCode::UNAUTHORIZED).into()
                }
            },
        ))
    });
    assert_eq!(fetch(server.addr, "GET", "/", "").status, 401);
    let ok = fetch(server.addr, "GET", "/", "X-Api-Key: k\r\n");
    assert_eq!((ok.status, ok.text()), (200, "secret"));
}

fn cors_app() -> Router {
    Router::new().route("/data", get(|| "data").post(|| "posted"))
}

#[test]
fn cors_preflight_and_simple_requests() {
    let server = InProcess::start(|_| {
        cors_app().layer(
            Cors::new()
                .allow_origin("https://app.example")
                .allow_methods(&[Method::GET, Method::POST])
                .allow_headers(&["content-type"])
                .expose_headers(&["x-total"])
                .allow_credentials(true)
                .max_age(Duration::from_secs(600)),
        )
    });
    // Preflight from an allowed origin: 204 with the policy, never reaching the router (which
    // has no OPTIONS handler and would say 405).
    let pre = fetch_raw(
        server.addr,
        "OPTIONS /data HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n\
         Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n\r\n",
    );
    assert_eq!(pre.status, 204, "{pre:?}");
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        pre.header("access-control-allow-methods"),
        Some("GET, POST")
    );
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("content-type")
    );
    assert_eq!(pre.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(pre.header("access-control-max-age"), Some("600"));
    assert!(pre.header("vary").unwrap().contains("origin"));
    // Preflight from another origin: no CORS headers.
    let bad = fetch_raw(
        server.addr,
        "OPTIONS /data HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n\
         Access-Control-Request-Method: POST\r\n\r\n",
    );
    assert_eq!(bad.status, 204);
    assert_eq!(bad.header("access-control-allow-origin"), None);
    // Actual request: origin echoed (credentials), exposed headers, Vary: origin.
    let r = fetch(
        server.addr,
        "GET",
        "/data",
        "Origin: https://app.example\r\n",
    );
    assert_eq!((r.status, r.text()), (200, "data"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-expose-headers"), Some("x-total"));
    assert_eq!(r.header("vary"), Some("origin"));
    let r = fetch(
        server.addr,
        "GET",
        "/data",
        "Origin: https://evil.example\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // Not a CORS request: untouched, and OPTIONS still reaches the router (405).
    let r = fetch(server.addr, "GET", "/data", "");
    assert_eq!(
        (r.header("vary"), r.header("access-control-allow-origin")),
        (None, None)
    );
    let r = fetch_raw(server.addr, "OPTIONS /data HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 405);
}

#[test]
fn cors_permissive_uses_a_wildcard_and_mirrors_headers() {
    let server = InProcess::start(|_| cors_app().layer(Cors::permissive()));
    let pre = fetch_raw(
        server.addr,
        "OPTIONS /data HTTP/1.1\r\nHost: x\r\nOrigin: https://any.example\r\n\
         Access-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: x-custom, content-type\r\n\r\n",
    );
    assert_eq!(pre.status, 204);
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("x-custom, content-type")
    );
    let r = fetch(
        server.addr,
        "GET",
        "/data",
        "Origin: https://any.example\r\n",
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("vary"), None);
}

#[test]
fn timeout_answers_503_for_slow_async_handlers_only() {
    let server = InProcess::start(|_| {
        Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "too late"
                }),
            )
            .route(
                "/quick",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    "quick"
                }),
            )
            .route("/sync", get(|| "sync"))
            .layer(Timeout::new(Duration::from_millis(200)))
    });
    let t = Instant::now();
    let r = fetch(server.addr, "GET", "/slow", "");
    let waited = t.elapsed();
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.text().contains("timed out"));
    assert!(
        waited >= Duration::from_millis(190) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(fetch(server.addr, "GET", "/quick", "").text(), "quick");
    assert_eq!(fetch(server.addr, "GET", "/sync", "").text(), "sync");
    // The connection stays usable after a timeout.
    let mut c = Client::connect(server.addr);
    c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /sync HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(c.response().status, 503);
    assert_eq!(c.response().text(), "sync");
}

#[test]
fn metrics_count_requests_statuses_latency_and_bytes() {
    let metrics = Metrics::new();
    let m = metrics.clone();
    let server = InProcess::start(move |_| {
        Router::new()
            .route("/ok", get(|| "12345"))
            .route("/upload", post(|b: bytes::Bytes| format!("{}", b.len())))
            .route("/metrics", get(m.endpoint()))
            .layer(m.layer())
    });
    for _ in 0..5 {
        assert_eq!(fetch(server.addr, "GET", "/ok", "").status, 200);
    }
    for _ in 0..3 {
        assert_eq!(fetch(server.addr, "GET", "/nope", "").status, 404);
    }
    let r = fetch_raw(
        server.addr,
        "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789",
    );
    assert_eq!(r.text(), "10");
    let r = fetch(server.addr, "GET", "/metrics", "");
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text();
    assert_eq!(metric(text, "canter_http_requests_total{code=\"200\"}"), 6);
    assert_eq!(metric(text, "canter_http_requests_total{code=\"404\"}"), 3);
    assert_eq!(
        metric(text, "canter_http_request_duration_seconds_count"),
        9
    );
    assert_eq!(
        metric(
            text,
            "canter_http_request_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        9
    );
    assert_eq!(metric(text, "canter_http_request_body_bytes_total"), 10);
    // 5 × "12345" + 3 × "not found\n" + "10".
    assert_eq!(
        metric(text, "canter_http_response_body_bytes_total"),
        25 + 30 + 2
    );
    // The same numbers from the handle the test kept.
    assert!(metrics
        .render()
        .contains("canter_http_requests_total{code=\"404\"} 3"));
}

#[test]
fn demo_access_log_and_metrics_flags() {
    let server = common::Server::start_with(&["--access-log", "--metrics"]);
    let mut c = server.client();
    let r = c.get("/hello/log");
    assert_eq!(r.status, 200);
    let id = r.header("x-request-id").unwrap().to_owned();
    let m = c.get("/metrics");
    assert_eq!(m.status, 200);
    assert_eq!(metric(m.text(), "canter_open_connections"), 1);
    assert!(metric(m.text(), "canter_connections_accepted_total") >= 1);
    assert_eq!(
        metric(m.text(), "canter_http_requests_total{code=\"200\"}"),
        1
    );
    // The access line for the first request carries its id.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = server.log();
        let line = log
            .lines()
            .find(|l| l.contains("canter::access") && l.contains("target=/hello/log"));
        if let Some(line) = line {
            assert!(line.contains("status=200"), "{line}");
            assert!(line.contains(&format!("request_id={id}")), "{line}");
            assert!(line.contains("bytes=11"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no access line in:\n{log}");
        thread::sleep(Duration::from_millis(20));
    }
    // Without the flags there is no /metrics and no request id.
    let plain = common::Server::start();
    let mut c = plain.client();
    assert_eq!(c.get("/metrics").status, 404);
    assert_eq!(c.get("/hello/x").header("x-request-id"), None);
}
