//! The built-in demo app served by `canter serve`, written on the [`Router`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /plaintext` | `Hello, World!` |
//! | `GET /json` | `{"message":"Hello, World!"}`, serialized per request |
//! | `POST /echo` | the body back (up to 16 MiB) |
//! | `GET /bytes/{n}` | `n` bytes of `x`, streamed (up to 1 GiB) |
//! | `GET /hello/{name}` | `Hello, {name}!` (percent-decoded) |
//! | `POST /api/items` | stores a JSON item `{"name": "...", "qty": 1}`; 201 with its `id` |
//! | `GET /api/items/{id}` | the stored item, or 404 |
//! | `GET /page?name=...` | an HTML page built per request (maud, escaped) |
//! | `GET /ws/echo` | WebSocket: text and binary messages echoed as they came (permessage-deflate when offered) |
//! | `GET /ws/broadcast` | WebSocket: a room, every message to every member, across workers |
//! | `GET /ws` | a live page that talks to `/ws/echo` |
//! | `GET /` | an index page |
//! | `GET /static/{*path}` | files of the `--static` directory ([`app_with_static`], [`ServeDir`]) |
//!
//! Anything else: 404 `no such endpoint`; a known path with another method: 405 with `Allow`.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::{Body, BodyStream, Response};
use maud::{html, Markup, DOCTYPE};
use serde::{Deserialize, Serialize};

use canter::app::{
    get, post, FromParts, Html, IntoResponse, Json, Parts, Path, Query, RawBody, Rejection, Router,
    ServeDir, State,
};
use canter::WebSocketUpgrade;
use canter_rt::ws::Prepared;

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
<li><a href="/ws">GET /ws</a> — a live page on the WebSocket echo at /ws/echo</li>
</ul>
</body></html>
"#;

/// The live page of `/ws`: greets `/ws/echo` (on whichever scheme served the page) once open,
/// then sends what is typed; shows what comes back and the round trip in milliseconds.
const WS_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>canter WebSocket echo</title></head>
<body>
<h1>WebSocket echo</h1>
<p id="state">connecting…</p>
<form id="f"><input id="msg" value="hello" autocomplete="off"> <button>send</button></form>
<ol id="log"></ol>
<script>
const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/echo";
const ws = new WebSocket(url);
const state = document.getElementById("state");
const log = document.getElementById("log");
let sent = [];
ws.onopen = () => {
  state.textContent = "open: " + (ws.extensions || "no extensions");
  sent.push(performance.now());
  ws.send("hello from " + navigator.userAgent.split(" ")[0]);
};
ws.onclose = (e) => { state.textContent = "closed: " + e.code; };
ws.onmessage = (e) => {
  const li = document.createElement("li");
  const ms = (performance.now() - sent.shift()).toFixed(2);
  li.textContent = e.data + " (" + ms + " ms)";
  log.appendChild(li);
};
document.getElementById("f").onsubmit = (e) => {
  e.preventDefault();
  sent.push(performance.now());
  ws.send(document.getElementById("msg").value);
};
</script>
</body></html>
"#;

/// `/ws/echo`: every text and binary message back as it came, until the client closes.
async fn ws_echo(State(store): State<Arc<Store>>, ws: WebSocketUpgrade) -> Response {
    ws.config(store.ws.clone()).on_upgrade(|socket| async move {
        while let Some(Ok(msg)) = socket.recv().await {
            if matches!(msg, canter_rt::ws::Message::Close(_)) || socket.send(msg).await.is_err() {
                break;
            }
        }
    })
}

/// `/ws/broadcast`: a room; every message any member sends goes to every member (itself
/// included), encoded once, across workers. A member whose output is full misses messages
/// rather than holding the room back.
async fn ws_broadcast(State(store): State<Arc<Store>>, ws: WebSocketUpgrade) -> Response {
    let room = store.room.clone();
    ws.config(store.ws.clone())
        .on_upgrade(move |socket| async move {
            let (tx, rx) = socket.split();
            room.subscribe(tx);
            while let Some(Ok(msg)) = rx.recv().await {
                match msg {
                    canter_rt::ws::Message::Text(t) => room.publish(&Prepared::text(&t)),
                    canter_rt::ws::Message::Binary(b) => room.publish(&Prepared::binary(b)),
                    _ => break,
                }
            }
        })
}

/// The demo router over `store` (shared by every worker that gets a clone of it): what
/// `canter serve` runs, built per worker in the service factory.
pub fn app(store: Arc<Store>) -> Router {
    let api = Router::new()
        .route("/items", post(create_item))
        .route("/items/{id}", get(get_item));
    Router::new()
        .route("/", get(|| Html(INDEX)))
        .route("/plaintext", get(plaintext))
        .route("/json", get(json))
        .route("/echo", post(echo))
        .route("/bytes/", get(bad_n))
        .route("/bytes/{*n}", get(bytes))
        .route("/hello/{name}", get(hello))
        .route("/page", get(page))
        .route("/tls/client-cert", get(client_cert))
        .route("/ws/echo", get(ws_echo))
        .route("/ws/broadcast", get(ws_broadcast))
        .route("/ws", get(|| Html(WS_PAGE)))
        .nest("/api", api)
        .fallback(|| error(StatusCode::NOT_FOUND, "no such endpoint"))
        .with_state(store)
}

