//! The server's settings ([`Config`], built and checked by [`ConfigBuilder`]): leaf data that
//! every layer reads, from the accept loop to the protocol drivers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use canter_http::{ConfigError, Limits, Timeouts};

#[cfg(feature = "tls")]
use crate::core::tls::TlsAcceptor;

/// Server settings, built with [`Config::builder`], which checks them; `Config::default()`
/// serves 127.0.0.1:8080 on every core.
///
/// ```
/// use std::time::Duration;
/// let config = canter_rt::Config::builder()
///     .addr("127.0.0.1:0".parse()?)
///     .workers(2)
///     .handler_timeout(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(config.workers(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    pub(crate) addr: SocketAddr,
    pub(crate) workers: usize,
    pub(crate) pin_workers: bool,
    pub(crate) limits: Limits,
    pub(crate) timeouts: Timeouts,
    pub(crate) min_body_rate: u64,
    pub(crate) min_body_rate_grace: Duration,
    pub(crate) handler_timeout: Duration,
    pub(crate) high_water: usize,
    pub(crate) read_budget: usize,
    pub(crate) max_pipeline: usize,
    pub(crate) max_connections: usize,
    pub(crate) backlog: i32,
    pub(crate) drain_timeout: Duration,
    pub(crate) half_close: bool,
    pub(crate) defer_accept: bool,
    pub(crate) reuse_port: bool,
    pub(crate) server_name: String,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<TlsListener>,
    #[cfg(feature = "http2")]
    pub(crate) http2: Option<canter_h2::Settings>,
    #[cfg(feature = "http3")]
    pub(crate) http3: bool,
    #[cfg(feature = "http3")]
    pub(crate) http3_early_data: bool,
    pub(crate) fault_log_interval: Duration,
    pub(crate) proxy_protocol: Option<crate::core::proxy::ProxyProtocol>,
    pub(crate) park_hooks: Option<ParkHooks>,
    pub(crate) coalesce: Option<Duration>,
}

