//! TLS with rustls (ring provider): server settings and acceptor, client settings, errors.
//!
//! TLS is a layer of the connection actor, not a task of its own: a TLS connection is the same
//! actor driving a [`TlsStream`](crate::TlsStream) instead of a socket, with the same
//! backpressure, read budget and timeouts. TLS 1.2 and 1.3 only, forward-secret suites only
//! (rustls offers nothing else), as Mozilla's "intermediate" profile asks.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;

use crate::core::transport::TlsStream;

/// What went wrong setting TLS up: a file that could not be read or parsed, a key that does not
/// match its certificate, settings rustls refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file held no usable PEM item of the kind expected.
    Pem {
        /// The file.
        path: PathBuf,
        /// What was looked for: "certificate", "private key", "CA certificate".
        expected: &'static str,
    },
    /// The private key is encrypted (PKCS#8 `ENCRYPTED PRIVATE KEY`, or a legacy PEM with
    /// `Proc-Type: 4,ENCRYPTED`): canter reads keys unencrypted only.
    EncryptedKey {
        /// The key file.
        path: PathBuf,
    },
    /// A private key does not belong to the certificate it was given with.
    KeyMismatch {
        /// The certificate chain file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Which pair, from 1, of `pairs` configured (several: SNI picks one).
        pair: usize,
        /// How many certificate and key pairs were configured.
        pairs: usize,
    },
    /// No certificate was configured (neither files nor a self-signed one).
    NoCertificate,
    /// rustls refused the material or the settings (a key that does not match its
    /// certificate, an unsupported key type…).
    Rustls(rustls::Error),
    /// A self-signed certificate could not be generated.
    Generate(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, source } => write!(f, "{}: {source}", path.display()),
            TlsError::Pem { path, expected } => {
                write!(f, "{}: no PEM {expected} found", path.display())
            }
            TlsError::EncryptedKey { path } => write!(
                f,
                "{}: the private key is encrypted; canter needs it unencrypted \
                 (for example: openssl pkey -in KEY -out PLAIN_KEY)",
                path.display()
            ),
            TlsError::KeyMismatch {
                cert,
                key,
                pair,
                pairs,
            } => {
                write!(
                    f,
                    "{}: the private key does not belong to the certificate in {}",
                    key.display(),
                    cert.display()
                )?;
                if *pairs > 1 {
                    write!(f, " (certificate and key pair {pair} of {pairs})")?;
                }
                Ok(())
            }
            TlsError::NoCertificate => {
                f.write_str("TLS needs a certificate (files or self-signed)")
            }
            TlsError::Rustls(e) => write!(f, "TLS: {e}"),
            TlsError::Generate(e) => write!(f, "self-signed certificate: {e}"),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read { source, .. } => Some(source),
            TlsError::Rustls(e) => Some(e),
            _ => None,
        }
    }
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Rustls(e)
    }
}

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// TLS 1.2 session IDs the server remembers (shared by all workers); TLS 1.3 and TLS 1.2
/// clients that take tickets resume from a ticket and cost no memory here.
const SESSION_CACHE: usize = 4096;

/// Server-side TLS settings; [`ServerTls::build`] checks them and loads the certificates.
///
/// ```no_run
/// use canter_rt::ServerTls;
/// let acceptor = ServerTls::new()
///     .cert("example.com.pem", "example.com.key")
///     .cert("example.org.pem", "example.org.key") // chosen by SNI
///     .build()?;
/// # Ok::<(), canter_rt::TlsError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServerTls {
    certs: Vec<(PathBuf, PathBuf)>,
    self_signed: bool,
    client_ca: Option<PathBuf>,
    alpn: Vec<Vec<u8>>,
    handshake_timeout: Duration,
}

impl Default for ServerTls {
    fn default() -> Self {
        ServerTls::new()
    }
}

