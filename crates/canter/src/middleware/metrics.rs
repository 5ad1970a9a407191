//! Request metrics, kept per worker without locks or shared cache lines, rendered in the
//! Prometheus text format.

use std::fmt::Write as _;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::{ClientFault, Reply, Request, Response, Stats};

use super::{Middleware, Next};

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// The same bounds in microseconds.
const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
const CODES: usize = 500;

const PROMETHEUS: HeaderValue =
    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");

/// One worker's counters. Written by that worker only (plain load + store, no locked
/// instruction); read by whoever renders.
#[repr(align(128))]
struct Shard {
    /// Responses by status code 100..=599.
    codes: [AtomicU64; CODES],
    /// Latency histogram (non-cumulative; the last slot is +Inf).
    buckets: [AtomicU64; BUCKETS.len() + 1],
    micros: AtomicU64,
    request_bytes: AtomicU64,
    response_bytes: AtomicU64,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            micros: AtomicU64::new(0),
            request_bytes: AtomicU64::new(0),
            response_bytes: AtomicU64::new(0),
        }
    }
}

/// Single-writer increment: the shard belongs to one thread (see `MetricsLayer`'s `!Send`).
#[inline]
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

#[derive(Default)]
struct Registry {
    shards: Mutex<Vec<Arc<Shard>>>,
    stats: Mutex<Option<Arc<Stats>>>,
}

/// Request metrics for Prometheus: requests by status code, a latency histogram (time until
/// the response head is ready), request and response body bytes (the declared Content-Length
/// and the known response length; streamed bodies of unknown length are not counted), and,
/// with [`Metrics::with_stats`], open and accepted connections and the client's faults by kind
/// (`canter_client_errors_total{kind="bad_request"}`, see [`ClientFault`]).
///
/// Create one `Metrics` for the server, give each worker its own [`Metrics::layer`], and serve
/// [`Metrics::endpoint`] where the scraper looks (opt-in: nothing is exposed otherwise).
///
/// ```no_run
/// use canter::middleware::Metrics;
/// use canter::rt::{Config, Server};
/// use canter::{get, Router};
///
/// let server = Server::bind(Config::default()).unwrap();
/// let metrics = Metrics::new().with_stats(server.stats());
/// server
///     .serve(move |_worker| {
///         Router::new()
///             .route("/", get(|| "hi\n"))
///             .route("/metrics", get(metrics.endpoint()))
///             .layer(metrics.layer())
///     })
///     .unwrap();
/// ```
#[derive(Clone, Default)]
pub struct Metrics {
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Also report the server's open and accepted connections.
    pub fn with_stats(self, stats: Arc<Stats>) -> Metrics {
        if let Ok(mut slot) = self.registry.stats.lock() {
            *slot = Some(stats);
        }
        self
    }

    /// A recording layer with its own counters: call once per worker.
    pub fn layer(&self) -> MetricsLayer {
        let shard = Arc::new(Shard::new());
        if let Ok(mut shards) = self.registry.shards.lock() {
            shards.push(shard.clone());
        }
        MetricsLayer {
            shard,
            _not_send: PhantomData,
        }
    }

