//! Thread-per-core serving: one event loop per worker thread, each with its own SO_REUSEPORT
//! listener, so accepted connections never cross threads.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use canter_h1::{ConfigError, Limits, Timeouts};
use socket2::{Domain, Protocol, Socket, Type};
use std::os::fd::{AsRawFd, FromRawFd};
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::http1::Http;
use crate::service::Service;
use crate::tls::TlsAcceptor;
use crate::transport::LazyTcp;
use crate::worker::{Registration, Worker};

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
    pub(crate) server_name: String,
    pub(crate) tls: Option<TlsListener>,
    pub(crate) http2: Option<canter_h2::Settings>,
    pub(crate) fault_log_interval: Duration,
    pub(crate) proxy_protocol: Option<crate::proxy::ProxyProtocol>,
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
    /// go never waits in the event loop (see [`crate::transport`]'s `LazyTcp`). A client that
    /// connects and stays silent is handed over after about a second, when the kernel gives up
    /// waiting; its header timeout runs from then. Custom protocols ([`Server::serve_protocol`])
    /// never defer: their server may have to speak first.
    pub fn defer_accept(&self) -> bool {
        self.defer_accept
    }

    /// Value of the Server header: 1 to [`MAX_SERVER_NAME`] visible ASCII characters or spaces
    /// ([`ConfigBuilder::build`] refuses others: the value goes into every response as it is).
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// A TLS listener beside the plain one: same service, same limits, each worker accepting
    /// on both.
    pub fn tls(&self) -> Option<&TlsListener> {
        self.tls.as_ref()
    }

    /// HTTP/2 (h2c with prior knowledge on the plain listener, ALPN `h2` on the TLS one) with
    /// these settings; `None` serves HTTP/1.1 only. Its header list limit is capped at
    /// [`Limits::max_head`].
    pub fn http2(&self) -> Option<&canter_h2::Settings> {
        self.http2.as_ref()
    }

    /// Client faults ([`ClientFault`]: bad requests, timeouts, resets, failed handshakes) are
    /// logged one by one at DEBUG only, since any peer can cause as many as it likes; at INFO,
    /// one line per this interval gives their counts by kind, when there were any (zero: no
    /// summary). The counts are also in [`Stats::client_faults`].
    pub fn fault_log_interval(&self) -> Duration {
        self.fault_log_interval
    }

    /// Every connection, on the plain and the TLS listener, opens with a PROXY protocol header
    /// (version 1 or 2) from a load balancer, read before anything else (the TLS handshake
    /// included); the client it names becomes the connection's peer: [`crate::peer_addr`] and
    /// the logs for HTTP, the address a custom protocol is made for with
    /// [`Server::serve_protocol`]. A connection from a source
    /// not allowed, or with a missing, malformed, oversized or late header, is closed with a
    /// debug line (a [`ClientFault::Protocol`]). `None` (the default): no header expected.
    pub fn proxy_protocol(&self) -> Option<&crate::proxy::ProxyProtocol> {
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

    /// See [`Config::server_name`].
    pub fn server_name(mut self, server_name: impl Into<String>) -> Self {
        self.0.server_name = server_name.into();
        self
    }

    /// See [`Config::tls`].
    pub fn tls(mut self, tls: Option<TlsListener>) -> Self {
        self.0.tls = tls;
        self
    }

    /// See [`Config::http2`].
    pub fn http2(mut self, http2: Option<canter_h2::Settings>) -> Self {
        self.0.http2 = http2;
        self
    }

    /// See [`Config::fault_log_interval`].
    pub fn fault_log_interval(mut self, fault_log_interval: Duration) -> Self {
        self.0.fault_log_interval = fault_log_interval;
        self
    }

    /// See [`Config::proxy_protocol`].
    pub fn proxy_protocol(mut self, proxy_protocol: Option<crate::proxy::ProxyProtocol>) -> Self {
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
        let c = self.0;
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
            server_name: "canter".to_owned(),
            tls: None,
            http2: Some(canter_h2::Settings::default()),
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

/// Stops a running server gracefully: listeners close, idle connections close, in-flight
/// requests finish (up to [`Config::drain_timeout`]).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// Begins the graceful shutdown. Idempotent.
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }
}

/// Counters of a running server, readable from any thread. Updated once per connection (never
/// per request), so they cost nothing on the hot path.
#[derive(Debug, Default)]
pub struct Stats {
    open: AtomicUsize,
    accepted: AtomicU64,
    faults: [AtomicU64; ClientFault::ALL.len()],
}