/// The demo router plus the files of `files` under `/static/` (`/static` redirects there); what
/// `canter serve --static DIR` runs.
pub fn app_with_static(store: Arc<Store>, files: ServeDir) -> Router {
    app(store).serve_dir("/static", files)
}

/// The TechEmpower plaintext response: `text/plain` without a charset, so its bytes match the
/// peers' in the benchmark suite.
pub fn plaintext() -> Response {
    Response::new(StatusCode::OK)
        .with_header(header::CONTENT_TYPE, TEXT_PLAIN)
        .with_body("Hello, World!")
}

#[derive(Serialize)]
pub struct Message {
    message: &'static str,
}

pub fn json() -> Json<Message> {
    Json(Message {
        message: "Hello, World!",
    })
}

async fn echo(RawBody(mut body): RawBody) -> Response {
    match body.collect(ECHO_LIMIT).await {
        Ok(body) => Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTET_STREAM)
            .with_body(body),
        Err(e) => error(
            StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
            &e.to_string(),
        ),
    }
}

/// The `n` of `/bytes/{n}` exactly as sent (not percent-decoded), as the demo always took it.
struct RawN(String);

impl FromParts for RawN {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        Ok(RawN(parts.param("n").unwrap_or_default().to_owned()))
    }
}

fn bytes(RawN(n): RawN) -> Response {
    match n.parse::<u64>() {
        Ok(n) if n <= BYTES_LIMIT => Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTET_STREAM)
            .with_body(Body::stream(Some(n), Repeat { left: n })),
        Ok(_) => error(StatusCode::BAD_REQUEST, "n is larger than 1 GiB"),
        Err(_) => bad_n(),
    }
}

fn bad_n() -> Response {
    error(StatusCode::BAD_REQUEST, "n must be a non-negative integer")
}

fn hello(Path(name): Path<String>) -> String {
    format!("Hello, {name}!")
}

#[derive(Deserialize)]
struct PageQuery {
    name: Option<String>,
}

fn page(Query(q): Query<PageQuery>) -> Markup {
    let name = q.name.as_deref().unwrap_or("stranger");
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "canter page" } }
            body {
                h1 { "Hello, " (name) "!" }
                p { "This page was built for this request." }
            }
        }
    }
}

/// The items of `POST /api/items`, shared by all workers.
#[derive(Debug, Default)]
pub struct Store {
    next_id: AtomicU64,
    items: RwLock<HashMap<u64, Item>>,
    /// The `/ws/broadcast` room, shared by every worker.
    room: canter_rt::WsHub,
    /// The settings of the WebSocket routes (`canter serve --ws-*`).
    ws: canter_rt::ws::WsConfig,
}

impl Store {
    /// An empty store whose WebSocket routes run with `ws`.
    pub fn new(ws: canter_rt::ws::WsConfig) -> Store {
        Store {
            ws,
            ..Store::default()
        }
    }
}

/// An item as posted.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NewItem {
    name: String,
    qty: i64,
}

/// A stored item.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    id: u64,
    name: String,
    qty: i64,
}

fn create_item(State(store): State<Arc<Store>>, Json(new): Json<NewItem>) -> impl IntoResponse {
    let id = store.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let item = Item {
        id,
        name: new.name,
        qty: new.qty,
    };
    let location = HeaderValue::from_str(&format!("/api/items/{id}"))
        .unwrap_or(HeaderValue::from_static("/api/items"));
    match store.items.write() {
        Ok(mut items) => {
            items.insert(id, item.clone());
        }
        Err(_) => {
            return Err(Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store poisoned",
            ))
        }
    }
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(item),
    ))
}

fn get_item(State(store): State<Arc<Store>>, Path(id): Path<u64>) -> Result<Json<Item>, Rejection> {
    let items = store
        .items
        .read()
        .map_err(|_| Rejection::new(StatusCode::INTERNAL_SERVER_ERROR, "store poisoned"))?;
    match items.get(&id) {
        Some(item) => Ok(Json(item.clone())),
        None => Err(Rejection::new(
            StatusCode::NOT_FOUND,
            format!("no item with id {id}"),
        )),
    }
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

/// `GET /tls/client-cert`: the SHA-256 fingerprint of the client's verified certificate (TLS with
/// `--tls-client-ca`), or 404 when the connection has none.
fn client_cert(cert: Option<canter::Extension<canter_rt::PeerCertificates>>) -> Response {
    match cert.and_then(|canter::Extension(c)| c.leaf_sha256()) {
        Some(fingerprint) => Response::text(format!("{fingerprint}\n")),
        None => error(StatusCode::NOT_FOUND, "no client certificate"),
    }
}
