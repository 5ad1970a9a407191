//! What both HTTP drivers share, and neither owns: a worker's service with its per-worker
//! HTTP state ([`Http`]: the cached HTTP/1.1 preamble block, brought up to the worker's second
//! when used) and the accounting of a connection's I/O end ([`count_io_fault`]). The HTTP/1.1
//! driver (`httpd/http1.rs`) and the HTTP/2 driver (`httpd/h2.rs`) import it; it imports neither.

use std::cell::{Cell, RefCell};
use std::io;

use canter_h1::Preamble;

use crate::core::stats::ClientFault;
use crate::core::worker::Worker;

/// HTTP/1.1's per-worker state: the preformatted `HTTP/1.1 200 OK` + `Server` + `Date` block
/// the engine writes at the top of most responses, its date brought up to the worker's second
/// when it is next used. Made once per worker and shared by its HTTP/1.1 connections.
pub(crate) struct PreambleCache {
    preamble: RefCell<Preamble>,
    /// The worker second the block's date names.
    second: Cell<u64>,
}

impl PreambleCache {
    /// A cache of `preamble`, whose date is brought up to the worker's at first use.
    pub(crate) fn new(preamble: Preamble) -> PreambleCache {
        PreambleCache {
            preamble: RefCell::new(preamble),
            second: Cell::new(u64::MAX),
        }
    }

    /// Runs `f` with the block, its date the worker's current one.
    #[inline]
    pub(crate) fn with<R>(&self, worker: &Worker, f: impl FnOnce(&Preamble) -> R) -> R {
        if self.second.get() != worker.second() {
            self.refresh(worker);
        }
        f(&self.preamble.borrow())
    }

    #[cold]
    fn refresh(&self, worker: &Worker) {
        self.second.set(worker.second());
        // An IMF-fixdate is printable ASCII; were it ever not, the second before stays.
        let _ = self.preamble.borrow_mut().set_date(&worker.date());
    }
}

/// A worker's service with what its HTTP connections share besides it. Derefs to the
/// service, so a driver calls `svc.call(req)` through its `Rc<Http<S>>` as through an `Rc<S>`.
pub(crate) struct Http<S> {
    svc: S,
    /// HTTP/1.1's preamble block (HTTP/2 encodes its own headers).
    pub(crate) preamble: PreambleCache,
    /// The block for answers over TLS when it differs (with HTTP/3 on: `Alt-Svc` after the
    /// date), so that the field costs nothing per response.
    tls_preamble: Option<PreambleCache>,
    /// With HTTP/3 on, the `Alt-Svc` field that points clients to it (RFC 7838): HTTP/2 adds it
    /// to every answer over TLS, HTTP/1.1 has it in `tls_preamble`.
    #[cfg(feature = "http3")]
    alt_svc: Option<(http::HeaderName, http::HeaderValue)>,
}

impl<S> Http<S> {
    pub(crate) fn new(svc: S, preamble: Preamble) -> Http<S> {
        Http {
            svc,
            preamble: PreambleCache::new(preamble),
            tls_preamble: None,
            #[cfg(feature = "http3")]
            alt_svc: None,
        }
    }

    /// The same, advertising HTTP/3 with `alt_svc` as the `Alt-Svc` value (`None`: not) on
    /// every answer over TLS, HTTP/1.1 or HTTP/2. Added where the head is encoded: pushed onto
    /// each response's field list, it cost an allocation and a copy per request.
    #[cfg(feature = "http3")]
    pub(crate) fn with_alt_svc(mut self, alt_svc: Option<http::HeaderValue>) -> Http<S> {
        let Some(value) = alt_svc else {
            return self;
        };
        let base = self.preamble.preamble.borrow().clone();
        match base.with_field("Alt-Svc", value.as_bytes()) {
            Ok(block) => {
                self.tls_preamble = Some(PreambleCache::new(block));
                self.alt_svc = Some((http::header::ALT_SVC, value));
            }
            Err(e) => tracing::error!(error = %e, "Alt-Svc not advertised"),
        }
        self
    }

    /// HTTP/1.1's preamble block for a connection, over TLS (`tls`) or not.
    #[inline]
    pub(crate) fn preamble_for(&self, tls: bool) -> &PreambleCache {
        match &self.tls_preamble {
            Some(block) if tls => block,
            _ => &self.preamble,
        }
    }

    /// The `Alt-Svc` field for an HTTP/2 answer, if it gets one: over TLS with HTTP/3 on.
    #[cfg(feature = "http2")]
    #[inline]
    pub(crate) fn alt_svc_for(&self, tls: bool) -> Option<(&http::HeaderName, &http::HeaderValue)> {
        #[cfg(feature = "http3")]
        if let (Some((name, value)), true) = (&self.alt_svc, tls) {
            return Some((name, value));
        }
        let _ = tls;
        None
    }
}

impl<S> std::ops::Deref for Http<S> {
    type Target = S;
    #[inline(always)]
    fn deref(&self) -> &S {
        &self.svc
    }
}

/// Counts an I/O error that ended a connection when it is the peer's reset.
pub(crate) fn count_io_fault(worker: &Worker, e: &io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    ) {
        worker.fault(ClientFault::Reset);
    }
}

#[cfg(any(feature = "http2", feature = "http3"))]
/// The answer to a request whose handler panicked, logged with the client's address.
pub(crate) fn panicked(peer: &std::net::SocketAddr) -> crate::httpd::service::Response {
    tracing::error!(%peer, "handler panicked; answering 500");
    crate::httpd::service::Response::handler_panicked()
}

#[cfg(any(feature = "http2", feature = "http3"))]
/// Fields HTTP/2 and HTTP/3 forbid (RFC 9113 Section 8.2.2, RFC 9114 Section 4.2): dropped
/// from responses.
pub(crate) fn is_connection_specific(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    )
}
