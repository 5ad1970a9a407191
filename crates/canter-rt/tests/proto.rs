//! Custom protocols on the connection actor over real sockets: the two examples (framed echo,
//! STARTTLS line protocol) served by `Server::serve_protocol`, clients on `proto::run` over
//! `connect`/`connect_tls`, Python's `ssl` module as an independent STARTTLS client, and the
//! failure cases (oversized frames, a peer that does not read, injected plaintext).

#![allow(clippy::unwrap_used, missing_docs)]

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/framed_echo.rs"]
mod framed_echo;
#[allow(dead_code, unreachable_pub)]
#[path = "../examples/starttls_line.rs"]
mod starttls_line;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use canter_rt::framing::{FrameHandler, Framed, LengthPrefixed, Lines};
use canter_rt::proto::{self, Close, Conn, Protocol, Settings, TlsUpgrade};
use canter_rt::{ClientTls, Config, Server, ServerTls, ShutdownHandle, Timeouts, TlsListener};

/// A protocol server on 127.0.0.1:0 in a background thread, stopped on drop.
struct ProtoServer {
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    handle: ShutdownHandle,
    done: Option<mpsc::Receiver<()>>,
}

impl ProtoServer {
    fn start<P, G, F>(config: Config, factory: F) -> ProtoServer
    where
        P: Protocol,
        G: FnMut(SocketAddr) -> P + 'static,
        F: Fn(usize) -> G + Send + Sync + 'static,
    {
        let server = Server::bind(config).unwrap();
        let (addr, tls_addr, handle) = (
            server.local_addr(),
            server.tls_local_addr(),
            server.shutdown_handle(),
        );
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            server.serve_protocol(factory).unwrap();
            let _ = tx.send(());
        });
        ProtoServer {
            addr,
            tls_addr,
            handle,
            done: Some(rx),
        }
    }
}

impl Drop for ProtoServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(rx) = self.done.take() {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }
}

fn config() -> Config {
    Config::builder()
        .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
        .workers(1)
        .drain_timeout(Duration::from_secs(2))
        .timeouts(
            Timeouts::builder()
                .write(Duration::from_secs(5))
                .build()
                .expect("valid timeouts"),
        )
        .build()
        .expect("valid config")
}

fn echo_server() -> ProtoServer {
    ProtoServer::start(config(), |_| |_| framed_echo::protocol())
}

fn self_signed() -> canter_rt::TlsAcceptor {
    ServerTls::new()
        .self_signed()
        .alpn(&[])
        .handshake_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A runtime on the test's thread for client protocols.
fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn frame(payload: &[u8]) -> Vec<u8> {
    LengthPrefixed::frame(payload).to_vec()
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0; 4];
    s.read_exact(&mut len).unwrap();
    let mut payload = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut payload).unwrap();
    payload
}

fn expect_eof(s: &mut TcpStream) {
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "unexpected bytes before close: {rest:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn framed_echo_returns_every_frame_in_order() {
    let server = echo_server();
    let mut s = connect(server.addr);
    let payloads: Vec<Vec<u8>> = vec![
        b"hello".to_vec(),
        Vec::new(),
        canter_testkit::random_bytes(100_000, 7),
        vec![b'x'; framed_echo::MAX_FRAME],
    ];
    for p in &payloads {
        s.write_all(&frame(p)).unwrap();
        assert_eq!(&read_frame(&mut s), p);
    }
    // A thousand small frames in one write, and one frame dribbled a byte at a time.
    let batch: Vec<u8> = (0..1000u32).flat_map(|i| frame(&i.to_be_bytes())).collect();
    s.write_all(&batch).unwrap();
    for i in 0..1000u32 {
        assert_eq!(read_frame(&mut s), i.to_be_bytes());
    }
    for b in frame(b"slow") {
        s.write_all(&[b]).unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(read_frame(&mut s), b"slow");
}

#[test]
fn oversized_frame_closes_only_that_connection() {
    let server = echo_server();
    let mut other = connect(server.addr);
    let mut s = connect(server.addr);
    s.write_all(&((framed_echo::MAX_FRAME as u32) + 1).to_be_bytes())
        .unwrap();
    expect_eof(&mut s);
    other.write_all(&frame(b"still here")).unwrap();
    assert_eq!(read_frame(&mut other), b"still here");
}

/// A client that writes frames without reading answers: the server stops reading once its
/// output is at the high-water mark, so the client's writes stall after a bounded amount
/// (kernel buffers plus the high-water mark), and everything arrives once it reads.
#[test]
fn peer_that_does_not_read_is_not_buffered_for() {
    let server = echo_server();
    let s = connect(server.addr);
    let mut writer = s.try_clone().unwrap();
    writer
        .set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let one = frame(&[7u8; 16 * 1024]);
    let mut written = 0usize;
    let limit = 256 * 1024 * 1024;
    // A write cut short by the timeout is continued where it stopped: starting the next frame
    // after part of one would put a header where the server expects payload.
    let mut at = 0;
    while written < limit {
        match writer.write(&one[at..]) {
            Ok(n) => {
                written += n;
                at = (at + n) % one.len();
            }
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                    "{e}"
                );
                break;
            }
        }
    }
    assert!(
        written < 64 * 1024 * 1024,
        "the server kept reading from a peer that does not read: {written} bytes taken"
    );
    // Now read: every complete frame written comes back intact.
    let complete = written / one.len();
    let mut reader = s;
    let mut got = 0;
    while got < complete {
        assert_eq!(read_frame(&mut reader).len(), 16 * 1024);
        got += 1;
    }
}

