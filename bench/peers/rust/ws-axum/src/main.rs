//! axum 0.8 WebSocket peer (tokio-tungstenite underneath): `/ws/echo` echoes every text and
//! binary message; `/ws/broadcast` is a room on a tokio broadcast channel (a member that lags
//! misses messages, as canter's hub skips it); current_thread tokio, as one canter worker.
//! `peer-ws-axum PORT`.
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: WebSocket| async move {
        while let Some(Ok(msg)) = socket.recv().await {
            match msg {
                Message::Text(_) | Message::Binary(_) => {
                    if socket.send(msg).await.is_err() {
                        break;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    })
}

async fn room(ws: WebSocketUpgrade, room: tokio::sync::broadcast::Sender<Message>) -> Response {
    ws.on_upgrade(move |mut socket: WebSocket| async move {
        let mut rx = room.subscribe();
        loop {
            tokio::select! {
                got = socket.recv() => match got {
                    Some(Ok(msg @ (Message::Text(_) | Message::Binary(_)))) => {
                        let _ = room.send(msg);
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
                msg = rx.recv() => match msg {
                    Ok(msg) => {
                        if socket.send(msg).await.is_err() {
                            break;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                },
            }
        }
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
    let (tx, _) = tokio::sync::broadcast::channel::<Message>(256);
    let app = Router::new()
        .route("/ws/echo", get(echo))
        .route("/ws/broadcast", get(move |ws| room(ws, tx.clone())));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    axum::serve(listener, app).await.unwrap();
}
