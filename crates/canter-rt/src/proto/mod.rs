//! Custom protocols on the connection actor: "the connection is the actor, the protocol is a
//! value it owns".
//!
//! A [`Protocol`] is sans-IO: it never sees a socket or a clock. The actor ([`run`], or
//! [`Server::serve_protocol`](crate::Server::serve_protocol) for accepted connections) owns the
//! transport, reads into its input buffer and calls the protocol with what arrived; the protocol
//! answers through [`Conn`]: [`Conn::send`] (accepted or refused, never queued without bound),
//! [`Conn::mute`]/[`Conn::unmute`], one timer, [`Conn::close`] and [`Conn::start_tls`]. What every
//! protocol gets from the actor, from one place:
//!
//! - **Backpressure.** Output above the high-water mark refuses further sends and stops reading;
//!   once the peer has taken it down to the low-water mark, [`Protocol::on_writable`] says so.
//! - **A read budget per turn**, after which the connection yields to the worker's others.
//! - **Timeouts**: the protocol's own timer, and the write timeout (a peer that stops reading).
//! - **Buffers released while idle**, to the worker's pool.
//! - **Graceful shutdown**: [`Protocol::on_shutdown`] when the server drains.
//! - **The transport underneath**: plain TCP or TLS, and the upgrade from one to the other.
//!
//! Calls happen in this order: [`Protocol::on_open`] once, then any of the event calls, then
//! [`Protocol::on_close`] once. Everything a call sends leaves after it returns, batched with
//! whatever else was sent in the same turn.
//!
//! ```no_run
//! use bytes::BytesMut;
//! use canter_rt::proto::{Conn, Protocol};
//! use canter_rt::{Config, Server};
//!
//! /// Echoes every byte back.
//! struct Echo;
//!
//! impl Protocol for Echo {
//!     fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
//!         if conn.send(input.split().freeze()).is_err() {
//!             conn.mute(); // the peer is slow: stop reading until it catches up
//!         }
//!     }
//!     fn on_writable(&mut self, conn: &mut Conn<'_>) {
//!         conn.unmute();
//!     }
//! }
//!
//! Server::bind(Config::default())?.serve_protocol(|_worker| |_peer| Echo)?;
//! # Ok::<(), std::io::Error>(())
//! ```

pub mod framing;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::{Instant, Sleep};

use canter_http::ConfigError;

use crate::core::config::Config;
use crate::core::link::{Ending, Link};
use crate::core::server::{Accept, Accepted, Server};
#[cfg(feature = "tls")]
use crate::core::tls::{ClientTls, TlsAcceptor};
use crate::core::transport::{Stream, Transport};
use crate::core::worker::{Worker, READ_BUF};

/// A protocol driven by the connection actor. Only [`Protocol::on_data`] is required.
pub trait Protocol: 'static {
    /// The connection is up (after the TLS handshake, on a TLS listener). Called once, first.
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// Bytes arrived. `input` holds everything received and not yet consumed: take what forms
    /// complete messages (`split_to`, `advance`) and leave the rest, which is handed back with
    /// the next bytes. While muted, nothing new arrives; after [`Conn::unmute`] what was left
    /// is handed back at once.
    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut);

    /// The peer ended its sending side. The default closes the connection (after sending what
    /// is queued); a protocol that still has answers to give can send them and close later.
    fn on_eof(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    /// After a refused [`Conn::send`], the peer has taken the output down to the low-water
    /// mark: sending is possible again.
    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The timer set with [`Conn::set_timer`] expired.
    fn on_timer(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// Somebody called [`Handle::wake`] (another task of this worker with something for the
    /// connection).
    fn on_wake(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The upgrade asked for with [`Conn::start_tls`] completed: what is sent from now on is
    /// encrypted. (A failed upgrade closes the connection with [`Close::Tls`] instead.)
    fn on_tls(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The server is shutting down gracefully. The default closes the connection after what is
    /// queued; a protocol may finish its current exchange first (the drain timeout bounds it).
    fn on_shutdown(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    /// The connection is gone; `why` says how. Called once, last.
    fn on_close(&mut self, why: &Close) {
        let _ = why;
    }
}

/// How a connection ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Close {
    /// The protocol closed it ([`Conn::close`]), after sending what was queued.
    Local,
    /// The peer closed the connection and the protocol closed its side ([`Protocol::on_eof`]).
    PeerClosed,
    /// The peer stopped taking output for longer than the write timeout.
    WriteTimeout,
    /// The input buffer grew past [`Settings::max_input`] without the protocol consuming it.
    InputLimit,
    /// A [`Conn::start_tls`] was refused or its handshake failed.
    Tls(StartTlsError),
    /// The socket failed (reset, broken pipe, a TLS error from the peer).
    Io(io::Error),
}

impl fmt::Display for Close {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Close::Local => f.write_str("closed"),
            Close::PeerClosed => f.write_str("closed by the peer"),
            Close::WriteTimeout => f.write_str("write timed out"),
            Close::InputLimit => f.write_str("input buffer limit reached"),
            Close::Tls(e) => write!(f, "TLS upgrade failed: {e}"),
            Close::Io(e) => write!(f, "connection error: {e}"),
        }
    }
}

/// Why [`Conn::start_tls`] did not upgrade the connection.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartTlsError {
    /// Bytes that arrived after the upgrade command were already buffered: they came before the
    /// handshake and would be taken as part of the protected stream (the STARTTLS injection
    /// class, CVE-2021-23222), so the connection is refused.
    PlaintextBuffered,
    /// What was sent before the upgrade could not all be written out first.
    WritesPending,
    /// The connection is already encrypted.
    AlreadyTls,
    /// This transport cannot be upgraded (an in-memory test pipe).
    Unsupported,
    /// The handshake failed or timed out.
    Handshake(io::Error),
}

