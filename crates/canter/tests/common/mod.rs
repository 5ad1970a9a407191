//! Shared helpers for the integration tests: start the `canter serve` binary on a free port and
//! talk raw HTTP/1.1 to it with a small, strict response reader.
//!
//! Every socket read has a timeout ([`IO_TIMEOUT`]) so a hung server fails a test instead of
//! hanging the suite.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Timeout on every blocking socket operation.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `canter serve` child process; killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
    pub pid: u32,
    log: Arc<Mutex<Vec<String>>>,
    exited: Option<ExitStatus>,
}

impl Server {
    /// `canter serve --addr 127.0.0.1:0 --workers 2`.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Like [`Server::start`] with extra `serve` flags (e.g. `["--head-timeout", "1"]`).
    pub fn start_with(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["serve", "--addr", "127.0.0.1:0", "--workers", "2"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn canter serve");
        let pid = child.id();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            thread::spawn(move || {
                // Keep draining so the pipe never fills; report the port once.
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(port) = parse_port(&line) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(port);
                        }
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let port = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not report its address; stderr:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Server {
            child,
            port,
            pid,
            log,
            exited: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A raw client connected to the server.
    pub fn client(&self) -> Client {
        Client::connect(self.addr())
    }

    /// The server's resident set size in KiB (from /proc/<pid>/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// Sends a signal with `kill -<sig> <pid>`.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} {} failed", self.pid);
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(status);
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's stderr so far (for failure messages).
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn parse_port(line: &str) -> Option<u16> {
    let rest = line
        .split("serving the demo app on http://127.0.0.1:")
        .nth(1)?;
    rest.split('/').next()?.parse().ok()
}

/// A parsed response.
#[derive(Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Header fields in order, as sent.
    pub headers: Vec<(String, String)>,
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

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 body")
    }

    /// Whether the server announced it closes the connection.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// Headers every canter response carries: `Server: canter` and a 29-byte IMF-fixdate.
pub fn assert_standard_headers(r: &Response) {
    assert_eq!(r.header("server"), Some("canter"), "Server header: {r:?}");
    assert_eq!(r.count("date"), 1, "one Date header: {r:?}");
    assert_imf_fixdate(r.header("date").unwrap());
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn assert_imf_fixdate(d: &str) {
    let b = d.as_bytes();
    assert_eq!(b.len(), 29, "Date is 29 bytes: {d:?}");
    assert!(d.ends_with(" GMT"), "Date ends in GMT: {d:?}");
    let days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    assert!(days.contains(&&d[..3]), "day name: {d:?}");
    assert_eq!(&d[3..5], ", ", "{d:?}");
    assert!(d[5..7].bytes().all(|c| c.is_ascii_digit()), "{d:?}");
    assert_eq!(b[7], b' ', "{d:?}");
    assert!(months.contains(&&d[8..11]), "month name: {d:?}");
    assert_eq!(b[11], b' ', "{d:?}");
    assert!(d[12..16].bytes().all(|c| c.is_ascii_digit()), "{d:?}");
    assert_eq!(b[16], b' ', "{d:?}");
    for (i, &c) in b[17..25].iter().enumerate() {
        if i == 2 || i == 5 {
            assert_eq!(c, b':', "{d:?}");
        } else {
            assert!(c.is_ascii_digit(), "{d:?}");
        }
    }
}

/// A raw HTTP/1.1 client over one TCP connection, with a read buffer.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
            pos: 0,
        }
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
        let r = self.stream.read(&mut self.buf[old..]);
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

    /// The next response to a non-HEAD request (1xx interim responses are returned as is).
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

    /// Everything until EOF.
    pub fn read_to_eof(&mut self) -> Vec<u8> {
        loop {
            match self.fill() {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => panic!(
                    "read error before EOF: {e}; buffered: {:?}",
                    String::from_utf8_lossy(self.buffered())
                ),
            }
        }
        let out = self.buf[self.pos..].to_vec();
        self.pos = self.buf.len();
        out
    }

    /// Asserts the server closes the connection next, without sending anything more.
    pub fn expect_eof(&mut self) {
        let rest = self.read_to_eof();
        assert!(
            rest.is_empty(),
            "expected EOF, got {:?}",
            String::from_utf8_lossy(&rest)
        );
    }

    /// Reads until EOF or an error; returns what was read and whether it ended in a clean EOF.
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

    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// `n` pseudo-random bytes (xorshift; deterministic for a seed).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A POST /echo request with a Content-Length body.
pub fn echo_request(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}