/// A client protocol on `proto::run` over `connect`: sends frames, counts the echoes, closes.
struct Counter {
    sent: u32,
    want: u32,
    got: u32,
    decoder: LengthPrefixed,
}

impl Protocol for Counter {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.on_writable(conn);
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        use canter_rt::framing::Decoder;
        while let Ok(Some(f)) = self.decoder.decode(input) {
            assert_eq!(f.as_ref(), &self.got.to_be_bytes());
            self.got += 1;
        }
        if self.got == self.want {
            conn.close();
        }
    }

    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        while self.sent < self.want {
            if conn
                .send(LengthPrefixed::frame(&self.sent.to_be_bytes()))
                .is_err()
            {
                return; // refused: on_writable comes back
            }
            self.sent += 1;
        }
    }
}

#[test]
fn client_protocol_over_connect() {
    let server = echo_server();
    let rt = client_runtime();
    let mut counter = Counter {
        sent: 0,
        want: 100_000,
        got: 0,
        decoder: LengthPrefixed::new(64),
    };
    let why = rt.block_on(async {
        let stream = canter_rt::connect(server.addr, Duration::from_secs(5))
            .await
            .unwrap();
        proto::run(stream, server.addr, &mut counter, &Settings::default()).await
    });
    assert!(matches!(why, Close::Local), "{why}");
    assert_eq!((counter.sent, counter.got), (100_000, 100_000));
}

#[test]
fn protocol_on_a_tls_listener() {
    let config = config()
        .to_builder()
        .tls(Some(TlsListener {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            acceptor: self_signed(),
        }))
        .build()
        .expect("valid config");
    let server = ProtoServer::start(config, |_| |_| framed_echo::protocol());
    let tls_addr = server.tls_addr.unwrap();
    let rt = client_runtime();
    let mut counter = Counter {
        sent: 0,
        want: 10_000,
        got: 0,
        decoder: LengthPrefixed::new(64),
    };
    let why = rt.block_on(async {
        let tls = ClientTls::insecure(&[]);
        let stream = canter_rt::connect_tls(tls_addr, "localhost", &tls, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(stream.is_tls());
        proto::run(stream, tls_addr, &mut counter, &Settings::default()).await
    });
    assert!(matches!(why, Close::Local), "{why}");
    assert_eq!(counter.got, 10_000);
    // The plain listener still speaks plaintext.
    let mut s = connect(server.addr);
    s.write_all(&frame(b"plain")).unwrap();
    assert_eq!(read_frame(&mut s), b"plain");
}

fn starttls_server() -> ProtoServer {
    let tls = self_signed();
    ProtoServer::start(config(), move |_| {
        let tls = tls.clone();
        move |_| starttls_line::protocol(tls.clone())
    })
}

/// The client side of the STARTTLS example, on `proto::run`: a command at a time, upgrading
/// itself after `OK begin TLS`.
struct LineClient {
    script: Vec<&'static str>,
    answers: Vec<String>,
    decoder: Lines,
}

impl LineClient {
    fn next(&mut self, conn: &mut Conn<'_>) {
        if self.script.is_empty() {
            conn.close();
            return;
        }
        let line = self.script.remove(0);
        conn.send(Bytes::from(format!("{line}\r\n"))).unwrap();
    }
}

impl Protocol for LineClient {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.next(conn);
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        use canter_rt::framing::Decoder;
        while let Ok(Some(line)) = self.decoder.decode(input) {
            let line = String::from_utf8(line.to_vec()).unwrap();
            let upgrade = line == "OK begin TLS";
            self.answers.push(line);
            if upgrade {
                conn.start_tls(TlsUpgrade::Client {
                    tls: ClientTls::insecure(&[]),
                    server_name: "localhost".into(),
                });
                return;
            }
            self.next(conn);
        }
    }

    fn on_tls(&mut self, conn: &mut Conn<'_>) {
        self.next(conn);
    }

    fn on_eof(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }
}

#[test]
fn starttls_upgrade_between_two_canter_actors() {
    let server = starttls_server();
    let rt = client_runtime();
    let mut client = LineClient {
        script: vec![
            "PING",
            "TLS?",
            "STARTTLS",
            "TLS?",
            "ECHO secret",
            "STARTTLS",
            "QUIT",
        ],
        answers: Vec::new(),
        decoder: Lines::new(1024),
    };
    let why = rt.block_on(async {
        let stream = canter_rt::connect(server.addr, Duration::from_secs(5))
            .await
            .unwrap();
        proto::run(stream, server.addr, &mut client, &Settings::default()).await
    });
    assert!(matches!(why, Close::Local | Close::PeerClosed), "{why}");
    assert_eq!(
        client.answers,
        [
            "PONG",
            "no",
            "OK begin TLS",
            "yes",
            "secret",
            "ERR already TLS",
            "BYE"
        ]
    );
}

