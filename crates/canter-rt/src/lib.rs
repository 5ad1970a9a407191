//! The canter runtime: thread-per-core event loops where each connection is one task that owns
//! its socket and its sans-IO protocol state, and runs the user's [`Service`] inline.
//!
//! - **Thread-per-core.** [`Server::serve`] starts [`Config::workers`] threads, each with its own
//!   SO_REUSEPORT listener and single-threaded event loop; nothing on the request path crosses
//!   threads.
//! - **The connection is the actor.** One task per connection reads, parses, calls the service,
//!   encodes and writes. No task or channel sits between the socket and the handler.
//! - **Backpressure, not buffering.** Output above [`Config::high_water`] stops parsing and
//!   reading until the peer drains; request bodies are pulled by the handler; response bodies
//!   are pulled from their stream only while the socket keeps up.
//! - **Bounded everything.** Head, body, idle and write timeouts; a read budget per turn;
//!   buffers returned to a per-worker pool while connections are idle.
//!
//! ```no_run
//! use canter_rt::{Config, Reply, Request, Response, Server};
//!
//! let server = Server::bind(Config::default()).unwrap();
//! server
//!     .serve(|_worker| |req: Request| -> Reply { Response::text("Hello, World!").into() })
//!     .unwrap();
//! ```

// The runtime is Linux's: say so at build time, not with a missing symbol.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "canter-rt runs on Linux only: it uses accept4, sendfile, TCP_DEFER_ACCEPT, MSG_MORE, \
     SO_REUSEPORT's balancing across listeners and SIOCOUTQ"
);

mod core;
mod httpd;
pub mod proto;
#[cfg(feature = "http3")]
mod quic;
#[cfg(feature = "ws")]
pub mod ws;

#[cfg(feature = "tls")]
pub use crate::core::config::TlsListener;
pub use crate::core::config::{Config, ConfigBuilder, ParkHooks, MAX_SERVER_NAME};
pub use crate::core::log_bridge::{log_lines_dropped, route_log_records, LogStderr};
#[cfg(feature = "tls")]
pub use crate::core::outbound::connect_tls;
pub use crate::core::outbound::{connect, connect_tcp};
pub use crate::core::proxy;
pub use crate::core::server::{
    listen, map_large_blocks, on_signals, pin_to_cpu, run_here, shutdown_on_signals, spawn_worker,
    Server, ServerWorker, ShutdownHandle,
};
pub use crate::core::stats::{ClientFault, Stats};
#[cfg(feature = "tls")]
pub use crate::core::tls::{reload_on_sighup, ClientTls, ServerTls, TlsAcceptor, TlsError};
#[cfg(feature = "tls")]
pub use crate::core::transport::{PeerCertificates, TlsStream};
pub use crate::core::transport::{Stream, Transport};
pub use crate::httpd::body::{Body, BodyError, BodyStream, RequestBody, PIPE_CAPACITY};
pub use crate::httpd::serve::serve_connection;
pub use crate::httpd::service::{ConnectProtocol, Reply, Request, Response, Service};
pub use crate::proto::framing;
#[cfg(feature = "ws")]
pub use crate::ws::hub::Hub as WsHub;
#[cfg(feature = "ws")]
pub use crate::ws::upgrade::{WsRefused, WsUpgrade};
/// The request head every protocol hands to a [`Service`]: HTTP/1.1 parses it, HTTP/2 builds
/// one from its header block; [`Request::head`] gives it.
pub use canter_http::{BodyKind, RequestHead, Version};
pub use canter_http::{ConfigError, Limits, LimitsBuilder, Timeouts, TimeoutsBuilder};

pub use bytes;
pub use http;

thread_local! {
    static PEER: std::cell::Cell<Option<(std::net::SocketAddr, bool)>> = const { std::cell::Cell::new(None) };
}

/// The client's address for the request being handled on this thread: the connection's peer,
/// or the client a load balancer named in its PROXY protocol header
/// ([`Config::proxy_protocol`]). Call it from a handler or middleware, or from a future they
/// return while it is polled; `None` outside the runtime's workers.
///
/// It is kept per worker thread, set as the connection's task turns to its requests, not
/// carried in every [`Request`]: a larger request is copied at a cost on every exchange, and
/// few handlers ask.
#[inline]
pub fn peer_addr() -> Option<std::net::SocketAddr> {
    PEER.with(std::cell::Cell::get).map(|(a, _)| a)
}

/// Whether the request being handled on this thread came over TLS (for a handler that must
/// tell `https` from `http`, as an ASGI server's scope does). Kept and called as
/// [`peer_addr`] is; `false` outside the runtime's workers.
#[inline]
pub fn peer_is_tls() -> bool {
    PEER.with(std::cell::Cell::get).is_some_and(|(_, tls)| tls)
}

/// Makes `peer` (and whether its connection is encrypted) the answer of [`peer_addr`] and
/// [`peer_is_tls`] on this thread.
#[inline]
pub(crate) fn set_peer(peer: std::net::SocketAddr, tls: bool) {
    PEER.with(|p| p.set(Some((peer, tls))));
}

/// Runs blocking work on the runtime's blocking pool and awaits its result, keeping the worker's
/// event loop free.
pub async fn spawn_blocking<T, F>(f: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)
}

/// Raises this process's soft limit on open files to its hard limit (as Go's runtime does at
/// start), so a server is not capped at the usual 1,024 connections; returns the new limit.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, exclusively borrowed rlimit that getrlimit fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit that setrlimit only reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}