impl Config {
    /// A builder starting from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder(Config::default())
    }

    /// A builder starting from this configuration, to change some of it.
    pub fn to_builder(self) -> ConfigBuilder {
        ConfigBuilder(self)
    }

    /// Address to listen on; port 0 picks a free port (shared by all workers).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of worker threads (event loops).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Pin worker `i` to CPU `i`.
    pub fn pin_workers(&self) -> bool {
        self.pin_workers
    }

    /// Parser limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Idle, head, body and write timeouts.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Minimum request body data rate, in bytes per second of the handler waiting for the body,
    /// enforced after [`Config::min_body_rate_grace`]; slower clients get the body timeout (408).
    /// 0 turns it off.
    pub fn min_body_rate(&self) -> u64 {
        self.min_body_rate
    }

    /// Waiting time before [`Config::min_body_rate`] applies.
    pub fn min_body_rate_grace(&self) -> Duration {
        self.min_body_rate_grace
    }

    /// Longest a handler may run before the request is answered 503 and the connection closed.
    pub fn handler_timeout(&self) -> Duration {
        self.handler_timeout
    }

    /// Output bytes above which a connection stops parsing pipelined requests and reading
    /// until the peer has taken what is buffered.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// Bytes a connection may read before yielding to the other connections of its worker.
    pub fn read_budget(&self) -> usize {
        self.read_budget
    }

    /// Pipelined requests a connection answers in one turn before it flushes and yields: bounds
    /// the responses in flight per connection and the work one client can claim at a time.
    pub fn max_pipeline(&self) -> usize {
        self.max_pipeline
    }

    /// Connections per worker; beyond it new connections wait in the listen backlog.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Listen backlog.
    pub fn backlog(&self) -> i32 {
        self.backlog
    }

    /// How long a graceful shutdown waits for in-flight requests.
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout
    }

    /// Whether a peer that shuts down its sending side still waits for the answer of a request
    /// whose handler is pending. `false` (the default, as in hyper): while a handler's future
    /// waits, the connection watches the socket, and end of input or a reset means the client is
    /// gone; the future is dropped (its work cancelled) and the connection closed. `true`: the
    /// handler runs to completion (up to [`Config::handler_timeout`]) and its response is sent.
    /// Handlers that answer without waiting are answered either way.
    pub fn half_close(&self) -> bool {
        self.half_close
    }

    /// Whether an HTTP listener hands over a connection only once its first bytes have arrived
    /// (`TCP_DEFER_ACCEPT`, as nginx's `listen ... deferred`). `true` (the default): the first
    /// read of a new connection finds its request, so a connection answered and closed in one
    /// go never waits in the event loop (see the transport's `LazyTcp`). A client that
    /// connects and stays silent is handed over after about a second, when the kernel gives up
    /// waiting; its header timeout runs from then. Custom protocols ([`Server::serve_protocol`](crate::Server::serve_protocol))
    /// never defer: their server may have to speak first.
    pub fn defer_accept(&self) -> bool {
        self.defer_accept
    }

    /// Whether the server may share its port with another process's listeners. `false` (the
    /// default): binding an address that another process is already listening on fails with
    /// `AddrInUse`, as nginx's does, although the server's own workers share their port through
    /// `SO_REUSEPORT` (a second server started by mistake would otherwise take a share of the
    /// connections, with its own certificate and routes). `true` lets a new process start
    /// beside the old one for a deliberate hand-over.
    pub fn reuse_port(&self) -> bool {
        self.reuse_port
    }

    /// Value of the Server header: 1 to [`MAX_SERVER_NAME`] visible ASCII characters or spaces
    /// ([`ConfigBuilder::build`] refuses others: the value goes into every response as it is).
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    #[cfg(feature = "tls")]
    /// A TLS listener beside the plain one: same service, same limits, each worker accepting
    /// on both.
    pub fn tls(&self) -> Option<&TlsListener> {
        self.tls.as_ref()
    }

    #[cfg(feature = "http2")]
    /// HTTP/2 (h2c with prior knowledge on the plain listener, ALPN `h2` on the TLS one) with
    /// these settings; `None` serves HTTP/1.1 only. Its header list limit is capped at
    /// [`Limits::max_head`].
    pub fn http2(&self) -> Option<&canter_h2::Settings> {
        self.http2.as_ref()
    }

    #[cfg(feature = "http3")]
    /// HTTP/3 over QUIC on the TLS listener's port number, over UDP (each worker owns a UDP
    /// socket on it, `SO_REUSEPORT`), with the TLS listener's certificates; needs
    /// [`Config::tls`]. Off by default.
    pub fn http3(&self) -> bool {
        self.http3
    }

    #[cfg(feature = "http3")]
    /// HTTP/3 takes 0-RTT data from a client resuming a session: its first requests arrive
    /// with its first packet, a round trip sooner. Early data can be replayed by an attacker,
    /// so a request that arrives in it is served only if its method is safe (GET, HEAD,
    /// OPTIONS); any other is answered 425 Too Early (RFC 8470), and the client sends it again
    /// once the handshake is done. Off by default.
    pub fn http3_early_data(&self) -> bool {
        self.http3_early_data
    }

    /// Whether connections may speak HTTP/2: set, and built with the `http2` feature.
    pub(crate) fn http2_on(&self) -> bool {
        #[cfg(feature = "http2")]
        return self.http2.is_some();
        #[cfg(not(feature = "http2"))]
        false
    }

    /// Client faults ([`ClientFault`](crate::ClientFault): bad requests, timeouts, resets, failed handshakes) are
    /// logged one by one at DEBUG only, since any peer can cause as many as it likes; at INFO,
    /// one line per this interval gives their counts by kind, when there were any (zero: no
    /// summary). The counts are also in [`Stats::client_faults`](crate::Stats::client_faults).
    pub fn fault_log_interval(&self) -> Duration {
        self.fault_log_interval
    }

    /// Every connection, on the plain and the TLS listener, opens with a PROXY protocol header
    /// (version 1 or 2) from a load balancer, read before anything else (the TLS handshake
    /// included); the client it names becomes the connection's peer: [`crate::peer_addr`] and
    /// the logs for HTTP, the address a custom protocol is made for with
    /// [`Server::serve_protocol`](crate::Server::serve_protocol). A connection from a source
    /// not allowed, or with a missing, malformed, oversized or late header, is closed with a
    /// debug line (a [`ClientFault::Protocol`](crate::ClientFault::Protocol)). `None` (the
    /// default): no header expected.
    pub fn proxy_protocol(&self) -> Option<&crate::core::proxy::ProxyProtocol> {
        self.proxy_protocol.as_ref()
    }

    /// Called on each worker thread just before its event loop blocks waiting for events, and
    /// just after it wakes: for an embedding that must give something up while the worker is
    /// idle (the Python front end releases the interpreter lock there). Not called when the
    /// loop only checks for events without waiting. `None` (the default): nothing.
    pub fn park_hooks(&self) -> Option<&ParkHooks> {
        self.park_hooks.as_ref()
    }

    /// Event coalescing: a busy worker that runs out of work sleeps this long before it waits
    /// for events, so that what arrives meanwhile is taken in one turn and the peers that send
    /// it (on other cores) need not wake it. Busy means its last wait for events was shorter
    /// than ten times this; a worker that waited longer blocks at once, as without coalescing,
    /// so an idle server does not wake up by itself. It costs each turn's events up to this
    /// delay, plus the kernel's timer slack (50 µs by default), of latency, and saves the
    /// wake-ups: worth it when the worker talks to programs on the same machine, a database
    /// above all (BENCHMARKS.md, "Event coalescing"). At most 1 ms. `None` (the default): no
    /// sleep.
    pub fn coalesce(&self) -> Option<Duration> {
        self.coalesce
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] checks it. Each setter's meaning is on the
/// getter of the same name.
#[derive(Debug, Clone)]
#[must_use]
pub struct ConfigBuilder(Config);

