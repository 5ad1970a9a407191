//! `canter serve --h3`: HTTP/3 over QUIC on the TLS port's number, against clients other than
//! our own: Python's aioquic (installed from PyPI on first use) and quinn with hyperium's h3
//! (canter-testkit's client); protocol violations written by hand on a raw QUIC connection, and
//! datagrams of garbage. Fails, never skips, when Python or pip cannot run.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use canter_h3::qpack::Encoder;
use canter_h3::varint;
use canter_testkit::h3::{connect_quic, Client};
use common::Server;

const AIOQUIC: &str = "aioquic==1.7.2";

fn start() -> Server {
    start_h3(&[])
}

/// `canter serve --h3` with a self-signed certificate on an ephemeral TLS port, and `extra`.
fn start_h3(extra: &[&str]) -> Server {
    let mut args = vec!["--tls-addr", "127.0.0.1:0", "--tls-self-signed", "--h3"];
    args.extend_from_slice(extra);
    Server::start_with(&args)
}

fn h3_addr(server: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.tls_port()))
}

/// aioquic, installed once per test run with pip into the target directory; returns where.
fn python_aioquic() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-aioquic");
        if dir
            .join("aioquic")
            .join("h3")
            .join("connection.py")
            .exists()
        {
            return dir;
        }
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .arg(AIOQUIC)
            .output()
            .unwrap_or_else(|e| {
                panic!("python3 is needed to install aioquic and could not run: {e}")
            });
        assert!(
            out.status.success(),
            "pip install {AIOQUIC} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .clone()
}

