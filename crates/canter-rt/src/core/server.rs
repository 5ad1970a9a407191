//! Thread-per-core serving: one event loop per worker thread, each with its own SO_REUSEPORT
//! listener, so accepted connections never cross threads.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use std::os::fd::{AsRawFd, FromRawFd};
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::core::config::Config;
use crate::core::stats::Stats;
#[cfg(feature = "tls")]
use crate::core::tls::TlsAcceptor;

/// What hands a connection from the TLS listener its handshake; none without the `tls`
/// feature (there is no TLS listener then, and `Option<Acceptor>` is always `None`).
#[cfg(feature = "tls")]
pub(crate) type Acceptor = TlsAcceptor;
/// What hands a connection from the TLS listener its handshake; none without the `tls`
/// feature (there is no TLS listener then, and `Option<Acceptor>` is always `None`).
#[cfg(not(feature = "tls"))]
pub(crate) type Acceptor = std::convert::Infallible;
use crate::core::worker::{Registration, Worker};

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

/// A bound server, ready to [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    config: Config,
    listeners: Vec<StdListener>,
    local_addr: SocketAddr,
    tls_listeners: Vec<StdListener>,
    tls_local_addr: Option<SocketAddr>,
    /// One UDP socket per worker on the TLS port, and what their QUIC endpoints share.
    #[cfg(feature = "http3")]
    quic: Option<(Vec<std::net::UdpSocket>, crate::quic::endpoint::Setup)>,
    shutdown: ShutdownHandle,
    rx: watch::Receiver<bool>,
    stats: Arc<Stats>,
}

impl Server {
    /// Binds one SO_REUSEPORT listener per worker. An address another process listens on is
    /// refused with `AddrInUse` unless [`Config::reuse_port`] allows sharing it.
    pub fn bind(config: Config) -> io::Result<Server> {
        let workers = config.workers;
        if !config.reuse_port {
            ensure_unused(config.addr)?;
        }
        let first = listen(config.addr, config.backlog)?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..workers {
            listeners.push(listen(local_addr, config.backlog)?);
        }
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut tls_listeners = Vec::new();
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut tls_local_addr = None;
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            if !config.reuse_port {
                ensure_unused(tls.addr)?;
            }
            let first = listen(tls.addr, config.backlog)?;
            let addr = first.local_addr()?;
            tls_listeners.push(first);
            for _ in 1..workers {
                tls_listeners.push(listen(addr, config.backlog)?);
            }
            tls_local_addr = Some(addr);
        }
        #[cfg(feature = "http3")]
        let quic = match tls_local_addr.filter(|_| config.http3) {
            Some(addr) => {
                let setup = crate::quic::endpoint::Setup::new(&config, workers)?;
                let sockets = (0..workers)
                    .map(|_| crate::quic::endpoint::bind(addr))
                    .collect::<io::Result<Vec<_>>>()?;
                Some((sockets, setup))
            }
            None => None,
        };
        let (tx, rx) = watch::channel(false);
        Ok(Server {
            config,
            listeners,
            local_addr,
            tls_listeners,
            tls_local_addr,
            #[cfg(feature = "http3")]
            quic,
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

    /// Sets `TCP_DEFER_ACCEPT` on every listener when [`Config::defer_accept`] says so: HTTP
    /// clients speak first.
    pub(crate) fn defer_http_accepts(&self) -> io::Result<()> {
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

    /// Runs the server's single worker on the calling thread until shutdown, serving its
    /// connections with `factory(0)` (see [`Server::serve_inline`]). Fails if
    /// [`Config::workers`] is not 1.
    pub(crate) fn run_inline<A, F>(mut self, factory: F) -> io::Result<()>
    where
        A: Accept,
        F: FnOnce(usize) -> A + 'static,
    {
        if self.listeners.len() != 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "serve_inline runs one worker: set Config::workers to 1",
            ));
        }
        let mut all = self.split_listeners();
        let listeners = all.remove(0);
        run_worker(0, listeners, self.config, self.rx, self.stats, factory)
    }