impl fmt::Display for StartTlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartTlsError::PlaintextBuffered => {
                f.write_str("plaintext received after the upgrade command")
            }
            StartTlsError::WritesPending => f.write_str("earlier output not yet written"),
            StartTlsError::AlreadyTls => f.write_str("already TLS"),
            StartTlsError::Unsupported => f.write_str("transport cannot be upgraded"),
            StartTlsError::Handshake(e) => write!(f, "handshake: {e}"),
        }
    }
}

impl std::error::Error for StartTlsError {}

/// Which side of the handshake [`Conn::start_tls`] plays.
#[cfg(feature = "tls")]
#[derive(Debug, Clone)]
pub enum TlsUpgrade {
    /// Server side, with these certificates and settings.
    Server(TlsAcceptor),
    /// Client side, verifying the server as `tls` says and sending `server_name` (SNI).
    Client {
        /// Verification and ALPN settings.
        tls: ClientTls,
        /// The name the certificate must be valid for.
        server_name: String,
    },
}

/// Which side of the handshake [`Conn::start_tls`] plays: neither without the `tls` feature,
/// so no upgrade can be asked for.
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub enum TlsUpgrade {}

/// A transport whose connection can be upgraded to TLS in place.
pub trait StartTls: Transport + Sized {
    /// Whether the connection is encrypted already.
    fn is_tls(&self) -> bool;

    /// Runs the handshake over this connection and returns the encrypted transport.
    fn start_tls(
        self,
        how: TlsUpgrade,
    ) -> impl Future<Output = Result<Self, StartTlsError>> + 'static;
}

impl StartTls for Stream {
    fn is_tls(&self) -> bool {
        Stream::is_tls(self)
    }

    #[allow(clippy::manual_async_fn)] // the trait's future must be 'static, spelled out
    fn start_tls(
        self,
        how: TlsUpgrade,
    ) -> impl Future<Output = Result<Self, StartTlsError>> + 'static {
        #[cfg(not(feature = "tls"))]
        return async move {
            let _ = self;
            match how {}
        };
        #[cfg(feature = "tls")]
        async move {
            let tcp = match self {
                Stream::Plain(tcp) => tcp,
                Stream::Tls(_) => return Err(StartTlsError::AlreadyTls),
            };
            let tls = match how {
                TlsUpgrade::Server(acceptor) => acceptor.accept(tcp).await,
                TlsUpgrade::Client { tls, server_name } => {
                    let handshake = tls.connect(&server_name, tcp);
                    match tokio::time::timeout(CLIENT_HANDSHAKE, handshake).await {
                        Ok(r) => r,
                        Err(_) => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "TLS handshake timed out",
                        )),
                    }
                }
            };
            tls.map(|s| Stream::Tls(Box::new(s)))
                .map_err(StartTlsError::Handshake)
        }
    }
}

