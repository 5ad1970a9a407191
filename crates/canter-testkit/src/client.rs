//! A raw HTTP/1.1 client over one TCP connection with a strict response reader.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// Timeout on every blocking socket operation.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `addr` within [`IO_TIMEOUT`] and sets [`IO_TIMEOUT`] as the read and write
/// timeouts and `TCP_NODELAY`; panics if any of that fails.
pub fn connect_stream(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

/// `reader.read(buf)`, tried again when it is interrupted. A blocking read with a timeout
/// (`SO_RCVTIMEO`) fails with `EINTR` after the process is stopped and continued, even with no
/// signal handler (signal(7)), as when a busy or suspended machine freezes the test for a moment.
pub fn read_some(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Waits up to `deadline` until the peer of `stream` has read every byte sent to it: `stream`'s
/// send queue and the peer socket's receive queue are both empty, as the kernel counts them
/// (`/proc/net/tcp` and `tcp6`; the peer must be on this machine). False at the deadline. For
/// tests that must know a server holds a request before they act (a signal, a timeout), instead
/// of sleeping and hoping it has.
pub fn wait_until_read_by_peer(stream: &TcpStream, deadline: Duration) -> bool {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return false;
    };
    let start = std::time::Instant::now();
    loop {
        let ours = socket_queues(local, peer).map(|(tx, _)| tx);
        let theirs = socket_queues(peer, local).map(|(_, rx)| rx);
        if ours == Some(0) && theirs == Some(0) {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The send and receive queues (bytes) of the TCP socket bound to `local` and connected to
/// `remote`, from `/proc/net/tcp` or `/proc/net/tcp6`.
fn socket_queues(local: SocketAddr, remote: SocketAddr) -> Option<(u64, u64)> {
    let table = if local.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let text = std::fs::read_to_string(table).ok()?;
    let (want_local, want_remote) = (proc_addr(local), proc_addr(remote));
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[1] != want_local || f[2] != want_remote {
            return None;
        }
        let (tx, rx) = f[4].split_once(':')?;
        Some((
            u64::from_str_radix(tx, 16).ok()?,
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

/// An address as `/proc/net/tcp` writes it: the address's bytes as 32-bit words in the host's
/// byte order, in hex, then the port in hex.
fn proc_addr(addr: SocketAddr) -> String {
    let words: Vec<u32> = match addr.ip() {
        std::net::IpAddr::V4(ip) => vec![u32::from_ne_bytes(ip.octets())],
        std::net::IpAddr::V6(ip) => ip
            .octets()
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    let hex: String = words.iter().map(|w| format!("{w:08X}")).collect();
    format!("{hex}:{:04X}", addr.port())
}

/// Waits up to `deadline` until a connection to `addr` is refused (nothing listens there any
/// more); a connection that is still accepted meanwhile is closed at once. False at the deadline.
pub fn wait_until_refused(addr: SocketAddr, deadline: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return true,
            _ if start.elapsed() > deadline => return false,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A parsed response.
#[derive(Clone)]
pub struct Response {
    /// The status code (three digits).
    pub status: u16,
    /// The reason phrase (possibly empty).
    pub reason: String,
    /// Header fields in order, as sent (values trimmed).
    pub headers: Vec<(String, String)>,
    /// The decoded body (de-chunked; empty for HEAD, 1xx, 204 and 304).
    pub body: Vec<u8>,
    /// The status line and header section, exactly as received (with the final CRLF CRLF).
    pub head: Vec<u8>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]);
        write!(
            f,
            "{:?} + {} body bytes {:?}",
            String::from_utf8_lossy(&self.head),
            self.body.len(),
            body
        )
    }
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// How many times header `name` occurs.
    pub fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    /// The body as UTF-8 (panics if it is not).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 body")
    }

    /// Whether the server announced it closes the connection.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A raw HTTP/1.1 client over one TCP connection, with a read buffer.
pub struct Client {
    /// The connection (timeouts set by [`Client::connect`]).
    pub stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Client {
    /// Connects to `addr` (see [`connect_stream`] for the timeouts).
    pub fn connect(addr: SocketAddr) -> Client {
        Client {
            stream: connect_stream(addr),
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Sets the read timeout of the connection.
    pub fn set_read_timeout(&self, t: Duration) {
        self.stream.set_read_timeout(Some(t)).unwrap();
    }

    /// Writes all of `bytes` in one `write_all`.
    pub fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream.write_all(bytes.as_ref()).expect("send");
    }

    /// `GET path` with `Host: x`.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
        self.response()
    }

    /// Bytes received but not consumed yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Reads more bytes into the buffer; returns how many (0 at EOF).
    pub fn fill(&mut self) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 1 << 20 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 64 * 1024, 0);
        let r = read_some(&mut self.stream, &mut self.buf[old..]);
        let n = *r.as_ref().unwrap_or(&0);
        self.buf.truncate(old + n);
        r
    }

    fn fill_or_panic(&mut self, what: &str) {
        match self.fill() {
            Ok(0) => panic!(
                "EOF while reading {what}; buffered: {:?}",
                String::from_utf8_lossy(self.buffered())
            ),
            Ok(_) => {}
            Err(e) => panic!(
                "read error while reading {what}: {e}; buffered: {:?}",
                String::from_utf8_lossy(self.buffered())
            ),
        }
    }

    /// Exactly `n` bytes.
    pub fn read_exact_bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buffered().len() < n {
            self.fill_or_panic("fixed-size data");
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        out
    }

    /// Consumes `n` body bytes without keeping them, calling `check` on each piece.
    pub fn skip_bytes(&mut self, mut n: u64, mut check: impl FnMut(&[u8])) {
        while n > 0 {
            if self.buffered().is_empty() {
                self.fill_or_panic("body");
            }
            let take = (self.buffered().len() as u64).min(n) as usize;
            check(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            n -= take as u64;
        }
    }

    /// One line ending in CRLF (returned without it).
    fn line(&mut self, what: &str) -> Vec<u8> {
        loop {
            if let Some(i) = self.buffered().windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[self.pos..self.pos + i].to_vec();
                self.pos += i + 2;
                return line;
            }
            assert!(
                self.buffered().len() < 1 << 20,
                "line too long while reading {what}"
            );
            self.fill_or_panic(what);
        }
    }

    /// The status line and header section of the next response; `body` left empty.
    pub fn response_head(&mut self) -> Response {
        let mut head = Vec::new();
        let status_line = self.line("status line");
        head.extend_from_slice(&status_line);
        head.extend_from_slice(b"\r\n");
        let status_line = String::from_utf8(status_line).expect("ascii status line");
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert_eq!(version, "HTTP/1.1", "status line {status_line:?}");
        let code = parts.next().unwrap_or_default();
        assert_eq!(code.len(), 3, "status line {status_line:?}");
        let status: u16 = code.parse().expect("status code");
        let reason = parts.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        loop {
            let line = self.line("header field");
            head.extend_from_slice(&line);
            head.extend_from_slice(b"\r\n");
            if line.is_empty() {
                break;
            }
            let line = String::from_utf8(line).expect("ascii header");
            let (name, value) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("header without colon: {line:?}"));
            assert!(
                !name.is_empty() && !name.contains([' ', '\t']),
                "header name {name:?}"
            );
            headers.push((name.to_owned(), value.trim().to_owned()));
        }
        Response {
            status,
            reason,
            headers,
            body: Vec::new(),
            head,
        }
    }

    /// The next response to a non-HEAD request (1xx interim responses are returned as is): the
    /// body is framed by `Transfer-Encoding: chunked`, `Content-Length`, or the end of the
    /// connection.
    pub fn response(&mut self) -> Response {
        self.response_to(false)
    }

    /// The next response to a HEAD request (no body whatever the headers say).
    pub fn head_response(&mut self) -> Response {
        self.response_to(true)
    }

    /// The next response; `head` says it answers a HEAD request.
    pub fn response_to(&mut self, head: bool) -> Response {
        let mut r = self.response_head();
        if head || (100..200).contains(&r.status) || r.status == 204 || r.status == 304 {
            return r;
        }
        let chunked = r.header("transfer-encoding").is_some();
        if chunked {
            assert_eq!(
                r.header("transfer-encoding"),
                Some("chunked"),
                "transfer-encoding"
            );
            assert!(
                r.header("content-length").is_none(),
                "both TE and CL: {r:?}"
            );
            r.body = self.chunked_body();
        } else if let Some(cl) = r.header("content-length") {
            assert_eq!(r.count("content-length"), 1, "one Content-Length: {r:?}");
            let n: usize = cl.parse().expect("numeric Content-Length");
            r.body = self.read_exact_bytes(n);
        } else {
            r.body = self.read_to_eof();
        }
        r
    }

    fn chunked_body(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line = self.line("chunk size");
            let line = String::from_utf8(line).expect("ascii chunk size");
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).expect("hex chunk size");
            if size == 0 {
                // Trailer section up to the empty line.
                while !self.line("trailer").is_empty() {}
                return body;
            }
            body.extend(self.read_exact_bytes(size));
            assert_eq!(self.read_exact_bytes(2), b"\r\n", "CRLF after chunk data");
        }
    }

    /// Everything up to and including the terminating `0\r\n\r\n` of a chunked body, raw.
    pub fn response_to_end_of_chunks(&mut self) -> Vec<u8> {
        while !self.buffered().ends_with(b"\r\n0\r\n\r\n") {
            assert!(self.buffered().len() < 1 << 20, "no end of chunks");
            self.fill_or_panic("chunked body");
        }
        let out = self.buffered().to_vec();
        self.pos = self.buf.len();
        out
    }

    /// Everything until EOF (panics on a read error).
    pub fn read_to_eof(&mut self) -> Vec<u8> {
        let (out, end) = self.drain();
        if let Err(e) = end {
            panic!(
                "read error before EOF: {e}; got {:?}",
                String::from_utf8_lossy(&out)
            );
        }
        out
    }

    /// Reads until EOF or an error; returns what was read and how it ended (`Ok` for a clean
    /// EOF).
    pub fn drain(&mut self) -> (Vec<u8>, io::Result<()>) {
        let result = loop {
            match self.fill() {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        let out = self.buf[self.pos..].to_vec();
        self.pos = self.buf.len();
        (out, result)
    }

    /// Asserts the server closes the connection next with a clean EOF, without sending
    /// anything more.
    pub fn expect_eof(&mut self) {
        let rest = self.read_to_eof();
        assert!(
            rest.is_empty(),
            "expected EOF, got {:?}",
            String::from_utf8_lossy(&rest)
        );
    }

    /// Asserts the server closes the connection next (EOF or reset), sending nothing more.
    pub fn expect_closed(&mut self) {
        let (rest, end) = self.drain();
        assert!(
            rest.is_empty(),
            "expected EOF, got {:?}",
            String::from_utf8_lossy(&rest)
        );
        if let Err(e) = end {
            assert_eq!(e.kind(), ErrorKind::ConnectionReset, "expected EOF: {e}");
        }
    }

    /// Asserts nothing arrives (no data, no EOF, no reset) for `wait`; the read timeout is
    /// [`IO_TIMEOUT`] again afterwards.
    pub fn expect_silence(&mut self, wait: Duration, what: &str) {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        match read_some(&mut self.stream, &mut byte) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Ok(0) => panic!("{what}: unexpected EOF"),
            Ok(_) => {
                self.buf.truncate(self.pos);
                panic!("{what}: unexpected data {:?}", byte[0] as char)
            }
            Err(e) => panic!("{what}: unexpected error {e}"),
        }
        self.stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    }

    /// Half-closes the connection (no more requests); errors are ignored.
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// A chunked body made of `pieces`, one chunk each, with the last chunk and an empty trailer.
pub fn chunked(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn read_by_peer_is_seen_only_once_the_peer_has_read() {
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(host) else {
                assert!(host.starts_with('['), "cannot bind {host}");
                continue; // no IPv6 loopback on this machine
            };
            let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            client.write_all(b"hello").unwrap();
            assert!(
                !wait_until_read_by_peer(&client, Duration::from_millis(200)),
                "{host}: five unread bytes counted as read"
            );
            let mut buf = [0; 5];
            server.read_exact(&mut buf).unwrap();
            assert!(
                wait_until_read_by_peer(&client, Duration::from_secs(10)),
                "{host}: the bytes the peer read were not seen as read"
            );
        }
    }

    #[test]
    fn refused_is_seen_only_once_nothing_listens() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(!wait_until_refused(addr, Duration::from_millis(200)));
        drop(listener);
        assert!(wait_until_refused(addr, Duration::from_secs(10)));
    }
}
