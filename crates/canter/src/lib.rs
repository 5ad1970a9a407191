//! canter: a fast, strict HTTP server toolkit on a thread-per-core connection-actor runtime.
//!
//! The runtime ([`canter_rt`]) owns sockets, event loops, timers and the protocol engines (pure
//! state machines, reached only through it); this crate holds the application layer: it sees
//! requests as the runtime hands them over, whichever protocol carried them. The `canter`
//! command is the `canter-cli` package.
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

// The database client's socket options (SO_RCVLOWAT) and static files' `openat2` are Linux's.
#[cfg(not(target_os = "linux"))]
compile_error!("canter runs on Linux only, as canter-rt does");

pub mod app;
#[cfg(feature = "db")]
pub mod db;
pub mod middleware;
mod negotiate;

#[cfg(feature = "multipart")]
pub use app::Multipart;
#[cfg(feature = "compression")]
pub use app::StaticCompression;
#[cfg(feature = "ws")]
pub use app::WebSocketUpgrade;
pub use app::{
    any, delete, get, head, options, patch, post, put, ClientAddr, Extension, Form, FromBody,
    FromParts, Handler, Headers, Html, IntoResponse, Json, MethodRouter, Parts, Path, Query,
    RawBody, Redirect, Rejection, RouteLimits, Router, State,
};
pub use app::{content_hashed, ServeDir};
pub use app::{Cookies, IntoChunk, JsonLines, NdJson, StreamBody};
pub use cookie;
pub use maud;

pub use canter_rt as rt;

/// The README's examples are compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod manifest_tests {
    /// The library builds without the command line's dependencies: those belong to
    /// `canter-cli`, so a program that serves with canter does not compile them.
    #[test]
    fn the_library_leaves_the_command_line_out() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .expect("a [dependencies] table");
        for cli_only in [
            "clap",
            "hdrhistogram",
            "tracing-subscriber",
            "canter-load",
            "canter-stream",
        ] {
            assert!(
                !deps.lines().any(|l| l.starts_with(cli_only)),
                "{cli_only} is a dependency of the library"
            );
        }
        assert!(!manifest.contains("[[bin]]"), "the library has a binary");
    }
}