    /// The settings the server was bound with.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// Runs worker `i` on a thread of its own for each listener, each serving its accepted
    /// connections with `factory(i)`, until shutdown; blocks the calling thread.
    pub(crate) fn run<A, F>(self, factory: F) -> io::Result<()>
    where
        A: Accept,
        F: Fn(usize) -> A + Send + Sync + 'static,
    {
        let factory = Arc::new(factory);
        let mut threads = Vec::new();
        let mut this = self;
        for (i, listeners) in this.split_listeners().into_iter().enumerate() {
            let factory = factory.clone();
            let config = this.config.clone();
            let rx = this.rx.clone();
            let stats = this.stats.clone();
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

/// One worker's share of a bound [`Server`] (its listeners, the configuration, the shutdown
/// signal, the counters), from [`Server::into_workers`]: for a program that runs its own worker
/// threads ([`spawn_worker`]) with more on each than one server's connections, as the stream
/// pipelines do (one server per source, all on the pipeline's workers). Serve it with
/// [`ServerWorker::serve_protocol`] on the worker's thread.
#[derive(Debug)]
pub struct ServerWorker {
    index: usize,
    listeners: Listeners,
    config: Config,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
}

impl ServerWorker {
    /// Which worker this is (its listener's position; the CPU it is pinned to).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Accepts and serves with `factory`'s [`Accept`] until shutdown, then drains: the accept
    /// loop of [`Server::serve`], on the calling thread's event loop.
    pub(crate) async fn run<A, F>(self, factory: F) -> io::Result<()>
    where
        A: Accept,
        F: FnOnce(usize) -> A,
    {
        let ServerWorker {
            index,
            listeners,
            config,
            shutdown,
            stats,
        } = self;
        accept_loop(index, listeners, config, shutdown, stats, factory).await
    }
}

impl Server {
    /// The server's workers, one per listener, to run on threads the caller owns; the server's
    /// [`ShutdownHandle`] (take it first) still stops them all.
    pub fn into_workers(mut self) -> Vec<ServerWorker> {
        self.split_listeners()
            .into_iter()
            .enumerate()
            .map(|(index, listeners)| ServerWorker {
                index,
                listeners,
                config: self.config.clone(),
                shutdown: self.rx.clone(),
                stats: self.stats.clone(),
            })
            .collect()
    }
}

impl Server {
    /// Each worker's sockets, worker 0's first (the server keeps none).
    fn split_listeners(&mut self) -> Vec<Listeners> {
        let mut tls = std::mem::take(&mut self.tls_listeners).into_iter();
        #[cfg(feature = "http3")]
        let (mut udp, setup) = match self.quic.take() {
            Some((sockets, setup)) => (sockets.into_iter(), Some(setup)),
            None => (Vec::new().into_iter(), None),
        };
        std::mem::take(&mut self.listeners)
            .into_iter()
            .map(|plain| Listeners {
                plain,
                tls: tls.next(),
                #[cfg(feature = "http3")]
                quic: udp.next().zip(setup.clone()),
            })
            .collect()
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

/// Makes the allocator give every block of 1 MiB or more a mapping of its own, returned to
/// the system when freed (glibc's malloc; elsewhere nothing is done), for the whole process.
/// By default glibc raises that threshold to the size of each large block freed, after which
/// blocks of up to 32 MiB come from its heaps and stay there once freed: a server that once
/// assembled a few 16 MiB WebSocket messages or request bodies kept that memory for good (124
/// MiB where it started at 10). For servers of requests and messages, where blocks that large
/// are rare and each costs its page faults anyway (`canter serve` and the Python server call
/// it); not for a program that allocates and frees large buffers at a high rate (a stream
/// pipeline's batches), which would pay a mapping and its page faults for each.
pub fn map_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes a setting of the allocator; it takes no pointer.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK);
            }
        });
    }
}

/// See [`map_large_blocks`]: 1 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const LARGE_BLOCK: libc::c_int = 1 << 20;

