//! An HTTP/3 client for tests: quinn (QUIC) and hyperium's `h3`, an implementation other than
//! the server's own, so a test that passes shows two stacks agreeing. It trusts any server
//! certificate (tests run against throwaway ones) and names the server `localhost`.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};

/// What a test gets back.
pub type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// A response, whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields, names lowercase, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/3 connection.
pub struct Client {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
    /// The QUIC connection under it (for its stats and close reason).
    pub quic: quinn::Connection,
    endpoint: quinn::Endpoint,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

/// A QUIC connection with ALPN `h3` and nothing on it yet: for tests that speak the protocol
/// by hand (and break it on purpose).
pub async fn connect_quic(addr: SocketAddr) -> Result<(quinn::Endpoint, quinn::Connection)> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(client_tls()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let conn = endpoint.connect(addr, "localhost")?.await?;
    Ok((endpoint, conn))
}

/// The TLS settings of the tests' QUIC clients: TLS 1.3, ALPN `h3`, any certificate trusted.
pub fn client_tls() -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    Ok(tls)
}

impl Client {
    /// Connects to the server's HTTP/3 port.
    pub async fn connect(addr: SocketAddr) -> Result<Client> {
        let (endpoint, quic) = connect_quic(addr).await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(quic.clone())).await?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Client {
            send,
            driver,
            quic,
            endpoint,
        })
    }

    /// Moves the connection to a new local socket (a new port on 127.0.0.1), as a client whose
    /// address changed: QUIC's connection migration. The next packets leave from there.
    pub fn migrate(&self) -> Result<SocketAddr> {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let addr = socket.local_addr()?;
        self.endpoint.rebind(socket)?;
        Ok(addr)
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Response> {
        self.request("GET", path, &[], b"").await
    }

    /// Sends `GET path` and waits for the response's head only: its status, and the stream to
    /// read the body from (with [`read_body`]).
    pub async fn get_head(&mut self, path: &str) -> Result<(u16, BodyStream)> {
        let req = http::Request::builder()
            .method("GET")
            .uri(format!("https://localhost{path}"))
            .body(())?;
        let mut stream = self.send.send_request(req).await?;
        stream.finish().await?;
        let res = stream.recv_response().await?;
        Ok((res.status().as_u16(), stream))
    }

    /// Sends a request with `headers` and `body` (none when empty) and reads its response.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let mut stream = self.send.send_request(req.body(())?).await?;
        if !body.is_empty() {
            stream.send_data(Bytes::copy_from_slice(body)).await?;
        }
        stream.finish().await?;
        let res = stream.recv_response().await?;
        let mut out = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await? {
            while chunk.has_remaining() {
                let piece = chunk.chunk();
                out.extend_from_slice(piece);
                let n = piece.len();
                chunk.advance(n);
            }
        }
        Ok(Response {
            status: res.status().as_u16(),
            headers: res
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: out,
        })
    }
}

/// A response body still to read.
pub type BodyStream = h3::client::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// Reads the rest of a body: its length.
pub async fn read_body(stream: &mut BodyStream) -> Result<usize> {
    let mut n = 0;
    while let Some(mut chunk) = stream.recv_data().await? {
        n += chunk.remaining();
        chunk.advance(chunk.remaining());
    }
    Ok(n)
}

impl Drop for Client {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Trusts any certificate: the tests' servers use throwaway ones.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