/// A fault of the client that ended or disturbed one of its connections. Any peer can cause any
/// number of them, so each is a DEBUG line, counted (see [`Config::fault_log_interval`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFault {
    /// A malformed or refused request head (answered 4xx/5xx), or an HTTP/2 stream refused for
    /// its request.
    BadRequest,
    /// A malformed request body, or one over the limit.
    BadBody,
    /// The request head did not arrive within the head timeout (408).
    HeadTimeout,
    /// The request body stalled or came slower than the minimum rate.
    BodyTimeout,
    /// The connection sat idle past the idle timeout.
    IdleTimeout,
    /// The peer reset the connection.
    Reset,
    /// The TLS handshake failed or stalled.
    TlsHandshake,
    /// The peer broke the protocol: a bad PROXY protocol header, a first line that is neither
    /// HTTP/1 nor HTTP/2, an HTTP/2 connection error.
    Protocol,
    /// The peer's TLS messages drew a warning from the TLS library, the connection going on:
    /// an IP address or an invalid name as SNI, a refused renegotiation (see
    /// [`crate::route_log_records`]).
    TlsWarning,
}

impl ClientFault {
    /// Every kind, in the order of [`ClientFault::name`]'s summaries.
    pub const ALL: [ClientFault; 9] = [
        ClientFault::BadRequest,
        ClientFault::BadBody,
        ClientFault::HeadTimeout,
        ClientFault::BodyTimeout,
        ClientFault::IdleTimeout,
        ClientFault::Reset,
        ClientFault::TlsHandshake,
        ClientFault::Protocol,
        ClientFault::TlsWarning,
    ];

    /// The kind's name in logs and metrics: `bad_request`, `bad_body`, `head_timeout`,
    /// `body_timeout`, `idle_timeout`, `reset`, `tls_handshake`, `protocol`, `tls_warning`.
    pub fn name(self) -> &'static str {
        match self {
            ClientFault::BadRequest => "bad_request",
            ClientFault::BadBody => "bad_body",
            ClientFault::HeadTimeout => "head_timeout",
            ClientFault::BodyTimeout => "body_timeout",
            ClientFault::IdleTimeout => "idle_timeout",
            ClientFault::Reset => "reset",
            ClientFault::TlsHandshake => "tls_handshake",
            ClientFault::Protocol => "protocol",
            ClientFault::TlsWarning => "tls_warning",
        }
    }
}

