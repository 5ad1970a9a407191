//! `canter serve` over TLS against real clients: curl, Python's `ssl` module and
//! `openssl s_client`, with certificates from a throwaway CA (`canter_testkit::Pki`). Covers
//! versions, ALPN, resumption, SNI, reload on SIGHUP, client certificates, files over TLS,
//! hostile input and a thousand handshakes at once. These tools are on every machine the suite
//! runs on; a missing one fails the test.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use canter_testkit::read_some;
use canter_testkit::{fingerprint, Pki};
use common::{curl, random_bytes, Server, TempFile};

fn tls_server(extra: &[&str]) -> Server {
    let mut args = vec!["--tls-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Server::start_with(&args)
}

fn with_cert<'a>(cert: &'a canter_testkit::CertFiles, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--tls-cert",
        cert.cert.to_str().unwrap(),
        "--tls-key",
        cert.key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args
}

/// Runs a Python script (`sys.argv[1:]` = `args`), fails the test on a non-zero exit, returns
/// its standard output.
fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

const PY_PRELUDE: &str = r#"
import hashlib, socket, ssl, sys
port = int(sys.argv[1])
def ctx(ca=None, version=None, alpn=("http/1.1",)):
    c = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    if not ca:
        c.check_hostname = False
        c.verify_mode = ssl.CERT_NONE
    if version:
        c.minimum_version = c.maximum_version = version
    if alpn:
        c.set_alpn_protocols(list(alpn))
    return c
def get(s, path="/plaintext"):
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < n:
        body += s.recv(65536)
    return head.split(b"\r\n")[0].decode(), body
"#;

#[test]
fn curl_verifies_the_chain_and_moves_bodies_both_ways() {
    let pki = Pki::new();
    let cert = pki.server("localhost", &["localhost", "127.0.0.1"]);
    let server = tls_server(&with_cert(&cert, &[]));
    let port = server.tls_port();
    let url = |p: &str| format!("https://localhost:{port}{p}");
    let resolve = format!("localhost:{port}:127.0.0.1");
    let ca = pki.ca();
    let base = [
        "--http1.1",
        "--resolve",
        &resolve,
        "--cacert",
        ca.to_str().unwrap(),
    ];
    let out = curl(&[&base[..], &[&url("/plaintext")]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"Hello, World!");
    // 1 MiB down (streamed response) and 1 MiB up (request body), checked byte for byte.
    let out = curl(&[&base[..], &[&url("/bytes/1048576")]].concat());
    assert_eq!(out.stdout.len(), 1 << 20);
    let data = random_bytes(1 << 20, 3);
    let upload = TempFile::new("tls-upload", &data);
    let at = format!("@{}", upload.path().display());
    let out = curl(
        &[
            &base[..],
            &[
                "--data-binary",
                &at,
                "-H",
                "content-type: application/octet-stream",
                &url("/echo"),
            ],
        ]
        .concat(),
    );
    assert!(
        out.stdout == data,
        "echo over TLS differs ({} bytes back)",
        out.stdout.len()
    );
    // Without the CA, curl refuses the certificate (exit 60: peer certificate not verified).
    let status = Command::new("curl")
        .args(["-s", "--http1.1", "--resolve", &resolve, &url("/plaintext")])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(60));
    // The plain listener is unchanged.
    assert_eq!(curl(&[&server.url("/plaintext")]).stdout, b"Hello, World!");
}

