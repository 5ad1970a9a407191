//! One log line per request through `tracing`.

use std::time::Instant;

use canter_rt::{Reply, Request};
use tracing::Level;

use super::request_id::{RequestId, REQUEST_ID};
use super::{Middleware, Next};

/// Logs each request at INFO under target `canter::access`: the client's address (the PROXY
/// protocol's when a load balancer sent one), method, target, status, body bytes
/// (`-` when streamed without a known length), microseconds until the response head was ready,
/// and the request id when a [`RequestId`](super::RequestId) layer set one. When that target is
/// disabled (`RUST_LOG=canter::access=off`) the layer costs one level check.
///
/// ```no_run
/// use canter::middleware::AccessLog;
/// use canter::rt::{Config, Server};
/// use canter::{get, Router};
///
/// tracing_subscriber::fmt().init();
/// Server::bind(Config::default())
///     .unwrap()
///     .serve(|_| Router::new().route("/", get(|| "hi\n")).layer(AccessLog::new()))
///     .unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLog {
    _private: (),
}

impl AccessLog {
    /// The access-log layer.
    pub fn new() -> AccessLog {
        AccessLog::default()
    }
}

impl Middleware for AccessLog {
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        if !tracing::enabled!(target: "canter::access", Level::INFO) {
            return next.run(req);
        }
        let start = Instant::now();
        let peer = canter_rt::peer_addr();
        let method = req.method().clone();
        let target: Box<str> = req.head().target().into();
        // Set by an outer RequestId layer, or (inner layer) found on the response.
        let id = req.extensions().get::<RequestId>().cloned();
        next.run(req).map(move |res| {
            let micros = start.elapsed().as_micros() as u64;
            let id = match &id {
                Some(id) => id.as_str(),
                None => res
                    .header(&REQUEST_ID)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-"),
            };
            let bytes = res
                .body()
                .exact_len()
                .map_or_else(|| "-".to_owned(), |n| n.to_string());
            tracing::info!(
                target: "canter::access",
                peer = %peer.map_or_else(|| "-".to_owned(), |p| p.to_string()),
                method = %method,
                target = %target,
                status = res.status().as_u16(),
                bytes = %bytes,
                micros,
                request_id = %id,
            );
            res
        })
    }
}
