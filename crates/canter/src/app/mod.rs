//! The application layer: a [`Router`] of handlers with typed extractors and responders.
//!
//! Handlers are plain functions. Their arguments are extractors ([`Path`], [`Query`],
//! [`State`], [`Headers`], [`Json`], [`Form`], `Bytes`, `String`, [`RawBody`]) and their result
//! is anything that implements [`IntoResponse`]. A synchronous handler that does not read the
//! body is answered without a future or an allocation; `async fn` handlers and handlers that
//! read the body run as a future on the connection's task.
//!
//! ```no_run
//! use canter::rt::http::StatusCode;
//! use canter::rt::{Config, Server};
//! use canter::{get, post, Json, Path, Router};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize, Serialize)]
//! struct Item {
//!     name: String,
//!     qty: u32,
//! }
//!
//! fn hello(Path(name): Path<String>) -> String {
//!     format!("Hello, {name}!")
//! }
//!
//! async fn create(Json(item): Json<Item>) -> (StatusCode, Json<Item>) {
//!     (StatusCode::CREATED, Json(item))
//! }
//!
//! fn app() -> Router {
//!     Router::new()
//!         .route("/hello/{name}", get(hello))
//!         .route("/items", post(create))
//! }
//!
//! Server::bind(Config::default()).unwrap().serve(|_worker| app()).unwrap();
//! ```

mod cookies;
mod extract;
mod handler;
#[cfg(feature = "multipart")]
mod multipart;
mod ndjson;
mod path_de;
mod response;
mod router;
#[cfg(feature = "compression")]
mod static_compress;
mod static_files;
mod stream;
#[cfg(feature = "ws")]
mod websocket;

pub use cookies::Cookies;
pub use extract::{
    ClientAddr, Extension, Form, FromBody, FromParts, Headers, Json, Parts, Path, Query, RawBody,
    Rejection, State, DEFAULT_BODY_LIMIT, DEFAULT_JSON_DEPTH_LIMIT,
};
pub use handler::Handler;
#[doc(hidden)]
pub use handler::{Later, Now, ViaBody, ViaParts};
#[cfg(feature = "multipart")]
pub use multipart::{Field, Multipart, DEFAULT_MAX_FIELDS, PART_HEAD_LIMIT};
pub use ndjson::{JsonLines, NdJson, DEFAULT_LINE_LIMIT};
pub use response::{Html, IntoResponse, Redirect};
pub use router::{
    any, delete, get, head, options, patch, post, put, MethodRouter, RouteLimits, Router,
};
#[cfg(feature = "compression")]
pub use static_compress::StaticCompression;
pub use static_files::{content_hashed, ServeDir};
pub use stream::{IntoChunk, StreamBody};
#[cfg(feature = "ws")]
pub use websocket::WebSocketUpgrade;

#[cfg(test)]
mod tests;
