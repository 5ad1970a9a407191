//! HTTP serving on the runtime: for each connection the choice between HTTP/1.1 and HTTP/2,
//! above both drivers. A TLS connection goes by what ALPN agreed; a plain one starts as
//! HTTP/1.1, which gives the connection back ([`http1::Handoff`]) when it opens with the
//! HTTP/2 preface or asks for `Upgrade: h2c`, and HTTP/2 then runs on it with what was read.
//! Also here: the [`Server`]'s HTTP entry points ([`Server::serve`], [`Server::serve_inline`])
//! and [`serve_connection`] for a transport made elsewhere.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

#[cfg(all(feature = "http2", feature = "tls"))]
use bytes::BytesMut;

use crate::core::config::{Config, EPOCH_DATE};
#[cfg(all(feature = "http2", feature = "tls"))]
use crate::core::link::Link;
use crate::core::server::{in_event_loop, Accept, Accepted, Server};
use crate::core::stats::Stats;
use crate::core::tcp_loop::{self, OwnTcp};
use crate::core::transport::{LazyTcp, Transport};
use crate::core::worker::{Registration, Worker, TICK};
#[cfg(feature = "http2")]
use crate::httpd::h2;
use crate::httpd::http1;
use crate::httpd::service::Service;
use crate::httpd::state::Http;

impl Server {
    /// Runs the workers until shutdown; blocks the calling thread. `factory(i)` builds the
    /// service of worker `i` on that worker's thread.
    pub fn serve<S, F>(self, factory: F) -> io::Result<()>
    where
        S: Service,
        F: Fn(usize) -> S + Send + Sync + 'static,
    {
        let preamble = canter_h1::Preamble::new(&self.config().server_name, EPOCH_DATE)?;
        self.defer_http_accepts()?;
        #[cfg(feature = "http3")]
        let alt_svc = self.alt_svc();
        self.run(move |i| {
            let http = Http::new(factory(i), preamble.clone());
            #[cfg(feature = "http3")]
            let http = http.with_alt_svc(alt_svc.clone());
            HttpAccept(Rc::new(http))
        })
    }

    /// With HTTP/3 on, the `Alt-Svc` value that points HTTP/1.1 and HTTP/2 clients over TLS to
    /// it: `h3=":PORT"; ma=86400`, PORT the TLS listener's.
    #[cfg(feature = "http3")]
    fn alt_svc(&self) -> Option<http::HeaderValue> {
        let port = self.tls_local_addr()?.port();
        if !self.config().http3 {
            return None;
        }
        http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400")).ok()
    }

    /// Runs the server's single worker on the calling thread until shutdown, instead of a
    /// thread of its own: for an embedding whose state belongs to one thread (the Python front
    /// end runs the interpreter's main thread as the worker). Fails if [`Config::workers`] is
    /// not 1.
    pub fn serve_inline<S, F>(self, factory: F) -> io::Result<()>
    where
        S: Service,
        F: FnOnce(usize) -> S + 'static,
    {
        let preamble = canter_h1::Preamble::new(&self.config().server_name, EPOCH_DATE)?;
        self.defer_http_accepts()?;
        #[cfg(feature = "http3")]
        let alt_svc = self.alt_svc();
        self.run_inline(move |i| {
            let http = Http::new(factory(i), preamble);
            #[cfg(feature = "http3")]
            let http = http.with_alt_svc(alt_svc);
            HttpAccept(Rc::new(http))
        })
    }
}

