//! The opening handshake's checks and its key (RFC 6455, Section 4), over HTTP/1.1's Upgrade,
//! and over HTTP/2's extended CONNECT (RFC 8441), which has no key.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// The GUID every server appends to the client's key (RFC 6455, Section 1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`: the base64 of the SHA-1 of the
/// key followed by the GUID.
pub fn accept_key(key: &[u8]) -> String {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key);
    sha.update(GUID);
    STANDARD.encode(sha.digest().bytes())
}

/// What a valid upgrade request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// The value for `Sec-WebSocket-Accept` (empty over HTTP/2).
    pub accept: String,
    /// The subprotocols offered, in the client's order of preference.
    pub protocols: Vec<String>,
    /// The extensions offered (`Sec-WebSocket-Extensions`), as sent.
    pub extensions: Vec<String>,
}

/// Why an upgrade request is refused, and the status to answer it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// Not a GET.
    Method,
    /// `Upgrade: websocket` or `Connection: upgrade` is missing.
    NotUpgrade,
    /// `Sec-WebSocket-Version` is not 13: answer 426 with `Sec-WebSocket-Version: 13`.
    Version,
    /// `Sec-WebSocket-Key` is missing, repeated, or not the base64 of 16 bytes.
    Key,
}

impl HandshakeError {
    /// The status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::Version => 426,
            _ => 400,
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HandshakeError::Method => "a WebSocket upgrade must be a GET",
            HandshakeError::NotUpgrade => "missing Upgrade: websocket or Connection: upgrade",
            HandshakeError::Version => "Sec-WebSocket-Version must be 13",
            HandshakeError::Key => "Sec-WebSocket-Key must be the base64 of 16 bytes, once",
        })
    }
}

impl std::error::Error for HandshakeError {}

/// Checks an HTTP/1.1 upgrade request (its method and header fields, names in any case) and
/// returns what it asks for.
pub fn check<'a>(
    method: &str,
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Result<Upgrade, HandshakeError> {
    if method != "GET" {
        return Err(HandshakeError::Method);
    }
    let (mut upgrade, mut connection, mut version) = (false, false, None);
    let (mut key, mut keys) = (None, 0);
    let (mut protocols, mut extensions) = (Vec::new(), Vec::new());
    for (name, value) in headers {
        let list = || value.split(|&b| b == b',').map(trim);
        if name.eq_ignore_ascii_case("upgrade") {
            upgrade |= list().any(|t| t.eq_ignore_ascii_case(b"websocket"));
        } else if name.eq_ignore_ascii_case("connection") {
            connection |= list().any(|t| t.eq_ignore_ascii_case(b"upgrade"));
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            version = Some(trim(value) == b"13");
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            keys += 1;
            key = Some(trim(value));
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            protocols.extend(list().filter(|t| !t.is_empty()).map(lossy));
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            extensions.extend(list().filter(|t| !t.is_empty()).map(lossy));
        }
    }
    if !upgrade || !connection {
        return Err(HandshakeError::NotUpgrade);
    }
    if version != Some(true) {
        return Err(HandshakeError::Version);
    }
    let key = key.filter(|_| keys == 1).ok_or(HandshakeError::Key)?;
    match STANDARD.decode(key) {
        Ok(raw) if raw.len() == 16 => {}
        _ => return Err(HandshakeError::Key),
    }
    Ok(Upgrade {
        accept: accept_key(key),
        protocols,
        extensions,
    })
}

/// Checks the header fields of an HTTP/2 extended CONNECT for WebSocket (RFC 8441, Section 5:
/// the method and `:protocol` are the caller's to check): `Sec-WebSocket-Version: 13`, and the
/// offered subprotocols and extensions. There is no key, so [`Upgrade::accept`] is empty.
pub fn check_h2<'a>(
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Result<Upgrade, HandshakeError> {
    let mut version = None;
    let (mut protocols, mut extensions) = (Vec::new(), Vec::new());
    for (name, value) in headers {
        let list = || value.split(|&b| b == b',').map(trim);
        if name.eq_ignore_ascii_case("sec-websocket-version") {
            version = Some(trim(value) == b"13");
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            protocols.extend(list().filter(|t| !t.is_empty()).map(lossy));
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            extensions.extend(list().filter(|t| !t.is_empty()).map(lossy));
        }
    }
    if version != Some(true) {
        return Err(HandshakeError::Version);
    }
    Ok(Upgrade {
        accept: String::new(),
        protocols,
        extensions,
    })
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b" \t".contains(b))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b" \t".contains(b))
        .map_or(start, |i| i + 1);
    &v[start..end]
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}