/// Python's `ssl` module as the client: an implementation that shares no code with canter.
#[test]
fn starttls_with_python_ssl() {
    let server = starttls_server();
    let script = r#"
import socket, ssl, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
f = s.makefile("rb")
def ask(sock, fh, line):
    sock.sendall(line + b"\r\n")
    return fh.readline().strip().decode()
out = [ask(s, f, b"TLS?"), ask(s, f, b"STARTTLS")]
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
t = ctx.wrap_socket(s, server_hostname="localhost")
tf = t.makefile("rb")
out += [t.version(), ask(t, tf, b"TLS?"), ask(t, tf, b"ECHO over tls"), ask(t, tf, b"QUIT")]
print("|".join(out))
"#;
    let out = Command::new("python3")
        .args(["-c", script, &server.addr.port().to_string()])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "no|OK begin TLS|TLSv1.3|yes|over tls|BYE");
}

/// Plaintext sent right behind the upgrade command (before the handshake) must not be taken
/// as part of the protected session: the upgrade is refused and the connection closed, and the
/// injected command is never executed.
#[test]
fn starttls_refuses_plaintext_injected_before_the_handshake() {
    let server = starttls_server();
    let mut s = connect(server.addr);
    s.write_all(b"STARTTLS\r\nECHO injected\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("injected"), "injected command ran: {got:?}");
    // The server is fine: a clean session still upgrades.
    let mut s = connect(server.addr);
    s.write_all(b"STARTTLS\r\n").unwrap();
    let mut line = [0u8; 14];
    s.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"OK begin TLS\r\n");
}

/// A client that asks for STARTTLS and then stalls is cut at the handshake timeout.
#[test]
fn starttls_stalled_handshake_times_out() {
    let server = starttls_server();
    let mut s = connect(server.addr);
    s.write_all(b"STARTTLS\r\n").unwrap();
    let mut line = [0u8; 14];
    s.read_exact(&mut line).unwrap();
    let started = Instant::now();
    expect_eof(&mut s);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(8),
        "closed after {waited:?}, handshake timeout 2 s"
    );
}

/// Frames and lines through the handler trait with a protocol that answers each line with its
/// length, to check `Lines` over a socket (CRLF and LF, an over-long line closing).
#[test]
fn lines_over_a_socket() {
    struct Len;
    impl FrameHandler for Len {
        fn on_frame(&mut self, conn: &mut Conn<'_>, line: Bytes) {
            let _ = conn.send(Bytes::from(format!("{}\n", line.len())));
        }
    }
    let server = ProtoServer::start(config(), |_| |_| Framed::new(Lines::new(16), Len));
    let mut s = connect(server.addr);
    s.write_all(b"abc\r\nhello\n\n0123456789abcdef\n").unwrap();
    let mut buf = [0u8; 9];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"3\n5\n0\n16\n");
    s.write_all(&[b'x'; 40]).unwrap();
    expect_eof(&mut s);
}

/// Says the peer address it was made for, then closes.
struct WhoAmI(SocketAddr);

impl Protocol for WhoAmI {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let _ = conn.send(format!("{}\n", self.0));
        conn.close();
    }

    fn on_data(&mut self, _conn: &mut Conn<'_>, input: &mut BytesMut) {
        input.clear();
    }
}

/// With `Config::proxy_protocol`, a custom protocol is made for the client the PROXY header
/// names, and bytes sent right behind the header are the protocol's; a connection without a
/// header is closed before the protocol exists.
#[test]
fn custom_protocols_behind_a_proxy_header() {
    let proxied = || {
        config()
            .to_builder()
            .proxy_protocol(Some(canter_rt::proxy::ProxyProtocol::default()))
            .build()
            .expect("valid config")
    };
    let server = ProtoServer::start(proxied(), |_| |peer| WhoAmI(peer));
    for (header, want) in [
        (
            &b"PROXY TCP4 192.0.2.7 198.51.100.1 4000 25\r\n"[..],
            "192.0.2.7:4000\n",
        ),
        (
            b"PROXY TCP6 2001:db8::5 2001:db8::1 4001 25\r\n",
            "[2001:db8::5]:4001\n",
        ),
    ] {
        let mut s = connect(server.addr);
        s.write_all(header).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert_eq!(out, want);
    }
    // The echo protocol behind a header: the frame right behind it is the protocol's.
    let echo = ProtoServer::start(proxied(), |_| |_| framed_echo::protocol());
    let mut s = connect(echo.addr);
    let mut bytes = b"PROXY UNKNOWN\r\n".to_vec();
    bytes.extend(frame(b"hello"));
    s.write_all(&bytes).unwrap();
    assert_eq!(read_frame(&mut s), b"hello");
    drop(s);
    // No header: closed without a word.
    let mut s = connect(server.addr);
    s.write_all(b"HELO there\r\n").unwrap();
    expect_eof(&mut s);
}