impl Stats {
    /// Connections currently open (their tasks alive), across all workers.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections accepted since start.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub(crate) fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Client faults of `kind` since start.
    pub fn client_faults(&self, kind: ClientFault) -> u64 {
        self.faults[kind as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn fault(&self, kind: ClientFault) {
        self.faults[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Logs, every `interval`, the client faults counted since the last line, when there were any.
async fn summarize_faults(stats: Arc<Stats>, interval: Duration) {
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    let mut last = [0u64; ClientFault::ALL.len()];
    loop {
        every.tick().await;
        let mut line = String::new();
        for kind in ClientFault::ALL {
            let now = stats.client_faults(kind);
            let new = now - last[kind as usize];
            last[kind as usize] = now;
            if new > 0 {
                use std::fmt::Write as _;
                let _ = write!(line, " {}={new}", kind.name());
            }
        }
        if !line.is_empty() {
            tracing::info!(
                "client faults in the last {:?}:{line} (each one at debug)",
                interval
            );
        }
    }
}

/// A bound server, ready to [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    config: Config,
    listeners: Vec<StdListener>,
    local_addr: SocketAddr,
    tls_listeners: Vec<StdListener>,
    tls_local_addr: Option<SocketAddr>,
    shutdown: ShutdownHandle,
    rx: watch::Receiver<bool>,
    stats: Arc<Stats>,
}

impl Server {
    /// Binds one SO_REUSEPORT listener per worker.
    pub fn bind(config: Config) -> io::Result<Server> {
        let workers = config.workers;
        let first = listen(config.addr, config.backlog)?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..workers {
            listeners.push(listen(local_addr, config.backlog)?);
        }
        let mut tls_listeners = Vec::new();
        let mut tls_local_addr = None;
        if let Some(tls) = &config.tls {
            let first = listen(tls.addr, config.backlog)?;
            let addr = first.local_addr()?;
            tls_listeners.push(first);
            for _ in 1..workers {
                tls_listeners.push(listen(addr, config.backlog)?);
            }
            tls_local_addr = Some(addr);
        }
        let (tx, rx) = watch::channel(false);
        Ok(Server {
            config,
            listeners,
            local_addr,
            tls_listeners,
            tls_local_addr,
            shutdown: ShutdownHandle { tx: Arc::new(tx) },
            rx,
            stats: Arc::default(),
        })
    }

    /// The bound address (with the actual port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The bound address of the TLS listener, if there is one.
    pub fn tls_local_addr(&self) -> Option<SocketAddr> {
        self.tls_local_addr
    }

    /// The server's counters (open connections, accepted connections).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// A handle to stop the server from another thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Runs the workers until shutdown; blocks the calling thread. `factory(i)` builds the
    /// service of worker `i` on that worker's thread.
    pub fn serve<S, F>(self, factory: F) -> io::Result<()>
    where
        S: Service,
        F: Fn(usize) -> S + Send + Sync + 'static,
    {
        let preamble = canter_h1::Preamble::new(&self.config.server_name, EPOCH_DATE)?;
        self.defer_http_accepts()?;
        self.run(move |i| HttpAccept(Rc::new(Http::new(factory(i), preamble.clone()))))
    }

    /// Runs the server's single worker on the calling thread until shutdown, instead of a
    /// thread of its own: for an embedding whose state belongs to one thread (the Python front
    /// end runs the interpreter's main thread as the worker). Fails if [`Config::workers`] is
    /// not 1.
    pub fn serve_inline<S, F>(mut self, factory: F) -> io::Result<()>
    where
        S: Service,
        F: FnOnce(usize) -> S + 'static,
    {
        if self.listeners.len() != 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "serve_inline runs one worker: set Config::workers to 1",
            ));
        }
        self.defer_http_accepts()?;
        let listeners = Listeners {
            plain: self.listeners.remove(0),
            tls: self.tls_listeners.pop(),
        };
        let preamble = canter_h1::Preamble::new(&self.config.server_name, EPOCH_DATE)?;
        run_worker(0, listeners, self.config, self.rx, self.stats, move |i| {
            HttpAccept(Rc::new(Http::new(factory(i), preamble)))
        })
    }

    /// Runs the workers with a custom protocol instead of HTTP until shutdown; blocks the
    /// calling thread. `factory(i)` runs once on worker `i`'s thread and returns that worker's
    /// per-connection constructor, called with each accepted peer's address. Connections from the
    /// TLS listener (if configured) complete their handshake before [`Protocol::on_open`].
    ///
    /// [`Protocol::on_open`]: crate::proto::Protocol::on_open
    pub fn serve_protocol<P, G, F>(self, factory: F) -> io::Result<()>
    where
        P: crate::proto::Protocol,
        G: FnMut(SocketAddr) -> P + 'static,
        F: Fn(usize) -> G + Send + Sync + 'static,
    {
        self.run(move |i| crate::proto::ProtocolAccept::new(factory(i)))
    }

    /// Sets `TCP_DEFER_ACCEPT` on every listener when [`Config::defer_accept`] says so: HTTP
    /// clients speak first.
    fn defer_http_accepts(&self) -> io::Result<()> {
        if !self.config.defer_accept {
            return Ok(());
        }
        for listener in self.listeners.iter().chain(&self.tls_listeners) {
            let secs: libc::c_int = DEFER_ACCEPT_SECS;
            // SAFETY: the descriptor is the open listener borrowed here; the option's value is
            // a c_int read by the kernel, passed with its size.
            let set = unsafe {
                libc::setsockopt(
                    listener.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_DEFER_ACCEPT,
                    (&secs as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if set != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn run<A, F>(self, factory: F) -> io::Result<()>
    where
        A: Accept,
        F: Fn(usize) -> A + Send + Sync + 'static,
    {
        let factory = Arc::new(factory);
        let mut threads = Vec::new();
        let mut tls_listeners = self.tls_listeners.into_iter();
        for (i, listener) in self.listeners.into_iter().enumerate() {
            let factory = factory.clone();
            let config = self.config.clone();
            let rx = self.rx.clone();
            let stats = self.stats.clone();
            let listeners = Listeners {
                plain: listener,
                tls: tls_listeners.next(),
            };
            let t = thread::Builder::new()
                .name(format!("canter-worker-{i}"))
                .spawn(move || run_worker(i, listeners, config, rx, stats, move |i| factory(i)))?;
            threads.push(t);
        }
        let mut result = Ok(());
        for t in threads {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(io::Error::other("worker thread panicked")),
            }
        }
        result
    }
}

/// Shuts the server down on SIGINT or SIGTERM (watched from a small background thread).
pub fn shutdown_on_signals(handle: ShutdownHandle) -> io::Result<()> {
    on_signals(move || {
        tracing::info!("shutting down: draining connections");
        handle.shutdown();
    })
}

/// Runs `then` once, on the first SIGINT or SIGTERM, from a small background thread. The
/// signals are watched from before this returns, so one right after start-up is not missed.
pub fn on_signals(then: impl FnOnce() + Send + 'static) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let (mut int, mut term) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    thread::Builder::new()
        .name("canter-signals".into())
        .spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            });
            then();
        })?;
    Ok(())
}

/// How long the kernel holds a connection whose client has not spoken yet before handing it
/// over anyway ([`Config::defer_accept`]), in seconds.
const DEFER_ACCEPT_SECS: libc::c_int = 1;

/// The longest [`Config::server_name`].
pub const MAX_SERVER_NAME: usize = canter_h1::Preamble::MAX_SERVER;

/// A placeholder date for a Server value's check and a worker's first block (its clock
/// replaces it at once).
pub(crate) const EPOCH_DATE: &[u8; 29] = b"Thu, 01 Jan 1970 00:00:00 GMT";

/// A nonblocking listener on `addr` with SO_REUSEPORT (so that every worker can have its own on
/// the same port) and TCP_NODELAY inherited by accepted sockets.
pub fn listen(addr: SocketAddr, backlog: i32) -> io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux: set once here rather
    // than with a system call per connection (a test checks that accepted ones have it).
    socket.set_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

/// A worker's listening sockets.
struct Listeners {
    plain: StdListener,
    tls: Option<StdListener>,
}

/// What a worker does with each accepted connection: drive HTTP/1.1 around a service, or a
/// custom protocol. Runs on the worker's thread.
pub(crate) trait Accept: 'static {
    /// Spawns the connection's task on the current worker.
    fn spawn(&mut self, conn: Accepted, worker: &Rc<Worker>, cfg: &Rc<Config>);
}