/// Serves one plain connection (after its PROXY header, if any): HTTP/1.1, then HTTP/2 if
/// HTTP/1.1 gives the connection up. With `sniff_h2`, HTTP/2 is on: a preface or an h2c
/// upgrade is honoured.
pub(crate) async fn serve<S: Service, T: Transport>(
    registration: Registration,
    io: T,
    peer: SocketAddr,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
    sniff_h2: bool,
) {
    let Some(handoff) = http1::serve(registration, io, peer, svc, worker, cfg, sniff_h2).await
    else {
        return;
    };
    #[cfg(feature = "http2")]
    {
        let http1::Handoff {
            registration,
            io,
            link,
            svc,
            cfg,
            upgrade,
        } = handoff;
        let upgraded = upgrade.map(|(head, settings)| h2::Upgraded { head, settings });
        // Boxed: inline, the HTTP/2 actor's state would sit in every HTTP/1.1 connection's task.
        Box::pin(h2::serve(registration, io, peer, svc, cfg, link, upgraded)).await
    }
    // Without HTTP/2 nothing is sniffed and no upgrade is honoured: HTTP/1.1 hands nothing over.
    #[cfg(not(feature = "http2"))]
    drop(handoff);
}

/// Serves one connection the caller already has, until it closes: the HTTP/1.1 actor a
/// [`Server`] runs for each accepted socket (and, when [`Config::http2`] is set and the peer
/// opens with the HTTP/2 preface or asks for h2c, the HTTP/2 one), for a transport made elsewhere:
/// a socket accepted by other code, a stream already wrapped in TLS, an in-memory pipe in
/// tests. It runs on the calling task, with a worker context of its own (the coarse clock, the
/// Date header, the buffer pool); the listener settings of `config` (`addr`, `workers`,
/// `backlog`, `tls`, `max_connections`, `proxy_protocol`) do not apply. Returns the counters,
/// whose client faults say how the peer misbehaved.
///
/// Time is tokio's: under a paused clock (tokio's `test-util`) every timeout runs on virtual
/// time, which is how canter's own tests script a peer against the actor without waiting.
pub async fn serve_connection<S: Service, T: Transport>(
    io: T,
    peer: SocketAddr,
    service: S,
    config: Config,
) -> Arc<Stats> {
    let stats = Arc::new(Stats::default());
    let preamble = match canter_h1::Preamble::new(&config.server_name, EPOCH_DATE) {
        Ok(preamble) => preamble,
        Err(e) => {
            // A built Config has a valid Server value; say so rather than serve without one.
            tracing::error!(error = %e, "cannot serve the connection");
            return stats;
        }
    };
    let worker = Rc::new(Worker::new(stats.clone()));
    let registration = Registration {
        id: worker.register(),
        worker: worker.clone(),
    };
    let sniff_h2 = config.http2_on();
    let conn = serve(
        registration,
        io,
        peer,
        Rc::new(Http::new(service, preamble)),
        worker.clone(),
        Rc::new(config),
        sniff_h2,
    );
    let mut conn = std::pin::pin!(conn);
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            () = &mut conn => return stats,
            _ = every.tick() => worker.tick(),
        }
    }
}

/// Runs the TLS handshake of an accepted connection under the handshake timeout, then serves
/// it as [`serve`] does. A failed or stalled handshake closes the connection (a debug line: the
/// peer's fault, and any peer can cause it).
#[cfg(feature = "tls")]
pub(crate) async fn serve_tls<S: Service, IO>(
    registration: Registration,
    tcp: IO,
    peer: SocketAddr,
    acceptor: crate::core::server::Acceptor,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
) where
    IO: Transport + tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    match acceptor.accept(tcp).await {
        Ok(tls) => {
            let session = tls.get_ref().1;
            tracing::debug!(
                %peer,
                version = ?session.protocol_version(),
                kind = ?session.handshake_kind(),
                alpn = ?session.alpn_protocol().map(String::from_utf8_lossy),
                "TLS handshake done"
            );
            #[cfg(feature = "http2")]
            if session.alpn_protocol() == Some(b"h2") {
                let link = Link::new(worker, BytesMut::new());
                return Box::pin(h2::serve(registration, tls, peer, svc, cfg, link, None)).await;
            }
            // ALPN chose HTTP/1.1 (or nothing): no preface to sniff, no h2c over TLS.
            serve(registration, tls, peer, svc, worker, cfg, false).await
        }
        Err(e) => {
            worker.fault(crate::core::stats::ClientFault::TlsHandshake);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
        }
    }
}

