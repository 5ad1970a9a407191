//! The PROXY protocol: `canter serve --proxy-protocol` behind a load balancer. Raw version 1 and
//! 2 headers (IPv4, IPv6, UNKNOWN and LOCAL), refused sources and bad headers, curl's header
//! before a TLS handshake, and HAProxy from Debian's package in front (`send-proxy` and
//! `send-proxy-v2`), each checked through the access log's client address.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{curl, need, Server};

const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

fn proxied(extra: &[&str]) -> Server {
    let mut args = vec!["--proxy-protocol", "--access-log", "--workers", "1"];
    args.extend_from_slice(extra);
    Server::start_with(&args)
}

/// Waits until the access log has a line for `peer` (as `peer=ADDR`).
fn logged_peer(server: &Server, peer: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = server.log();
        if log.lines().any(|l| l.contains(&format!("peer={peer} "))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no access line with peer={peer}:\n{log}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `header` then a request on a new connection, in pieces of `split` bytes, and returns
/// the answer's status line (empty when the server closed without answering).
fn exchange(server: &Server, header: &[u8], split: usize) -> String {
    let answer = exchange_for(server, header, split, "/plaintext");
    answer.lines().next().unwrap_or("").to_owned()
}

/// Like [`exchange`] for `path`, returning the whole answer.
fn exchange_for(server: &Server, header: &[u8], split: usize, path: &str) -> String {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    for piece in bytes.chunks(split) {
        if s.write_all(piece).is_err() {
            break;
        }
        if split < bytes.len() {
            thread::sleep(Duration::from_millis(5));
        }
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn v2(cmd: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.extend([0x20 | cmd, family]);
    h.extend((body.len() as u16).to_be_bytes());
    h.extend(body);
    h
}

#[test]
fn raw_headers_name_the_client() {
    let server = proxied(&[]);
    // Version 1, IPv4 and IPv6, whole and a few bytes at a time (the header is read exactly:
    // the request right behind it in the same packet is not lost).
    let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
    assert_eq!(exchange(&server, v1, 4096), "HTTP/1.1 200 OK");
    logged_peer(&server, "192.0.2.1:56324");
    let v1 = b"PROXY TCP6 2001:db8::7 2001:db8::1 4242 443\r\n";
    assert_eq!(exchange(&server, v1, 7), "HTTP/1.1 200 OK");
    logged_peer(&server, "[2001:db8::7]:4242");
    // Version 2 with a TLV after the addresses, IPv4 and IPv6.
    let mut body = vec![203, 0, 113, 9, 198, 51, 100, 2];
    body.extend(40000u16.to_be_bytes());
    body.extend(80u16.to_be_bytes());
    body.extend([0x02, 0x00, 0x04, b'h', b'o', b's', b't']);
    assert_eq!(
        exchange(&server, &v2(1, 0x11, &body), 4096),
        "HTTP/1.1 200 OK"
    );
    logged_peer(&server, "203.0.113.9:40000");
    let mut body = Vec::new();
    body.extend("2001:db8::9".parse::<Ipv6Addr>().unwrap().octets());
    body.extend("2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    body.extend([0x9c, 0x41, 0, 80]);
    assert_eq!(exchange(&server, &v2(1, 0x21, &body), 5), "HTTP/1.1 200 OK");
    logged_peer(&server, "[2001:db8::9]:40001");
    // UNKNOWN and LOCAL (the balancer's own health checks): the connection's own address.
    let before = server.log().matches("peer=127.0.0.1:").count();
    assert_eq!(
        exchange(&server, b"PROXY UNKNOWN\r\n", 4096),
        "HTTP/1.1 200 OK"
    );
    assert_eq!(exchange(&server, &v2(0, 0, &[]), 4096), "HTTP/1.1 200 OK");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.log().matches("peer=127.0.0.1:").count() < before + 2 {
        assert!(Instant::now() < deadline, "{}", server.log());
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_missing_and_unallowed_headers_close_unanswered() {
    let server = proxied(&["--metrics"]);
    let mut too_long = v2(1, 0x11, &[0; 12]);
    too_long[14..16].copy_from_slice(&5000u16.to_be_bytes());
    for bad in [
        &b""[..],                                         // missing: the request comes first
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n",   // a field short
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\n", // no CR
        b"PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n",   // family and address disagree
        &too_long,                                        // over the 4 KiB bound
    ] {
        assert_eq!(
            exchange(&server, bad, 4096),
            "",
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // A header that never ends is given up after the header timeout (3 s).
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.1").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    // Each counted as a protocol fault (the metrics request needs its header too).
    let metrics = exchange_for(&server, b"PROXY UNKNOWN\r\n", 4096, "/metrics");
    assert!(
        metrics.contains("canter_client_errors_total{kind=\"protocol\"} 6\n"),
        "{metrics}"
    );
    drop(server);

    // Only the listed sources may send headers: 127.0.0.1 is not in 10.0.0.0/8.
    let server = proxied(&["--proxy-from", "10.0.0.0/8"]);
    let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
    assert_eq!(exchange(&server, v1, 4096), "");
    let server = proxied(&["--proxy-from", "10.0.0.0/8", "--proxy-from", "127.0.0.0/8"]);
    assert_eq!(exchange(&server, v1, 4096), "HTTP/1.1 200 OK");
    logged_peer(&server, "192.0.2.1:56324");
}

#[test]
fn header_before_a_tls_handshake() {
    let server = proxied(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    let url = format!("https://127.0.0.1:{}/plaintext", server.tls_port());
    // curl writes `PROXY TCP4 <its address> <server> <its port> <port>` and then the handshake;
    // `%{local_port}` says which port it used.
    let out = curl(&["-k", "--haproxy-protocol", "-w", "\n%{local_port}", &url]);
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, port) = text.rsplit_once('\n').unwrap();
    assert_eq!(body, "Hello, World!");
    logged_peer(&server, &format!("127.0.0.1:{port}"));
}

/// HAProxy with this configuration, stopped when dropped.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_haproxy(name: &str, config: &str, ports: &[u16]) -> Haproxy {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("haproxy-{name}-{}.cfg", std::process::id()));
    std::fs::write(&path, config).unwrap();
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haproxy");
    let deadline = Instant::now() + Duration::from_secs(10);
    for &port in ports {
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "haproxy did not listen on {port}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
    Haproxy(child)
}

#[test]
fn behind_haproxy_send_proxy_and_v2() {
    need("haproxy");
    let server = proxied(&["--proxy-from", "127.0.0.1"]);
    let (v1, v2) = (free_port(), free_port());
    let config = format!(
        "global\n  maxconn 100\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
         frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend canter_v1\n\
         frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend canter_v2\n\
         backend canter_v1\n  server c 127.0.0.1:{port} send-proxy\n\
         backend canter_v2\n  server c 127.0.0.1:{port} send-proxy-v2\n",
        port = server.addr().port()
    );
    let _haproxy = start_haproxy("pp", &config, &[v1, v2]);
    for port in [v1, v2] {
        for _ in 0..3 {
            let url = format!("http://127.0.0.1:{port}/plaintext");
            let out = curl(&["-w", "\n%{local_port}", &url]);
            let text = String::from_utf8(out.stdout).unwrap();
            let (body, local) = text.rsplit_once('\n').unwrap();
            assert_eq!(body, "Hello, World!");
            // The client is curl, not HAProxy's own connection to canter.
            logged_peer(&server, &format!("127.0.0.1:{local}"));
        }
    }
}
