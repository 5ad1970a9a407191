//! The PROXY protocol (HAProxy's, versions 1 and 2): a load balancer in front of the server
//! opens each connection with a header that names the client it accepted, so the server sees
//! the client's address instead of the balancer's.
//!
//! [`parse`] is the sans-IO part (bytes in, a header or "need more" out); `read_header` reads
//! one from an accepted connection without consuming a byte beyond it, so what follows (a TLS
//! handshake, an HTTP request) is read by the next layer as if the header had never been there.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::core::tcp_loop::OwnTcp;

/// The version 2 signature: twelve bytes no HTTP or TLS stream can start with.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The longest version 1 header, CRLF included (the specification's 107 bytes).
const V1_MAX: usize = 107;

/// Accepting the PROXY protocol on the listeners: every connection must open with a header,
/// from one of the allowed sources. Built with [`ProxyProtocol::builder`], which checks it;
/// `ProxyProtocol::default()` accepts a header from any source within 3 s, 4 KiB at most.
///
/// ```
/// use std::time::Duration;
/// let pp = canter_rt::proxy::ProxyProtocol::builder()
///     .from(vec!["10.0.0.0/8".parse()?])
///     .timeout(Duration::from_secs(1))
///     .build()?;
/// assert!(pp.allows("10.1.2.3".parse()?) && !pp.allows("192.0.2.1".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProxyProtocol {
    pub(crate) from: Vec<Cidr>,
    pub(crate) timeout: Duration,
    pub(crate) max_len: usize,
}

impl Default for ProxyProtocol {
    fn default() -> Self {
        ProxyProtocol {
            from: Vec::new(),
            timeout: Duration::from_secs(3),
            max_len: 4096,
        }
    }
}

impl ProxyProtocol {
    /// A builder starting from the defaults.
    pub fn builder() -> ProxyProtocolBuilder {
        ProxyProtocolBuilder(ProxyProtocol::default())
    }

    /// Whether `peer` may send a header.
    pub fn allows(&self, peer: IpAddr) -> bool {
        self.from.is_empty() || self.from.iter().any(|c| c.contains(peer))
    }

    /// Sources allowed to send a header (the balancers); empty allows any.
    pub fn sources(&self) -> &[Cidr] {
        &self.from
    }

    /// How long the header may take to arrive.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Longest accepted version 2 header, TLVs included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
}

/// Builds a [`ProxyProtocol`]; [`ProxyProtocolBuilder::build`] checks every value.
#[derive(Debug, Clone)]
pub struct ProxyProtocolBuilder(ProxyProtocol);

impl ProxyProtocolBuilder {
    /// Sources allowed to send a header (the balancers); empty (the default) allows any. A
    /// connection from elsewhere is closed unread.
    pub fn from(mut self, sources: Vec<Cidr>) -> Self {
        self.0.from = sources;
        self
    }

    /// How long the header may take to arrive (above zero).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.0.timeout = timeout;
        self
    }

    /// Longest accepted version 2 header, TLVs included (they are skipped); longer ones close
    /// the connection. At least the 16-byte fixed part, at most 64 KiB (the length field's
    /// range).
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.0.max_len = bytes;
        self
    }

    /// The settings, or the first one out of its range.
    pub fn build(self) -> Result<ProxyProtocol, canter_http::ConfigError> {
        let p = self.0;
        if p.timeout.is_zero() {
            return Err(canter_http::ConfigError::new(
                "timeout",
                "must be above zero",
            ));
        }
        if !(16..=16 + 65535).contains(&p.max_len) {
            return Err(canter_http::ConfigError::new(
                "max_len",
                "must be 16 bytes to 64 KiB",
            ));
        }
        Ok(p)
    }
}

/// An address block, `10.0.0.0/8` or `2001:db8::/32`; a bare address is a block of one. An
/// IPv4 block also matches the same addresses mapped into IPv6 (`::ffff:10.1.2.3`), as a
/// dual-stack listener reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// A block that is not `ADDRESS` or `ADDRESS/PREFIX` with a prefix the address family allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an address or address/prefix: {:?}", self.0)
    }
}

impl std::error::Error for CidrError {}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = || CidrError(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(err)?
            }
            Some(_) => return Err(err()),
        };
        Ok(Cidr { addr, prefix })
    }
}

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A proxied TCP connection from `source` to `destination`.
    Proxied {
        /// The client's address.
        source: SocketAddr,
        /// The address the client connected to (the balancer's).
        destination: SocketAddr,
    },
    /// No client address: version 1 `UNKNOWN`, a version 2 `LOCAL` command (the balancer's own
    /// health check), or an address family other than TCP over IPv4 or IPv6. The connection is
    /// the balancer's own.
    Local,
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The connection does not start with a PROXY header.
    Missing,
    /// A header that breaks the grammar of its version.
    Malformed,
    /// A version 2 header longer than [`ProxyProtocol::max_len`].
    TooLong,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Missing => "no PROXY protocol header",
            Error::Malformed => "malformed PROXY protocol header",
            Error::TooLong => "PROXY protocol header too long",
        })
    }
}