impl ServerTls {
    /// No certificate yet, ALPN `h2` then `http/1.1`, a 10 s handshake timeout, no client
    /// certificates.
    pub fn new() -> ServerTls {
        ServerTls {
            certs: Vec::new(),
            self_signed: false,
            client_ca: None,
            // `h2` only where this build speaks it: a client that chose it would get HTTP/1.1.
            #[cfg(feature = "http2")]
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            #[cfg(not(feature = "http2"))]
            alpn: vec![b"http/1.1".to_vec()],
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// Adds a certificate chain (PEM, leaf first) and its private key (PEM: PKCS#8, PKCS#1 or
    /// SEC1). With several, the client's server name (SNI) picks the first whose certificate is
    /// valid for it; an unknown or missing name gets the first.
    pub fn cert(mut self, chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> ServerTls {
        self.certs.push((chain.into(), key.into()));
        self
    }

    /// Generates a development certificate for `localhost`, `127.0.0.1` and `::1` at build time
    /// (ECDSA P-256), used when no files are given. Its SHA-256 fingerprint is in
    /// [`TlsAcceptor::self_signed_fingerprint`].
    pub fn self_signed(mut self) -> ServerTls {
        self.self_signed = true;
        self
    }

    /// Requires a client certificate signed by one of the CAs in `pem` (a PEM bundle); handlers
    /// read the verified chain as the request extension
    /// [`PeerCertificates`](crate::PeerCertificates).
    pub fn client_ca(mut self, pem: impl Into<PathBuf>) -> ServerTls {
        self.client_ca = Some(pem.into());
        self
    }

    /// The protocols offered by ALPN, most preferred first (default `h2`, `http/1.1`). A client that
    /// offers ALPN but none of these gets the `no_application_protocol` alert.
    pub fn alpn(mut self, protocols: &[&[u8]]) -> ServerTls {
        self.alpn = protocols.iter().map(|p| p.to_vec()).collect();
        self
    }

    /// How long a client may take to complete the handshake before the connection is closed.
    pub fn handshake_timeout(mut self, timeout: Duration) -> ServerTls {
        self.handshake_timeout = timeout;
        self
    }

    /// Loads the certificates and builds the acceptor shared by every worker (one session cache
    /// and one set of ticket keys, rotated every six hours, so a session resumes on any worker).
    pub fn build(self) -> Result<TlsAcceptor, TlsError> {
        let provider = provider();
        let (keys, fingerprint) = self.load_keys(&provider)?;
        let resolver = Arc::new(Resolver {
            keys: RwLock::new(Arc::new(keys)),
        });
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(VERSIONS)?;
        let builder = match &self.client_ca {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certs(path, "CA certificate")? {
                    roots.add(cert)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = self.alpn.clone();
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        Ok(TlsAcceptor {
            inner: Arc::new(AcceptorInner {
                acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
                resolver,
                settings: self,
                fingerprint,
            }),
        })
    }

    fn load_keys(&self, provider: &CryptoProvider) -> Result<(Keys, Option<String>), TlsError> {
        if self.certs.is_empty() {
            if !self.self_signed {
                return Err(TlsError::NoCertificate);
            }
            let (key, fingerprint) = self_signed(provider)?;
            return Ok((Keys { all: vec![key] }, Some(fingerprint)));
        }
        let mut all = Vec::with_capacity(self.certs.len());
        for (i, (chain, key)) in self.certs.iter().enumerate() {
            all.push(Arc::new(load_pair(
                chain,
                key,
                (i + 1, self.certs.len()),
                provider,
            )?));
        }
        Ok((Keys { all }, None))
    }
}

/// A certificate chain and its private key from PEM files, checked to belong together;
/// `(pair, pairs)` places them among those configured, for the error.
fn load_pair(
    chain: &Path,
    key: &Path,
    (pair, pairs): (usize, usize),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain_der = read_certs(chain, "certificate")?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        if is_encrypted_key(key) {
            TlsError::EncryptedKey {
                path: key.to_owned(),
            }
        } else {
            pem_error(key, e)
        }
    })?;
    match CertifiedKey::from_der(chain_der, key_der, provider) {
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch {
            cert: chain.to_owned(),
            key: key.to_owned(),
            pair,
            pairs,
        }),
        other => Ok(other?),
    }
}

/// Whether the PEM file at `path` holds an encrypted private key (which the PEM reader skips,
/// finding no key).
fn is_encrypted_key(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED")
    })
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    match e {
        rustls::pki_types::pem::Error::Io(source) => TlsError::Read {
            path: path.to_owned(),
            source,
        },
        _ => TlsError::Pem {
            path: path.to_owned(),
            expected: "private key",
        },
    }
}

