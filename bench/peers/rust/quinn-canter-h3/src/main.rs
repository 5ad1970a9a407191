//! quinn's own endpoint with canter's HTTP/3 engine on top: the A/B of the layer canter-rt's
//! QUIC driver (`quic/endpoint.rs`, `httpd/h3.rs`) replaces. quinn's tokio driver (a task for
//! the endpoint that owns the socket, one per connection, one per stream here) on one
//! current-thread runtime, with the connection's transport settings as canter's (100 request
//! streams, 1 MiB stream and 8 MiB connection windows); each request stream is read to its end
//! into one `canter_h3::Connection` per QUIC connection, whose events give the request, and the
//! response's HEADERS and DATA are encoded by the same engine. It does less per request than
//! canter (no router, no service, a fixed response), so it is the endpoint layer's cost that
//! differs. `peer-quinn-canter-h3 PORT CERT.pem KEY.pem`; serves GET /plaintext (any path).
use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use canter_h3::{Connection, Event, Settings};

/// One QUIC connection's HTTP/3 state, shared by its streams' tasks.
struct Shared {
    engine: Connection,
    /// Requests whose head the engine has parsed, by stream, for their stream's task.
    heads: HashSet<u64>,
}

impl Shared {
    fn drain_events(&mut self) {
        while let Some(ev) = self.engine.poll_event() {
            if let Event::Request { stream, .. } = ev {
                self.heads.insert(stream);
            }
        }
    }
}

thread_local! {
    static DATE: RefCell<(Instant, String)> = RefCell::new((
        Instant::now(),
        httpdate::fmt_http_date(std::time::SystemTime::now()),
    ));
}

fn date() -> String {
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0.elapsed() >= Duration::from_secs(1) {
            *d = (
                Instant::now(),
                httpdate::fmt_http_date(std::time::SystemTime::now()),
            );
        }
        d.1.clone()
    })
}

async fn request(shared: Rc<RefCell<Shared>>, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let id = u64::from(recv.id());
    loop {
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(c)) => {
                let mut s = shared.borrow_mut();
                if s.engine.recv(id, c.bytes, false).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let mut s = shared.borrow_mut();
                if s.engine.recv(id, Bytes::new(), true).is_err() {
                    return;
                }
                break;
            }
            Err(_) => return,
        }
    }
    let mut buf = Vec::with_capacity(128);
    {
        let mut s = shared.borrow_mut();
        s.drain_events();
        if !s.heads.remove(&id) {
            return;
        }
        let body = b"Hello, World!";
        let date = date();
        let len = body.len().to_string();
        let fields: [(&[u8], &[u8]); 4] = [
            (b"server", b"quinn-canter-h3"),
            (b"date", date.as_bytes()),
            (b"content-type", b"text/plain"),
            (b"content-length", len.as_bytes()),
        ];
        s.engine.headers(200, fields, &mut buf);
        s.engine.data_head(body.len() as u64, &mut buf);
        buf.extend_from_slice(body);
    }
    if send.write_all(&buf).await.is_ok() {
        let _ = send.finish();
    }
}

async fn uni(shared: Rc<RefCell<Shared>>, mut recv: quinn::RecvStream) {
    let id = u64::from(recv.id());
    loop {
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(c)) => {
                if shared.borrow_mut().engine.recv(id, c.bytes, false).is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

async fn connection(incoming: quinn::Incoming) {
    let Ok(conn) = incoming.await else { return };
    let shared = Rc::new(RefCell::new(Shared {
        engine: Connection::new(Settings::default()),
        heads: HashSet::new(),
    }));
    let Ok(mut control) = conn.open_uni().await else { return };
    let mut preamble = Vec::new();
    shared.borrow().engine.control_preamble(&mut preamble);
    if control.write_all(&preamble).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            bi = conn.accept_bi() => match bi {
                Ok((send, recv)) => {
                    tokio::task::spawn_local(request(shared.clone(), send, recv));
                }
                Err(_) => break,
            },
            u = conn.accept_uni() => match u {
                Ok(recv) => {
                    tokio::task::spawn_local(uni(shared.clone(), recv));
                }
                Err(_) => break,
            },
        }
    }
    drop(control);
}

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
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(100u32.into())
        .max_concurrent_uni_streams(8u32.into())
        .stream_receive_window((1u32 << 20).into())
        .receive_window((8u32 << 20).into());
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let endpoint = quinn::Endpoint::server(config, addr).expect("bind");
        while let Some(incoming) = endpoint.accept().await {
            tokio::task::spawn_local(connection(incoming));
        }
    });
}