/// Fails with `AddrInUse` when another socket listens on `addr` (port 0 asks for a free port:
/// nothing to check). The check binds a socket without SO_REUSEPORT, which the kernel refuses
/// beside any listener on the address, with or without it; SO_REUSEADDR keeps connections in
/// TIME_WAIT from counting. The socket is closed at once: the listeners bind just after.
pub fn ensure_unused(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into()).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{addr}: address in use (another process listens on it; to share the port \
                     on purpose, for a hand-over, allow it with reuse_port)"
                ),
            )
        } else {
            e
        }
    })
}

/// A worker's listening sockets.
#[derive(Debug)]
struct Listeners {
    plain: StdListener,
    tls: Option<StdListener>,
    /// The worker's UDP socket for QUIC, and the endpoint settings every worker shares.
    #[cfg(feature = "http3")]
    quic: Option<(std::net::UdpSocket, crate::quic::endpoint::Setup)>,
}

/// What a worker does with each accepted connection: drive HTTP/1.1 around a service, or a
/// custom protocol. Runs on the worker's thread.
pub(crate) trait Accept: 'static {
    /// Spawns the connection's task on the current worker.
    fn spawn(&mut self, conn: Accepted, worker: &Rc<Worker>, cfg: &Rc<Config>);

    /// Spawns the task of a QUIC connection just accepted; one that serves no QUIC protocol
    /// drops it, which closes it.
    #[cfg(feature = "http3")]
    fn spawn_quic(
        &mut self,
        registration: Registration,
        link: crate::quic::endpoint::QuicLink,
        worker: &Rc<Worker>,
        cfg: &Rc<Config>,
    ) {
        let _ = (registration, link, worker, cfg);
    }
}

/// A connection just accepted, counted in its worker's registry.
pub(crate) struct Accepted {
    pub(crate) registration: Registration,
    /// Nonblocking, and not yet in the event loop: a driver registers it when it wants
    /// ([`TcpStream::from_std`], or lazily with [`crate::core::transport::LazyTcp`]).
    pub(crate) tcp: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    /// Set when the connection came from the TLS listener: its handshake is still to run.
    pub(crate) tls: Option<Acceptor>,
}

fn run_worker<A, F>(
    index: usize,
    listeners: Listeners,
    config: Config,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    factory: F,
) -> io::Result<()>
where
    A: Accept,
    F: FnOnce(usize) -> A + 'static,
{
    let worker = config.clone();
    run_here(index, &worker, move || {
        accept_loop(index, listeners, config, shutdown, stats, factory)
    })
}

/// Runs `main` on a new thread named `name`, as worker `index` of `config` (see
/// [`run_here`]); the thread's result is `main`'s. What the server's workers run on, and what
/// any other set of workers (the stream pipelines') runs on, so that pinning, park hooks and
/// event coalescing are one code.
pub fn spawn_worker<F, Fut>(
    index: usize,
    config: &Config,
    name: String,
    main: F,
) -> io::Result<thread::JoinHandle<io::Result<()>>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = io::Result<()>> + 'static,
{
    let config = config.clone();
    thread::Builder::new()
        .name(name)
        .spawn(move || run_here(index, &config, main))
}

