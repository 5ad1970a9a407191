//! One connection to one broker: size-prefixed requests out, responses back in the order the
//! requests went (Kafka answers a connection's requests in order), several in flight. TLS and
//! SASL (with re-authentication when the broker's session ends, KIP-368) happen here, so
//! nothing above knows whether the cluster is secured.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub use crate::addr::BrokerAddr;
use crate::error::Error;
use crate::sasl::Exchange;
use crate::security::Transport;

/// The largest response frame read (a fetch is bounded by its own `max_bytes`, 50 MiB by
/// default; a frame over this is a broken peer, not data).
const MAX_FRAME: usize = 256 << 20;

/// The socket under a connection.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<canter_rt::TlsStream>),
}

impl Stream {
    async fn read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_buf(buf).await,
            Stream::Tls(s) => s.read_buf(buf).await,
        }
    }

    async fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf).await,
            Stream::Tls(s) => {
                s.write_all(buf).await?;
                s.flush().await
            }
        }
    }
}

/// A broker connection.
pub struct Conn {
    stream: Stream,
    addr: BrokerAddr,
    rbuf: BytesMut,
    wbuf: BytesMut,
    next_corr: i32,
    pending: VecDeque<i32>,
    /// Requests queued in `wbuf`, not written yet (the last ones of `pending`).
    unflushed: usize,
    versions: HashMap<i16, (i16, i16)>,
    client_id: StrBytes,
    timeout: Duration,
    transport: Arc<Transport>,
    /// When the SASL session the broker granted must be renewed (KIP-368).
    reauth_at: Option<Instant>,
    reauthentications: u32,
    /// Whether a request other than the handshake's has been answered (a broker that closes
    /// before that may be a SASL listener refusing a client that did not authenticate).
    answered: bool,
}