impl StartTls for tokio::io::DuplexStream {
    fn is_tls(&self) -> bool {
        false
    }

    fn start_tls(
        self,
        _how: TlsUpgrade,
    ) -> impl Future<Output = Result<Self, StartTlsError>> + 'static {
        std::future::ready(Err(StartTlsError::Unsupported))
    }
}

/// How long the client side of a [`Conn::start_tls`] waits for the server.
#[cfg(feature = "tls")]
const CLIENT_HANDSHAKE: Duration = Duration::from_secs(10);

/// The actor's limits for one connection, built with [`Settings::builder`], which checks them
/// (as [`Config::builder`](crate::Config::builder) does); `Settings::default()` suits
/// request/response protocols.
///
/// ```
/// use std::time::Duration;
/// let settings = canter_rt::proto::Settings::builder()
///     .high_water(256 * 1024)
///     .write_timeout(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(settings.low_water(), 64 * 1024);
/// # Ok::<(), canter_rt::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    pub(crate) high_water: usize,
    pub(crate) low_water: usize,
    pub(crate) read_budget: usize,
    pub(crate) write_timeout: Duration,
    pub(crate) max_input: usize,
    pub(crate) read_size: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            high_water: 64 * 1024,
            low_water: 16 * 1024,
            read_budget: 256 * 1024,
            write_timeout: Duration::from_secs(30),
            max_input: 4 * 1024 * 1024,
            read_size: READ_BUF,
        }
    }
}

impl Settings {
    /// A builder starting from the defaults.
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder(Settings::default())
    }

    /// Output bytes at or above which [`Conn::send`] refuses and reading stops.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// Output bytes at or below which a refused sender hears [`Protocol::on_writable`].
    pub fn low_water(&self) -> usize {
        self.low_water
    }

    /// Bytes read before the connection yields to the worker's other connections.
    pub fn read_budget(&self) -> usize {
        self.read_budget
    }

    /// Longest the peer may take no output while some is queued.
    pub fn write_timeout(&self) -> Duration {
        self.write_timeout
    }

    /// Input the protocol may leave unconsumed (a partial message) before the connection is
    /// closed with [`Close::InputLimit`].
    pub fn max_input(&self) -> usize {
        self.max_input
    }

    /// Room made for each read.
    pub fn read_size(&self) -> usize {
        self.read_size
    }

    fn from_config(cfg: &Config) -> Settings {
        // Config's own builder checked these (each at least 1, the timeout above zero).
        Settings {
            high_water: cfg.high_water,
            low_water: cfg.high_water / 4,
            read_budget: cfg.read_budget,
            write_timeout: cfg.timeouts.write(),
            ..Settings::default()
        }
    }
}

/// Builds [`Settings`]; [`SettingsBuilder::build`] checks every value.
#[derive(Debug, Clone)]
pub struct SettingsBuilder(Settings);

impl SettingsBuilder {
    /// The high-water mark; the low-water mark becomes a quarter of it (at least 1 byte).
    pub fn high_water(mut self, bytes: usize) -> Self {
        self.0.high_water = bytes;
        self.0.low_water = bytes / 4;
        self
    }

    /// The read budget per turn (at least 1 byte).
    pub fn read_budget(mut self, bytes: usize) -> Self {
        self.0.read_budget = bytes;
        self
    }

    /// The write timeout (above zero).
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.0.write_timeout = timeout;
        self
    }

    /// The most input left unconsumed (at least 1 byte).
    pub fn max_input(mut self, bytes: usize) -> Self {
        self.0.max_input = bytes;
        self
    }

    /// The room made for each read: the default suits request/response protocols; a streaming
    /// protocol reading megabytes a second takes fewer, larger reads with more (1 KiB to
    /// 16 MiB).
    pub fn read_size(mut self, bytes: usize) -> Self {
        self.0.read_size = bytes;
        self
    }

    /// The settings, or the first one out of its range.
    pub fn build(self) -> Result<Settings, ConfigError> {
        let s = self.0;
        for (value, name) in [
            (s.high_water, "high_water"),
            (s.read_budget, "read_budget"),
            (s.max_input, "max_input"),
        ] {
            if value == 0 {
                return Err(ConfigError::new(name, "must be at least 1"));
            }
        }
        if s.high_water < 4 {
            return Err(ConfigError::new(
                "high_water",
                "must be at least 4 (the low-water mark is a quarter of it)",
            ));
        }
        if s.write_timeout.is_zero() {
            return Err(ConfigError::new("write_timeout", "must be above zero"));
        }
        if !(1024..=16 << 20).contains(&s.read_size) {
            return Err(ConfigError::new("read_size", "must be 1 KiB to 16 MiB"));
        }
        Ok(s)
    }
}