#[test]
fn self_signed_certificate_and_its_logged_fingerprint() {
    let server = tls_server(&["--tls-self-signed"]);
    let port = server.tls_port().to_string();
    let out = curl(&["-k", "--http1.1", &format!("https://127.0.0.1:{port}/json")]);
    assert_eq!(out.stdout, br#"{"message":"Hello, World!"}"#);
    let der_sha = python(
        &format!(
            "{PY_PRELUDE}\ns = ctx().wrap_socket(socket.create_connection(('127.0.0.1', port)))\n\
             print(':'.join('%02X' % b for b in hashlib.sha256(s.getpeercert(True)).digest()))"
        ),
        &[&port],
    );
    let logged = format!("sha256=\"{}\"", der_sha.trim());
    assert!(
        server.log().contains(&logged),
        "{logged} not in:\n{}",
        server.log()
    );
}

#[test]
fn python_ssl_versions_alpn_and_resumption_across_workers() {
    let pki = Pki::new();
    let cert = pki.server("localhost", &["localhost"]);
    let server = tls_server(&with_cert(&cert, &["--workers", "2"]));
    let port = server.tls_port().to_string();
    let ca = pki.ca();
    let script = format!(
        r#"{PY_PRELUDE}
for v in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
    c = ctx(ca=sys.argv[2], version=v)
    session = None
    reused = []
    for i in range(8):
        s = c.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost", session=session)
        status, body = get(s)
        assert status == "HTTP/1.1 200 OK" and body == b"Hello, World!", (status, body)
        if i == 0:
            print(s.version(), s.selected_alpn_protocol(), s.cipher()[0])
        reused.append(s.session_reused)
        session = s.session
        s.close()
    print(v.name, reused)
"#
    );
    let out = python(&script, &[&port, ca.to_str().unwrap()]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("TLSv1.2 http/1.1 ECDHE-"), "{out}");
    assert_eq!(
        lines[1], "TLSv1_2 [False, True, True, True, True, True, True, True]",
        "{out}"
    );
    assert!(lines[2].starts_with("TLSv1.3 http/1.1 TLS_"), "{out}");
    assert_eq!(
        lines[3], "TLSv1_3 [False, True, True, True, True, True, True, True]",
        "{out}"
    );
}

/// TLS 1.2: `-reconnect` resumes by session ID five times. TLS 1.3: s_client's reconnects run
/// before any ticket arrives, so the session is saved after a request (`-sess_out`) and offered
/// by a second run (`-sess_in`).
#[test]
fn openssl_s_client_resumes() {
    let pki = Pki::new();
    let cert = pki.server("localhost", &["localhost"]);
    let server = tls_server(&with_cert(&cert, &[]));
    let connect = format!("127.0.0.1:{}", server.tls_port());
    let ca = pki.ca();
    let s_client = |extra: &[&str]| {
        let mut child = Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &connect,
                "-ign_eof",
                "-servername",
                "localhost",
            ])
            .args(["-CAfile", ca.to_str().unwrap()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = s_client(&["-tls1_2", "-reconnect"]);
    let reused = text
        .lines()
        .filter(|l| l.starts_with("Reused, TLSv1.2"))
        .count();
    assert!(reused >= 5, "TLS 1.2: {reused} resumed sessions\n{text}");
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    let session = pki.dir().join("session.pem");
    let session = session.to_str().unwrap();
    let first = s_client(&["-tls1_3", "-sess_out", session]);
    assert!(
        first.contains("New, TLSv1.3") && first.contains("Hello, World!"),
        "{first}"
    );
    let second = s_client(&["-tls1_3", "-sess_in", session]);
    assert!(
        second.contains("Reused, TLSv1.3") && second.contains("Hello, World!"),
        "{second}"
    );
}

#[test]
fn alpn_offering_only_unknown_protocols_gets_the_alert() {
    let server = tls_server(&["--tls-self-signed"]);
    let port = server.tls_port().to_string();
    let script = format!(
        r#"{PY_PRELUDE}
try:
    ctx(alpn=("spdy/1", "foo")).wrap_socket(socket.create_connection(("127.0.0.1", port)))
    print("connected")
except ssl.SSLError as e:
    print("no application protocol" in str(e))
s = ctx(alpn=None).wrap_socket(socket.create_connection(("127.0.0.1", port)))
print(get(s)[0], s.selected_alpn_protocol())
"#
    );
    let out = python(&script, &[&port]);
    assert_eq!(out, "True\nHTTP/1.1 200 OK None\n");
}

#[test]
fn sni_selects_the_certificate() {
    let pki = Pki::new();
    let a = pki.server("a", &["a.test"]);
    let b = pki.server("b", &["b.test", "*.b.test"]);
    let args = [
        "--tls-cert",
        a.cert.to_str().unwrap(),
        "--tls-key",
        a.key.to_str().unwrap(),
        "--tls-cert",
        b.cert.to_str().unwrap(),
        "--tls-key",
        b.key.to_str().unwrap(),
    ];
    let server = tls_server(&args);
    let port = server.tls_port().to_string();
    let script = format!(
        r#"{PY_PRELUDE}
for name in ["a.test", "b.test", "www.b.test", "unknown.test", None]:
    s = ctx().wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname=name)
    print(':'.join('%02X' % b for b in hashlib.sha256(s.getpeercert(True)).digest()))
"#
    );
    let out = python(&script, &[&port]);
    let got: Vec<&str> = out.lines().collect();
    let (fa, fb) = (a.sha256(), b.sha256());
    assert_eq!(got, [&fa, &fb, &fb, &fa, &fa]);
}

fn peer_fingerprint(port: u16) -> String {
    let script = format!(
        "{PY_PRELUDE}\ns = ctx().wrap_socket(socket.create_connection(('127.0.0.1', port)), server_hostname='localhost')\n\
         print(':'.join('%02X' % b for b in hashlib.sha256(s.getpeercert(True)).digest()))"
    );
    python(&script, &[&port.to_string()]).trim().to_owned()
}

fn wait_for_log(server: &Server, needle: &str, after: usize) {
    let start = Instant::now();
    while server.log().matches(needle).count() <= after {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {needle:?} in:\n{}",
            server.log()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_certificates_and_keeps_them_on_a_broken_file() {
    let pki = Pki::new();
    let first = pki.server("first", &["localhost"]);
    let second = pki.server("second", &["localhost"]);
    let live = pki.server("live", &["localhost"]);
    std::fs::copy(&first.cert, &live.cert).unwrap();
    std::fs::copy(&first.key, &live.key).unwrap();
    let mut server = tls_server(&with_cert(&live, &[]));
    let port = server.tls_port();
    assert_eq!(peer_fingerprint(port), first.sha256());
    // A connection opened before the reload keeps working after it.
    let open = python_keepalive_start(port);
    std::fs::copy(&second.cert, &live.cert).unwrap();
    std::fs::copy(&second.key, &live.key).unwrap();
    server.signal("HUP");
    wait_for_log(&server, "TLS certificates reloaded", 0);
    assert_eq!(peer_fingerprint(port), second.sha256());
    python_keepalive_finish(open);
    // A broken file: logged, and the certificate in use stays.
    std::fs::write(&live.cert, "not a certificate").unwrap();
    server.signal("HUP");
    wait_for_log(&server, "TLS reload failed", 0);
    assert_eq!(peer_fingerprint(port), second.sha256());
    server.assert_alive();
}

/// Starts a Python client that opens a TLS connection, makes a request, waits for a line on
/// its stdin, and makes a second request on the same connection.
fn python_keepalive_start(port: u16) -> std::process::Child {
    let script = format!(
        r#"{PY_PRELUDE}
s = ctx().wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
print(get(s)[0], flush=True)
sys.stdin.readline()
print(get(s)[0], flush=True)
"#
    );
    let mut child = Command::new("python3")
        .args(["-c", &script, &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK\n");
    child
}

fn python_keepalive_finish(mut child: std::process::Child) {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"HTTP/1.1 200 OK\n");
}

#[test]
fn client_certificates_required_and_seen_by_handlers() {
    let pki = Pki::new();
    let cert = pki.server("localhost", &["localhost"]);
    let client = pki.client("client", "alice");
    let ca = pki.client_ca();
    let server = tls_server(&with_cert(
        &cert,
        &["--tls-client-ca", ca.to_str().unwrap()],
    ));
    let port = server.tls_port().to_string();
    let script = format!(
        r#"{PY_PRELUDE}
try:
    s = ctx().wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
    print(get(s))
except (ssl.SSLError, ConnectionError, IndexError) as e:
    print("refused")
c = ctx()
c.load_cert_chain(sys.argv[2], sys.argv[3])
s = c.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
status, body = get(s, "/tls/client-cert")
print(status, body.decode().strip())
"#
    );
    let out = python(
        &script,
        &[
            &port,
            client.cert.to_str().unwrap(),
            client.key.to_str().unwrap(),
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "refused", "{out}");
    assert_eq!(
        lines[1],
        format!("HTTP/1.1 200 OK {}", client.sha256()),
        "{out}"
    );
    // Without client authentication the route says there is no certificate.
    let plain = tls_server(&with_cert(&cert, &[]));
    let port = plain.tls_port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--resolve",
            &resolve,
        ])
        .args(["--cacert", pki.ca().to_str().unwrap()])
        .arg(format!("https://localhost:{port}/tls/client-cert"))
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"404");
    assert_eq!(fingerprint(&client.der), client.sha256());
}

#[test]
fn static_files_over_tls_are_read_in_pieces() {
    let dir = std::env::temp_dir().join(format!("canter-tls-static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = random_bytes(3 * 1024 * 1024 + 17, 9);
    std::fs::write(dir.join("big.bin"), &data).unwrap();
    let server = tls_server(&["--tls-self-signed", "--static", dir.to_str().unwrap()]);
    let url = format!("https://127.0.0.1:{}/static/big.bin", server.tls_port());
    let out = curl(&["-k", "--http1.1", &url]);
    assert!(
        out.stdout == data,
        "file over TLS differs ({} bytes)",
        out.stdout.len()
    );
    let out = curl(&["-k", "--http1.1", "-r", "1000-1999", &url]);
    assert_eq!(out.stdout, &data[1000..2000]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads what the server sends until it closes; panics if it does not close within 10 s.
fn until_closed(mut s: TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match read_some(&mut s, &mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("server did not close: {e} (got {got:?})"),
        }
    }
}

/// A minimal TLS 1.0 ClientHello with no extensions (so no `supported_versions`).
fn tls10_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x01];
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x02, 0x00, 0x2f]); // one suite
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut hs = vec![0x01, 0, 0, body.len() as u8];
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01, 0, hs.len() as u8];
    record.extend_from_slice(&hs);
    record
}

