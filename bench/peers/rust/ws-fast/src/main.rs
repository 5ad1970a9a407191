//! fastwebsockets peer (hyper 1 for the upgrade): `/ws/echo` echoes every text and binary
//! message, fragments assembled (`FragmentCollector`); current_thread tokio.
//! `peer-ws-fast PORT`.
use fastwebsockets::{upgrade, FragmentCollector, OpCode, WebSocketError};
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn echo(fut: upgrade::UpgradeFut) -> Result<(), WebSocketError> {
    let mut ws = FragmentCollector::new(fut.await?);
    loop {
        let frame = ws.read_frame().await?;
        match frame.opcode {
            OpCode::Close => break,
            OpCode::Text | OpCode::Binary => ws.write_frame(frame).await?,
            _ => {}
        }
    }
    Ok(())
}

async fn handle(mut req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, WebSocketError> {
    let (response, fut) = upgrade::upgrade(&mut req)?;
    tokio::task::spawn_local(async move {
        let _ = echo(fut).await;
    });
    Ok(response)
}

fn main() {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            tokio::task::spawn_local(async move {
                let conn = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(handle))
                    .with_upgrades();
                let _ = conn.await;
            });
        }
    });
}