/// aioquic's HTTP/3 client (tests/py/h3client.py): multiplexing, flow control both ways,
/// errors and 431, trailers, the server's SETTINGS, session resumption, WebSocket over HTTP/3
/// (RFC 9220) on `/ws/echo`, Alt-Svc.
#[test]
fn aioquic_client() {
    let site = python_aioquic();
    let server = start();
    let script = format!("{}/tests/py/h3client.py", env!("CARGO_MANIFEST_DIR"));
    // Eight steps, one of which waits 5 s to see that nothing is answered: beside other work
    // the whole can take over the usual 30 s.
    let out = common::run_python_within(
        &[
            &script,
            &server.tls_port().to_string(),
            site.to_str().unwrap(),
        ],
        None,
        Duration::from_secs(180),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h3client.py failed ({}):\n{stdout}\n{}\nserver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    for check in [
        "ok 30 multiplexed requests",
        "ok POST /echo and a 3 MB download under flow control",
        "ok 404, 405 and 431",
        "ok a request with trailers",
        "ok session resumption",
        "ok WebSocket over HTTP/3 (RFC 9220)",
        "ok 0-RTT refused",
        "ok Alt-Svc over HTTP/1.1 with TLS",
        "ALL OK",
    ] {
        assert!(
            stdout.lines().any(|l| l == check),
            "missing {check:?} in:\n{stdout}"
        );
    }
}

/// `Alt-Svc` advertises HTTP/3 on every answer over TLS, HTTP/2 (curl) and HTTP/1.1 alike, a
/// handler's pending answer and an error included, and on none over plain TCP.
#[test]
fn alt_svc_on_answers_over_tls_only() {
    let server = start();
    let port = server.tls_port();
    let want = format!("alt-svc: h3=\":{port}\"; ma=86400");
    for (args, path, status) in [
        (vec!["--http2"], "/plaintext", "HTTP/2 200"),
        (vec!["--http1.1"], "/plaintext", "HTTP/1.1 200"),
        // A handler that reads the body: its answer is pending when the driver gets it.
        (
            vec!["--http2", "--data-binary", "abc"],
            "/echo",
            "HTTP/2 200",
        ),
    ] {
        let url = format!("https://127.0.0.1:{port}{path}");
        let mut all = vec!["-k", "-D", "-", "-o", "/dev/null"];
        all.extend(args.iter().copied());
        all.push(&url);
        let out = common::curl(&all);
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        let lines: Vec<&str> = head.lines().map(str::trim_end).collect();
        assert!(
            lines[0].starts_with(&status.to_lowercase()),
            "{args:?}: {head}"
        );
        let n = lines.iter().filter(|l| l.starts_with("alt-svc:")).count();
        assert!(lines.contains(&want.as_str()) && n == 1, "{args:?}: {head}");
    }
    let out = common::curl_any_status(&[
        "-k",
        "--http2",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("https://127.0.0.1:{port}/no/such/route"),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.starts_with("http/2 404"), "{head}");
    assert!(head.lines().any(|l| l.trim_end() == want), "{head}");
    // Plain TCP: not advertised (HTTP/3 needs TLS's certificate).
    let r = common::fetch(server.addr(), "GET", "/plaintext", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("alt-svc"), None);
}

/// `--h3-early-data`: a resumed session's 0-RTT GET is served, its POST answered 425 Too Early,
/// while the client withholds its Finished as a replayed first flight would (aioquic,
/// tests/py/h3client.py --early-data); without the flag (above) early data is refused.
#[test]
fn early_data_serves_safe_methods_only() {
    let site = python_aioquic();
    let server = start_h3(&["--h3-early-data"]);
    let script = format!("{}/tests/py/h3client.py", env!("CARGO_MANIFEST_DIR"));
    let out = common::run_python(
        &[
            &script,
            &server.tls_port().to_string(),
            site.to_str().unwrap(),
            "--early-data",
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h3client.py --early-data failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == "ok 0-RTT accepted: GET served, POST 425"),
        "{stdout}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The demo's routes over HTTP/3 with quinn and h3 answer what they answer over HTTP/1.1.
#[test]
fn quinn_h3_client_gets_every_route() {
    let server = start();
    let addr = h3_addr(&server);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        let r = c.get("/plaintext").await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"Hello, World!"[..]));
        assert_eq!(r.header("content-length"), Some("13"));
        // No Alt-Svc on HTTP/3 itself.
        assert_eq!(r.header("alt-svc"), None);
        let r = c.get("/json").await.unwrap();
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.body, br#"{"message":"Hello, World!"}"#);
        let r = c.get("/hello/quic").await.unwrap();
        assert!(String::from_utf8_lossy(&r.body).contains("quic"), "{r:?}");
        let r = c.get("/").await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.header("content-type").unwrap().starts_with("text/html"));
        let r = c.get("/bytes/200000").await.unwrap();
        assert_eq!((r.status, r.body.len()), (200, 200_000));
        let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let r = c.request("POST", "/echo", &[], &body).await.unwrap();
        assert_eq!((r.status, r.body == body), (200, true));
        // HEAD: the length of the GET, no body (RFC 9110, Section 9.3.2).
        let r = c.request("HEAD", "/plaintext", &[], b"").await.unwrap();
        assert_eq!(
            (r.status, r.header("content-length"), r.body.len()),
            (200, Some("13"), 0)
        );
        let r = c.get("/no/such/page").await.unwrap();
        assert_eq!(r.status, 404);
        let r = c.request("DELETE", "/plaintext", &[], b"").await.unwrap();
        assert_eq!(r.status, 405);
        // A body over the server's limit, declared: 413 before a byte of it is read.
        let r = c
            .request("POST", "/echo", &[("content-length", "99999999999")], b"x")
            .await;
        assert!(
            matches!(r, Ok(ref r) if r.status == 413) || r.is_err(),
            "{r:?}"
        );
        // The connection still serves.
        let r = c.get("/plaintext").await.unwrap();
        assert_eq!(r.status, 200);
    });
}

fn frame(ty: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint::encode(ty, &mut out);
    varint::encode(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

fn headers(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    let mut enc = Encoder::new();
    enc.begin(&mut block);
    for (n, v) in fields {
        enc.field(n.as_bytes(), v.as_bytes(), &mut block);
    }
    frame(0x1, &block)
}

const GET: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":authority", "localhost"),
    (":path", "/plaintext"),
];