/// What the protocol can do to its connection, during a call.
pub struct Conn<'a> {
    core: &'a mut Core,
}

impl fmt::Debug for Conn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.core.peer)
            .field("queued", &self.core.link.out.len())
            .field("muted", &self.core.muted)
            .field("closing", &self.core.closing)
            .finish_non_exhaustive()
    }
}

/// A refused [`Conn::send`]: the output is at its high-water mark (or the connection is
/// closing). The data is handed back; [`Protocol::on_writable`] says when to try again.
#[derive(Debug)]
pub struct Refused(pub Bytes);

impl<'a> Conn<'a> {
    /// Queues `data` to send, unless the output is at its high-water mark or the connection is
    /// closing. Queued data leaves when the call returns, batched with the rest of the turn.
    pub fn send(&mut self, data: impl Into<Bytes>) -> Result<(), Refused> {
        let data = data.into();
        if !self.can_send() {
            self.core.refused = true;
            return Err(Refused(data));
        }
        self.core.link.prepare_output();
        self.core.link.out.push(data);
        Ok(())
    }

    /// Whether [`Conn::send`] would accept now.
    pub fn can_send(&self) -> bool {
        !self.core.closing && self.core.link.out.len() < self.core.settings.high_water
    }

    /// Asks for [`Protocol::on_writable`] once the output is down to the low-water mark (as a
    /// refused [`Conn::send`] does).
    pub fn notify_writable(&mut self) {
        self.core.refused = true;
    }

    /// Output queued and not yet written.
    pub fn queued(&self) -> usize {
        self.core.link.out.len()
    }

    /// Stops reading: [`Protocol::on_data`] is not called until [`Conn::unmute`].
    pub fn mute(&mut self) {
        self.core.muted = true;
    }

    /// Reads again; input left over from before is handed to [`Protocol::on_data`] at once.
    pub fn unmute(&mut self) {
        if self.core.muted {
            self.core.muted = false;
            self.core.redeliver = true;
        }
    }

    /// Whether reading is stopped.
    pub fn is_muted(&self) -> bool {
        self.core.muted
    }

    /// Calls [`Protocol::on_timer`] after `after` (replacing any timer set before).
    pub fn set_timer(&mut self, after: Duration) {
        self.core.timer = Some(Instant::now() + after);
    }

    /// Cancels the timer.
    pub fn cancel_timer(&mut self) {
        self.core.timer = None;
    }

    /// Closes the connection once what is queued has been written.
    pub fn close(&mut self) {
        self.core.closing = true;
    }

    /// Whether [`Conn::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.core.closing
    }

    /// Upgrades the connection to TLS when the current call returns: what was sent before goes
    /// out in plaintext first, then the handshake runs, then [`Protocol::on_tls`]. Refused (and
    /// the connection closed with [`Close::Tls`]) if input is left over after the upgrade
    /// command (it would have been injected before the handshake) or if the earlier output
    /// cannot be written at once.
    pub fn start_tls(&mut self, how: TlsUpgrade) {
        self.core.upgrade = Some(how);
    }

    /// Whether a [`Conn::start_tls`] is waiting for the current call to return. A protocol
    /// that handles several messages per call stops at the upgrade command: whatever follows
    /// it in the input must not be read as plaintext (it makes the upgrade refused).
    pub fn is_upgrading(&self) -> bool {
        self.core.upgrade.is_some()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.core.peer
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.core.tls
    }

    /// A handle through which other tasks of this worker can wake the connection
    /// ([`Protocol::on_wake`]).
    pub fn handle(&self) -> Handle {
        Handle {
            cell: self.core.wake.clone(),
        }
    }
}

/// Wakes a connection from another task of the same worker (same thread).
#[derive(Clone)]
pub struct Handle {
    cell: Rc<WakeCell>,
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("closed", &self.cell.closed.get())
            .finish()
    }
}