#[test]
fn hostile_tls_input_is_refused_and_others_unaffected() {
    let mut server = tls_server(&["--tls-self-signed", "--tls-handshake-timeout", "1"]);
    let addr = SocketAddr::from(([127, 0, 0, 1], server.tls_port()));
    let connect = || TcpStream::connect(addr).unwrap();
    // A connection that stays healthy throughout.
    let keeper = python_keepalive_start(server.tls_port());

    // Plain HTTP on the TLS port: an alert or a close, nothing else.
    let mut s = connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = until_closed(s);
    assert!(got.is_empty() || got[0] == 0x15, "not an alert: {got:?}");

    // TLS 1.0 (no supported_versions, no suite in common): a fatal alert (level 2).
    let mut s = connect();
    s.write_all(&tls10_hello()).unwrap();
    let got = until_closed(s);
    assert!(got.len() >= 7 && got[0] == 0x15 && got[5] == 2, "{got:?}");

    // An SSLv2-style hello.
    let mut s = connect();
    s.write_all(&[
        0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10,
    ])
    .unwrap();
    let got = until_closed(s);
    assert!(got.is_empty() || got[0] == 0x15, "{got:?}");

    // A record longer than TLS allows (2^14 + 2048): refused on its header.
    let mut s = connect();
    s.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff]).unwrap();
    let got = until_closed(s);
    assert!(got.is_empty() || got[0] == 0x15, "{got:?}");

    // A truncated hello, then the client goes away.
    let mut s = connect();
    s.write_all(&tls10_hello()[..20]).unwrap();
    drop(s);

    // A client that stalls mid-handshake is cut at the handshake timeout (1 s).
    let mut s = connect();
    s.write_all(&tls10_hello()[..20]).unwrap();
    let started = Instant::now();
    let _ = until_closed(s);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // Renegotiation asked for by openssl (`R` on its input) over TLS 1.2: refused or ignored,
    // the server keeps serving.
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-tls1_2",
            "-quiet",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.as_mut().unwrap().write_all(b"R\n").unwrap();
    thread::sleep(Duration::from_millis(500));
    let _ = child.kill();
    let _ = child.wait();

    python_keepalive_finish(keeper);
    server.assert_alive();
    assert!(!server.log().contains("panicked"), "{}", server.log());
    let out = curl(&["-k", "--http1.1", &format!("https://{addr}/plaintext")]);
    assert_eq!(out.stdout, b"Hello, World!");
}