impl std::error::Error for Error {}

/// Parses the header at the start of `buf`: `Ok(Some((header, length)))`, or `Ok(None)` when
/// `buf` is a correct beginning of a header that has not arrived whole (every byte of `buf` then
/// belongs to the header).
pub fn parse(buf: &[u8], max_len: usize) -> Result<Option<(Header, usize)>, Error> {
    if buf.first() == Some(&b'P') {
        return parse_v1(buf);
    }
    let sig = buf.len().min(V2_SIGNATURE.len());
    if buf[..sig] != V2_SIGNATURE[..sig] {
        return Err(Error::Missing);
    }
    let Some(fixed) = buf.get(..16) else {
        return Ok(None);
    };
    let (ver_cmd, family) = (fixed[12], fixed[13]);
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if ver_cmd >> 4 != 2 {
        return Err(Error::Malformed);
    }
    if 16 + len > max_len {
        return Err(Error::TooLong);
    }
    let Some(body) = buf.get(16..16 + len) else {
        return Ok(None);
    };
    let header = match ver_cmd & 0x0f {
        0 => Header::Local,
        1 => match family {
            // TCP over IPv4: two addresses, two ports; TLVs after them are skipped.
            0x11 => {
                let a = body.get(..12).ok_or(Error::Malformed)?;
                let ip = |i: usize| Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]);
                let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
                Header::Proxied {
                    source: SocketAddr::new(ip(0).into(), port(8)),
                    destination: SocketAddr::new(ip(4).into(), port(10)),
                }
            }
            0x21 => {
                let a = body.get(..36).ok_or(Error::Malformed)?;
                let ip = |i: usize| {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&a[i..i + 16]);
                    Ipv6Addr::from(o)
                };
                let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
                Header::Proxied {
                    source: SocketAddr::new(ip(0).into(), port(32)),
                    destination: SocketAddr::new(ip(16).into(), port(34)),
                }
            }
            // UNSPEC, UDP, Unix sockets: no TCP client address to report.
            _ => Header::Local,
        },
        _ => return Err(Error::Malformed),
    };
    Ok(Some((header, 16 + len)))
}

/// `PROXY TCP4 src dst sport dport\r\n`, `PROXY TCP6 …` or `PROXY UNKNOWN…\r\n`.
fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, Error> {
    const START: &[u8] = b"PROXY ";
    let n = buf.len().min(START.len());
    if buf[..n] != START[..n] {
        return Err(Error::Missing);
    }
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= V1_MAX {
            Err(Error::Malformed)
        } else {
            Ok(None)
        };
    };
    if end == 0 || buf[end - 1] != b'\r' {
        return Err(Error::Malformed);
    }
    let line = std::str::from_utf8(&buf[START.len().min(end - 1)..end - 1])
        .map_err(|_| Error::Malformed)?;
    let mut parts = line.split(' ');
    let header = match parts.next() {
        // Anything may follow UNKNOWN; the receiver ignores it.
        Some("UNKNOWN") => Header::Local,
        Some(family @ ("TCP4" | "TCP6")) => {
            let fields: Vec<&str> = parts.collect();
            let [src, dst, sport, dport] = fields[..] else {
                return Err(Error::Malformed);
            };
            let ip = |s: &str| -> Result<IpAddr, Error> {
                let ip = if family == "TCP4" {
                    s.parse::<Ipv4Addr>().map(IpAddr::V4)
                } else {
                    s.parse::<Ipv6Addr>().map(IpAddr::V6)
                };
                ip.map_err(|_| Error::Malformed)
            };
            // Ports are decimal, without leading zeros (the specification's grammar).
            let port = |s: &str| -> Result<u16, Error> {
                if s.is_empty() || (s.len() > 1 && s.starts_with('0')) {
                    return Err(Error::Malformed);
                }
                if !s.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Error::Malformed);
                }
                s.parse().map_err(|_| Error::Malformed)
            };
            Header::Proxied {
                source: SocketAddr::new(ip(src)?, port(sport)?),
                destination: SocketAddr::new(ip(dst)?, port(dport)?),
            }
        }
        _ => return Err(Error::Malformed),
    };
    Ok(Some((header, end + 1)))
}