impl Conn {
    /// Connects (each address the host resolves to in turn), runs the TLS handshake if the
    /// transport has TLS, asks the broker which request versions it speaks, and authenticates
    /// if the transport has SASL.
    pub(crate) async fn connect(
        addr: &BrokerAddr,
        transport: &Arc<Transport>,
        client_id: &str,
        timeout: Duration,
    ) -> Result<Conn, Error> {
        let deadline = Instant::now() + timeout;
        let resolved = match tokio::time::timeout_at(
            deadline,
            tokio::net::lookup_host((addr.host.as_str(), addr.port)),
        )
        .await
        {
            Ok(Ok(a)) => a.collect::<Vec<_>>(),
            Ok(Err(e)) => {
                return Err(Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("resolving {addr}: {e}"),
                )))
            }
            Err(_) => return Err(Error::Timeout("resolving a broker's name")),
        };
        let mut last = None;
        let mut tcp = None;
        for a in resolved {
            match tokio::time::timeout_at(deadline, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    tcp = Some(s);
                    break;
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => return Err(Error::Timeout("connect")),
            }
        }
        let Some(tcp) = tcp else {
            let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
            return Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!("connecting to {addr}: {e}"),
            )));
        };
        tcp.set_nodelay(true)?;
        let stream = match &transport.tls {
            None => Stream::Tcp(tcp),
            Some(tls) => {
                match tokio::time::timeout_at(deadline, tls.connect(&addr.host, tcp)).await {
                    Ok(Ok(s)) => Stream::Tls(Box::new(s)),
                    Ok(Err(e)) => return Err(tls_error(addr, e, true)),
                    Err(_) => return Err(Error::Timeout("TLS handshake with a broker")),
                }
            }
        };
        let mut conn = Conn {
            stream,
            addr: addr.clone(),
            rbuf: BytesMut::with_capacity(64 << 10),
            wbuf: BytesMut::with_capacity(64 << 10),
            next_corr: 1,
            pending: VecDeque::new(),
            unflushed: 0,
            versions: HashMap::new(),
            client_id: StrBytes::from_string(client_id.to_owned()),
            timeout,
            transport: transport.clone(),
            reauth_at: None,
            reauthentications: 0,
            answered: false,
        };
        // ApiVersions v3; a broker that knows no v3 answers v0 with error 35 and its ranges.
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("canter"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let resp = conn.call_at(req, 3).await?;
        if resp.error_code != 0 {
            return Err(Error::broker("ApiVersions", resp.error_code, None));
        }
        for k in resp.api_keys {
            conn.versions
                .insert(k.api_key, (k.min_version, k.max_version));
        }
        if conn.transport.sasl.is_some() {
            conn.authenticate().await?;
        }
        Ok(conn)
    }

    /// Runs a SASL exchange (SaslHandshake, then SaslAuthenticate until the mechanism is
    /// done) and notes when the broker wants it renewed.
    async fn authenticate(&mut self) -> Result<(), Error> {
        let transport = self.transport.clone();
        let Some(sasl) = &transport.sasl else {
            return Ok(());
        };
        let mech = sasl.mechanism.name();
        let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mech));
        let v = self.version::<SaslHandshakeRequest>(1, 1)?;
        let resp = self.call_at(hs, v).await?;
        match resp.error_code {
            0 => {}
            33 => {
                let enabled: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
                return Err(Error::Auth(format!(
                    "broker {} does not enable SASL mechanism {mech} (sasl.mechanism); it                      enables: {}",
                    self.addr,
                    enabled.join(", ")
                )));
            }
            code => return Err(Error::broker("SaslHandshake", code, None)),
        }
        let mut exchange = Exchange::start(sasl.mechanism, &sasl.username, sasl.password.expose());
        let v = self.version::<SaslAuthenticateRequest>(0, 2)?;
        let mut out = exchange.first();
        loop {
            let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(out));
            let resp = self.call_at(req, v).await?;
            if resp.error_code != 0 {
                let said = resp
                    .error_message
                    .as_deref()
                    .filter(|m| !m.is_empty())
                    .map_or_else(|| Error::code_name(resp.error_code), str::to_owned);
                return Err(Error::Auth(format!(
                    "SASL {mech} authentication as {:?} at broker {} failed: {said} (error {})",
                    sasl.username, self.addr, resp.error_code
                )));
            }
            match exchange.step(&resp.auth_bytes) {
                Ok(Some(next)) => out = next,
                Ok(None) => {
                    self.reauth_at = (resp.session_lifetime_ms > 0).then(|| {
                        Instant::now()
                            + Duration::from_millis(resp.session_lifetime_ms as u64 * 9 / 10)
                    });
                    return Ok(());
                }
                Err(e) => {
                    return Err(Error::Auth(format!(
                        "SASL {mech} with broker {}: {}",
                        self.addr, e.0
                    )))
                }
            }
        }
    }

    /// How many times this connection renewed its SASL session (KIP-368).
    pub fn reauthentications(&self) -> u32 {
        self.reauthentications
    }

    /// How long a request may wait for its answer.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The broker's address.
    pub fn addr(&self) -> &BrokerAddr {
        &self.addr
    }

    /// The highest version of `R` in `lo..=hi` the broker speaks.
    pub fn version<R: Request>(&self, lo: i16, hi: i16) -> Result<i16, Error> {
        let name = api_name(R::KEY);
        let (min, max) = *self.versions.get(&R::KEY).ok_or(Error::Version(name))?;
        let v = hi.min(max);
        if v < lo || v < min {
            return Err(Error::Version(name));
        }
        Ok(v)
    }

    /// Sends a request and waits for its answer.
    pub async fn call<R: Request>(
        &mut self,
        req: R,
        lo: i16,
        hi: i16,
    ) -> Result<R::Response, Error> {
        let v = self.version::<R>(lo, hi)?;
        self.send(&req, v)?;
        self.flush().await?;
        self.recv::<R>(v).await
    }

    async fn call_at<R: Request>(&mut self, req: R, v: i16) -> Result<R::Response, Error> {
        self.send(&req, v)?;
        self.write_queued().await?;
        self.recv::<R>(v).await
    }

    /// Queues a request (written by [`Conn::flush`]); its answer is read by [`Conn::recv`] in
    /// the order requests were queued.
    pub fn send<R: Request>(&mut self, req: &R, v: i16) -> Result<(), Error> {
        let corr = self.next_corr;
        self.next_corr = self.next_corr.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(v)
            .with_correlation_id(corr)
            .with_client_id(Some(self.client_id.clone()));
        let hv = R::header_version(v);
        let start = self.wbuf.len();
        self.wbuf.put_i32(0);
        header
            .encode(&mut self.wbuf, hv)
            .and_then(|()| req.encode(&mut self.wbuf, v))
            .map_err(|e| Error::Corrupt(format!("encoding {}: {e}", api_name(R::KEY))))?;
        let len = (self.wbuf.len() - start - 4) as i32;
        self.wbuf[start..start + 4].copy_from_slice(&len.to_be_bytes());
        self.pending.push_back(corr);
        self.unflushed += 1;
        Ok(())
    }

    /// Writes what [`Conn::send`] queued; first renews the SASL session if it is due and no
    /// answer is outstanding (the exchange must not interleave with other responses).
    pub async fn flush(&mut self) -> Result<(), Error> {
        let r = self.flush_inner().await;
        if let Err(e) = &r {
            self.report(e);
        }
        r
    }

    /// A failure of this connection, for the brokers' health: a request that timed out says
    /// the broker does not answer; a connection that broke (a broker restarting, or closing a
    /// connection idle past its `connections.max.idle.ms`) says nothing yet — the reconnect
    /// that follows reports the broker if it is really gone.
    fn report(&self, e: &Error) {
        if matches!(e, Error::Timeout(_)) {
            self.transport.health.failure(&self.addr, e);
        }
    }

    async fn flush_inner(&mut self) -> Result<(), Error> {
        if self
            .reauth_at
            .is_some_and(|at| Instant::now() >= at && self.pending.len() == self.unflushed)
        {
            let queued = std::mem::take(&mut self.wbuf);
            let pending = std::mem::take(&mut self.pending);
            let unflushed = std::mem::replace(&mut self.unflushed, 0);
            let r = self.authenticate().await;
            self.wbuf = queued;
            self.pending = pending;
            self.unflushed = unflushed;
            r?;
            self.reauthentications += 1;
            tracing::debug!(broker = %self.addr, "SASL session renewed");
        }
        self.write_queued().await
    }

    async fn write_queued(&mut self) -> Result<(), Error> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let w = self.stream.write_all(&self.wbuf);
        match tokio::time::timeout(self.timeout, w).await {
            Ok(r) => r.map_err(|e| self.io_error(e))?,
            Err(_) => return Err(Error::Timeout("write to broker")),
        }
        self.wbuf.clear();
        self.unflushed = 0;
        Ok(())
    }

    /// An I/O error, with what TLS said if it was TLS.
    fn io_error(&self, e: std::io::Error) -> Error {
        match &self.stream {
            Stream::Tls(_) => tls_error(&self.addr, e, false),
            Stream::Tcp(_) => Error::Io(e),
        }
    }

    /// Requests sent whose answers have not been read.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Reads the answer to the oldest request in flight, which was an `R` at version `v`.
    pub async fn recv<R: Request>(&mut self, v: i16) -> Result<R::Response, Error> {
        let frame = match self.read_frame(self.timeout).await {
            Ok(f) => {
                self.transport.health.answered(&self.addr);
                f
            }
            Err(e) => {
                self.report(&e);
                return Err(e);
            }
        };
        self.decode::<R>(frame, v)
    }

    fn decode<R: Request>(&mut self, mut frame: Bytes, v: i16) -> Result<R::Response, Error> {
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(v))
            .map_err(|e| Error::Corrupt(format!("response header: {e}")))?;
        let want = self.pending.pop_front();
        if want != Some(header.correlation_id) {
            return Err(Error::Corrupt(format!(
                "response {} where {want:?} was due",
                header.correlation_id
            )));
        }
        let resp = R::Response::decode(&mut frame, v)
            .map_err(|e| Error::Corrupt(format!("{} response: {e}", api_name(R::KEY))))?;
        if !matches!(
            R::KEY,
            k if k == ApiKey::ApiVersions as i16
                || k == ApiKey::SaslHandshake as i16
                || k == ApiKey::SaslAuthenticate as i16
        ) {
            self.answered = true;
        }
        Ok(resp)
    }

    /// Like [`Conn::recv`] with a longer wait: a fetch that waits `max_wait` at the broker.
    pub async fn recv_within<R: Request>(
        &mut self,
        v: i16,
        extra: Duration,
    ) -> Result<R::Response, Error> {
        let saved = self.timeout;
        self.timeout += extra;
        let r = self.recv::<R>(v).await;
        self.timeout = saved;
        r
    }

    async fn read_frame(&mut self, timeout: Duration) -> Result<Bytes, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.rbuf.len() >= 4 {
                // A TLS record (an alert, a handshake) where a Kafka frame was due: the
                // listener speaks TLS and this client does not.
                if !self.answered
                    && matches!(self.stream, Stream::Tcp(_))
                    && matches!(self.rbuf[..3], [0x15 | 0x16, 3, 0..=4])
                {
                    return Err(Error::Tls(format!(
                        "broker {} answered with TLS: its listener needs security.protocol=ssl                          or sasl_ssl",
                        self.addr
                    )));
                }
                let len = (&self.rbuf[..4]).get_i32();
                if len < 0 || len as usize > MAX_FRAME {
                    return Err(Error::Corrupt(format!("response frame of {len} bytes")));
                }
                let total = 4 + len as usize;
                if self.rbuf.len() >= total {
                    let mut f = self.rbuf.split_to(total);
                    f.advance(4);
                    return Ok(f.freeze());
                }
                self.rbuf.reserve(total - self.rbuf.len());
            } else {
                self.rbuf.reserve(64 << 10);
            }
            let read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf));
            match read.await {
                Ok(Ok(0)) => {
                    let hint = match (self.answered, self.transport.sasl.is_some()) {
                        (false, false) => {
                            " before answering a request: a SASL listener does this to a \
                             client that does not authenticate (security.protocol=sasl_ssl \
                             or sasl_plaintext?)"
                        }
                        _ => "",
                    };
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("broker {} closed the connection{hint}", self.addr),
                    )));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(self.io_error(e)),
                Err(_) => return Err(Error::Timeout("broker response")),
            }
        }
    }
}