/// A TLS 1.2 client that asks to renegotiate (`R` on openssl's input) gets rustls's refusal, the
/// `no_renegotiation` alert, at once: a read that makes TLS output and no plaintext is followed
/// by a write. What the TLS library says about a peer (the refusal, an IP address as SNI) is a
/// client fault: counted (`tls_warning`) and logged at debug, never a WARN line per peer.
#[test]
fn a_renegotiation_is_refused_at_once_and_tls_warnings_are_counted() {
    let server = tls_server(&[
        "--tls-self-signed",
        "--metrics",
        "--fault-log-interval",
        "1",
    ]);
    let addr = SocketAddr::from(([127, 0, 0, 1], server.tls_port())).to_string();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &addr, "-tls1_2", "-msg"])
        .args(["-servername", "127.0.0.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl runs");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The handshake is done once openssl prints its session; then ask to renegotiate.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    let mut asked = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break;
        };
        seen.push_str(&line);
        seen.push('\n');
        if asked.is_none() && line.contains("Verify return code") {
            stdin.write_all(b"R\n").unwrap();
            asked = Some(Instant::now());
        }
        if line.contains("warning no_renegotiation") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let asked = asked.unwrap_or_else(|| panic!("no handshake:\n{seen}"));
    assert!(
        seen.contains("Alert [length 0002], warning no_renegotiation"),
        "no alert within 10 s of the request:\n{seen}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );

    // Counted (the IP address as SNI, the refusal), summarised, and no WARN line.
    wait_for_log(&server, "tls_warning=", 0);
    let out = curl(&["-k", "--http1.1", &format!("https://{addr}/metrics")]);
    let metrics = String::from_utf8_lossy(&out.stdout);
    let count: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("canter_client_errors_total{kind=\"tls_warning\"} "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(count >= 2, "{metrics}");
    let log = server.log();
    assert!(!log.contains(" WARN "), "{log}");
}

/// Start-up errors name the files: a key that does not belong to its certificate (and which
/// pair, when there are several), and an encrypted key (which canter cannot read).
#[test]
fn bad_key_files_are_named_at_start() {
    let pki = Pki::new();
    let a = pki.server("a", &["a.test"]);
    let b = pki.server("b", &["b.test"]);
    let start = |pairs: &[(&std::path::Path, &std::path::Path)]| {
        let mut args: Vec<std::ffi::OsString> =
            vec!["serve".into(), "--tls-addr".into(), "127.0.0.1:0".into()];
        for (cert, key) in pairs {
            args.extend(["--tls-cert".into(), cert.as_os_str().to_owned()]);
            args.extend(["--tls-key".into(), key.as_os_str().to_owned()]);
        }
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let (status, err) = common::canter_exits(&args);
        assert!(!status.success(), "{err}");
        err
    };
    let err = start(&[(&a.cert, &b.key)]);
    let want = format!(
        "{}: the private key does not belong to the certificate in {}",
        b.key.display(),
        a.cert.display()
    );
    assert!(err.contains(&want), "{err}");
    assert!(!err.contains("pair"), "{err}");
    let err = start(&[(&a.cert, &a.key), (&b.cert, &a.key)]);
    assert!(err.contains("(certificate and key pair 2 of 2)"), "{err}");
    assert!(err.contains(&b.cert.display().to_string()), "{err}");

    let encrypted = a.key.with_extension("encrypted.pem");
    let out = Command::new("openssl")
        .args([
            "pkcs8",
            "-topk8",
            "-v2",
            "aes-256-cbc",
            "-passout",
            "pass:secret",
            "-in",
        ])
        .arg(&a.key)
        .arg("-out")
        .arg(&encrypted)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "{out:?}");
    let err = start(&[(&a.cert, &encrypted)]);
    let want = format!(
        "{}: the private key is encrypted; canter needs it unencrypted",
        encrypted.display()
    );
    assert!(err.contains(&want), "{err}");
}

