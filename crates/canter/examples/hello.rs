//! The smallest canter app: a router with a path parameter, a query and an HTML page.
//!
//! ```sh
//! cargo run --release -p canter --example hello
//! curl http://127.0.0.1:8080/hello/world
//! curl 'http://127.0.0.1:8080/greet?name=<you>'
//! ```

use canter::maud::{html, Markup, DOCTYPE};
use canter::rt::{Config, Server};
use canter::{get, Path, Query, Router};
use serde::Deserialize;

/// A synchronous handler: answered without a future or an allocation beyond its own.
fn hello(Path(name): Path<String>) -> String {
    format!("Hello, {name}!\n")
}

#[derive(Deserialize)]
struct Greet {
    name: Option<String>,
}

/// HTML built per request; maud escapes `name`.
fn greet(Query(q): Query<Greet>) -> Markup {
    html! {
        (DOCTYPE)
        html { body { h1 { "Hello, " (q.name.as_deref().unwrap_or("world")) "!" } } }
    }
}

/// One router per worker thread.
fn app() -> Router {
    Router::new()
        .route("/", get(|| "try /hello/{name} or /greet?name=...\n"))
        .route("/hello/{name}", get(hello))
        .route("/greet", get(greet))
}

fn main() -> std::io::Result<()> {
    let server = Server::bind(Config::default())?;
    canter::rt::shutdown_on_signals(server.shutdown_handle())?;
    println!("listening on http://{}/", server.local_addr());
    server.serve(|_worker| app())
}
