//! canter: a fast, strict HTTP server toolkit on a thread-per-core connection-actor runtime.
//!
//! The runtime ([`canter_rt`]) owns sockets, event loops and timers; the protocol engine
//! ([`canter_h1`]) is a pure state machine; this crate holds the application layer and the
//! `canter` command (`canter serve`, `canter load`).
//!
//! ```no_run
//! use canter::rt::{Config, Reply, Request, Response, Server};
//!
//! fn hello(_req: Request) -> Reply {
//!     Response::text("Hello, World!").into()
//! }
//!
//! Server::bind(Config::default()).unwrap().serve(|_worker| hello).unwrap();
//! ```

pub mod app;
pub mod db;
pub mod demo;
pub mod middleware;
mod negotiate;
pub mod techempower;

pub use app::{
    any, delete, get, head, options, patch, post, put, ClientAddr, Extension, Form, FromBody,
    FromParts, Handler, Headers, Html, IntoResponse, Json, MethodRouter, Parts, Path, Query,
    RawBody, Redirect, Rejection, RouteLimits, Router, State,
};
pub use app::{content_hashed, ServeDir, StaticCompression};
pub use app::{Cookies, IntoChunk, JsonLines, Multipart, NdJson, StreamBody};
pub use cookie;
pub use maud;

pub use canter_h1 as h1;
pub use canter_rt as rt;

/// The README's examples are compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