/// A thousand TLS handshakes at once against one worker with default settings: all complete.
#[test]
fn a_thousand_concurrent_handshakes_on_one_worker() {
    let server = tls_server(&["--tls-self-signed", "--workers", "1"]);
    let port = server.tls_port().to_string();
    let script = r#"
import asyncio, resource, ssl, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
port = int(sys.argv[1])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
async def one(i, start):
    await start.wait()
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, ssl_handshake_timeout=60)
    w.write(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    body = await r.readexactly(13)
    w.close()
    return head.startswith(b"HTTP/1.1 200 OK") and body == b"Hello, World!"
async def main():
    start = asyncio.Event()
    tasks = [asyncio.create_task(one(i, start)) for i in range(1000)]
    await asyncio.sleep(0.1)
    start.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    ok = sum(1 for r in results if r is True)
    errors = set(repr(r) for r in results if r is not True)
    print(ok, sorted(errors)[:3])
asyncio.run(main())
"#;
    let out = python(script, &[&port]);
    assert_eq!(out.trim(), "1000 []", "{out}");
}

/// `canter load` over TLS: verified against the CA, with `-k`, and pipelined; a server it
/// cannot verify gives connect errors and no responses.
#[test]
fn canter_load_over_tls() {
    let pki = Pki::new();
    let cert = pki.server("localhost", &["localhost", "127.0.0.1"]);
    let server = tls_server(&with_cert(&cert, &[]));
    let url = format!("https://127.0.0.1:{}/plaintext", server.tls_port());
    let load = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["load", "--json", "--no-progress", "-c", "4"])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let stderr_of = |extra: &[&str], url: &str| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["load", "--json", "--no-progress", "-c", "4"])
            .args(extra)
            .arg(url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let ca = pki.ca();
    for extra in [
        &["-n", "2000", "--cacert", ca.to_str().unwrap()][..],
        &["-n", "2000", "-k"],
        &["-n", "4000", "-k", "--pipeline", "16"],
    ] {
        let report = load(extra);
        let want = extra[1].parse::<u64>().unwrap();
        assert_eq!(report["requests"], want, "{extra:?}: {report}");
        assert_eq!(report["status"]["200"], want, "{extra:?}: {report}");
        assert_eq!(report["errors"]["connect"], 0, "{report}");
    }
    let report = load(&["-d", "1s"]);
    assert_eq!(report["requests"], 0, "{report}");
    assert!(
        report["errors"]["connect"].as_u64().unwrap() > 0,
        "{report}"
    );
    // Why, said once (as curl says it), for HTTP/1.1 and HTTP/2 alike.
    for extra in [&["-d", "1s"][..], &["-d", "1s", "-m", "10"]] {
        let err = stderr_of(extra, &url);
        let why = "certificate not trusted (UnknownIssuer): use --cacert FILE, or -k for a \
                   development certificate";
        assert_eq!(err.matches(why).count(), 1, "{extra:?}: {err}");
    }
    // A server that goes away during the run: its connections fail, then connecting is
    // refused; each reason said once.
    let plain = server.addr();
    let load = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["load", "--json", "--no-progress", "-c", "4", "-d", "3s"])
        .arg(format!("http://{plain}/plaintext"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_secs(1));
    server.signal("KILL");
    let out = load.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let why = format!("connection refused (is a server listening on {plain}?)");
    assert_eq!(err.matches(&why).count(), 1, "{err}");
}