impl Handle {
    /// Calls [`Protocol::on_wake`] on the connection's next turn (once, however often this is
    /// called before then).
    pub fn wake(&self) {
        self.cell.woken.set(true);
        if let Some(w) = self.cell.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Whether the connection has closed.
    pub fn is_closed(&self) -> bool {
        self.cell.closed.get()
    }
}

#[derive(Default)]
struct WakeCell {
    woken: Cell<bool>,
    closed: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The actor's state that the protocol reaches through [`Conn`].
struct Core {
    /// The input, the output and the worker: what every protocol's connection has. The input
    /// is handed to [`Protocol::on_data`] beside the `Conn`, not through it.
    link: Link,
    settings: Settings,
    peer: SocketAddr,
    tls: bool,
    muted: bool,
    closing: bool,
    /// A send was refused: say when the output is down to the low-water mark.
    refused: bool,
    /// Hand the leftover input to the protocol again (after an unmute).
    redeliver: bool,
    timer: Option<Instant>,
    upgrade: Option<TlsUpgrade>,
    wake: Rc<WakeCell>,
}

/// What woke the actor.
enum Event {
    Data,
    Eof,
    Writable,
    Timer,
    Wake,
    Shutdown,
    Yield,
    /// Closing, and everything queued is written.
    Flushed,
    Failed(Close),
}

/// Runs `protocol` on a connected transport (accepted or from [`crate::connect`]) until the
/// connection closes; returns how it closed (after [`Protocol::on_close`]). Runs on the calling
/// task: any tokio runtime, a canter worker or a test's.
pub async fn run<T: StartTls, P: Protocol>(
    io: T,
    peer: SocketAddr,
    protocol: &mut P,
    settings: &Settings,
) -> Close {
    // A worker of its own: the buffer pool and the clock, with nobody to drain it.
    let worker = Rc::new(Worker::new(Arc::default()));
    Actor::new(peer, settings.clone(), worker)
        .run(io, protocol)
        .await
}

impl Server {
    /// Runs the workers with a custom protocol instead of HTTP until shutdown; blocks the
    /// calling thread. `factory(i)` runs once on worker `i`'s thread and returns that worker's
    /// per-connection constructor, called with each accepted peer's address. Connections from the
    /// TLS listener (if configured) complete their handshake before [`Protocol::on_open`].
    ///
    pub fn serve_protocol<P, G, F>(self, factory: F) -> io::Result<()>
    where
        P: Protocol,
        G: FnMut(SocketAddr) -> P + 'static,
        F: Fn(usize) -> G + Send + Sync + 'static,
    {
        self.run(move |i| ProtocolAccept::new(factory(i), None))
    }
}

impl crate::core::server::ServerWorker {
    /// Serves a custom protocol on the calling thread's event loop (a worker run by
    /// [`crate::spawn_worker`] or [`crate::run_here`]) until the server's shutdown, then drains,
    /// as [`Server::serve_protocol`] does on each of its own workers: `make` is called with
    /// each accepted peer's address (after its PROXY protocol header, when the server expects
    /// one). `settings` replaces those derived from the server's [`Config`].
    pub async fn serve_protocol<P, G>(self, settings: Option<Settings>, make: G) -> io::Result<()>
    where
        P: Protocol,
        G: FnMut(SocketAddr) -> P + 'static,
    {
        self.run(move |_| ProtocolAccept::new(make, settings)).await
    }
}

/// Per-worker constructor of protocol connections, behind [`crate::Server::serve_protocol`].
pub(crate) struct ProtocolAccept<G> {
    /// Shared with the connection tasks that call it once they know the peer (after a PROXY
    /// protocol header); called on the worker's thread only, one call at a time.
    make: Rc<RefCell<G>>,
    /// The connections' settings; `None`: derived from the server's [`Config`].
    settings: Option<Settings>,
}

impl<G> ProtocolAccept<G> {
    pub(crate) fn new(make: G, settings: Option<Settings>) -> Self {
        ProtocolAccept {
            make: Rc::new(RefCell::new(make)),
            settings,
        }
    }
}

impl<P: Protocol, G: FnMut(SocketAddr) -> P + 'static> Accept for ProtocolAccept<G> {
    fn spawn(&mut self, conn: Accepted, worker: &Rc<Worker>, cfg: &Rc<Config>) {
        let Accepted {
            registration,
            tcp,
            peer,
            tls,
        } = conn;
        let settings = match &self.settings {
            Some(settings) => settings.clone(),
            None => Settings::from_config(cfg),
        };
        let (worker, cfg, make) = (worker.clone(), cfg.clone(), self.make.clone());
        tokio::task::spawn_local(async move {
            let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
            worker.set_waker(registration.id, waker);
            let Some(mut tcp) = crate::core::server::in_event_loop(tcp, peer) else {
                return;
            };
            // Behind a load balancer the peer is the client its PROXY header names.
            let Some(peer) =
                crate::core::proxy::client_of(&mut tcp, peer, cfg.proxy_protocol.as_ref(), &worker)
                    .await
            else {
                return;
            };
            let mut protocol = (make.borrow_mut())(peer);
            let stream = match tls {
                None => Stream::Plain(tcp),
                #[cfg(not(feature = "tls"))]
                Some(never) => match never {},
                #[cfg(feature = "tls")]
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(s) => Stream::Tls(Box::new(s)),
                    Err(e) => {
                        worker.fault(crate::core::stats::ClientFault::TlsHandshake);
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                },
            };
            let actor = Actor::new(peer, settings, worker);
            let why = actor.run(stream, &mut protocol).await;
            tracing::debug!(%peer, %why, "connection closed");
            drop(registration);
        });
    }
}

struct Actor {
    core: Core,
    eof: bool,
    shutdown_told: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: Option<Instant>,
}

impl Actor {
    fn new(peer: SocketAddr, settings: Settings, worker: Rc<Worker>) -> Actor {
        Actor {
            core: Core {
                link: Link::new(worker, BytesMut::new()),
                settings,
                peer,
                tls: false,
                muted: false,
                closing: false,
                refused: false,
                redeliver: false,
                timer: None,
                upgrade: None,
                wake: Rc::default(),
            },
            eof: false,
            shutdown_told: false,
            sleep: None,
            armed: None,
        }
    }

