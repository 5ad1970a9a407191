//! Target URL parsing and request construction.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{usage, LoadError};

/// Wire protocol used to talk to the target (over TCP or TLS, as the URL says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1, optionally pipelined.
    Http1,
    /// HTTP/2 with `-m` concurrent streams per connection: prior knowledge on `http://` (h2c),
    /// ALPN `h2` on `https://`.
    Http2,
    /// WebSocket on `ws://` and `wss://`: messages echoed, `--pipeline` in flight.
    WebSocket,
    /// HTTP/3 over QUIC (`--h3`, `https://` only), `-m` requests in flight per connection.
    Http3,
}

/// A request as HTTP/2 fields: the pseudo-headers first, then the regular fields with
/// lowercase names, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Request {
    /// Name and value of each field, in order.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// The request body (sent as DATA frames).
    pub body: Vec<u8>,
}

/// Builds the HTTP/2 form of a request: `:method`, `:scheme`, `:authority` (a `Host` header
/// given with `-H` replaces the URL's), `:path`, the other headers lowercased, and
/// `content-length` when there is a body. Connection-specific headers (`Connection`,
/// `Keep-Alive`, `Transfer-Encoding`, `Upgrade`, `Proxy-Connection`) are refused: HTTP/2
/// forbids them (RFC 9113, Section 8.2.2).
pub fn build_h2_request(
    method: &str,
    target: &Target,
    headers: &[String],
    body: &[u8],
) -> Result<H2Request, LoadError> {
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return usage!("invalid method {method:?}");
    }
    let mut authority = target.authority.clone();
    let mut regular = Vec::new();
    let mut has_len = false;
    for h in headers {
        let (name, value) = h.split_once(':').ok_or_else(|| {
            LoadError::Usage(format!("header {h:?} must look like \"Name: value\""))
        })?;
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return usage!("invalid header name in {h:?}");
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return usage!("invalid header value in {h:?}");
        }
        match name.as_str() {
            "host" => authority = value.to_string(),
            "connection" | "keep-alive" | "transfer-encoding" | "upgrade" | "proxy-connection" => {
                return usage!("header {name:?} is not allowed in HTTP/2");
            }
            _ => {
                has_len |= name == "content-length";
                regular.push((name.into_bytes(), value.as_bytes().to_vec()));
            }
        }
    }
    let scheme: &[u8] = if target.tls { b"https" } else { b"http" };
    let mut fields = vec![
        (b":method".to_vec(), method.as_bytes().to_vec()),
        (b":scheme".to_vec(), scheme.to_vec()),
        (b":authority".to_vec(), authority.into_bytes()),
        (b":path".to_vec(), target.path.as_bytes().to_vec()),
    ];
    fields.extend(regular);
    if !has_len && (!body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH")) {
        fields.push((
            b"content-length".to_vec(),
            body.len().to_string().into_bytes(),
        ));
    }
    Ok(H2Request {
        fields,
        body: body.to_vec(),
    })
}

/// A parsed `http://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Value for the `Host` header (authority as written).
    pub authority: String,
    /// Host part without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// `https://` or `wss://`: TLS to the server.
    pub tls: bool,
    /// `ws://` or `wss://`: WebSocket.
    pub websocket: bool,
}

impl Target {
    /// Parses an absolute `http://`, `https://`, `ws://` or `wss://` URL.
    pub fn parse(url: &str) -> Result<Target, LoadError> {
        let schemes = [
            ("http://", false, false),
            ("https://", true, false),
            ("ws://", false, true),
            ("wss://", true, true),
        ];
        let Some((rest, tls, websocket)) = schemes
            .iter()
            .find_map(|&(scheme, tls, ws)| strip_prefix_ci(url, scheme).map(|r| (r, tls, ws)))
        else {
            return usage!("URL must start with http://, https://, ws:// or wss:// (got {url:?})");
        };
        let default_port = if tls { 443 } else { 80 };
        let rest = rest.split('#').next().unwrap_or("");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.is_empty() {
            return usage!("URL {url:?} has no host");
        }
        if authority.contains('@') {
            return usage!("user info in URL is not supported");
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let close = v6
                .find(']')
                .ok_or_else(|| LoadError::Usage(format!("bad IPv6 literal in {url:?}")))?;
            let host = &v6[..close];
            let after = &v6[close + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => parse_port(p)?,
                None if after.is_empty() => default_port,
                None => return usage!("bad authority in {url:?}"),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), parse_port(p)?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return usage!("URL {url:?} has no host");
        }
        let path = if path.is_empty() {
            "/".to_string()
        } else if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_string()
        };
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return usage!("URL path contains spaces or control characters");
        }
        Ok(Target {
            authority: authority.to_string(),
            host,
            port,
            path,
            tls,
            websocket,
        })
    }

    /// Resolves the target to its loopback addresses. Non-loopback targets
    /// are refused.
    pub fn resolve_loopback(&self) -> Result<Vec<SocketAddr>, LoadError> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|source| LoadError::Io {
                what: "cannot resolve the host",
                source,
            })?
            .collect();
        let lo: Vec<SocketAddr> = addrs
            .iter()
            .filter(|a| a.ip().is_loopback())
            .copied()
            .collect();
        if lo.is_empty() {
            return Err(LoadError::NotLoopback {
                host: self.host.clone(),
                addrs,
            });
        }
        Ok(lo)
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    if s.len() >= prefix.len()
        && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
    {
        Some(&s[prefix.len()..])
    } else {
        None
    }
}

