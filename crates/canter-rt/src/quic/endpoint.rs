//! A worker's QUIC endpoint: its UDP socket (one per worker on the same port, `SO_REUSEPORT`,
//! so the kernel spreads clients by address), the `quinn-proto` endpoint that routes each
//! datagram to its connection by connection ID, and the connection's I/O half ([`QuicLink`]).
//!
//! The socket is driven with `quinn-udp`: a connection's packets to one client leave in trains
//! of up to its GSO limit per `sendmsg` (`UDP_SEGMENT`), and reads take a batch of datagrams
//! per `recvmmsg`, each possibly several coalesced by GRO.
//!
//! One task per worker reads the socket ([`run`]): a datagram whose connection ID names
//! another worker (its client changed address, and the kernel's hash chose another socket) is
//! handed to that worker (`route.rs`); a datagram for a known connection goes to
//! that connection's inbox and wakes its task; a new connection is accepted (refused while the
//! worker drains) and queued for the accept loop, which gives it its own task. A connection's
//! task takes its inbox, drives its timers and writes its own packets on the shared socket
//! ([`QuicLink::poll_io`]); everything stays on the worker's thread, so the endpoint is shared
//! by `Rc`, never locked.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::io;
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::BytesMut;
use quinn_proto::{
    ConnectionEvent, ConnectionHandle, DatagramEvent, EndpointConfig, ServerConfig, Transmit,
    VarInt,
};
use tokio::net::UdpSocket;

use crate::core::config::Config;
use crate::core::stats::ClientFault;
use crate::core::worker::Worker;
use crate::quic::route::{Forwarded, Routes, WorkerCids};

/// The UDP socket buffers asked for, each way.
const SOCKET_BUFFER: usize = 4 << 20;
/// Room for one read: a datagram, or with GRO several coalesced (at most 64 KiB in all).
const READ_SLOT: usize = 65_536;
/// Batches read in one turn of the endpoint task before it lets the worker's other tasks run.
const READ_TURN: usize = 4;
/// Bidirectional streams (requests) a client may have open at once.
const MAX_REQUEST_STREAMS: u32 = 100;
/// Unidirectional streams a client may have open: its control and two QPACK streams, and room
/// for the reserved types clients send to exercise the rule that unknown ones are ignored.
const MAX_UNI_STREAMS: u32 = 8;
/// Bytes a client may send on one stream ahead of what the server has read.
const STREAM_WINDOW: u32 = 1 << 20;
/// Bytes a client may send on all its streams together ahead of what the server has read: with
/// the request bodies' pipes, what bounds the memory one connection's uploads can take.
const CONNECTION_WINDOW: u32 = 8 << 20;
/// Handshakes in progress on one worker above which a new client must first prove its address
/// with a stateless Retry (RFC 9000, Section 8.1.2): a flood of Initials from spoofed
/// addresses then costs one packet each, no connection state.
const RETRY_ABOVE: usize = 64;

/// What every worker's endpoint shares, made once for the server: one reset key (a stateless
/// reset from any worker is valid for a connection of any other), one server configuration
/// (one key for address validation tokens, one TLS session cache and ticket keys), and the
/// routes between workers by connection ID.
#[derive(Clone)]
pub(crate) struct Setup {
    endpoint: Arc<EndpointConfig>,
    server: Arc<ServerConfig>,
    routes: Arc<Routes>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup").finish_non_exhaustive()
    }
}

impl Setup {
    /// The QUIC configuration of a server built with `cfg` (which has a TLS listener) and
    /// `workers` workers.
    pub(crate) fn new(cfg: &Config, workers: usize) -> io::Result<Setup> {
        let Some(tls) = cfg.tls.as_ref() else {
            return Err(io::Error::other("HTTP/3 needs a TLS listener"));
        };
        let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(
            tls.acceptor.quic_config(cfg.http3_early_data),
        )
        .map_err(|e| io::Error::other(format!("TLS settings unusable for QUIC: {e}")))?;
        let mut transport = quinn_proto::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(VarInt::from_u32(MAX_REQUEST_STREAMS))
            .max_concurrent_uni_streams(VarInt::from_u32(MAX_UNI_STREAMS))
            .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
            .receive_window(VarInt::from_u32(CONNECTION_WINDOW))
            .max_idle_timeout(quinn_proto::IdleTimeout::try_from(cfg.timeouts.idle()).ok());
        let mut server = ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(Arc::new(transport));
        Ok(Setup {
            endpoint: Arc::new(EndpointConfig::default()),
            server: Arc::new(server),
            routes: Routes::new(workers),
        })
    }
}