/// Why [`read_header`] gave up on a connection.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer is not one of [`ProxyProtocol::from`].
    NotAllowed,
    /// A bad or missing header.
    Header(Error),
    /// The header did not arrive in time.
    TimedOut,
    /// The peer closed before the header ended.
    Eof,
    /// The socket failed.
    Io(io::Error),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::NotAllowed => f.write_str("source not allowed to send a PROXY header"),
            ReadError::Header(e) => e.fmt(f),
            ReadError::TimedOut => f.write_str("PROXY header timed out"),
            ReadError::Eof => f.write_str("closed inside the PROXY header"),
            ReadError::Io(e) => e.fmt(f),
        }
    }
}

/// A socket a PROXY header is read from: looked at without taking it, then taken.
pub(crate) trait Peek: tokio::io::AsyncRead + Unpin {
    /// Copies what the socket holds into `buf` without taking it; `Ok(0)` at its end.
    fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>>;
}

impl Peek for TcpStream {
    fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut buf = tokio::io::ReadBuf::new(buf);
        TcpStream::poll_peek(self, cx, &mut buf)
    }
}

impl Peek for OwnTcp {
    fn poll_peek(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        OwnTcp::poll_peek(self, cx, buf)
    }
}

/// Reads the header that opens `tcp`, accepted from `peer`, and returns the client's address
/// (`peer` itself for a [`Header::Local`] one). Reads nothing past the header: it peeks at what
/// has arrived and takes only the header's bytes, so the next layer reads the rest.
pub(crate) async fn read_header<T: Peek>(
    tcp: &mut T,
    peer: SocketAddr,
    cfg: &ProxyProtocol,
) -> Result<SocketAddr, ReadError> {
    if !cfg.allows(peer.ip()) {
        return Err(ReadError::NotAllowed);
    }
    let cap = cfg.max_len.max(V1_MAX);
    let read = async {
        // What has been taken of the header so far, and a window onto what follows it.
        let mut taken: Vec<u8> = Vec::with_capacity(64);
        let mut peeked = vec![0u8; 256.min(cap)];
        loop {
            let want = (cap - taken.len()).min(peeked.len());
            let window = &mut peeked[..want];
            let n = std::future::poll_fn(|cx| tcp.poll_peek(cx, window))
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return Err(ReadError::Eof);
            }
            let mut seen = taken.clone();
            seen.extend_from_slice(&peeked[..n]);
            match parse(&seen, cfg.max_len).map_err(ReadError::Header)? {
                Some((header, len)) => {
                    let rest = len - taken.len();
                    let mut sink = vec![0u8; rest];
                    tcp.read_exact(&mut sink).await.map_err(ReadError::Io)?;
                    return Ok(match header {
                        Header::Proxied { source, .. } => source,
                        Header::Local => peer,
                    });
                }
                None => {
                    // All of it is header: take it, so the next peek waits for more.
                    let mut chunk = vec![0u8; n];
                    tcp.read_exact(&mut chunk).await.map_err(ReadError::Io)?;
                    taken.extend_from_slice(&chunk);
                    if n == want && peeked.len() < cap {
                        peeked.resize(cap.min(peeked.len() * 4), 0);
                    }
                }
            }
        }
    };
    match tokio::time::timeout(cfg.timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(ReadError::TimedOut),
    }
}