/// Sends `bytes` on a new request stream of `conn` and reads the answer (`Ok(bytes)`), or the
/// stream's reset code (`Err(code)`).
async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> Result<Vec<u8>, u64> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    send.finish().unwrap();
    match recv.read_to_end(1 << 20).await {
        Ok(data) => Ok(data),
        Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => Err(code.into_inner()),
        Err(e) => panic!("unexpected: {e}"),
    }
}

/// Protocol violations written by hand: a malformed request resets its stream with
/// H3_MESSAGE_ERROR and the connection goes on; a frame out of place closes the connection with
/// H3_FRAME_UNEXPECTED; a second control stream with H3_STREAM_CREATION_ERROR.
#[test]
fn protocol_violations_get_their_error_codes() {
    let server = start();
    let addr = h3_addr(&server);
    runtime().block_on(async {
        let (_ep, conn) = connect_quic(addr).await.unwrap();
        // A well-formed request by hand: HEADERS then DATA (status 200 in static index 25).
        let answer = exchange(&conn, &headers(GET)).await.unwrap();
        assert_eq!(answer[0], 0x01, "a HEADERS frame first: {answer:x?}");
        assert!(answer.ends_with(b"Hello, World!"), "{answer:x?}");
        // Uppercase field name: malformed (RFC 9114, Section 4.2).
        let mut bad = GET.to_vec();
        bad.push(("X-Upper", "1"));
        assert_eq!(exchange(&conn, &headers(&bad)).await, Err(0x10e));
        // Content-length that the body does not match.
        let mut post = vec![
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "x"),
            (":path", "/echo"),
            ("content-length", "10"),
        ];
        let mut bytes = headers(&post);
        bytes.extend(frame(0x0, b"12345"));
        assert_eq!(exchange(&conn, &bytes).await, Err(0x10e));
        post.pop();
        // The connection is still good.
        let answer = exchange(&conn, &headers(GET)).await.unwrap();
        assert!(answer.ends_with(b"Hello, World!"));
        // DATA before HEADERS: a connection error.
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        send.write_all(&frame(0x0, b"early")).await.unwrap();
        let reason = conn.closed().await;
        match reason {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code.into_inner(), 0x105, "{c:?}")
            }
            other => panic!("{other:?}"),
        }

        // Two control streams.
        let (_ep, conn) = connect_quic(addr).await.unwrap();
        // Kept open: a dropped stream is finished, and a closed control stream is an error
        // of its own (H3_CLOSED_CRITICAL_STREAM).
        let mut open = Vec::new();
        for _ in 0..2 {
            let mut s = conn.open_uni().await.unwrap();
            let mut bytes = vec![0x00];
            bytes.extend(frame(0x4, &[]));
            s.write_all(&bytes).await.unwrap();
            open.push(s);
        }
        match conn.closed().await {
            quinn::ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code.into_inner(), 0x103, "{c:?}")
            }
            other => panic!("{other:?}"),
        }
    });
    // The server counted the peers' faults and is still up.
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
}

/// Datagrams of garbage (random bytes, truncated Initials, long-header junk) cost the server a
/// header parse each: it drops them and goes on serving.
#[test]
fn garbage_datagrams_are_dropped() {
    let server = start();
    let addr = h3_addr(&server);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    for i in 0..3000 {
        let _ = sock.send_to(&junk(i, &mut next), addr);
    }
    // Replies to garbage (version negotiation, stateless resets) are bounded: at most one per
    // datagram, and none of them large.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 2048];
    let mut replies = 0;
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        assert!(n <= 1500, "a reply of {n} bytes to garbage");
        replies += 1;
    }
    assert!(replies <= 3000, "{replies} replies");
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
    assert!(
        server.log().lines().all(|l| !l.contains("panicked")),
        "{}",
        server.log()
    );
}