/// Binds a worker's UDP socket on `addr` (shared with the other workers' by `SO_REUSEPORT`).
pub(crate) fn bind(addr: SocketAddr) -> io::Result<StdUdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    // A burst of handshakes (a thousand Initials at once) must not overflow the default
    // receive buffer (about 200 KiB): a dropped Initial costs its client a retransmission
    // timeout, and a dropped retried one can outlive its Retry token. As large as the kernel
    // allows up to 4 MiB (`net.core.rmem_max`); smaller is not an error.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A connection's mailbox: datagrams the endpoint routed to it, and the task to wake.
#[derive(Default)]
struct Inbox {
    events: RefCell<VecDeque<ConnectionEvent>>,
    waker: RefCell<Option<Waker>>,
}

impl Inbox {
    fn push(&self, ev: ConnectionEvent) {
        self.events.borrow_mut().push_back(ev);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// A worker's endpoint, shared by its task and its connections' tasks.
pub(crate) struct Endpoint {
    endpoint: RefCell<quinn_proto::Endpoint>,
    socket: UdpSocket,
    /// What the kernel offers for this socket (GSO, GRO) and how to use it.
    udp: quinn_udp::UdpSocketState,
    inboxes: RefCell<HashMap<ConnectionHandle, Rc<Inbox>>>,
    /// Connections accepted and not yet taken by the accept loop.
    accepted: RefCell<VecDeque<QuicLink>>,
    accept_waker: RefCell<Option<Waker>>,
    worker: Rc<Worker>,
    /// Connections accepted whose handshake has not completed.
    handshaking: Cell<usize>,
    /// Where a connection builds the packets it sends (see [`QuicLink::blocked`]).
    transmit: RefCell<Vec<u8>>,
    routes: Arc<Routes>,
    /// The worker's number among the server's.
    index: usize,
}

impl Endpoint {
    /// The endpoint of `worker`, the `index`th of the server's, on `socket` (from [`bind`]).
    pub(crate) fn new(
        socket: StdUdpSocket,
        setup: &Setup,
        index: usize,
        worker: Rc<Worker>,
    ) -> io::Result<Rc<Endpoint>> {
        let mut config = (*setup.endpoint).clone();
        let routes = setup.routes.clone();
        config.cid_generator(move || {
            Box::new(WorkerCids {
                routes: routes.clone(),
                index,
                random: ring::rand::SystemRandom::new(),
            })
        });
        let endpoint =
            quinn_proto::Endpoint::new(Arc::new(config), Some(setup.server.clone()), false, None);
        let udp = quinn_udp::UdpSocketState::new((&socket).into())?;
        Ok(Rc::new(Endpoint {
            endpoint: RefCell::new(endpoint),
            udp,
            socket: UdpSocket::from_std(socket)?,
            inboxes: RefCell::default(),
            accepted: RefCell::default(),
            accept_waker: RefCell::default(),
            worker,
            handshaking: Cell::new(0),
            transmit: RefCell::default(),
            routes: setup.routes.clone(),
            index,
        }))
    }

    /// The next accepted connection.
    pub(crate) async fn accept(&self) -> QuicLink {
        poll_fn(|cx| {
            if let Some(link) = self.accepted.borrow_mut().pop_front() {
                return Poll::Ready(link);
            }
            *self.accept_waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Sends what the endpoint answers on its own (version negotiation, stateless reset,
    /// refusal); dropped if the socket is full, as the peer will retry.
    fn send_response(&self, t: &Transmit, buf: &[u8]) {
        let _ = self.send(t, buf);
    }

    /// Sends `t` (its bytes at the front of `buf`): `WouldBlock` when the socket is full; any
    /// other failure is a lost packet, as on the network (loss recovery resends its contents).
    fn send(&self, t: &Transmit, buf: &[u8]) -> io::Result<()> {
        let transmit = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t
                .ecn
                .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents: &buf[..t.size],
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        self.socket.try_io(tokio::io::Interest::WRITABLE, || {
            self.udp.send((&self.socket).into(), &transmit)
        })
    }

    fn datagram(
        self: &Rc<Self>,
        now: Instant,
        peer: SocketAddr,
        ecn: Option<quinn_proto::EcnCodepoint>,
        data: BytesMut,
        resp: &mut Vec<u8>,
    ) {
        resp.clear();
        let event = self
            .endpoint
            .borrow_mut()
            .handle(now, peer, None, ecn, data, resp);
        match event {
            Some(DatagramEvent::ConnectionEvent(handle, ev)) => {
                if let Some(inbox) = self.inboxes.borrow().get(&handle) {
                    inbox.push(ev);
                }
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                if self.worker.draining() {
                    let t = self.endpoint.borrow_mut().refuse(incoming, resp);
                    self.send_response(&t, resp);
                    return;
                }
                if self.handshaking.get() >= RETRY_ABOVE && incoming.may_retry() {
                    match self.endpoint.borrow_mut().retry(incoming, resp) {
                        Ok(t) => self.send_response(&t, resp),
                        Err(e) => self.endpoint.borrow_mut().ignore(e.into_incoming()),
                    }
                    return;
                }
                let accepted = self.endpoint.borrow_mut().accept(incoming, now, resp, None);
                match accepted {
                    Ok((handle, conn)) => {
                        self.handshaking.set(self.handshaking.get() + 1);
                        let inbox = Rc::new(Inbox::default());
                        self.inboxes.borrow_mut().insert(handle, inbox.clone());
                        self.accepted.borrow_mut().push_back(QuicLink {
                            conn,
                            handle,
                            inbox,
                            peer,
                            timer: Box::pin(tokio::time::sleep_until(
                                tokio::time::Instant::from_std(now),
                            )),
                            timer_at: None,
                            blocked: None,
                            endpoint: self.clone(),
                            handshake_done: false,
                        });
                        if let Some(w) = self.accept_waker.borrow_mut().take() {
                            w.wake();
                        }
                    }
                    Err(e) => {
                        self.worker.fault(ClientFault::TlsHandshake);
                        tracing::debug!(%peer, error = %e.cause, "QUIC connection refused");
                        if let Some(t) = e.response {
                            self.send_response(&t, resp);
                        }
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => self.send_response(&t, resp),
            None => {}
        }
    }
}

/// Reads the worker's UDP socket until aborted (after the worker drained): routes each
/// datagram to its connection and queues new connections for [`Endpoint::accept`].
pub(crate) async fn run(ep: Rc<Endpoint>) {
    let slots = quinn_udp::BATCH_SIZE;
    let mut buf = vec![0u8; READ_SLOT * slots];
    let mut metas = vec![quinn_udp::RecvMeta::default(); slots];
    let mut resp = Vec::new();
    let routes = ep.routes.clone();
    let mailbox = routes.mailbox(ep.index);
    loop {
        // The socket, or datagrams handed over by the other workers.
        let handed = mailbox.ready.notified();
        tokio::pin!(handed);
        let ready = poll_fn(|cx| {
            if handed.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            ep.socket.poll_recv_ready(cx)
        })
        .await;
        if let Err(e) = ready {
            tracing::error!(error = %e, "QUIC socket failed");
            return;
        }
        let forwarded = mailbox.take();
        if !forwarded.is_empty() {
            let now = Instant::now();
            for f in forwarded {
                ep.datagram(now, f.peer, f.ecn, f.data, &mut resp);
            }
        }
        for _ in 0..READ_TURN {
            let mut iovs: Vec<std::io::IoSliceMut<'_>> = buf
                .chunks_mut(READ_SLOT)
                .map(std::io::IoSliceMut::new)
                .collect();
            let got = ep.socket.try_io(tokio::io::Interest::READABLE, || {
                ep.udp.recv((&ep.socket).into(), &mut iovs, &mut metas)
            });
            drop(iovs);
            let n = match got {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // ICMP errors for earlier sends surface here: nothing to do for them.
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC socket read failed");
                    continue;
                }
            };
            let now = Instant::now();
            for (meta, slot) in metas[..n].iter().zip(buf.chunks(READ_SLOT)) {
                let ecn = meta
                    .ecn
                    .and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8));
                let stride = meta.stride.max(1);
                for datagram in slot[..meta.len.min(slot.len())].chunks(stride) {
                    if let Some(to) = routes.owner(datagram, ep.index) {
                        let d = Forwarded {
                            peer: meta.addr,
                            ecn,
                            data: BytesMut::from(datagram),
                        };
                        if routes.forward(to, d) {
                            ep.worker.stats().quic_forwarded();
                        }
                        continue;
                    }
                    ep.datagram(now, meta.addr, ecn, BytesMut::from(datagram), &mut resp);
                }
            }
        }
        tokio::task::yield_now().await;
    }
}

/// A connection's QUIC state and its I/O: what a protocol driver over QUIC holds, as a TCP
/// driver holds its `Link` and transport.
pub(crate) struct QuicLink {
    /// The QUIC state machine: streams, flow control, recovery.
    pub(crate) conn: quinn_proto::Connection,
    handle: ConnectionHandle,
    inbox: Rc<Inbox>,
    peer: SocketAddr,
    timer: Pin<Box<tokio::time::Sleep>>,
    timer_at: Option<Instant>,
    /// A datagram (or GSO train) the socket did not take, with its bytes: sent first once
    /// the socket is writable. Packets are built in the endpoint's buffer, shared by its
    /// connections (each writes and sends in one go), so an idle connection keeps none.
    blocked: Option<(Transmit, Vec<u8>)>,
    endpoint: Rc<Endpoint>,
    /// No longer counted among the endpoint's handshakes in progress.
    handshake_done: bool,
}

impl QuicLink {
    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Takes in what arrived (routed datagrams, expired timers) and lets the endpoint see
    /// what the connection asks of it; then writes what the connection has to send and arms
    /// its timer. A datagram the socket refuses is lost, as on the network: loss recovery
    /// sends its contents again.
    pub(crate) fn poll_io(&mut self, cx: &mut Context<'_>) {
        let ep = self.endpoint.clone();
        *self.inbox.waker.borrow_mut() = Some(cx.waker().clone());
        loop {
            let ev = self.inbox.events.borrow_mut().pop_front();
            match ev {
                Some(ev) => self.conn.handle_event(ev),
                None => break,
            }
        }
        if self.timer_at.is_some() && self.timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            self.conn.handle_timeout(Instant::now());
        }
        self.endpoint_events(&ep);
        self.send(&ep, cx);
        self.endpoint_events(&ep);
        self.arm_timer(cx);
        if !self.handshake_done && !self.conn.is_handshaking() {
            self.handshake_ended();
        }
    }

    fn handshake_ended(&mut self) {
        self.handshake_done = true;
        let n = &self.endpoint.handshaking;
        n.set(n.get().saturating_sub(1));
    }

    /// The certificate chain the client presented and TLS verified (with client
    /// certificates required), as over TCP.
    pub(crate) fn peer_certificates(&self) -> Option<crate::core::transport::PeerCertificates> {
        let identity = self.conn.crypto_session().peer_identity()?;
        let chain = identity
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()?;
        Some(crate::core::transport::PeerCertificates(Arc::new(*chain)))
    }

    fn endpoint_events(&mut self, ep: &Endpoint) {
        while let Some(ev) = self.conn.poll_endpoint_events() {
            let back = ep.endpoint.borrow_mut().handle_event(self.handle, ev);
            if let Some(back) = back {
                self.conn.handle_event(back);
            }
        }
    }

    fn send(&mut self, ep: &Endpoint, cx: &mut Context<'_>) {
        let mut out = ep.transmit.borrow_mut();
        loop {
            let (t, sent) = match self.blocked.take() {
                Some((t, bytes)) => {
                    let sent = ep.send(&t, &bytes);
                    (t, sent.map_err(|e| (e, Some(bytes))))
                }
                None => {
                    out.clear();
                    let gso = ep.udp.max_gso_segments();
                    let Some(t) = self.conn.poll_transmit(Instant::now(), gso, &mut out) else {
                        return;
                    };
                    let sent = ep.send(&t, &out);
                    (t, sent.map_err(|e| (e, None)))
                }
            };
            match sent {
                Ok(()) => {}
                Err((e, kept)) if e.kind() == io::ErrorKind::WouldBlock => {
                    let bytes = kept.unwrap_or_else(|| out[..t.size].to_vec());
                    self.blocked = Some((t, bytes));
                    // Woken when the socket takes more.
                    if ep.socket.poll_send_ready(cx).is_ready() {
                        cx.waker().wake_by_ref();
                    }
                    return;
                }
                Err((e, _)) => {
                    tracing::debug!(peer = %self.peer, error = %e, "QUIC send failed")
                }
            }
        }
    }

    fn arm_timer(&mut self, cx: &mut Context<'_>) {
        let Some(at) = self.conn.poll_timeout() else {
            self.timer_at = None;
            return;
        };
        if self.timer_at != Some(at) {
            self.timer_at = Some(at);
            self.timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(at));
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
    }
}

impl Drop for QuicLink {
    fn drop(&mut self) {
        let ep = self.endpoint.clone();
        if !self.handshake_done {
            self.handshake_ended();
        }
        ep.inboxes.borrow_mut().remove(&self.handle);
        // A drained connection's last event tells the endpoint to forget it.
        self.endpoint_events(&ep);
        if !self.conn.is_drained() {
            // The task ended before the connection did (the worker stopped): forget it.
            ep.endpoint
                .borrow_mut()
                .handle_event(self.handle, quinn_proto::EndpointEvent::drained());
        }
    }
}
