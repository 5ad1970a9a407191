//! The WebSocket opening handshake as a handler sees it: [`WsUpgrade`] checks a request
//! (RFC 6455, Section 4.2.1), lets the handler choose a subprotocol and settings, and answers
//! with the 101 that carries the connection's [`Upgrade`] to the protocol driver.

use std::future::Future;
use std::rc::Rc;

use canter_ws::handshake::{self, HandshakeError};
use canter_ws::{deflate, Connection, Role};
use http::{header, HeaderValue, StatusCode};

use crate::httpd::body::Body;
use crate::httpd::service::{ConnectProtocol, Request, Response};
use crate::ws::{Accepted, Info, Upgrade, WebSocket, WsConfig};

/// A checked WebSocket upgrade request, to answer with [`WsUpgrade::on_upgrade`].
///
/// ```no_run
/// use canter_rt::{Reply, Request, Response, WsUpgrade};
///
/// fn route(req: Request) -> Reply {
///     match WsUpgrade::from_request(&req) {
///         Ok(ws) => ws
///             .on_upgrade(|socket| async move {
///                 while let Some(Ok(msg)) = socket.recv().await {
///                     if socket.send(msg).await.is_err() {
///                         break;
///                     }
///                 }
///             })
///             .into(),
///         Err(refused) => Response::from(refused).into(),
///     }
/// }
/// # let _ = route;
/// ```
#[derive(Debug)]
pub struct WsUpgrade {
    /// `Sec-WebSocket-Accept`, over HTTP/1.1; `None` over HTTP/2, which has no key.
    accept: Option<String>,
    offered_protocols: Vec<String>,
    offered_extensions: Vec<String>,
    protocol: Option<String>,
    config: WsConfig,
}

impl WsUpgrade {
    /// Checks `req` as an opening handshake: over HTTP/1.1 (RFC 6455, Section 4.2.1) a GET
    /// without a body, with `Upgrade: websocket`, `Connection: upgrade`,
    /// `Sec-WebSocket-Version: 13` and a valid `Sec-WebSocket-Key`; over HTTP/2 (RFC 8441) an
    /// extended CONNECT with `:protocol` `websocket` and `Sec-WebSocket-Version: 13`. A refusal
    /// says its status (400, or 426 for another version) and converts into the response to
    /// answer with.
    pub fn from_request(req: &Request) -> Result<WsUpgrade, WsRefused> {
        let head = req.head();
        let checked = match head.version() {
            canter_http::Version::Http11 => {
                if !matches!(head.body_kind(), canter_http::BodyKind::Length(0)) {
                    return Err(WsRefused::new(400, "a WebSocket upgrade has no body"));
                }
                handshake::check(req.method().as_str(), head.headers())
            }
            canter_http::Version::Http2 | canter_http::Version::Http3 => {
                let protocol = req.extensions().get::<ConnectProtocol>();
                if !protocol.is_some_and(|p| p.0.eq_ignore_ascii_case("websocket")) {
                    return Err(WsRefused::new(
                        400,
                        "WebSocket over HTTP/2 is an extended CONNECT with :protocol websocket",
                    ));
                }
                handshake::check_h2(head.headers())
            }
            canter_http::Version::Http10 => {
                return Err(WsRefused::new(400, "a WebSocket upgrade needs HTTP/1.1"))
            }
        };
        let checked = checked.map_err(|e| WsRefused {
            status: e.status(),
            reason: e.to_string(),
            version: e == HandshakeError::Version,
        })?;
        Ok(WsUpgrade {
            accept: (!checked.accept.is_empty()).then_some(checked.accept),
            offered_protocols: checked.protocols,
            offered_extensions: checked.extensions,
            protocol: None,
            config: WsConfig::default(),
        })
    }

    /// The subprotocols the client offered, in its order of preference.
    pub fn offered_protocols(&self) -> &[String] {
        &self.offered_protocols
    }