fn read_certs(
    path: &Path,
    expected: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| TlsError::Pem {
            path: path.to_owned(),
            expected,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            expected,
        });
    }
    Ok(certs)
}

fn self_signed(provider: &CryptoProvider) -> Result<(Arc<CertifiedKey>, String), TlsError> {
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(generate)?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).map_err(generate)?;
    for ip in [
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
    ] {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    }
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "canter development certificate");
    let cert = params.self_signed(&key).map_err(generate)?;
    let der = cert.der().clone();
    let fingerprint = crate::core::transport::sha256_fingerprint(&der);
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Generate(e.to_owned()))?;
    let certified = CertifiedKey::from_der(vec![der], key_der, provider)?;
    Ok((Arc::new(certified), fingerprint))
}

/// The server's certificates, the first being the default.
#[derive(Debug)]
struct Keys {
    all: Vec<Arc<CertifiedKey>>,
}

impl Keys {
    fn for_name(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let first = self.all.first()?;
        let (Some(name), true) = (name, self.all.len() > 1) else {
            return Some(first.clone());
        };
        let Ok(name) = ServerName::try_from(name) else {
            return Some(first.clone());
        };
        let valid = |key: &&Arc<CertifiedKey>| {
            key.end_entity_cert().ok().is_some_and(|der| {
                webpki::EndEntityCert::try_from(der)
                    .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
            })
        };
        Some(self.all.iter().find(valid).unwrap_or(first).clone())
    }
}

/// Picks a certificate by SNI; swapped whole on reload, so a handshake sees the old set or the
/// new one, never a mix.
#[derive(Debug)]
struct Resolver {
    keys: RwLock<Arc<Keys>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let keys = match self.keys.read() {
            Ok(keys) => keys.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        keys.for_name(hello.server_name())
    }
}

/// A built server TLS configuration, shared by every worker; cheap to clone.
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: Arc<AcceptorInner>,
}

struct AcceptorInner {
    acceptor: tokio_rustls::TlsAcceptor,
    resolver: Arc<Resolver>,
    settings: ServerTls,
    fingerprint: Option<String>,
}

