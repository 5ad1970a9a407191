//! Shared helpers for the runtime's integration tests: run a [`canter_rt::Server`] in a
//! background thread on 127.0.0.1:0, and talk raw HTTP/1.1 to it with a small, strict response
//! reader (adapted from `crates/canter/tests/common`).
//!
//! Every socket operation has a timeout so a hung server fails a test instead of hanging the
//! suite.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use canter_rt::{Config, Server, Service, ShutdownHandle, Stats};

/// Timeout on every blocking socket operation.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A server running `serve()` on a background thread; shut down (and joined with a timeout)
/// by [`TestServer::stop`] or on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    pub handle: ShutdownHandle,
    done: Option<mpsc::Receiver<io::Result<()>>>,
}

/// A config for tests: 127.0.0.1:0, one worker, short timeouts.
pub fn test_config() -> Config {
    let mut config = Config {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        workers: 1,
        handler_timeout: Duration::from_secs(5),
        drain_timeout: Duration::from_secs(3),
        backlog: 1024,
        ..Config::default()
    };
    config.timeouts.idle = Duration::from_secs(10);
    config.timeouts.head = Duration::from_secs(5);
    config.timeouts.body = Duration::from_secs(5);
    config.timeouts.write = Duration::from_secs(5);
    config
}

impl TestServer {
    /// Binds `config` and serves `factory(worker)` on a background thread.
    pub fn start<S, F>(config: Config, factory: F) -> TestServer
    where
        S: Service,
        F: Fn(usize) -> S + Send + Sync + 'static,
    {
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr();
        let stats = server.stats();
        let handle = server.shutdown_handle();
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("test-server".into())
            .spawn(move || {
                let _ = tx.send(server.serve(factory));
            })
            .unwrap();
        TestServer {
            addr,
            stats,
            handle,
            done: Some(rx),
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Polls until no connection is open; returns how long it took, or panics after `timeout`.
    pub fn wait_idle(&self, timeout: Duration, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            let open = self.stats.open_connections();
            if open == 0 {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{what}: {open} connection(s) still open after {timeout:?} (accepted {})",
                self.stats.accepted()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Polls until `accepted()` reaches `n` (or panics after `timeout`).
    pub fn wait_accepted(&self, n: u64, timeout: Duration) {
        let start = Instant::now();
        while self.stats.accepted() < n {
            assert!(
                start.elapsed() < timeout,
                "accepted {} < {n} after {timeout:?}",
                self.stats.accepted()
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Starts the graceful shutdown without waiting.
    pub fn begin_shutdown(&self) {
        self.handle.shutdown();
    }

    /// Shuts down and waits up to `timeout` for `serve()` to return; returns its result and how
    /// long the wait took.
    pub fn stop_within(&mut self, timeout: Duration) -> (io::Result<()>, Duration) {
        let start = Instant::now();
        self.handle.shutdown();
        let rx = self.done.take().expect("server already stopped");
        match rx.recv_timeout(timeout) {
            Ok(result) => (result, start.elapsed()),
            Err(_) => panic!("serve() did not return within {timeout:?} of shutdown"),
        }
    }

    /// Shuts down, asserting `serve()` returns Ok within 5 s.
    pub fn stop(mut self) {
        let (result, _) = self.stop_within(Duration::from_secs(5));
        result.expect("serve() failed");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(rx) = self.done.take() {
            // Bounded: a stuck server must not hang the suite (the thread is then leaked).
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}

/// A parsed response.
#[derive(Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
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
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
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

    pub fn set_read_timeout(&self, t: Duration) {
        self.stream.set_read_timeout(Some(t)).unwrap();
    }

    pub fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream.write_all(bytes.as_ref()).expect("send");
    }

    /// `GET path` with `Host: x`.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"));
        self.response()
    }

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

    pub fn read_exact_bytes(&mut self, n: usize) -> Vec<u8> {
        while self.buffered().len() < n {
            self.fill_or_panic("fixed-size data");
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        out
    }

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
        assert_eq!(
            parts.next(),
            Some("HTTP/1.1"),
            "status line {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("status line {status_line:?}"));
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
            headers.push((name.to_owned(), value.trim().to_owned()));
        }
        Response {
            status,
            headers,
            body: Vec::new(),
            head,
        }
    }

    /// The next complete response (Content-Length, chunked, or until EOF).
    pub fn response(&mut self) -> Response {
        let mut r = self.response_head();
        if (100..200).contains(&r.status) || r.status == 204 || r.status == 304 {
            return r;
        }
        if r.header("transfer-encoding").is_some() {
            r.body = self.chunked_body();
        } else if let Some(cl) = r.header("content-length") {
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
            let line = String::from_utf8(self.line("chunk size")).expect("ascii chunk size");
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).expect("hex chunk size");
            if size == 0 {
                while !self.line("trailer").is_empty() {}
                return body;
            }
            body.extend(self.read_exact_bytes(size));
            assert_eq!(self.read_exact_bytes(2), b"\r\n", "CRLF after chunk data");
        }
    }

    /// Everything up to and including the terminating `0\r\n\r\n` of a chunked body.
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

    /// Reads until EOF or an error; returns what was read and how it ended.
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

    /// Asserts nothing arrives (no data, no EOF, no reset) for `wait`.
    pub fn expect_silence(&mut self, wait: Duration, what: &str) {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
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

    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// A chunked request body split into `pieces` chunks of the given sizes.
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
