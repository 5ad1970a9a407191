//! The server side of the application-layer overhead benchmark (`bench/overhead.py`): the same
//! three endpoints, `/plaintext`, `/json` and a path with a numeric id
//! (`/api/v1/resource7/{id}`), served three ways.
//!
//! - `bare`: a plain [`Service`] function that matches the path by hand, parses the id and
//!   serializes the JSON message itself: the least any app on this runtime can do.
//! - `router`: a [`Router`] with 100 other routes (static, parameterized, nested and wildcard)
//!   plus the two endpoints, written as ordinary handlers (`&'static str` and `Json<T>`).
//! - `layered`: `router` wrapped in three layers that are configured off (`Option::None`), as
//!   `canter serve` does when its `--access-log`/`--metrics` flags are absent.
//!
//! ```sh
//! cargo run --release -p canter --example app_overhead -- router 127.0.0.1:8080
//! ```

use canter::middleware::{AccessLog, Metrics, RequestId};
use canter::rt::http::StatusCode;
use canter::rt::{Config, Reply, Request, Response, Server, Service};
use canter::{get, post, Json, Path, Router};
use serde::Serialize;

#[derive(Serialize)]
struct Message {
    message: &'static str,
}

fn bare(req: Request) -> Reply {
    let res = match req.path() {
        "/plaintext" => Response::text("Hello, World!"),
        "/json" => match serde_json::to_vec(&Message {
            message: "Hello, World!",
        }) {
            Ok(v) => Response::json_bytes(v),
            Err(_) => Response::new(StatusCode::INTERNAL_SERVER_ERROR),
        },
        path => match path
            .strip_prefix("/api/v1/resource7/")
            .and_then(|id| id.parse::<u64>().ok())
        {
            Some(id) => Response::text(id.to_string()),
            None => Response::text("not found\n").with_status(StatusCode::NOT_FOUND),
        },
    };
    Reply::Ready(res)
}

fn plaintext() -> &'static str {
    "Hello, World!"
}

fn json() -> Json<Message> {
    Json(Message {
        message: "Hello, World!",
    })
}

fn show(Path(id): Path<u64>) -> String {
    id.to_string()
}

/// 100 routes besides the two measured ones.
fn router() -> Router {
    let mut users = Router::new();
    for i in 0..10 {
        users = users
            .route(&format!("/group{i}"), get(|| "group"))
            .route(&format!("/group{i}/{{id}}"), get(show).post(|| "created"));
    }
    let mut app = Router::new().nest("/users", users);
    for i in 0..25 {
        app = app
            .route(
                &format!("/api/v1/resource{i}"),
                get(|| "list").post(|| "created"),
            )
            .route(&format!("/api/v1/resource{i}/{{id}}"), get(show));
    }
    for i in 0..25 {
        app = app.route(&format!("/pages/section{i}/{{*rest}}"), get(|| "page"));
    }
    app.route("/plaintext", get(plaintext))
        .route("/json", get(json))
        .route("/upload", post(|body: bytes::Bytes| body.len().to_string()))
}

fn serve<S: Service>(addr: std::net::SocketAddr, app: fn() -> S) {
    let config = Config::builder().addr(addr).workers(1).build();
    let server = match config.map_err(std::io::Error::from).and_then(Server::bind) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = canter::rt::shutdown_on_signals(server.shutdown_handle()) {
        eprintln!("cannot install signal handlers: {e}");
    }
    println!("listening on http://{}/", server.local_addr());
    if let Err(e) = server.serve(move |_| app()) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "router".into());
    let addr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:8080".into())
        .parse()
        .unwrap_or_else(|e| {
            eprintln!("bad address: {e}");
            std::process::exit(2);
        });
    match mode.as_str() {
        "bare" => serve(addr, || bare),
        "router" => serve(addr, router),
        "layered" => serve(addr, || {
            // Decided at run time, as a command-line flag would be.
            let off = std::hint::black_box(false);
            router()
                .layer(off.then(|| Metrics::new().layer()))
                .layer(off.then(AccessLog::new))
                .layer(off.then(RequestId::layer))
        }),
        other => {
            eprintln!("unknown mode {other:?}: bare, router or layered");
            std::process::exit(2);
        }
    }
}