/// A fixed sequence of pseudo-random numbers (xorshift64) from `seed`.
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The `i`-th datagram of garbage: random bytes of one of five lengths, every third a long
/// header with QUIC version 1 and junk after it.
fn junk(i: usize, next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let len = [1, 20, 1200, 1350, 64][i % 5];
    let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
    if i.is_multiple_of(3) {
        d[0] = 0xc0 | (d[0] & 0x0f);
        if d.len() >= 5 {
            d[1..5].copy_from_slice(&[0, 0, 0, 1]);
        }
    }
    d
}

/// Headless Chromium: with QUIC forced on for the origin, the page and its fetches come over
/// HTTP/3. Without, it loads the page over HTTP/2 with TLS, reads the Alt-Svc header and
/// records HTTP/3 on the advertised port as the origin's alternative service. (It does not move
/// to it here: Chromium uses QUIC by Alt-Svc only with a certificate from a publicly trusted
/// root, which no loopback test can have; its handshake then fails with "certificate unknown".)
/// The certificate is a throwaway CA's, trusted by its key's hash.
#[test]
fn chromium_speaks_http3_and_learns_it_from_alt_svc() {
    let pki = canter_testkit::Pki::new();
    let cert = pki.server("h3", &["localhost", "127.0.0.1"]);
    let page = format!("{}/tests/h3_page", env!("CARGO_MANIFEST_DIR"));
    let server = Server::start_with(&[
        "--tls-addr",
        "127.0.0.1:0",
        "--tls-cert",
        cert.cert.to_str().unwrap(),
        "--tls-key",
        cert.key.to_str().unwrap(),
        "--h3",
        "--static",
        &page,
    ]);
    let port = server.tls_port();
    let url = format!("https://127.0.0.1:{port}/static/proto.html");
    let trust = format!(
        "--ignore-certificate-errors-spki-list={}",
        cert.spki_sha256_base64()
    );

    let forced = [
        "--enable-quic".to_owned(),
        format!("--origin-to-force-quic-on=127.0.0.1:{port}"),
        trust.clone(),
    ];
    let (out, html) = common::chromium_dom_with(&url, 5000, &forced);
    assert!(out.status.success(), "{out:?}");
    assert!(html.contains("navigation: h3"), "{html}\n{}", server.log());
    assert!(html.contains("fetch 1: h3 Hello, World!"), "{html}");

    let profile =
        std::env::temp_dir().join(format!("canter-chromium-altsvc-{}", std::process::id()));
    let (out, html) =
        common::chromium_dom_in(&url, 3000, &["--enable-quic".to_owned(), trust], &profile);
    let state = std::fs::read_to_string(profile.join("Default/Network Persistent State"));
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "{out:?}");
    assert!(html.contains("navigation: h2"), "{html}");
    let state = state.expect("Chromium wrote no network state");
    let v: serde_json::Value = serde_json::from_str(&state).unwrap();
    let servers = v["net"]["http_server_properties"]["servers"]
        .as_array()
        .unwrap();
    let learned = servers.iter().any(|s| {
        s["server"] == format!("https://127.0.0.1:{port}")
            && s["alternative_service"].as_array().is_some_and(|alts| {
                alts.iter().any(|a| {
                    a["port"] == port
                        && a["advertised_alpns"][0] == "h3"
                        && a["protocol_str"] == "quic"
                })
            })
    });
    assert!(
        learned,
        "no h3 alternative service learned from Alt-Svc:\n{state}"
    );
}