impl ConfigBuilder {
    /// See [`Config::addr`].
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.0.addr = addr;
        self
    }

    /// See [`Config::workers`].
    pub fn workers(mut self, workers: usize) -> Self {
        self.0.workers = workers;
        self
    }

    /// See [`Config::pin_workers`].
    pub fn pin_workers(mut self, pin_workers: bool) -> Self {
        self.0.pin_workers = pin_workers;
        self
    }

    /// See [`Config::limits`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.0.limits = limits;
        self
    }

    /// See [`Config::timeouts`].
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.0.timeouts = timeouts;
        self
    }

    /// See [`Config::min_body_rate`].
    pub fn min_body_rate(mut self, min_body_rate: u64) -> Self {
        self.0.min_body_rate = min_body_rate;
        self
    }

    /// See [`Config::min_body_rate_grace`].
    pub fn min_body_rate_grace(mut self, min_body_rate_grace: Duration) -> Self {
        self.0.min_body_rate_grace = min_body_rate_grace;
        self
    }

    /// See [`Config::handler_timeout`].
    pub fn handler_timeout(mut self, handler_timeout: Duration) -> Self {
        self.0.handler_timeout = handler_timeout;
        self
    }

    /// See [`Config::high_water`].
    pub fn high_water(mut self, high_water: usize) -> Self {
        self.0.high_water = high_water;
        self
    }

    /// See [`Config::read_budget`].
    pub fn read_budget(mut self, read_budget: usize) -> Self {
        self.0.read_budget = read_budget;
        self
    }

    /// See [`Config::max_pipeline`].
    pub fn max_pipeline(mut self, max_pipeline: usize) -> Self {
        self.0.max_pipeline = max_pipeline;
        self
    }

    /// See [`Config::max_connections`].
    pub fn max_connections(mut self, max_connections: usize) -> Self {
        self.0.max_connections = max_connections;
        self
    }

    /// See [`Config::backlog`].
    pub fn backlog(mut self, backlog: i32) -> Self {
        self.0.backlog = backlog;
        self
    }

    /// See [`Config::drain_timeout`].
    pub fn drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.0.drain_timeout = drain_timeout;
        self
    }

    /// See [`Config::half_close`].
    pub fn half_close(mut self, half_close: bool) -> Self {
        self.0.half_close = half_close;
        self
    }

    /// See [`Config::defer_accept`].
    pub fn defer_accept(mut self, defer_accept: bool) -> Self {
        self.0.defer_accept = defer_accept;
        self
    }

    /// See [`Config::reuse_port`].
    pub fn reuse_port(mut self, reuse_port: bool) -> Self {
        self.0.reuse_port = reuse_port;
        self
    }

    /// See [`Config::server_name`].
    pub fn server_name(mut self, server_name: impl Into<String>) -> Self {
        self.0.server_name = server_name.into();
        self
    }

    #[cfg(feature = "tls")]
    /// See [`Config::tls`].
    pub fn tls(mut self, tls: Option<TlsListener>) -> Self {
        self.0.tls = tls;
        self
    }

    #[cfg(feature = "http2")]
    /// See [`Config::http2`].
    pub fn http2(mut self, http2: Option<canter_h2::Settings>) -> Self {
        self.0.http2 = http2;
        self
    }

    #[cfg(feature = "http3")]
    /// See [`Config::http3`].
    pub fn http3(mut self, on: bool) -> Self {
        self.0.http3 = on;
        self
    }

    #[cfg(feature = "http3")]
    /// See [`Config::http3_early_data`].
    pub fn http3_early_data(mut self, on: bool) -> Self {
        self.0.http3_early_data = on;
        self
    }

    /// See [`Config::fault_log_interval`].
    pub fn fault_log_interval(mut self, fault_log_interval: Duration) -> Self {
        self.0.fault_log_interval = fault_log_interval;
        self
    }

    /// See [`Config::proxy_protocol`].
    pub fn proxy_protocol(
        mut self,
        proxy_protocol: Option<crate::core::proxy::ProxyProtocol>,
    ) -> Self {
        self.0.proxy_protocol = proxy_protocol;
        self
    }

    /// See [`Config::park_hooks`].
    pub fn park_hooks(mut self, park_hooks: Option<ParkHooks>) -> Self {
        self.0.park_hooks = park_hooks;
        self
    }

    /// See [`Config::coalesce`].
    pub fn coalesce(mut self, coalesce: Option<Duration>) -> Self {
        self.0.coalesce = coalesce;
        self
    }

    /// The configuration, or the first setting out of its range.
    pub fn build(self) -> Result<Config, ConfigError> {
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut c = self.0;
        // Refuses a Server value that is empty, too long, or not printable ASCII: it is
        // written into every response head as it is, so CR or LF in it would split responses.
        canter_h1::Preamble::new(&c.server_name, EPOCH_DATE)?;
        for (value, name) in [
            (c.workers, "workers"),
            (c.high_water, "high_water"),
            (c.read_budget, "read_budget"),
            (c.max_pipeline, "max_pipeline"),
            (c.max_connections, "max_connections"),
        ] {
            if value == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if c.backlog < 1 {
            return Err(ConfigError::new("backlog", "must be at least 1"));
        }
        // A zero `fault_log_interval` is allowed: it turns the summary off.
        if c.handler_timeout.is_zero() {
            return Err(ConfigError::new("handler_timeout", "must be above zero"));
        }
        if let Some(d) = c.coalesce {
            if d.is_zero() || d > MAX_COALESCE {
                return Err(ConfigError::new(
                    "coalesce",
                    "must be above zero and at most 1 ms",
                ));
            }
        }
        #[cfg(feature = "http3")]
        if c.http3 && c.tls.is_none() {
            return Err(ConfigError::new(
                "http3",
                "needs a TLS listener: HTTP/3 uses its certificates and its port number",
            ));
        }
        // With HTTP/2 off, a TLS client must not be able to agree on `h2` by ALPN: it would be
        // answered in HTTP/2 all the same.
        #[cfg(feature = "tls")]
        if !c.http2_on() {
            if let Some(t) = c.tls.as_mut() {
                if t.acceptor.alpn_protocols().iter().any(|p| p == b"h2") {
                    t.acceptor = t.acceptor.without_alpn(b"h2");
                }
            }
        }
        Ok(c)
    }
}