/// A connection just accepted, counted in its worker's registry.
pub(crate) struct Accepted {
    pub(crate) registration: Registration,
    /// Nonblocking, and not yet in the event loop: a driver registers it when it wants
    /// ([`TcpStream::from_std`], or lazily with [`crate::transport::LazyTcp`]).
    pub(crate) tcp: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    /// Set when the connection came from the TLS listener: its handshake is still to run.
    pub(crate) tls: Option<TlsAcceptor>,
}

/// HTTP/1.1 connections around the worker's service.
struct HttpAccept<S>(Rc<crate::http1::Http<S>>);

impl<S: Service> Accept for HttpAccept<S> {
    fn spawn(&mut self, conn: Accepted, worker: &Rc<Worker>, cfg: &Rc<Config>) {
        let (svc, worker, cfg) = (self.0.clone(), worker.clone(), cfg.clone());
        if cfg.proxy_protocol.is_some() {
            tokio::task::spawn_local(serve_proxied(conn, svc, worker, cfg));
            return;
        }
        let Accepted {
            registration,
            tcp,
            peer,
            tls,
        } = conn;
        match tls {
            None => {
                let sniff_h2 = cfg.http2.is_some();
                tokio::task::spawn_local(crate::http1::serve(
                    registration,
                    LazyTcp::new(tcp),
                    peer,
                    svc,
                    worker,
                    cfg,
                    sniff_h2,
                ))
            }
            Some(acceptor) => {
                // A handshake waits on the peer from the start: no point in waiting to register.
                let Some(tcp) = in_event_loop(tcp, peer) else {
                    return;
                };
                tokio::task::spawn_local(crate::http1::serve_tls(
                    registration,
                    tcp,
                    peer,
                    acceptor,
                    svc,
                    worker,
                    cfg,
                ))
            }
        };
    }
}