/// `canter load --h3`: closed loop with several streams per connection, and open loop at a fixed
/// rate; every request answered, the report says HTTP/3.
#[test]
fn canter_load_speaks_http3() {
    let server = start();
    let url = format!("https://127.0.0.1:{}/plaintext", server.tls_port());
    for args in [
        &["-c", "3", "-m", "8", "-n", "3000"][..],
        &["-c", "2", "-n", "300", "--rate", "2000"],
        &[
            "-c", "1", "-m", "2", "-n", "20", "-X", "POST", "--body", "hello",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["load", &url, "--h3", "-k", "--json", "--no-progress"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let want: u64 = args[args.iter().position(|a| *a == "-n").unwrap() + 1]
            .parse()
            .unwrap();
        assert_eq!(report["protocol"], "h3", "{report}");
        assert_eq!(report["requests"], want, "{args:?}: {report}");
        let errors = report["errors"].as_object().unwrap();
        assert!(errors.values().all(|v| v == 0), "{args:?}: {report}");
    }
    // The POST went to a GET-only route: 405s, counted as answers with their status.
    // An http:// URL is refused with a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "load",
            &format!("http://127.0.0.1:{}/", server.port),
            "--h3",
            "-n",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--h3 needs an https:// URL"),
        "{out:?}"
    );
}

/// A client Initial, as quinn-proto's client writes it, for a connection nobody will finish.
fn initial_datagram(server: SocketAddr) -> Vec<u8> {
    let mut ep = quinn_proto::Endpoint::new(
        std::sync::Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(
        canter_testkit::h3::client_tls().unwrap(),
    )
    .unwrap();
    let config = quinn_proto::ClientConfig::new(std::sync::Arc::new(crypto));
    let now = std::time::Instant::now();
    let (_, mut conn) = ep.connect(now, config, server, "localhost").unwrap();
    let mut buf = Vec::new();
    let t = conn.poll_transmit(now, 1, &mut buf).unwrap();
    buf.truncate(t.size);
    buf
}

/// Handshakes that never finish pile up (Initials from many addresses, then silence); past
/// the threshold a new client is sent a stateless Retry instead of a connection, and a real
/// client still gets through (it answers the Retry with the token).
#[test]
fn a_pile_of_handshakes_meets_stateless_retry() {
    let server = start_h3(&["--workers", "1"]);
    let addr = h3_addr(&server);
    let mut silent = Vec::new();
    for _ in 0..80 {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.send_to(&initial_datagram(addr), addr).unwrap();
        silent.push(sock);
    }
    // The first 64 get the server's Initial (a handshake begins); later ones a Retry. Every
    // socket gets an answer: wait for each (generous deadlines: the machine may be busy).
    let mut retries = 0;
    let mut handshakes = 0;
    for sock in &silent {
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = [0u8; 2048];
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        assert!(n > 0);
        // Long header, version 1: the type is in bits 4-5 (0 Initial, 3 Retry).
        assert_eq!(buf[0] & 0x80, 0x80, "a long header");
        match (buf[0] >> 4) & 0x3 {
            0 => handshakes += 1,
            3 => retries += 1,
            t => panic!("unexpected packet type {t}"),
        }
    }
    assert_eq!(handshakes, 64, "{retries} retries");
    assert_eq!(retries, 16);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
}

/// SIGTERM with a download in flight: the download completes, the server says GOAWAY and
/// closes the connection with H3_NO_ERROR, and exits.
#[test]
fn sigterm_drains_http3() {
    let mut server = start();
    let addr = h3_addr(&server);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        let (status, mut body) = c.get_head("/bytes/20000000").await.unwrap();
        assert_eq!(status, 200);
        // The response has begun: the request is in flight when the signal comes.
        server.signal("TERM");
        let n = canter_testkit::h3::read_body(&mut body).await.unwrap();
        assert_eq!(n, 20_000_000);
        let closed = tokio::time::timeout(Duration::from_secs(30), c.quic.closed())
            .await
            .expect("the server closes the connection once drained");
        match closed {
            quinn::ConnectionError::ApplicationClosed(a) => {
                assert_eq!(a.error_code.into_inner(), 0x100, "{a:?}")
            }
            other => panic!("{other:?}"),
        }
    });
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        server.log()
    );
}