/// The pair of callbacks of [`Config::park_hooks`].
#[derive(Clone)]
pub struct ParkHooks {
    /// Runs before the worker blocks.
    pub before_park: Arc<dyn Fn() + Send + Sync>,
    /// Runs after the worker wakes.
    pub after_unpark: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for ParkHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkHooks").finish_non_exhaustive()
    }
}

/// Where and how to accept TLS connections.
#[cfg(feature = "tls")]
#[derive(Debug, Clone)]
pub struct TlsListener {
    /// Address of the TLS listener; port 0 picks a free port (shared by all workers).
    pub addr: SocketAddr,
    /// Certificates and TLS settings, built with [`crate::ServerTls::build`].
    pub acceptor: TlsAcceptor,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: thread::available_parallelism().map_or(1, usize::from),
            pin_workers: false,
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            handler_timeout: Duration::from_secs(60),
            min_body_rate: 240,
            min_body_rate_grace: Duration::from_secs(5),
            high_water: 64 * 1024,
            read_budget: 256 * 1024,
            max_pipeline: 64,
            max_connections: 65_536,
            backlog: 4096,
            drain_timeout: Duration::from_secs(10),
            half_close: false,
            defer_accept: true,
            reuse_port: false,
            server_name: "canter".to_owned(),
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "http2")]
            http2: Some(canter_h2::Settings::default()),
            #[cfg(feature = "http3")]
            http3: false,
            #[cfg(feature = "http3")]
            http3_early_data: false,
            fault_log_interval: Duration::from_secs(10),
            proxy_protocol: None,
            park_hooks: None,
            coalesce: None,
        }
    }
}

/// The longest [`Config::coalesce`] delay accepted: ten times it stays below the period of the
/// worker's own clock, so that a worker with nothing to do is never taken for a busy one.
const MAX_COALESCE: Duration = Duration::from_millis(1);

/// The longest [`Config::server_name`].
pub const MAX_SERVER_NAME: usize = canter_h1::Preamble::MAX_SERVER;

/// A placeholder date for a Server value's check and a worker's first block (its clock
/// replaces it at once).
pub(crate) const EPOCH_DATE: &[u8; 29] = b"Thu, 01 Jan 1970 00:00:00 GMT";