    /// Chooses the first of the client's offered subprotocols that is in `supported`
    /// (compared exactly, as RFC 6455 asks); none chosen if none matches.
    pub fn protocols<'a>(mut self, supported: impl IntoIterator<Item = &'a str>) -> WsUpgrade {
        let supported: Vec<&str> = supported.into_iter().collect();
        self.protocol = self
            .offered_protocols
            .iter()
            .find(|p| supported.contains(&p.as_str()))
            .cloned();
        self
    }

    /// Replaces the connection's settings.
    pub fn config(mut self, config: WsConfig) -> WsUpgrade {
        self.config = config;
        self
    }

    /// The answer that switches to WebSocket (a 101 over HTTP/1.1, a 200 that opens the tunnel
    /// over HTTP/2), then runs `handler` with the socket on the connection's own task.
    pub fn on_upgrade<F, Fut>(self, handler: F) -> Response
    where
        F: FnOnce(WebSocket) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let WsUpgrade {
            accept,
            offered_extensions,
            protocol,
            config,
            ..
        } = self;
        let mut engine = Connection::new(Role::Server, config.limits);
        let mut extensions = None;
        if let Some(wanted) = config.deflate {
            if let Some((agreed, answer)) = deflate::negotiate(&offered_extensions, wanted) {
                engine = engine.with_deflate(agreed);
                extensions = Some(answer);
            }
        }
        let mut res = match accept {
            Some(_) => Response::new(StatusCode::SWITCHING_PROTOCOLS)
                .with_header(header::UPGRADE, HeaderValue::from_static("websocket"))
                .with_header(header::CONNECTION, HeaderValue::from_static("Upgrade")),
            None => Response::new(StatusCode::OK),
        };
        // The accept key is base64; a chosen protocol was offered as a header value; the
        // extension answer is built of tokens: each makes a valid header value.
        for (name, value) in [
            (header::SEC_WEBSOCKET_ACCEPT, accept.as_ref()),
            (header::SEC_WEBSOCKET_PROTOCOL, protocol.as_ref()),
            (header::SEC_WEBSOCKET_EXTENSIONS, extensions.as_ref()),
        ] {
            if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
                res.append_header(name, v);
            }
        }
        let info = Rc::new(Info {
            protocol,
            extensions,
            peer: crate::peer_addr(),
        });
        res.with_body(Body::Upgrade(Upgrade(Box::new(Accepted {
            engine,
            config,
            info,
            handler: Box::new(move |socket| Box::pin(handler(socket))),
        }))))
    }
}

/// A request refused as a WebSocket upgrade: its status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsRefused {
    status: u16,
    reason: String,
    /// Refused for its `Sec-WebSocket-Version`: the answer names the version spoken here.
    version: bool,
}

impl WsRefused {
    fn new(status: u16, reason: &str) -> WsRefused {
        WsRefused {
            status,
            reason: reason.to_owned(),
            version: false,
        }
    }

    /// The status to answer with: 400, or 426 (Upgrade Required) for another version.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST)
    }

    /// The header fields the answer needs: `Sec-WebSocket-Version: 13` after a 426.
    pub fn headers(&self) -> impl Iterator<Item = (http::HeaderName, HeaderValue)> {
        self.version
            .then(|| {
                (
                    header::SEC_WEBSOCKET_VERSION,
                    HeaderValue::from_static("13"),
                )
            })
            .into_iter()
    }
}

impl std::fmt::Display for WsRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for WsRefused {}

impl From<WsRefused> for Response {
    /// The status, the fields of [`WsRefused::headers`] and the reason as text (a debug line
    /// says why).
    fn from(refused: WsRefused) -> Response {
        tracing::debug!(reason = %refused, "WebSocket upgrade refused");
        let mut res = Response::text(format!("{refused}\n")).with_status(refused.status());
        for (name, value) in refused.headers() {
            res.append_header(name, value);
        }
        res
    }
}