/// `canter load --h3 --no-keepalive`: a connection (a full handshake) per request, 300 of them
/// started at once; past the Retry threshold clients are asked to prove their address first,
/// and every one of them still completes.
#[test]
fn concurrent_handshakes_all_complete() {
    let server = start();
    let url = format!("https://127.0.0.1:{}/plaintext", server.tls_port());
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "load",
            &url,
            "--h3",
            "-k",
            "--no-keepalive",
            "--tls-no-resume",
            "--json",
        ])
        .args([
            "--no-progress",
            "-c",
            "300",
            "-n",
            "300",
            "--timeout",
            "120s",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"]["200"], 300, "{report}\n{}", server.log());
}

/// A client that changes address (QUIC's connection migration) keeps its connection. The
/// kernel picks one of the workers' sockets by a hash of the client's address, so after a move
/// its packets may reach a worker that does not own the connection: that worker hands them to
/// the owner, found from the connection ID (without it, the other worker would answer with a
/// stateless reset and the connection would die).
#[test]
fn a_migrating_client_keeps_its_connection_across_workers() {
    let server = start_h3(&["--workers", "2", "--metrics"]);
    let addr = h3_addr(&server);
    let forwarded = || {
        let m = common::fetch(server.addr(), "GET", "/metrics", "");
        common::metric(m.text(), "canter_quic_datagrams_forwarded_total")
    };
    assert_eq!(forwarded(), 0);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
        // Each move lands on either socket (the hash of the new port decides): move until the
        // other worker has handed packets over at least once (all of 64 moves landing on the
        // owner has odds of 2^-64), and a few times in any case.
        let mut moves = 0;
        while moves < 4 || forwarded() == 0 {
            assert!(moves < 64, "64 moves and no datagram handed over");
            let local = c.migrate().unwrap();
            moves += 1;
            let r = c
                .get("/bytes/100000")
                .await
                .unwrap_or_else(|e| panic!("request after move {moves} (to {local}) failed: {e}"));
            assert_eq!((r.status, r.body.len()), (200, 100_000), "move {moves}");
        }
    });
    assert!(forwarded() > 0);
}

