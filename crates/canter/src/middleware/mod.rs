//! Middleware: layers that run around a [`Service`] (usually a [`Router`](crate::Router)),
//! before the request reaches it and after its response is ready.
//!
//! A layer is a [`Middleware`]: it gets the request and a [`Next`] to pass it on, and returns
//! the reply. "After" work goes through [`Reply::map`], which costs nothing for a synchronous
//! reply and wraps the future of an asynchronous one. Layers are plain values composed at
//! compile time ([`Layered`]): a router without layers runs exactly as before, and each layer
//! costs one call plus what it does.
//!
//! `router.layer(a).layer(b)` runs `b` first (outermost), then `a`, then the router.
//!
//! Layers included: [`RequestId`], [`AccessLog`], [`Cors`], [`Timeout`], [`Compression`],
//! [`Metrics`] (with a Prometheus endpoint); write your own with [`from_fn`] or by implementing
//! [`Middleware`].
//!
//! ```no_run
//! use std::time::Duration;
//! use canter::middleware::{AccessLog, Cors, RequestId, Timeout};
//! use canter::rt::{Config, Server};
//! use canter::{get, Router};
//!
//! Server::bind(Config::default())
//!     .unwrap()
//!     .serve(|_worker| {
//!         Router::new()
//!             .route("/", get(|| "hi\n"))
//!             .layer(Timeout::new(Duration::from_secs(5)))
//!             .layer(Cors::permissive())
//!             .layer(AccessLog::new())
//!             .layer(RequestId::layer())
//!     })
//!     .unwrap();
//! ```

mod access_log;
mod coding;
#[cfg(feature = "compression")]
mod compression;
mod cors;
mod metrics;
mod request_id;
mod timeout;

pub use access_log::AccessLog;
pub use coding::Coding;
#[cfg(feature = "compression")]
pub use compression::Compression;
pub use cors::Cors;
pub use metrics::{Metrics, MetricsLayer};
pub use request_id::{RequestId, RequestIdLayer, REQUEST_ID};
pub use timeout::Timeout;

use canter_rt::{Reply, Request, Service};

/// A layer around a service.
///
/// ```
/// use canter::middleware::{Middleware, Next};
/// use canter::rt::http::{HeaderName, HeaderValue};
/// use canter::rt::{Reply, Request};
///
/// /// Adds `x-powered-by: canter` to every response.
/// struct PoweredBy;
///
/// impl Middleware for PoweredBy {
///     fn call(&self, req: Request, next: Next<'_>) -> Reply {
///         next.run(req).map(|mut res| {
///             res.set_header(
///                 HeaderName::from_static("x-powered-by"),
///                 HeaderValue::from_static("canter"),
///             );
///             res
///         })
///     }
/// }
/// let app = canter::Router::new().layer(PoweredBy);
/// # let _ = app;
/// ```
pub trait Middleware: 'static {
    /// Handles `req`: answer it directly, or pass it on with `next.run(req)` and adjust the
    /// reply.
    fn call(&self, req: Request, next: Next<'_>) -> Reply;
}

/// An optional layer: `None` passes every request straight through, so a layer chosen at
/// start-up (a command-line flag) keeps one service type.
///
/// ```
/// use canter::middleware::AccessLog;
///
/// let log_requests = std::env::var_os("ACCESS_LOG").is_some();
/// let app = canter::Router::new().layer(log_requests.then(AccessLog::new));
/// # let _ = app;
/// ```
impl<M: Middleware> Middleware for Option<M> {
    #[inline]
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        match self {
            Some(m) => m.call(req, next),
            None => next.run(req),
        }
    }
}

/// The rest of the chain, handed to a [`Middleware`].
///
/// ```
/// use canter::middleware::{from_fn, Next};
/// use canter::rt::{Reply, Request};
///
/// let passthrough = from_fn(|req: Request, next: Next<'_>| -> Reply { next.run(req) });
/// # let _ = passthrough;
/// ```
pub struct Next<'a> {
    inner: &'a dyn Service,
}

impl Next<'_> {
    /// Passes the request to the inner layers and the service.
    #[inline]
    pub fn run(self, req: Request) -> Reply {
        self.inner.call(req)
    }
}

impl std::fmt::Debug for Next<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Next")
    }
}

/// A service wrapped in a middleware; itself a [`Service`] that can be wrapped again.
///
/// ```
/// use canter::middleware::{AccessLog, RequestId};
///
/// let app = canter::Router::new()
///     .layer(AccessLog::new())
///     .layer(RequestId::layer());
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct Layered<M, S> {
    middleware: M,
    inner: S,
}

impl<M: Middleware, S: Service> Layered<M, S> {
    /// Wraps `inner` in `middleware`.
    pub fn new(middleware: M, inner: S) -> Layered<M, S> {
        Layered { middleware, inner }
    }

    /// Wraps this service in one more layer, which runs before this one.
    pub fn layer<N: Middleware>(self, middleware: N) -> Layered<N, Layered<M, S>> {
        Layered::new(middleware, self)
    }
}

impl<M: Middleware, S: Service> Service for Layered<M, S> {
    #[inline]
    fn call(&self, req: Request) -> Reply {
        self.middleware.call(req, Next { inner: &self.inner })
    }
}

/// A middleware from a closure.
///
/// ```
/// use canter::middleware::{from_fn, Next};
/// use canter::rt::http::StatusCode;
/// use canter::rt::{Reply, Request, Response};
/// use canter::{get, Router};
///
/// // Requests without an API key are answered 401 before reaching the router.
/// let auth = from_fn(|req: Request, next: Next<'_>| -> Reply {
///     if req.header("x-api-key") == Some(&b"secret"[..]) {
///         next.run(req)
///     } else {
///         Response::new(StatusCode::UNAUTHORIZED).into()
///     }
/// });
/// let app = Router::new().route("/", get(|| "hi\n")).layer(auth);
/// # let _ = app;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(Request, Next<'_>) -> Reply + 'static,
{
    FromFn(f)
}

/// The middleware made by [`from_fn`].
///
/// ```
/// use canter::middleware::{from_fn, FromFn, Next};
/// use canter::rt::{Reply, Request};
///
/// fn log_path(req: Request, next: Next<'_>) -> Reply {
///     eprintln!("{}", req.path());
///     next.run(req)
/// }
/// let layer: FromFn<_> = from_fn(log_path);
/// let app = canter::Router::new().layer(layer);
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct FromFn<F>(F);

impl<F> Middleware for FromFn<F>
where
    F: Fn(Request, Next<'_>) -> Reply + 'static,
{
    #[inline]
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        (self.0)(req, next)
    }
}