/// `canter load --cacert` trusts a certificate that is itself the anchor given: a self-signed
/// one from a plain `openssl req -x509` (OpenSSL 3 marks it CA:TRUE), as curl, Python, Node and
/// browsers do; still only for the names it holds.
#[test]
fn canter_load_trusts_a_self_signed_certificate_given_as_its_own_ca() {
    let pki = Pki::new();
    let x509 = |stem: &str, names: &str| {
        let (cert, key) = (
            pki.dir().join(format!("{stem}.pem")),
            pki.dir().join(format!("{stem}.key")),
        );
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext"])
            .arg(format!("subjectAltName={names}"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl is needed and could not run");
        assert!(out.status.success(), "{out:?}");
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&cert)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("CA:TRUE"),
            "the case needs a CA:TRUE certificate"
        );
        (
            cert.to_str().unwrap().to_owned(),
            key.to_str().unwrap().to_owned(),
        )
    };
    let load = |cert: &(String, String)| -> serde_json::Value {
        let server = tls_server(&["--tls-cert", &cert.0, "--tls-key", &cert.1]);
        let out = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["load", "--json", "--no-progress", "-c", "2", "-n", "200"])
            .args(["-d", "3s", "--cacert", &cert.0])
            .arg(format!("https://127.0.0.1:{}/plaintext", server.tls_port()))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let report = load(&x509("ip", "DNS:localhost,IP:127.0.0.1"));
    assert_eq!(report["status"]["200"], 200, "{report}");
    // One that does not hold the name asked for: refused.
    let report = load(&x509("name", "DNS:example.test"));
    assert_eq!(report["requests"], 0, "{report}");
    assert!(
        report["errors"]["connect"].as_u64().unwrap() > 0,
        "{report}"
    );
}