/// A client that asks for 100 responses of 64 MiB each (6.4 GiB in all) and reads none of
/// them: QUIC's flow control stops the server at the client's windows, and a response body is
/// pulled only while its stream has little queued, so the server's memory stays bounded while
/// it waits, and it goes on serving others.
#[test]
fn memory_stays_bounded_when_an_http3_client_reads_nothing() {
    let server = start_h3(&["--workers", "1"]);
    let addr = h3_addr(&server);
    // One connection first, so that what the server allocates once (buffers, TLS state) is
    // in the baseline.
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
    let before = server.rss_kib();
    runtime().block_on(async {
        let (_ep, conn) = connect_quic(addr).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..100 {
            let (mut send, recv) = conn.open_bi().await.unwrap();
            let mut get = GET.to_vec();
            get[3] = (":path", "/bytes/67108864");
            send.write_all(&headers(&get)).await.unwrap();
            send.finish().unwrap();
            held.push((send, recv));
        }
        // Wait until the server has sent all the windows allow: the bytes received stop
        // growing (unchanged over a second), with a generous deadline for a busy machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let (mut last, mut still) = (0, 0);
        while still < 5 {
            assert!(
                std::time::Instant::now() < deadline,
                "the server kept sending to a client that reads nothing: {last} bytes"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = conn.stats().udp_rx.bytes;
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        // What quinn's windows allowed arrived (1.25 MB a stream by its defaults), far short
        // of what was asked.
        assert!(
            (10_000_000..1_000_000_000).contains(&last),
            "{last} bytes received"
        );
        let grown = server.rss_kib().saturating_sub(before);
        assert!(
            grown < 64 * 1024,
            "RSS grew by {grown} KiB for 6.4 GiB of requested, unread responses"
        );
        // Others are still served, by the same (single) worker, the stalled client connected.
        let mut other = Client::connect(addr).await.unwrap();
        let r = other.get("/bytes/100000").await.unwrap();
        assert_eq!((r.status, r.body.len()), (200, 100_000));
        drop(held);
    });
}

/// Before a client's address is validated, the server sends it at most three times what it
/// received (RFC 9000, Section 8.1): one Initial of 1,200 bytes from an address that then
/// never answers draws at most 3,600 bytes, however often the server's loss timer fires to
/// send its flight again (at about 1, 3 and 7 s: without the limit the probes alone would
/// pass it).
#[test]
fn an_unvalidated_address_gets_at_most_three_times_what_it_sent() {
    let server = start_h3(&["--workers", "1"]);
    let addr = h3_addr(&server);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let initial = initial_datagram(addr);
    assert!(initial.len() >= 1200, "{} bytes", initial.len());
    sock.send_to(&initial, addr).unwrap();
    // The first answer may take a while on a busy machine; after it, wait until the server
    // has been silent for 8 s (its probes back off: 1, 2, 4 s apart).
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (mut got, mut datagrams) = (0, 0);
    let mut buf = [0u8; 65536];
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        got += n;
        datagrams += 1;
        sock.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    }
    assert!(datagrams > 0, "no answer to the Initial");
    assert!(
        got <= 3 * initial.len(),
        "{got} bytes in {datagrams} datagrams for {} received",
        initial.len()
    );
}

/// An idle HTTP/3 connection is closed by the server's idle timeout (`--idle-timeout`, as
/// over TCP) and counted among the client faults of its kind.
#[test]
fn an_idle_http3_connection_times_out_and_is_counted() {
    let server = start_h3(&["--workers", "1", "--idle-timeout", "1", "--metrics"]);
    let addr = h3_addr(&server);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
        // QUIC takes the smaller of the two sides' idle timeouts: the server's second.
        let closed = tokio::time::timeout(Duration::from_secs(60), c.quic.closed())
            .await
            .expect("the idle connection was not closed within 60 s");
        assert!(
            matches!(closed, quinn::ConnectionError::TimedOut),
            "{closed:?}"
        );
    });
    // The server's own timer fires too; wait for its count (generous: a busy machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = common::fetch(server.addr(), "GET", "/metrics", "");
        let counted = m.text().lines().find_map(|l| {
            l.strip_prefix("canter_client_errors_total{kind=\"idle_timeout\"} ")?
                .parse::<u64>()
                .ok()
        });
        if counted.is_some_and(|n| n >= 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "idle timeout not counted:\n{}",
            m.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A flood of tiny streams: 3,000 requests on one connection, as fast as the server's limit
/// of 100 open streams lets the client open them (each stream it finishes gives one back).
/// All are answered, the server's memory stays bounded, and another client is served
/// meanwhile.
#[test]
fn a_flood_of_tiny_streams_is_served_within_the_stream_limit() {
    let server = start_h3(&["--workers", "1"]);
    let addr = h3_addr(&server);
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
    let before = server.rss_kib();
    runtime().block_on(async {
        let (_ep, conn) = connect_quic(addr).await.unwrap();
        let request = headers(GET);
        let flood: Vec<_> = (0..3000)
            .map(|_| {
                let (conn, request) = (conn.clone(), request.clone());
                tokio::spawn(async move { exchange(&conn, &request).await })
            })
            .collect();
        let mut other = Client::connect(addr).await.unwrap();
        assert_eq!(other.get("/plaintext").await.unwrap().status, 200);
        for (i, t) in flood.into_iter().enumerate() {
            let answer = t
                .await
                .unwrap()
                .unwrap_or_else(|code| panic!("stream {i} reset with {code:#x}"));
            assert!(answer.ends_with(b"Hello, World!"), "stream {i}");
        }
    });
    let grown = server.rss_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "RSS grew by {grown} KiB");
}

/// A UDP relay between a client and `server` that drops about one datagram in five each way
/// (a fixed sequence, the same every run). Stops when the returned flag is set.
fn lossy_relay(server: SocketAddr) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let front = UdpSocket::bind("127.0.0.1:0").unwrap();
    let back = UdpSocket::bind("127.0.0.1:0").unwrap();
    back.connect(server).unwrap();
    for s in [&front, &back] {
        s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    }
    let addr = front.local_addr().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let done = stop.clone();
    std::thread::spawn(move || {
        let mut client = None;
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut drop_one = move || next().is_multiple_of(5);
        let mut buf = [0u8; 65536];
        while !done.load(Ordering::Relaxed) {
            while let Ok((n, from)) = front.recv_from(&mut buf) {
                client = Some(from);
                if !drop_one() {
                    let _ = back.send(&buf[..n]);
                }
            }
            while let Ok(n) = back.recv(&mut buf) {
                if let (Some(to), false) = (client, drop_one()) {
                    let _ = front.send_to(&buf[..n], to);
                }
            }
        }
    });
    (addr, stop)
}