/// A connection behind a load balancer: its PROXY header first, then HTTP (over TLS when it
/// came from the TLS listener) with the client the header names as its peer.
async fn serve_proxied<S: Service>(
    conn: Accepted,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
) {
    let Accepted {
        registration,
        tcp,
        peer,
        tls,
    } = conn;
    let Some(mut tcp) = in_event_loop(tcp, peer) else {
        return;
    };
    let Some(peer) = crate::proxy::client_of(&mut tcp, peer, &cfg, &worker).await else {
        return;
    };
    match tls {
        None => {
            let sniff_h2 = cfg.http2.is_some();
            crate::http1::serve(registration, tcp, peer, svc, worker, cfg, sniff_h2).await;
        }
        Some(acceptor) => {
            crate::http1::serve_tls(registration, tcp, peer, acceptor, svc, worker, cfg).await;
        }
    }
}

fn run_worker<A, F>(
    index: usize,
    listener: Listeners,
    config: Config,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    factory: F,
) -> io::Result<()>
where
    A: Accept,
    F: FnOnce(usize) -> A + 'static,
{
    if config.pin_workers {
        pin_to_cpu(index);
    }
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    let hooks = config.park_hooks.clone();
    if hooks.is_some() || config.coalesce.is_some() {
        let (before, after) = hooks
            .map(|h| (Some(h.before_park), Some(h.after_unpark)))
            .unwrap_or((None, None));
        let coalesce = config.coalesce.map(crate::worker::Coalesce::new);
        builder
            .on_thread_park(move || {
                if let Some(f) = &before {
                    f();
                }
                if let Some(c) = &coalesce {
                    c.before_park();
                }
            })
            .on_thread_unpark(move || {
                if let Some(c) = &coalesce {
                    c.after_unpark();
                }
                if let Some(f) = &after {
                    f();
                }
            });
    }
    let rt = builder.build()?;
    let local = tokio::task::LocalSet::new();
    // The accept loop runs as a task of its own: `block_on`'s future is polled every time the
    // worker wakes up, so it only looks at a cell the loop fills when it ends (or unwinds).
    let outcome = Rc::new(Outcome::default());
    local.block_on(&rt, async move {
        let guard = OutcomeGuard(outcome.clone());
        tokio::task::spawn_local(async move {
            let result = accept_loop(index, listener, config, shutdown, stats, factory).await;
            guard.0.set(result);
        });
        poll_fn(|cx| outcome.poll(cx)).await
    })
}

/// How a worker's accept loop ended, and who waits for it.
#[derive(Default)]
struct Outcome {
    result: RefCell<Option<io::Result<()>>>,
    waiter: RefCell<Option<Waker>>,
}

impl Outcome {
    fn set(&self, result: io::Result<()>) {
        self.result.borrow_mut().get_or_insert(result);
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(result) = self.result.borrow_mut().take() {
            return Poll::Ready(result);
        }
        let mut waiter = self.waiter.borrow_mut();
        if !waiter.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waiter = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Reports a panic of the accept loop: its task drops the guard without a result set.
struct OutcomeGuard(Rc<Outcome>);

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        self.0.set(Err(io::Error::other("accept loop panicked")));
    }
}

/// Accepts connections and spawns a task for each until shutdown, then drains them.
async fn accept_loop<A, F>(
    index: usize,
    listeners: Listeners,
    config: Config,
    mut shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    factory: F,
) -> io::Result<()>
where
    A: Accept,
    F: FnOnce(usize) -> A,
{
    let listener = Listener::new(listeners.plain)?;
    let tls = match (listeners.tls, config.tls.as_ref()) {
        (Some(l), Some(t)) => Some((Listener::new(l)?, t.acceptor.clone())),
        _ => None,
    };
    let worker = Rc::new(Worker::new(stats));
    let mut accept = factory(index);
    let cfg = Rc::new(config);
    // One summary of the client faults for the whole server, from the first worker.
    let summary = (index == 0 && !cfg.fault_log_interval.is_zero()).then(|| {
        tokio::task::spawn_local(summarize_faults(
            worker.stats().clone(),
            cfg.fault_log_interval,
        ))
    });
    let ticker = {
        let worker = worker.clone();
        tokio::task::spawn_local(async move {
            let mut every = tokio::time::interval(crate::worker::TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                worker.tick();
            }
        })
    };
    loop {
        while worker.live() >= cfg.max_connections {
            // At capacity: leave new connections in the kernel's backlog.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = shutdown.changed() => break,
            }
        }
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((io, peer)) => {
                    let registration = Registration { id: worker.register(), worker: worker.clone() };
                    accept.spawn(Accepted { registration, tcp: io, peer, tls: None }, &worker, &cfg);
                }
                Err(e) => accept_failed(e).await,
            },
            accepted = accept_tls(tls.as_ref()) => match accepted {
                Ok((io, peer, acceptor)) => {
                    let registration = Registration { id: worker.register(), worker: worker.clone() };
                    accept.spawn(Accepted { registration, tcp: io, peer, tls: Some(acceptor) }, &worker, &cfg);
                }
                Err(e) => accept_failed(e).await,
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    drop(tls);
    worker.drain();
    let deadline = tokio::time::Instant::from_std(crate::worker::later(
        std::time::Instant::now(),
        cfg.drain_timeout,
    ));
    while worker.live() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if worker.live() > 0 {
        tracing::warn!(
            worker = index,
            open = worker.live(),
            "drain timeout: closing remaining connections"
        );
    }
    ticker.abort();
    if let Some(summary) = summary {
        summary.abort();
    }
    Ok(())
}