    /// A handler answering with [`Metrics::render`].
    ///
    /// ```
    /// let metrics = canter::middleware::Metrics::new();
    /// let app = canter::Router::new().route("/metrics", canter::get(metrics.endpoint()));
    /// # let _ = app;
    /// ```
    pub fn endpoint(&self) -> impl Fn() -> Response + Clone + 'static {
        let metrics = self.clone();
        move || {
            Response::new(StatusCode::OK)
                .with_header(header::CONTENT_TYPE, PROMETHEUS)
                .with_body(metrics.render())
        }
    }

    /// Everything, summed over workers, in the Prometheus text exposition format.
    ///
    /// ```
    /// let text = canter::middleware::Metrics::new().render();
    /// assert!(text.contains("# TYPE canter_http_requests_total counter"));
    /// ```
    pub fn render(&self) -> String {
        let shards: Vec<Arc<Shard>> = match self.registry.shards.lock() {
            Ok(s) => s.clone(),
            Err(_) => Vec::new(),
        };
        let sum = |f: &dyn Fn(&Shard) -> &AtomicU64| -> u64 {
            shards
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .fold(0, u64::wrapping_add)
        };
        let mut out = String::with_capacity(2048);
        out.push_str(
            "# HELP canter_http_requests_total Requests answered by the application, by status code.\n\
             # TYPE canter_http_requests_total counter\n",
        );
        for i in 0..CODES {
            let n = sum(&|s| &s.codes[i]);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "canter_http_requests_total{{code=\"{}\"}} {n}",
                    i + 100
                );
            }
        }
        out.push_str(
            "# HELP canter_http_request_duration_seconds Time from the request reaching the application to its response head being ready.\n\
             # TYPE canter_http_request_duration_seconds histogram\n",
        );
        let mut cumulative = 0u64;
        for (i, le) in BUCKETS.iter().enumerate() {
            cumulative += sum(&|s| &s.buckets[i]);
            let _ = writeln!(
                out,
                "canter_http_request_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += sum(&|s| &s.buckets[BUCKETS.len()]);
        let _ = writeln!(
            out,
            "canter_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let micros = sum(&|s| &s.micros);
        let _ = writeln!(
            out,
            "canter_http_request_duration_seconds_sum {}\ncanter_http_request_duration_seconds_count {cumulative}",
            micros as f64 / 1e6
        );
        let _ = write!(
            out,
            "# HELP canter_http_request_body_bytes_total Request body bytes declared by Content-Length.\n\
             # TYPE canter_http_request_body_bytes_total counter\n\
             canter_http_request_body_bytes_total {}\n\
             # HELP canter_http_response_body_bytes_total Response body bytes of known length.\n\
             # TYPE canter_http_response_body_bytes_total counter\n\
             canter_http_response_body_bytes_total {}\n",
            sum(&|s| &s.request_bytes),
            sum(&|s| &s.response_bytes),
        );
        let stats = self.registry.stats.lock().ok().and_then(|s| s.clone());
        if let Some(stats) = stats {
            let _ = write!(
                out,
                "# HELP canter_open_connections Connections currently open.\n\
                 # TYPE canter_open_connections gauge\n\
                 canter_open_connections {}\n\
                 # HELP canter_connections_accepted_total Connections accepted since start.\n\
                 # TYPE canter_connections_accepted_total counter\n\
                 canter_connections_accepted_total {}\n\
                 # HELP canter_quic_datagrams_forwarded_total QUIC datagrams handed to the worker \
                 that owns their connection (the client changed address).\n\
                 # TYPE canter_quic_datagrams_forwarded_total counter\n\
                 canter_quic_datagrams_forwarded_total {}\n\
                 # HELP canter_ws_assembling_bytes Bytes held in WebSocket messages still being \
                 assembled (bounded per worker by its budget).\n\
                 # TYPE canter_ws_assembling_bytes gauge\n\
                 canter_ws_assembling_bytes {}\n",
                stats.open_connections(),
                stats.accepted(),
                stats.quic_datagrams_forwarded(),
                stats.ws_assembling_bytes(),
            );
            out.push_str(
                "# HELP canter_client_errors_total Connections ended or disturbed by the client: \
                 bad requests and bodies, timeouts, resets, failed TLS handshakes, protocol errors.\n\
                 # TYPE canter_client_errors_total counter\n",
            );
            for kind in ClientFault::ALL {
                let _ = writeln!(
                    out,
                    "canter_client_errors_total{{kind=\"{}\"}} {}",
                    kind.name(),
                    stats.client_faults(kind)
                );
            }
        }
        out
    }
}

/// The per-worker recording layer made by [`Metrics::layer`]. Not `Send`: its counters have
/// a single writer.
///
/// ```
/// use canter::middleware::{Metrics, MetricsLayer};
///
/// let metrics = Metrics::new();
/// let layer: MetricsLayer = metrics.layer(); // in the worker's factory
/// let app = canter::Router::new().layer(layer);
/// # let _ = app;
/// ```
pub struct MetricsLayer {
    shard: Arc<Shard>,
    _not_send: PhantomData<Rc<()>>,
}

impl std::fmt::Debug for MetricsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsLayer").finish_non_exhaustive()
    }
}

impl Middleware for MetricsLayer {
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        let start = Instant::now();
        let shard = self.shard.clone();
        if let Some(n) = req.body().content_length() {
            bump(&shard.request_bytes, n);
        }
        next.run(req).map(move |res| {
            let micros = start.elapsed().as_micros() as u64;
            let code = res.status().as_u16() as usize;
            if let Some(slot) = code.checked_sub(100).and_then(|i| shard.codes.get(i)) {
                bump(slot, 1);
            }
            let bucket = BUCKETS_US
                .iter()
                .position(|&b| micros <= b)
                .unwrap_or(BUCKETS_US.len());
            bump(&shard.buckets[bucket], 1);
            bump(&shard.micros, micros);
            if let Some(n) = res.body().exact_len() {
                bump(&shard.response_bytes, n);
            }
            res
        })
    }
}
