//! One connection to one broker: size-prefixed requests out, responses back in the order the
//! requests went (Kafka answers a connection's requests in order), several in flight.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::Error;

/// The largest response frame read (a fetch is bounded by its own `max_bytes`, 50 MiB by
/// default; a frame over this is a broken peer, not data).
const MAX_FRAME: usize = 256 << 20;

/// A broker connection.
pub struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    rbuf: BytesMut,
    wbuf: BytesMut,
    next_corr: i32,
    pending: VecDeque<i32>,
    versions: HashMap<i16, (i16, i16)>,
    client_id: StrBytes,
    timeout: Duration,
}

impl Conn {
    /// Connects, then asks the broker which request versions it speaks.
    pub async fn connect(
        addr: SocketAddr,
        client_id: &str,
        timeout: Duration,
    ) -> Result<Conn, Error> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(s) => s?,
            Err(_) => return Err(Error::Timeout("connect")),
        };
        stream.set_nodelay(true)?;
        let mut conn = Conn {
            stream,
            addr,
            rbuf: BytesMut::with_capacity(64 << 10),
            wbuf: BytesMut::with_capacity(64 << 10),
            next_corr: 1,
            pending: VecDeque::new(),
            versions: HashMap::new(),
            client_id: StrBytes::from_string(client_id.to_owned()),
            timeout,
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
        Ok(conn)
    }

    /// How long a request may wait for its answer.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The broker's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
        self.call_at(req, v).await
    }

    async fn call_at<R: Request>(&mut self, req: R, v: i16) -> Result<R::Response, Error> {
        self.send(&req, v)?;
        self.flush().await?;
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
        Ok(())
    }

    /// Writes what [`Conn::send`] queued.
    pub async fn flush(&mut self) -> Result<(), Error> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let w = self.stream.write_all(&self.wbuf);
        match tokio::time::timeout(self.timeout, w).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::Timeout("write to broker")),
        }
        self.wbuf.clear();
        Ok(())
    }

    /// Requests sent whose answers have not been read.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Reads the answer to the oldest request in flight, which was an `R` at version `v`.
    pub async fn recv<R: Request>(&mut self, v: i16) -> Result<R::Response, Error> {
        let mut frame = self.read_frame(self.timeout).await?;
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(v))
            .map_err(|e| Error::Corrupt(format!("response header: {e}")))?;
        let want = self.pending.pop_front();
        if want != Some(header.correlation_id) {
            return Err(Error::Corrupt(format!(
                "response {} where {want:?} was due",
                header.correlation_id
            )));
        }
        R::Response::decode(&mut frame, v)
            .map_err(|e| Error::Corrupt(format!("{} response: {e}", api_name(R::KEY))))
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
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("broker {} closed the connection", self.addr),
                    )))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err(Error::Timeout("broker response")),
            }
        }
    }
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
        _ => "request",
    }
}
