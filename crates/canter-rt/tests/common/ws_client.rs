//! A blocking WebSocket client for the runtime's tests: canter-ws's engine in the client role
//! over a socket with timeouts, plus raw frames for what a well-behaved client never sends.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use canter_testkit::read_some;
use canter_ws::deflate::{self, DeflateConfig};
use canter_ws::{Connection, Event, Limits, Role};

/// The key of RFC 6455's example; its accept value is `s3pPLMBiTxaQ9kYGzzhZRbK+xOo=`.
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A blocking WebSocket client on the engine.
pub struct Client {
    pub tcp: TcpStream,
    pub ws: Connection,
    pub input: BytesMut,
    pub head: String,
}

pub fn client_role() -> Role {
    let mut n = 0x1234_5678u32;
    Role::Client {
        keys: Box::new(move || {
            n = n.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            n.to_be_bytes()
        }),
    }
}

/// Sends `request` and reads the response head; the rest of what was read stays as input.
pub fn raw_handshake(addr: SocketAddr, request: &str) -> (TcpStream, String, BytesMut) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(request.as_bytes()).unwrap();
    let mut buf = BytesMut::new();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf.split_to(end + 4).to_vec()).unwrap();
            return (tcp, head, buf);
        }
        let mut chunk = [0u8; 4096];
        let n = read_some(&mut tcp, &mut chunk).unwrap();
        assert!(n > 0, "closed before the response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the head has field `name` (any case) with exactly `value`.
pub fn has_field(head: &str, name: &str, value: &str) -> bool {
    head.lines().any(|l| {
        l.split_once(':')
            .is_some_and(|(n, v)| n.eq_ignore_ascii_case(name) && v.trim() == value)
    })
}

pub fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

impl Client {
    pub fn open(addr: SocketAddr, path: &str, extra: &str) -> Client {
        Client::open_with(addr, &upgrade_request(path, extra), b"")
    }

    /// Upgrades with `request`, `early` written in the same segment right behind it.
    pub fn open_with(addr: SocketAddr, request: &str, early: &[u8]) -> Client {
        let mut bytes = request.as_bytes().to_vec();
        bytes.extend_from_slice(early);
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tcp.write_all(&bytes).unwrap();
        let mut input = BytesMut::new();
        let head = loop {
            if let Some(end) = input.windows(4).position(|w| w == b"\r\n\r\n") {
                break String::from_utf8(input.split_to(end + 4).to_vec()).unwrap();
            }
            let mut chunk = [0u8; 4096];
            let n = read_some(&mut tcp, &mut chunk).unwrap();
            assert!(n > 0, "closed before the response head");
            input.extend_from_slice(&chunk[..n]);
        };
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(
            has_field(
                &head,
                "sec-websocket-accept",
                "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
            ),
            "{head}"
        );
        let mut ws = Connection::new(client_role(), Limits::default());
        if let Some(line) = head.lines().find(|l| {
            l.to_ascii_lowercase()
                .starts_with("sec-websocket-extensions:")
        }) {
            let value = line.split_once(':').unwrap().1.trim();
            let agreed = deflate::client_agreed(value, DeflateConfig::default()).unwrap();
            ws = ws.with_deflate(agreed);
        }
        Client {
            tcp,
            ws,
            input,
            head,
        }
    }

    pub fn write(&mut self, f: impl FnOnce(&mut Connection, &mut Vec<u8>)) {
        let mut out = Vec::new();
        f(&mut self.ws, &mut out);
        self.tcp.write_all(&out).unwrap();
    }

    /// The next event, or `None` at the end of the stream.
    pub fn next(&mut self) -> Option<Event> {
        loop {
            let mut out = Vec::new();
            let event = self.ws.poll(&mut self.input, &mut out).unwrap();
            if !out.is_empty() {
                let _ = self.tcp.write_all(&out);
            }
            if event.is_some() {
                return event;
            }
            let mut chunk = vec![0u8; 64 * 1024];
            match read_some(&mut self.tcp, &mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Reads until the server closes the TCP connection; fails if it does not within 5 s.
    pub fn expect_end(&mut self) {
        let started = Instant::now();
        let mut chunk = [0u8; 4096];
        loop {
            match read_some(&mut self.tcp, &mut chunk) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("the server did not close: {e}"),
            }
            assert!(started.elapsed() < Duration::from_secs(5));
        }
    }
}

/// A client frame as written by hand: `first` is the first header byte (FIN, RSV bits, opcode),
/// the payload masked with a fixed key.
pub fn raw_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let key = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![first];
    let n = payload.len();
    if n < 126 {
        f.push(0x80 | n as u8);
    } else if n < 65536 {
        f.push(0x80 | 126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        f.push(0x80 | 127);
        f.extend_from_slice(&(n as u64).to_be_bytes());
    }
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

impl Client {
    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).unwrap();
    }

    /// The server's close, and then the end of the connection: its code.
    pub fn expect_close(&mut self) -> u16 {
        loop {
            match self.next() {
                Some(Event::Close(why)) => {
                    self.expect_end();
                    return why.map_or(1005, |(code, _)| code);
                }
                Some(_) => continue,
                None => panic!("the connection ended without a close"),
            }
        }
    }
}