    async fn run<T: StartTls, P: Protocol>(mut self, io: T, protocol: &mut P) -> Close {
        let why = self.drive(io, protocol).await;
        self.core.wake.closed.set(true);
        self.core.link.release_all();
        protocol.on_close(&why);
        why
    }

    async fn drive<T: StartTls, P: Protocol>(&mut self, mut io: T, protocol: &mut P) -> Close {
        self.core.tls = io.is_tls();
        protocol.on_open(&mut Conn {
            core: &mut self.core,
        });
        loop {
            if let Some(how) = self.core.upgrade.take() {
                io = match self.upgrade(io, how).await {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::debug!(peer = %self.core.peer, error = %e, "TLS upgrade refused or failed");
                        return Close::Tls(e);
                    }
                };
                self.core.tls = true;
                protocol.on_tls(&mut Conn {
                    core: &mut self.core,
                });
                continue;
            }
            let event = poll_fn(|cx| self.poll_event(&mut io, cx)).await;
            if let Event::Data = event {
                // The input is the protocol's to consume during the call; the rest of the
                // connection is reached through `Conn`.
                let mut input = std::mem::take(&mut self.core.link.input);
                protocol.on_data(
                    &mut Conn {
                        core: &mut self.core,
                    },
                    &mut input,
                );
                let over = input.len() >= self.core.settings.max_input;
                self.core.link.input = input;
                if over {
                    tracing::warn!(peer = %self.core.peer, "input buffer limit reached; closing");
                    return Close::InputLimit;
                }
                self.core.link.release_idle();
                continue;
            }
            let conn = &mut Conn {
                core: &mut self.core,
            };
            match event {
                // Handled above, where the input can be lent beside the `Conn`.
                Event::Data => {}
                Event::Eof => protocol.on_eof(conn),
                Event::Writable => protocol.on_writable(conn),
                Event::Timer => protocol.on_timer(conn),
                Event::Wake => protocol.on_wake(conn),
                Event::Shutdown => protocol.on_shutdown(conn),
                Event::Yield => tokio::task::yield_now().await,
                Event::Flushed => {
                    let timeout = self.core.settings.write_timeout;
                    self.core
                        .link
                        .finish(&mut io, timeout, Ending::Shutdown)
                        .await;
                    return if self.eof {
                        Close::PeerClosed
                    } else {
                        Close::Local
                    };
                }
                Event::Failed(why) => return why,
            }
            self.core.link.release_idle();
        }
    }