/// A TLS failure, said in the terms of the settings that fix it. `handshake`: during the
/// handshake (else on an established connection, where only an alert is TLS's own).
fn tls_error(addr: &BrokerAddr, e: std::io::Error, handshake: bool) -> Error {
    use rustls::{AlertDescription as A, CertificateError as C, Error as R};
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<R>()) else {
        if handshake && e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Error::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "broker {addr} closed the connection during the TLS handshake (does it \
                     listen with TLS on this port? security.protocol)"
                ),
            ));
        }
        return Error::Io(e);
    };
    let what = match tls {
        R::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "the certificate of broker {addr} is not signed by a CA this client trusts \
             (ssl.ca.location)"
        ),
        R::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
            "the certificate of broker {addr} is not valid for {:?} (set \
             ssl.endpoint.identification.algorithm=none to accept it anyway)",
            addr.host
        ),
        R::InvalidCertificate(c) => {
            format!("the certificate of broker {addr} is refused: {c:?}")
        }
        R::AlertReceived(
            alert @ (A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::HandshakeFailure
            | A::AccessDenied),
        ) => format!(
            "broker {addr} refused the TLS session ({alert:?}): it requires a client \
             certificate it trusts (ssl.certificate.location, ssl.key.location)"
        ),
        R::InvalidMessage(_) => format!(
            "broker {addr} does not speak TLS on this port (security.protocol=plaintext or \
             sasl_plaintext?): {tls}"
        ),
        other => format!("TLS with broker {addr}: {other}"),
    };
    Error::Tls(what)
}