fn parse_port(p: &str) -> Result<u16, LoadError> {
    match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => usage!("invalid port {p:?}"),
    }
}

/// Builds the bytes of one HTTP/1.1 request.
pub fn build_request(
    method: &str,
    target: &Target,
    headers: &[String],
    body: &[u8],
) -> Result<Vec<u8>, LoadError> {
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return usage!("invalid method {method:?}");
    }
    let mut out = Vec::with_capacity(128 + body.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut has_host = false;
    let mut has_len = false;
    for h in headers {
        let (name, value) = h.split_once(':').ok_or_else(|| {
            LoadError::Usage(format!("header {h:?} must look like \"Name: value\""))
        })?;
        let name = name.trim();
        let value = value.trim();
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return usage!("invalid header name in {h:?}");
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return usage!("invalid header value in {h:?}");
        }
        if name.eq_ignore_ascii_case("host") {
            has_host = true;
        }
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            has_len = true;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        out.extend_from_slice(b"Host: ");
        out.extend_from_slice(target.authority.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_len && (!body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH")) {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Ok(out)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/plaintext").expect("ok");
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 8080);
        assert_eq!(t.path, "/plaintext");
        assert_eq!(t.authority, "127.0.0.1:8080");
        let t = Target::parse("http://[::1]:9000").expect("ok");
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9000, "/")
        );
        let t = Target::parse("HTTP://localhost?x=1#frag").expect("ok");
        assert_eq!((t.port, t.path.as_str()), (80, "/?x=1"));
        let t = Target::parse("https://127.0.0.1/").expect("ok");
        assert_eq!((t.port, t.tls), (443, true));
        let t = Target::parse("HTTPS://localhost:8443/x").expect("ok");
        assert_eq!((t.host.as_str(), t.port, t.tls), ("localhost", 8443, true));
        assert!(Target::parse("ftp://127.0.0.1/").is_err());
        assert!(Target::parse("ftp://127.0.0.1/").is_err());
        assert!(Target::parse("http://127.0.0.1:0/").is_err());
        assert!(Target::parse("http:///x").is_err());
    }

    #[test]
    fn loopback_only() {
        let t = Target::parse("http://127.0.0.1:1/").expect("ok");
        assert!(t.resolve_loopback().is_ok());
        let t = Target::parse("http://10.1.2.3:1/").expect("ok");
        assert!(t.resolve_loopback().is_err());
    }

    #[test]
    fn builds_requests() {
        let t = Target::parse("http://127.0.0.1:8080/p").expect("ok");
        let r = build_request("GET", &t, &[], b"").expect("ok");
        assert_eq!(r, b"GET /p HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n");
        let r = build_request("POST", &t, &["X-A:  b ".into()], b"hi").expect("ok");
        assert_eq!(
            r,
            b"POST /p HTTP/1.1\r\nX-A: b\r\nHost: 127.0.0.1:8080\r\nContent-Length: 2\r\n\r\nhi"
        );
        let r = build_request("GET", &t, &["host: x".into()], b"").expect("ok");
        assert_eq!(r, b"GET /p HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(build_request("GET", &t, &["bad".into()], b"").is_err());
        assert!(build_request("G T", &t, &[], b"").is_err());
    }

    #[test]
    fn builds_h2_requests() {
        let t = Target::parse("http://127.0.0.1:8080/p?q=1").expect("ok");
        let r = build_h2_request("POST", &t, &["X-A: b".into()], b"hi").expect("ok");
        let fields: Vec<(&[u8], &[u8])> = r
            .fields
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        assert_eq!(
            fields,
            [
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":authority", b"127.0.0.1:8080"),
                (b":path", b"/p?q=1"),
                (b"x-a", b"b"),
                (b"content-length", b"2"),
            ]
        );
        assert_eq!(r.body, b"hi");
        let r = build_h2_request("GET", &t, &["Host: example".into()], b"").expect("ok");
        assert_eq!(r.fields[2].1, b"example");
        assert_eq!(r.fields.len(), 4);
        assert!(build_h2_request("GET", &t, &["Connection: close".into()], b"").is_err());
        let t = Target::parse("https://localhost:8443/").expect("ok");
        let r = build_h2_request("GET", &t, &[], b"").expect("ok");
        assert_eq!(r.fields[1].1, b"https");
    }
}

/// What a WebSocket run sends: the upgrade request, and the message every send repeats.
#[derive(Debug, Clone)]
pub struct WsPlan {
    /// The upgrade request's bytes.
    pub request: Vec<u8>,
    /// The message payload.
    pub payload: Vec<u8>,
    /// Binary messages (text otherwise; the payload is then UTF-8).
    pub binary: bool,
    /// Offer permessage-deflate.
    pub deflate: bool,
    /// Broadcast mode (see `LoadOptions::ws_broadcast`).
    pub broadcast: bool,
}