    /// The checks and the handshake of a [`Conn::start_tls`].
    async fn upgrade<T: StartTls>(
        &mut self,
        mut io: T,
        how: TlsUpgrade,
    ) -> Result<T, StartTlsError> {
        let link = &mut self.core.link;
        if !link.input.is_empty() {
            return Err(StartTlsError::PlaintextBuffered);
        }
        if !link.out.is_empty() {
            // What was sent before the upgrade goes out in plaintext first, at once or never:
            // the peer starts its handshake only after reading it.
            let flushed = poll_fn(|cx| Poll::Ready(link.poll_write(&mut io, cx))).await;
            if !matches!(flushed, Poll::Ready(Ok(()))) || !link.out.is_empty() {
                return Err(StartTlsError::WritesPending);
            }
        }
        io.start_tls(how).await
    }

    fn poll_event<T: Transport>(&mut self, io: &mut T, cx: &mut Context<'_>) -> Poll<Event> {
        let core = &mut self.core;
        // Write what is queued, and what the transport still holds (TLS records).
        if let Err(e) = core.link.poll_send(io, cx) {
            return Poll::Ready(Event::Failed(Close::Io(e)));
        }
        if !core.link.has_output(io) {
            if core.link.out.buf.capacity() > 0 {
                let buf = std::mem::take(&mut core.link.out.buf);
                core.link.worker.give_buf(buf);
            }
            if core.closing {
                return Poll::Ready(Event::Flushed);
            }
        }
        if core.refused && core.link.out.len() <= core.settings.low_water && !core.closing {
            core.refused = false;
            return Poll::Ready(Event::Writable);
        }
        if core.wake.woken.replace(false) {
            return Poll::Ready(Event::Wake);
        }
        if !self.shutdown_told && core.link.worker.draining() {
            self.shutdown_told = true;
            return Poll::Ready(Event::Shutdown);
        }
        // Read, unless muted, closing or held back by unwritten output.
        let reading =
            !core.muted && !core.closing && core.link.out.len() < core.settings.high_water;
        if reading && core.redeliver {
            core.redeliver = false;
            if !core.link.input.is_empty() {
                return Poll::Ready(Event::Data);
            }
        }
        if reading && !self.eof {
            if core.link.budget_spent(core.settings.read_budget) {
                return Poll::Ready(Event::Yield);
            }
            let size = core.settings.read_size;
            let read = core.link.poll_read(io, cx, size, |input| {
                if input.capacity() - input.len() < size / 2 {
                    input.reserve(size);
                }
            });
            match read {
                Poll::Ready(Ok(0)) => {
                    self.eof = true;
                    return Poll::Ready(Event::Eof);
                }
                Poll::Ready(Ok(_)) => return Poll::Ready(Event::Data),
                Poll::Ready(Err(e)) => return Poll::Ready(Event::Failed(Close::Io(e))),
                Poll::Pending => {}
            }
        }
        // Timers: the protocol's, and the write timeout.
        let write_deadline = self
            .core
            .link
            .write_deadline(self.core.settings.write_timeout)
            .map(Instant::from_std);
        let next = [self.core.timer, write_deadline]
            .into_iter()
            .flatten()
            .min();
        if let Some(at) = next {
            if self.poll_sleep(cx, at) {
                let now = Instant::now();
                if write_deadline.is_some_and(|d| d <= now) {
                    if self.core.link.write_timed_out(io) {
                        return Poll::Ready(Event::Failed(Close::WriteTimeout));
                    }
                    // The peer is still taking what the kernel holds: the deadline moved on.
                    cx.waker().wake_by_ref();
                }
                if self.core.timer.is_some_and(|t| t <= now) {
                    self.core.timer = None;
                    return Poll::Ready(Event::Timer);
                }
            }
        }
        let mut waker = self.core.wake.waker.borrow_mut();
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Whether `at` has passed; otherwise arranges a wake-up for then.
    fn poll_sleep(&mut self, cx: &mut Context<'_>, at: Instant) -> bool {
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if self.armed != Some(at) {
            sleep.as_mut().reset(at);
            self.armed = Some(at);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}
