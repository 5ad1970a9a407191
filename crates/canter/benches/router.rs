//! The cost of the application layer: routing and dispatch through a [`Router`] with 100 routes
//! against calling a bare handler, and a `Json` response against serializing by hand.
//!
//! Requests are parsed heads (built once with `canter_h1::Conn`, cloned per iteration on both
//! sides) given to `Router::dispatch_head`, which wraps them in a body-less `Request` and takes
//! the same path as `Service::call`.
//!
//! ```sh
//! cargo bench -p canter --bench router
//! ```

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

use bytes::BytesMut;
use canter::rt::http::{Method, StatusCode};
use canter::rt::{Reply, Response};
use canter::{get, post, Json, Path, Router};
use canter_h1::Conn;
use canter_http::RequestHead;
use canter_http::{Limits, Timeouts};
use criterion::{criterion_group, Criterion};
use serde::Serialize;

fn head(target: &str) -> RequestHead {
    let mut conn = Conn::new(Limits::default(), Timeouts::default(), Instant::now());
    let raw = format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
    );
    let mut buf = BytesMut::from(raw.as_str());
    conn.poll_request(&mut buf, Instant::now())
        .unwrap()
        .unwrap()
}

fn plaintext() -> Response {
    Response::text("Hello, World!")
}

fn user(Path(id): Path<u64>) -> String {
    format!("user {id}")
}

#[derive(Serialize)]
struct Message {
    message: &'static str,
}

/// 100 routes in the shape of a real API: static paths, one- and two-parameter paths, a
/// wildcard; the benchmarked ones sit among them.
fn router() -> Router {
    let mut r = Router::new();
    for i in 0..24 {
        r = r
            .route(
                &format!("/api/v1/resource{i}"),
                get(plaintext).post(plaintext),
            )
            .route(&format!("/api/v1/resource{i}/{{id}}"), get(plaintext))
            .route(
                &format!("/api/v1/resource{i}/{{id}}/children/{{child}}"),
                get(plaintext),
            )
            .route(&format!("/static{i}/{{*path}}"), get(plaintext));
    }
    r.route("/plaintext", get(plaintext))
        .route("/users/{id}", get(user))
        .route(
            "/json",
            get(|| {
                Json(Message {
                    message: "Hello, World!",
                })
            }),
        )
        .route("/items", post(plaintext))
}

fn ready(reply: Reply) -> Response {
    match reply {
        Reply::Ready(r) => r,
        Reply::Pending(_) => panic!("not the sync path"),
    }
}

/// The benchmarked cases, by name: each runs one request and returns its response.
struct Cases {
    app: Router,
    plain: RequestHead,
    users: RequestHead,
    json: RequestHead,
    nope: RequestHead,
}

impl Cases {
    fn new() -> Cases {
        Cases {
            app: router(),
            plain: head("/plaintext"),
            users: head("/users/12345"),
            json: head("/json"),
            nope: head("/api/v1/nope/x"),
        }
    }

    const NAMES: [&'static str; 8] = [
        "bare",
        "static",
        "bare-path",
        "path",
        "405",
        "404",
        "bare-json",
        "json",
    ];

    #[inline(never)]
    fn run(&self, case: &str) -> Response {
        let app = &self.app;
        match case {
            "bare" => {
                let h = black_box(self.plain.clone());
                black_box(h.path());
                plaintext()
            }
            "static" => ready(app.dispatch_head(Method::GET, black_box(self.plain.clone()))),
            "bare-path" => {
                let h = black_box(self.users.clone());
                let id: u64 = h.path()["/users/".len()..].parse().unwrap();
                Response::text(format!("user {id}"))
            }
            "path" => ready(app.dispatch_head(Method::GET, black_box(self.users.clone()))),
            "405" => ready(app.dispatch_head(Method::DELETE, black_box(self.plain.clone()))),
            "404" => ready(app.dispatch_head(Method::GET, black_box(self.nope.clone()))),
            "bare-json" => {
                let h = black_box(self.json.clone());
                black_box(h.path());
                let body = serde_json::to_vec(&Message {
                    message: "Hello, World!",
                })
                .unwrap();
                Response::json_bytes(body).with_status(StatusCode::OK)
            }
            "json" => ready(app.dispatch_head(Method::GET, black_box(self.json.clone()))),
            _ => panic!("unknown case {case}"),
        }
    }
}

fn bench(c: &mut Criterion) {
    let cases = Cases::new();
    let mut g = c.benchmark_group("dispatch");
    for (name, case) in [
        ("bare handler", "bare"),
        ("router, 100 routes, static path", "static"),
        ("bare handler, parse id by hand", "bare-path"),
        ("router, 100 routes, Path<u64>", "path"),
        ("router, 100 routes, 405", "405"),
        ("router, 100 routes, 404", "404"),
    ] {
        g.bench_function(name, |b| b.iter(|| black_box(cases.run(black_box(case)))));
    }
    g.finish();

    let mut g = c.benchmark_group("json response");
    for (name, case) in [
        ("serde_json::to_vec + Response::json_bytes", "bare-json"),
        ("router, Json<T> responder", "json"),
    ] {
        g.bench_function(name, |b| b.iter(|| black_box(cases.run(black_box(case)))));
    }
    g.finish();

    let mut g = c.benchmark_group("matchit");
    let mut m = matchit::Router::new();
    for i in 0..24 {
        m.insert(format!("/api/v1/resource{i}"), 0).unwrap();
        m.insert(format!("/api/v1/resource{i}/{{id}}"), 0).unwrap();
        m.insert(format!("/api/v1/resource{i}/{{id}}/children/{{child}}"), 0)
            .unwrap();
        m.insert(format!("/static{i}/{{*path}}"), 0).unwrap();
    }
    m.insert("/plaintext", 1).unwrap();
    m.insert("/users/{id}", 2).unwrap();
    g.bench_function("lookup /users/{id}", |b| {
        b.iter(|| black_box(m.at(black_box("/users/12345")).map(|x| *x.value)))
    });
    g.finish();
}

criterion_group!(benches, bench);

/// `CANTER_ROUTER_COST=<case>:<n>` runs one case `n` times and exits, for counting instructions
/// under callgrind (run it with n and 2n; the difference divided by n is the cost of one
/// request): `valgrind --tool=callgrind target/release/deps/router-* --bench`. Cases:
/// `bare static bare-path path 405 404 bare-json json`.
fn main() {
    if let Ok(spec) = std::env::var("CANTER_ROUTER_COST") {
        let (case, n) = spec.split_once(':').unwrap_or((&spec, "1000"));
        assert!(Cases::NAMES.contains(&case), "cases: {:?}", Cases::NAMES);
        let cases = Cases::new();
        for _ in 0..n.parse::<u64>().unwrap() {
            black_box(cases.run(black_box(case)));
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