/// Without the `tls` feature there is no TLS listener: no connection comes with an acceptor.
#[cfg(not(feature = "tls"))]
pub(crate) async fn serve_tls<S: Service, IO>(
    _registration: Registration,
    _tcp: IO,
    _peer: SocketAddr,
    acceptor: crate::core::server::Acceptor,
    _svc: Rc<Http<S>>,
    _worker: Rc<Worker>,
    _cfg: Rc<Config>,
) {
    match acceptor {}
}

/// HTTP connections around the worker's service.
struct HttpAccept<S>(Rc<Http<S>>);

impl<S: Service> Accept for HttpAccept<S> {
    #[cfg(feature = "http3")]
    fn spawn_quic(
        &mut self,
        registration: Registration,
        link: crate::quic::endpoint::QuicLink,
        worker: &Rc<Worker>,
        cfg: &Rc<Config>,
    ) {
        self.serve_h3(registration, link, worker, cfg);
    }

    fn spawn(&mut self, conn: Accepted, worker: &Rc<Worker>, cfg: &Rc<Config>) {
        let (svc, worker, cfg) = (self.0.clone(), worker.clone(), cfg.clone());
        if conn.tls.is_some() || cfg.proxy_protocol.is_some() {
            spawn_tls_or_proxied(conn, svc, worker, cfg);
            return;
        }
        let Accepted {
            registration,
            tcp,
            peer,
            ..
        } = conn;
        let sniff_h2 = cfg.http2_on();
        match tcp_loop::here() {
            Some(set) => {
                let io = OwnTcp::new(tcp, set.clone());
                set.spawn(serve(registration, io, peer, svc, worker, cfg, sniff_h2));
            }
            None => {
                tokio::task::spawn_local(serve(
                    registration,
                    LazyTcp::new(tcp),
                    peer,
                    svc,
                    worker,
                    cfg,
                    sniff_h2,
                ));
            }
        }
    }
}

#[cfg(feature = "http3")]
impl<S: Service> HttpAccept<S> {
    fn serve_h3(
        &self,
        registration: Registration,
        link: crate::quic::endpoint::QuicLink,
        worker: &Rc<Worker>,
        cfg: &Rc<Config>,
    ) {
        tokio::task::spawn_local(crate::httpd::h3::serve(
            registration,
            link,
            self.0.clone(),
            worker.clone(),
            cfg.clone(),
        ));
    }
}

/// A connection from the TLS listener, or behind a load balancer, or both: its PROXY header
/// first if the server expects one (the client it names is then the peer), then HTTP, over TLS
/// when it came from the TLS listener. In the worker's connection set when it has one, else a
/// tokio task (registered at once: a handshake or a header waits on the peer from the start).
fn spawn_tls_or_proxied<S: Service>(
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
    if let Some(set) = tcp_loop::here() {
        let io = OwnTcp::new(tcp, set.clone());
        set.spawn(serve_tls_or_proxied(
            registration,
            io,
            peer,
            tls,
            svc,
            worker,
            cfg,
        ));
        return;
    }
    let Some(tcp) = in_event_loop(tcp, peer) else {
        return;
    };
    tokio::task::spawn_local(serve_tls_or_proxied(
        registration,
        tcp,
        peer,
        tls,
        svc,
        worker,
        cfg,
    ));
}

async fn serve_tls_or_proxied<S: Service, IO>(
    registration: Registration,
    mut tcp: IO,
    peer: SocketAddr,
    tls: Option<crate::core::server::Acceptor>,
    svc: Rc<Http<S>>,
    worker: Rc<Worker>,
    cfg: Rc<Config>,
) where
    IO: Transport + crate::core::proxy::Peek + tokio::io::AsyncWrite,
{
    let Some(peer) =
        crate::core::proxy::client_of(&mut tcp, peer, cfg.proxy_protocol.as_ref(), &worker).await
    else {
        return;
    };
    match tls {
        None => {
            let sniff_h2 = cfg.http2_on();
            serve(registration, tcp, peer, svc, worker, cfg, sniff_h2).await;
        }
        Some(acceptor) => {
            serve_tls(registration, tcp, peer, acceptor, svc, worker, cfg).await;
        }
    }
}