/// Accepts on the TLS listener, if there is one; never completes otherwise.
async fn accept_tls(
    tls: Option<&(Listener, TlsAcceptor)>,
) -> io::Result<(std::net::TcpStream, SocketAddr, TlsAcceptor)> {
    match tls {
        Some((listener, acceptor)) => {
            let (io, peer) = listener.accept().await?;
            Ok((io, peer, acceptor.clone()))
        }
        None => std::future::pending().await,
    }
}

/// A listening socket in the event loop. The sockets it accepts are not put there: each
/// connection's driver registers its own when it needs to wait on it, which a connection
/// answered in one go never does.
struct Listener(AsyncFd<StdListener>);

impl Listener {
    fn new(listener: StdListener) -> io::Result<Listener> {
        listener.set_nonblocking(true)?;
        // SAFETY: a `TcpListener` owns its descriptor, which stays open and the same until
        // the `AsyncFd` that owns the listener is dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(listener, tokio::io::Interest::READABLE) };
        Ok(Listener(fd.map_err(io::Error::from)?))
    }

    /// The next connection, nonblocking and close-on-exec, with its peer's address.
    async fn accept(&self) -> io::Result<(std::net::TcpStream, SocketAddr)> {
        loop {
            let mut ready = self.0.readable().await?;
            if let Ok(accepted) = ready.try_io(|l| accept4(l.get_ref())) {
                return accepted;
            }
            // Would block: the readiness was cleared; wait for the next.
        }
    }
}

/// One `accept4(2)`, the socket nonblocking from the start (no second system call for it).
fn accept4(listener: &StdListener) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    let fd = listener.as_raw_fd();
    // SAFETY: `try_init` hands over a zeroed `sockaddr_storage` and its length, which is what
    // `accept4` fills in (never beyond the length it is given).
    let (conn, addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let conn = libc::accept4(
                fd,
                storage.cast(),
                len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            );
            if conn < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(conn)
            }
        })
    }?;
    // SAFETY: `accept4` returned a new descriptor, owned by nobody else.
    let conn = unsafe { std::net::TcpStream::from_raw_fd(conn) };
    let peer = addr
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted a socket that is not TCP/IP"))?;
    Ok((conn, peer))
}

/// Registers an accepted socket with the event loop, for drivers that wait on it from the
/// start; `None` (the socket closed, a debug line) when the event loop refuses it.
pub(crate) fn in_event_loop(tcp: std::net::TcpStream, peer: SocketAddr) -> Option<TcpStream> {
    match TcpStream::from_std(tcp) {
        Ok(tcp) => Some(tcp),
        Err(e) => {
            tracing::debug!(%peer, error = %e, "cannot register the connection");
            None
        }
    }
}

/// EMFILE and friends: back off instead of spinning.
async fn accept_failed(e: io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: `cpu_set_t` is plain data; zeroed is a valid empty set, CPU_SET writes within it
    // (it ignores indices beyond the set's size) and sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(cpu, "could not pin worker");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// The listener sets TCP_NODELAY once and the accept loop relies on accepted sockets
    /// inheriting it (as Linux does): a small response must not wait for the client's ACK.
    #[test]
    fn accepted_sockets_inherit_nodelay() {
        let listener = super::listen("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        listener.set_nonblocking(false).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(accepted.nodelay().unwrap());
        // And it is the listener's doing: a listener without it gives sockets without it.
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(plain.local_addr().unwrap()).unwrap();
        let (accepted, _) = plain.accept().unwrap();
        assert!(!accepted.nodelay().unwrap());
    }
}