/// The client of an accepted connection: `peer` itself when the server expects no PROXY
/// header, else the one its header names; `None` when the connection must close (a refused
/// source or a bad, missing or late header: counted as a protocol fault, logged at debug).
pub(crate) async fn client_of<T: Peek>(
    tcp: &mut T,
    peer: SocketAddr,
    expected: Option<&ProxyProtocol>,
    worker: &crate::core::worker::Worker,
) -> Option<SocketAddr> {
    let Some(pp) = expected else {
        return Some(peer);
    };
    match read_header(tcp, peer, pp).await {
        Ok(client) => Some(client),
        Err(e) => {
            worker.fault(crate::core::stats::ClientFault::Protocol);
            tracing::debug!(%peer, error = %e, "PROXY protocol: closing");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend([0x20 | cmd, family]);
        h.extend((body.len() as u16).to_be_bytes());
        h.extend(body);
        h
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        for (built, name) in [
            (
                ProxyProtocol::builder().timeout(Duration::ZERO).build(),
                "timeout",
            ),
            (ProxyProtocol::builder().max_len(15).build(), "max_len"),
            (ProxyProtocol::builder().max_len(1 << 20).build(), "max_len"),
        ] {
            let e = built.unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
        let pp = ProxyProtocol::builder().max_len(512).build().unwrap();
        assert_eq!((pp.max_len(), pp.timeout()), (512, Duration::from_secs(3)));
    }

    #[test]
    fn version_1() {
        let h = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /";
        let (header, len) = parse(h, 4096).unwrap().unwrap();
        assert_eq!(len, h.len() - 5);
        assert_eq!(
            header,
            Header::Proxied {
                source: "192.0.2.1:56324".parse().unwrap(),
                destination: "198.51.100.2:443".parse().unwrap(),
            }
        );
        let h = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n";
        let (header, _) = parse(h, 4096).unwrap().unwrap();
        assert!(
            matches!(header, Header::Proxied { source, .. } if source == "[2001:db8::1]:1".parse().unwrap())
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n", 4096),
            Ok(Some((Header::Local, 15)))
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", 4096)
                .unwrap()
                .unwrap()
                .0,
            Header::Local
        );
        // Every beginning of a good header waits for more.
        let whole = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
        for cut in 1..whole.len() {
            assert_eq!(parse(&whole[..cut], 4096), Ok(None), "{cut}");
        }
        for bad in [
            &b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\n"[..],
            b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n",
            b"PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n",
            b"PROXY TCP6 192.0.2.1 198.51.100.2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.2 056324 443\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.2 65536 443\r\n",
            b"PROXY TCP4 192.0.2.1  198.51.100.2 1 443\r\n",
            b"PROXY UDP4 192.0.2.1 198.51.100.2 1 443\r\n",
            b"PROXY \r\n",
        ] {
            assert_eq!(
                parse(bad, 4096),
                Err(Error::Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [&b"PROXY UNKNOWN "[..], &[b'x'; 120]].concat();
        assert_eq!(parse(&long, 4096), Err(Error::Malformed));
        assert_eq!(parse(b"GET / HTTP/1.1\r\n", 4096), Err(Error::Missing));
        assert_eq!(parse(b"PROXZ", 4096), Err(Error::Missing));
        assert_eq!(parse(b"\x16\x03\x01", 4096), Err(Error::Missing));
    }

    #[test]
    fn version_2() {
        let mut body = vec![192, 0, 2, 1, 198, 51, 100, 2];
        body.extend(56324u16.to_be_bytes());
        body.extend(443u16.to_be_bytes());
        // A TLV (PP2_TYPE_AUTHORITY) after the addresses is skipped.
        body.extend([0x02, 0x00, 0x03, b'a', b'.', b'b']);
        let h = v2(1, 0x11, &body);
        let (header, len) = parse(&[&h[..], b"rest"].concat(), 4096).unwrap().unwrap();
        assert_eq!(len, h.len());
        assert_eq!(
            header,
            Header::Proxied {
                source: "192.0.2.1:56324".parse().unwrap(),
                destination: "198.51.100.2:443".parse().unwrap(),
            }
        );
        let mut body = Vec::new();
        body.extend("2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        body.extend("2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        body.extend([0, 7, 1, 187]);
        let (header, _) = parse(&v2(1, 0x21, &body), 4096).unwrap().unwrap();
        assert_eq!(
            header,
            Header::Proxied {
                source: "[2001:db8::1]:7".parse().unwrap(),
                destination: "[2001:db8::2]:443".parse().unwrap(),
            }
        );
        // LOCAL (health checks), with or without addresses; UNSPEC and Unix families.
        assert_eq!(parse(&v2(0, 0, &[]), 4096), Ok(Some((Header::Local, 16))));
        assert_eq!(
            parse(&v2(0, 0x11, &[0; 12]), 4096).unwrap().unwrap().0,
            Header::Local
        );
        assert_eq!(
            parse(&v2(1, 0x00, &[]), 4096).unwrap().unwrap().0,
            Header::Local
        );
        assert_eq!(
            parse(&v2(1, 0x31, &[0; 216]), 4096).unwrap().unwrap().0,
            Header::Local
        );
        let whole = v2(1, 0x11, &[1; 12]);
        for cut in 1..whole.len() {
            assert_eq!(parse(&whole[..cut], 4096), Ok(None), "{cut}");
        }
        // Short address blocks, other versions and commands, too long.
        assert_eq!(parse(&v2(1, 0x11, &[0; 11]), 4096), Err(Error::Malformed));
        assert_eq!(parse(&v2(1, 0x21, &[0; 35]), 4096), Err(Error::Malformed));
        let mut h = v2(1, 0x11, &[0; 12]);
        h[12] = 0x11;
        assert_eq!(parse(&h, 4096), Err(Error::Malformed));
        assert_eq!(parse(&v2(2, 0x11, &[0; 12]), 4096), Err(Error::Malformed));
        assert_eq!(parse(&v2(1, 0x11, &[0; 200]), 100), Err(Error::TooLong));
        assert_eq!(parse(b"\r\n\r\n\0\r\nQUIZ", 4096), Err(Error::Missing));
    }

    #[test]
    fn blocks() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.200.1.2".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:1::5".parse().unwrap()));
        assert!(!v6.contains("2001:db9::5".parse().unwrap()));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0/8",
            "x",
            "10.0.0.0/+8",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
