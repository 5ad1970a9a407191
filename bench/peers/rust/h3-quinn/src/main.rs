//! The `h3` crate's server on quinn: the peer HTTP/3 benchmarks compare canter with, written
//! as h3's own server example is (one task per connection, one per request), on a
//! current-thread tokio runtime. `peer-h3-quinn PORT CERT.pem KEY.pem`; serves GET /plaintext.
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args[1].parse().expect("PORT");
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(&args[2]).expect("CERT"),
    ))
    .collect::<Result<_, _>>()
    .expect("certificates");
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(&args[3]).expect("KEY"),
    ))
    .expect("key")
    .expect("a key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("certificate and key");
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = u32::MAX;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
    let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let endpoint = quinn::Endpoint::server(config, addr).expect("bind");
        while let Some(incoming) = endpoint.accept().await {
            tokio::task::spawn_local(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok(mut h3) = h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(conn)).await else {
                    return;
                };
                loop {
                    match h3.accept().await {
                        Ok(Some(resolver)) => {
                            tokio::task::spawn_local(async move {
                                let Ok((req, mut stream)) = resolver.resolve_request().await else {
                                    return;
                                };
                                let (status, body) = if req.uri().path() == "/plaintext" {
                                    (StatusCode::OK, Bytes::from_static(b"Hello, World!"))
                                } else {
                                    (StatusCode::NOT_FOUND, Bytes::new())
                                };
                                let res = Response::builder()
                                    .status(status)
                                    .header("server", "h3-quinn")
                                    .header("date", httpdate::fmt_http_date(std::time::SystemTime::now()))
                                    .header("content-type", "text/plain")
                                    .header("content-length", body.len())
                                    .body(())
                                    .expect("response");
                                if stream.send_response(res).await.is_err() {
                                    return;
                                }
                                if !body.is_empty() && stream.send_data(body).await.is_err() {
                                    return;
                                }
                                let _ = stream.finish().await;
                            });
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
            });
        }
    });
}