impl fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl TlsAcceptor {
    /// Re-reads the certificate and key files. New handshakes use the new certificates; open
    /// connections keep theirs. On error the old certificates stay in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        if self.inner.settings.certs.is_empty() {
            return Ok(());
        }
        let (keys, _) = self.inner.settings.load_keys(&provider())?;
        let mut current = match self.inner.resolver.keys.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        *current = Arc::new(keys);
        Ok(())
    }

    /// This acceptor without `protocol` among the ALPN protocols it offers: the same
    /// certificates (a [`TlsAcceptor::reload`] of either reaches both), session caches of its
    /// own. What a server with HTTP/2 off serves with, so that no client agrees on `h2`.
    pub fn without_alpn(&self, protocol: &[u8]) -> TlsAcceptor {
        let mut config = (**self.inner.acceptor.config()).clone();
        config.alpn_protocols.retain(|p| p != protocol);
        let mut settings = self.inner.settings.clone();
        settings.alpn.retain(|p| p != protocol);
        TlsAcceptor {
            inner: Arc::new(AcceptorInner {
                acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
                resolver: self.inner.resolver.clone(),
                settings,
                fingerprint: self.inner.fingerprint.clone(),
            }),
        }
    }

    /// The rustls configuration for QUIC: the same certificates (the resolver is shared, so a
    /// reload reaches it), session tickets and cache, ALPN `h3` only. With `early_data`, 0-RTT
    /// is offered: rustls takes early data only on sessions resumed from its cache, so tickets
    /// then carry a session ID rather than the session itself; without, no early data (it can
    /// be replayed).
    #[cfg(feature = "http3")]
    pub(crate) fn quic_config(&self, early_data: bool) -> rustls::ServerConfig {
        let mut config = (**self.inner.acceptor.config()).clone();
        config.alpn_protocols = vec![b"h3".to_vec()];
        if early_data {
            config.max_early_data_size = u32::MAX;
            config.ticketer = Arc::new(StatefulTickets);
        } else {
            config.max_early_data_size = 0;
        }
        config
    }

    /// The ALPN protocols offered, in order of preference.
    pub fn alpn_protocols(&self) -> &[Vec<u8>] {
        &self.inner.acceptor.config().alpn_protocols
    }

    /// The SHA-256 fingerprint of the generated development certificate, if one is in use.
    pub fn self_signed_fingerprint(&self) -> Option<&str> {
        self.inner.fingerprint.as_deref()
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        self.inner.settings.handshake_timeout
    }

    /// Runs the server side of a handshake on `io` (a [`TcpStream`], or any byte stream) under
    /// the handshake timeout.
    pub async fn accept<IO>(&self, io: IO) -> io::Result<tokio_rustls::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let handshake = self.inner.acceptor.accept(io);
        match tokio::time::timeout(self.handshake_timeout(), handshake).await {
            Ok(Ok(stream)) => Ok(tokio_rustls::TlsStream::Server(stream)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}

/// No stateless tickets: sessions resume from the server's cache (what early data needs).
#[cfg(feature = "http3")]
#[derive(Debug)]
struct StatefulTickets;

#[cfg(feature = "http3")]
impl rustls::server::ProducesTickets for StatefulTickets {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Re-reads the acceptor's certificate files on SIGHUP (watched from a small background
/// thread), logging the outcome; a broken file keeps the old certificates.
pub fn reload_on_sighup(acceptor: TlsAcceptor) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let mut hup = {
        let _guard = rt.enter();
        signal(SignalKind::hangup())?
    };
    std::thread::Builder::new()
        .name("canter-tls-reload".into())
        .spawn(move || {
            rt.block_on(async {
                while hup.recv().await.is_some() {
                    match acceptor.reload() {
                        Ok(()) => tracing::info!("TLS certificates reloaded"),
                        Err(e) => {
                            tracing::error!(error = %e, "TLS reload failed; keeping the old certificates")
                        }
                    }
                }
            });
        })?;
    Ok(())
}

/// Client-side TLS settings for outbound connections; cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    /// The config's verifier (rustls has no getter), for [`ClientTls::without_name_check`].
    verifier: Arc<dyn rustls::client::danger::ServerCertVerifier>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Verifies servers against the Mozilla root store (the `webpki-roots` crate).
    pub fn webpki_roots(alpn: &[&[u8]]) -> ClientTls {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        ClientTls::with_roots(roots, alpn)
    }

    /// Verifies servers against the CA certificates in `pem` only. A server certificate that
    /// is itself one of them is trusted for the names it holds, as curl, Python, Node and
    /// browsers trust it: a self-signed certificate from a plain `openssl req -x509` is marked
    /// CA:TRUE by OpenSSL 3, which chain validation alone refuses as an end entity.
    pub fn ca_file(pem: impl AsRef<Path>, alpn: &[&[u8]]) -> Result<ClientTls, TlsError> {
        let anchors = read_certs(pem.as_ref(), "CA certificate")?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &anchors {
            roots.add(cert.clone())?;
        }
        let provider = provider();
        let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
        Ok(ClientTls::from_verifier(
            provider,
            Arc::new(AnchorsOrChain { anchors, chain }),
            alpn,
        ))
    }

    /// Accepts any server certificate: no authentication at all, for testing against a
    /// development certificate only. The handshake's signatures are still checked.
    pub fn insecure(alpn: &[&[u8]]) -> ClientTls {
        let provider = provider();
        ClientTls::from_verifier(provider.clone(), Arc::new(NoVerification(provider)), alpn)
    }

    fn with_roots(roots: rustls::RootCertStore, alpn: &[&[u8]]) -> ClientTls {
        let provider = provider();
        match rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        {
            Ok(verifier) => ClientTls::from_verifier(provider, verifier, alpn),
            // Only an empty store fails to build: no server can then be trusted.
            Err(_) => ClientTls::from_verifier(provider, Arc::new(Nobody), alpn),
        }
    }

    fn from_verifier(
        provider: Arc<CryptoProvider>,
        verifier: Arc<dyn rustls::client::danger::ServerCertVerifier>,
        alpn: &[&[u8]],
    ) -> ClientTls {
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(VERSIONS)
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            verifier,
        }
    }

    /// Verifies servers against the system's CA certificates (the bundle OpenSSL reads:
    /// `SSL_CERT_FILE`, or the first of the distributions' usual paths that exists), with
    /// the Mozilla root store where the system has none.
    pub fn system_roots(alpn: &[&[u8]]) -> Result<ClientTls, TlsError> {
        let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
        let bundle = from_env
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
            .find(|p| p.is_file());
        match bundle {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                // A system bundle may hold a certificate webpki cannot parse; the rest still count.
                let (added, _) =
                    roots.add_parsable_certificates(read_certs(&path, "CA certificate")?);
                if added == 0 {
                    return Err(TlsError::Pem {
                        path,
                        expected: "CA certificate",
                    });
                }
                Ok(ClientTls::with_roots(roots, alpn))
            }
            None => Ok(ClientTls::webpki_roots(alpn)),
        }
    }

    /// The same settings, presenting the certificate chain in `chain` with the private key in
    /// `key` (PEM files) to servers that ask for one (mutual TLS).
    pub fn with_client_cert(
        self,
        chain: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<ClientTls, TlsError> {
        let certified = load_pair(chain.as_ref(), key.as_ref(), (1, 1), &provider())?;
        let mut config = rustls::ClientConfig::clone(self.connector.config());
        config.client_auth_cert_resolver =
            Arc::new(rustls::sign::SingleCertAndKey::from(certified));
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            verifier: self.verifier,
        })
    }

    /// The same settings, checking the server's chain but not that its certificate names the
    /// server (librdkafka's `ssl.endpoint.identification.algorithm=none`): for servers whose
    /// certificates do not name the address clients use.
    pub fn without_name_check(self) -> ClientTls {
        let mut config = rustls::ClientConfig::clone(self.connector.config());
        let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> =
            Arc::new(AnyName(self.verifier));
        config
            .dangerous()
            .set_certificate_verifier(verifier.clone());
        ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            verifier,
        }
    }

    /// The rustls client configuration these settings stand for (its verifier, roots,
    /// resumption and ALPN), for a transport other than TCP: a QUIC client builds on it.
    pub fn rustls_config(&self) -> Arc<rustls::ClientConfig> {
        self.connector.config().clone()
    }

    /// The same settings with session resumption off: every connection runs a full handshake
    /// (by default a client resumes its sessions with the server).
    pub fn without_resumption(self) -> ClientTls {
        let mut config = rustls::ClientConfig::clone(self.connector.config());
        config.resumption = rustls::client::Resumption::disabled();
        ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            verifier: self.verifier,
        }
    }

    /// Runs the client side of a handshake on `tcp`, sending `server_name` (SNI) and verifying
    /// the certificate against it.
    pub async fn connect(&self, server_name: &str, tcp: TcpStream) -> io::Result<TlsStream> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let stream = self.connector.connect(name, tcp).await?;
        Ok(tokio_rustls::TlsStream::Client(stream))
    }
}

/// The verifier behind [`ClientTls::ca_file`]: the chain to one of the anchors, as webpki
/// checks it, or else a certificate that is byte for byte one of the anchors and valid for the
/// name asked for.
#[derive(Debug)]
struct AnchorsOrChain {
    anchors: Vec<CertificateDer<'static>>,
    chain: Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for AnchorsOrChain {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let refused =
            match self
                .chain
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Ok(verified) => return Ok(verified),
                Err(e) => e,
            };
        if !self
            .anchors
            .iter()
            .any(|a| a.as_ref() == end_entity.as_ref())
        {
            return Err(refused);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| refused)?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// Where distributions keep the system's CA bundle (what OpenSSL and Go look for).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The verifier behind [`ClientTls::without_name_check`]: another verifier's verdict, except
/// that a certificate for another name passes.
#[derive(Debug)]
struct AnyName(Arc<dyn rustls::client::danger::ServerCertVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The verifier of an empty root store: every server certificate is refused.
#[derive(Debug)]
struct Nobody;

impl rustls::client::danger::ServerCertVerifier for Nobody {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ))
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ))
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The verifier behind [`ClientTls::insecure`].
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