/// QUIC delivers a connection's streams in any order, more so under loss: a request whose
/// stream's first bytes come after a higher stream's must still be answered. Rounds of 30
/// concurrent requests through a relay that drops a fifth of the datagrams: every one is
/// answered (before, some waited for the client's timeout).
#[test]
fn every_request_is_answered_under_packet_loss() {
    let server = start_h3(&["--workers", "1"]);
    let (relay, stop) = lossy_relay(h3_addr(&server));
    runtime().block_on(async {
        let (_ep, conn) = tokio::time::timeout(Duration::from_secs(60), connect_quic(relay))
            .await
            .expect("the handshake completes through the relay")
            .unwrap();
        // A request of about a datagram each, so that each stream's first bytes travel in a
        // packet of their own, and a lost packet leaves a lower stream behind higher ones.
        let pad = "p".repeat(1100);
        let mut fields = GET.to_vec();
        fields.push(("x-pad", &pad));
        let request = headers(&fields);
        for round in 0..8 {
            let streams: Vec<_> = (0..30)
                .map(|_| {
                    let (conn, request) = (conn.clone(), request.clone());
                    tokio::spawn(async move {
                        tokio::time::timeout(Duration::from_secs(60), exchange(&conn, &request))
                            .await
                    })
                })
                .collect();
            for (i, t) in streams.into_iter().enumerate() {
                let answer = t
                    .await
                    .unwrap()
                    .unwrap_or_else(|_| panic!("round {round}, request {i}: no answer in 60 s"))
                    .unwrap_or_else(|code| panic!("round {round}, request {i}: reset {code:#x}"));
                assert!(
                    answer.ends_with(b"Hello, World!"),
                    "round {round}, request {i}"
                );
            }
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The bytes waiting in the receive queues of the UDP sockets bound to `port` (from
/// /proc/net/udp: every worker's socket of a `SO_REUSEPORT` group).
fn udp_queued(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/udp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let rx = u64::from_str_radix(f.get(4)?.split(':').nth(1)?, 16).ok()?;
            (local_port == port).then_some(rx)
        })
        .sum()
}

/// Memory under a stream of junk datagrams stays bounded: after a first 50,000 (the
/// allocator's pools fill), 200,000 more, each batch read by the server before the next is
/// sent, leave its resident memory within 2 MiB (a leak of 10 bytes a datagram would be
/// 2 MiB).
#[test]
fn memory_stays_flat_under_a_stream_of_junk_datagrams() {
    let server = start_h3(&["--workers", "1"]);
    let addr = h3_addr(&server);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut send = |count: usize| {
        for batch in 0..count / 5_000 {
            for i in 0..5_000 {
                let _ = sock.send_to(&junk(i, &mut next), addr);
            }
            // Each batch read before the next: junk the kernel drops would cost nothing.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while udp_queued(addr.port()) > 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "batch {batch}: the server read nothing for 60 s"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            // Replies (version negotiation) are read off so that ours does not fill.
            sock.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 2048];
            while sock.recv_from(&mut buf).is_ok() {}
            sock.set_nonblocking(false).unwrap();
        }
    };
    send(50_000);
    let before = server.rss_kib();
    send(200_000);
    let grown = server.rss_kib().saturating_sub(before);
    assert!(
        grown < 2 * 1024,
        "RSS grew by {grown} KiB over 200,000 junk datagrams"
    );
    runtime().block_on(async {
        let mut c = Client::connect(addr).await.unwrap();
        assert_eq!(c.get("/plaintext").await.unwrap().status, 200);
    });
}
