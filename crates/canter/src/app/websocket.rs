//! WebSocket routes: the [`WebSocketUpgrade`] extractor, answered with
//! [`WebSocketUpgrade::on_upgrade`] (as axum's `WebSocketUpgrade`).

use std::future::Future;

use canter_rt::ws::{WebSocket, WsConfig};
use canter_rt::{Response, WsUpgrade};

use super::extract::{FromParts, Parts, Rejection};

/// A request to upgrade to WebSocket, checked (RFC 6455, Section 4.2.1); refused with 400, or
/// 426 and `Sec-WebSocket-Version: 13` for another protocol version.
///
/// ```
/// use canter::rt::ws::Message;
/// use canter::{get, Router, WebSocketUpgrade};
///
/// async fn echo(ws: WebSocketUpgrade) -> canter::rt::Response {
///     ws.protocols(["chat"]).on_upgrade(|socket| async move {
///         while let Some(Ok(msg)) = socket.recv().await {
///             if matches!(msg, Message::Close(_)) || socket.send(msg).await.is_err() {
///                 break;
///             }
///         }
///     })
/// }
/// let app = Router::new().route("/ws", get(echo));
/// # let _ = app;
/// ```
#[derive(Debug)]
pub struct WebSocketUpgrade(WsUpgrade);

impl FromParts for WebSocketUpgrade {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        WsUpgrade::from_request(&parts.req)
            .map(WebSocketUpgrade)
            .map_err(|refused| {
                tracing::debug!(reason = %refused, "WebSocket upgrade refused");
                refused.headers().fold(
                    Rejection::new(refused.status(), refused.to_string()),
                    |r, (name, value)| r.with_header(name, value),
                )
            })
    }
}

impl WebSocketUpgrade {
    /// The subprotocols the client offered, in its order of preference.
    pub fn offered_protocols(&self) -> &[String] {
        self.0.offered_protocols()
    }

    /// Chooses the first offered subprotocol that is in `supported` (none if none matches).
    pub fn protocols<'a>(self, supported: impl IntoIterator<Item = &'a str>) -> Self {
        WebSocketUpgrade(self.0.protocols(supported))
    }

    /// Replaces the connection's settings (limits, backpressure, permessage-deflate,
    /// keepalive).
    pub fn config(self, config: WsConfig) -> Self {
        WebSocketUpgrade(self.0.config(config))
    }

    /// The 101 that switches the connection; `handler` then runs with the socket.
    pub fn on_upgrade<F, Fut>(self, handler: F) -> Response
    where
        F: FnOnce(WebSocket) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        self.0.on_upgrade(handler)
    }
}