/// A request's name, for errors.
pub(crate) fn api_name(key: i16) -> &'static str {
    match ApiKey::try_from(key) {
        Ok(ApiKey::Produce) => "Produce",
        Ok(ApiKey::Fetch) => "Fetch",
        Ok(ApiKey::ListOffsets) => "ListOffsets",
        Ok(ApiKey::Metadata) => "Metadata",
        Ok(ApiKey::OffsetCommit) => "OffsetCommit",
        Ok(ApiKey::OffsetFetch) => "OffsetFetch",
        Ok(ApiKey::FindCoordinator) => "FindCoordinator",
        Ok(ApiKey::ApiVersions) => "ApiVersions",
        Ok(ApiKey::CreateTopics) => "CreateTopics",
        Ok(ApiKey::InitProducerId) => "InitProducerId",
        Ok(ApiKey::ConsumerGroupHeartbeat) => "ConsumerGroupHeartbeat",
        Ok(ApiKey::SaslHandshake) => "SaslHandshake",
        Ok(ApiKey::SaslAuthenticate) => "SaslAuthenticate",
        Ok(ApiKey::JoinGroup) => "JoinGroup",
        Ok(ApiKey::SyncGroup) => "SyncGroup",
        Ok(ApiKey::Heartbeat) => "Heartbeat",
        Ok(ApiKey::LeaveGroup) => "LeaveGroup",
        Ok(ApiKey::TxnOffsetCommit) => "TxnOffsetCommit",
        Ok(ApiKey::AddOffsetsToTxn) => "AddOffsetsToTxn",
        Ok(ApiKey::AddPartitionsToTxn) => "AddPartitionsToTxn",
        Ok(ApiKey::EndTxn) => "EndTxn",
        _ => "request",
    }
}
