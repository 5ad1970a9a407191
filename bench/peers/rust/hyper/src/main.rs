//! hyper 1.x peer: hyper-util auto (HTTP/1.1 + h2c prior knowledge), current_thread tokio.
//! `peer-hyper PORT` or, over TLS with tokio-rustls, `peer-hyper PORT CERT.pem KEY.pem`.
use std::cell::RefCell;
use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, DATE, SERVER};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::net::TcpListener;

#[derive(Serialize)]
struct Message {
    message: &'static str,
}

thread_local! {
    // Date header value, refreshed at most once per second.
    static DATE_CACHE: RefCell<(SystemTime, HeaderValue)> =
        RefCell::new((SystemTime::UNIX_EPOCH, HeaderValue::from_static("")));
}

fn date() -> HeaderValue {
    DATE_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let now = SystemTime::now();
        if now.duration_since(c.0).unwrap_or(Duration::ZERO) >= Duration::from_secs(1) {
            let secs = now.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
            c.0 = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            c.1 = HeaderValue::from_str(&httpdate::fmt_http_date(now)).unwrap();
        }
        c.1.clone()
    })
}

async fn handle(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (body, ctype) = match req.uri().path() {
        "/plaintext" => (Bytes::from_static(b"Hello, World!"), "text/plain"),
        "/json" => {
            let v = serde_json::to_vec(&Message { message: "Hello, World!" }).unwrap();
            (Bytes::from(v), "application/json")
        }
        _ => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            return Ok(r);
        }
    };
    let len = body.len();
    let mut res = Response::new(Full::new(body));
    let h = res.headers_mut();
    h.insert(SERVER, HeaderValue::from_static("hyper"));
    h.insert(DATE, date());
    h.insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    Ok(res)
}

/// rustls settings as canter's: ring, TLS 1.2 and 1.3, a session cache and rotating tickets.
fn tls_acceptor(cert: &str, key: &str) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    // ALPN: `http/1.1` (the TLS suite's HTTP/1.1 rows), or the comma-separated list in
    // PEER_ALPN (bench/h2.py sets `h2,http/1.1`).
    let alpn = std::env::var("PEER_ALPN").unwrap_or_else(|_| "http/1.1".into());
    config.alpn_protocols = alpn.split(',').map(|p| p.as_bytes().to_vec()).collect();
    config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
    tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args
        .get(1)
        .cloned()
        .or_else(|| std::env::var("PORT").ok())
        .unwrap_or_else(|| "8080".into())
        .parse()
        .expect("port");
    let tls = match (args.get(2), args.get(3)) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        eprintln!("hyper listening on 127.0.0.1:{port}");
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(_) => continue,
            };
            let _ = stream.set_nodelay(true);
            let tls = tls.clone();
            tokio::task::spawn(async move {
                let mut b = auto::Builder::new(TokioExecutor::new());
                b.http1().pipeline_flush(true);
                match tls {
                    None => {
                        let _ = b.serve_connection(TokioIo::new(stream), service_fn(handle)).await;
                    }
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            let _ = b.serve_connection(TokioIo::new(stream), service_fn(handle)).await;
                        }
                    }
                }
            });
        }
    });
}