/// Runs `main` (made on this thread) to its end as worker `index` of `config`, on the calling
/// thread: pinned to CPU `index` when [`Config::pin_workers`] says so, on a current-thread
/// event loop with [`Config::park_hooks`] and [`Config::coalesce`], inside a `LocalSet` (so
/// `main` and what it spawns may hold `Rc`s).
pub fn run_here<F, Fut>(index: usize, config: &Config, main: F) -> io::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = io::Result<()>> + 'static,
{
    if config.pin_workers {
        if let Err(e) = pin_to_cpu(index) {
            tracing::warn!(cpu = index, error = %e, "could not pin worker");
        }
    }
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    let hooks = config.park_hooks.clone();
    if hooks.is_some() || config.coalesce.is_some() {
        let (before, after) = hooks
            .map(|h| (Some(h.before_park), Some(h.after_unpark)))
            .unwrap_or((None, None));
        let coalesce = config.coalesce.map(crate::core::worker::Coalesce::new);
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
    // `main` runs as a task of its own: `block_on`'s future is polled every time the worker
    // wakes up, so it only looks at a cell the task fills when it ends (or unwinds).
    let outcome = Rc::new(Outcome::default());
    local.block_on(&rt, async move {
        let guard = OutcomeGuard(outcome.clone());
        let main = main();
        tokio::task::spawn_local(async move {
            let result = main.await;
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
        self.0
            .set(Err(io::Error::other("worker's main task panicked")));
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
    #[cfg(feature = "tls")]
    let tls = match (listeners.tls, config.tls.as_ref()) {
        (Some(l), Some(t)) => Some((Listener::new(l)?, t.acceptor.clone())),
        _ => None,
    };
    #[cfg(not(feature = "tls"))]
    let tls: Option<(Listener, Acceptor)> = {
        drop(listeners.tls);
        None
    };
    crate::core::worker::count_faults_into(stats.clone());
    let worker = Rc::new(Worker::new(stats));
    worker.allow_spawns();
    #[cfg(feature = "http3")]
    let quic = match listeners.quic {
        Some((socket, setup)) => {
            let ep = crate::quic::endpoint::Endpoint::new(socket, &setup, index, worker.clone())?;
            let task = tokio::task::spawn_local(crate::quic::endpoint::run(ep.clone()));
            Some((ep, task))
        }
        None => None,
    };
    #[cfg(not(feature = "http3"))]
    let quic: Option<(std::convert::Infallible, ())> = None;
    let mut accept = factory(index);
    let cfg = Rc::new(config);
    // One summary of the client faults for the whole server, from the first worker.
    let summary = (index == 0 && !cfg.fault_log_interval.is_zero()).then(|| {
        tokio::task::spawn_local(crate::core::stats::summarize_faults(
            worker.stats().clone(),
            cfg.fault_log_interval,
        ))
    });
    let ticker = {
        let worker = worker.clone();
        tokio::task::spawn_local(async move {
            let mut every = tokio::time::interval(crate::core::worker::TICK);
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
            link = accept_quic(quic.as_ref().map(|q| &q.0)) => {
                #[cfg(feature = "http3")]
                {
                    let registration = Registration { id: worker.register(), worker: worker.clone() };
                    accept.spawn_quic(registration, link, &worker, &cfg);
                }
                #[cfg(not(feature = "http3"))]
                match link {}
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    drop(tls);
    worker.drain();
    let deadline = tokio::time::Instant::from_std(crate::core::worker::later(
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
    // The endpoint routed the draining connections' packets until now.
    #[cfg(feature = "http3")]
    if let Some((_, task)) = quic {
        task.abort();
    }
    ticker.abort();
    if let Some(summary) = summary {
        summary.abort();
    }
    Ok(())
}

/// The next QUIC connection, if the worker has an endpoint; never completes otherwise.
#[cfg(feature = "http3")]
async fn accept_quic(
    ep: Option<&Rc<crate::quic::endpoint::Endpoint>>,
) -> crate::quic::endpoint::QuicLink {
    match ep {
        Some(ep) => ep.accept().await,
        None => std::future::pending().await,
    }
}

/// Without the `http3` feature there is no QUIC endpoint.
#[cfg(not(feature = "http3"))]
async fn accept_quic(_ep: Option<&std::convert::Infallible>) -> std::convert::Infallible {
    std::future::pending().await
}

/// Accepts on the TLS listener, if there is one; never completes otherwise.
#[cfg_attr(not(feature = "tls"), allow(clippy::clone_on_copy))]
async fn accept_tls(
    tls: Option<&(Listener, Acceptor)>,
) -> io::Result<(std::net::TcpStream, SocketAddr, Acceptor)> {
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

/// Pins the calling thread to CPU `cpu` (what [`Config::pin_workers`] does for each worker,
/// for a program that runs threads of its own: the stream pipelines' workers).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is plain data; zeroed is a valid empty set, CPU_SET writes within it
    // (it ignores indices beyond the set's size) and sched_setaffinity only reads it, for the
    // calling thread (pid 0).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    match set {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
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
