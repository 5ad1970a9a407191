//! The counters every layer shares: connections open and accepted, and the client faults
//! counted by kind ([`ClientFault`]), with the interval summary that logs them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counters of a running server, readable from any thread. Updated once per connection (never
/// per request), so they cost nothing on the hot path; the count of QUIC datagrams handed
/// between workers moves only for connections whose client changed address.
#[derive(Debug, Default)]
pub struct Stats {
    open: AtomicUsize,
    accepted: AtomicU64,
    faults: [AtomicU64; ClientFault::ALL.len()],
    quic_forwarded: AtomicU64,
    ws_assembling: AtomicU64,
}

/// A fault of the client that ended or disturbed one of its connections. Any peer can cause any
/// number of them, so each is a DEBUG line, counted (see [`Config::fault_log_interval`](crate::Config::fault_log_interval)).
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

    /// QUIC datagrams one worker read and handed to the worker that owns their connection
    /// (their client changed address) since start. Always 0 without HTTP/3.
    pub fn quic_datagrams_forwarded(&self) -> u64 {
        self.quic_forwarded.load(Ordering::Relaxed)
    }

    #[cfg_attr(not(feature = "http3"), allow(dead_code))]
    pub(crate) fn quic_forwarded(&self) {
        self.quic_forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes the WebSocket connections hold, across all workers, in messages still being
    /// assembled (each worker's are bounded by its budget, `WsConfig::worker_budget`).
    pub fn ws_assembling_bytes(&self) -> u64 {
        self.ws_assembling.load(Ordering::Relaxed)
    }

    /// A connection's bytes in messages being assembled went from `was` to `now`.
    #[cfg_attr(not(feature = "ws"), allow(dead_code))]
    pub(crate) fn ws_assembling(&self, was: usize, now: usize) {
        if now > was {
            self.ws_assembling
                .fetch_add((now - was) as u64, Ordering::Relaxed);
        } else if was > now {
            self.ws_assembling
                .fetch_sub((was - now) as u64, Ordering::Relaxed);
        }
    }
}

/// Logs, every `interval`, the client faults counted since the last line, when there were any.
pub(crate) async fn summarize_faults(stats: Arc<Stats>, interval: Duration) {
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
