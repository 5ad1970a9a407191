//! The demo's WebSocket route (`/ws/echo`) and its live page (`/ws`) against the clients of
//! the runtimes users run: Node's built-in WebSocket client and headless Chromium. (Python's
//! `websockets` and `wsproto` are in the Python package's suite, python/tests/test_websocket.py.)

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Command;

use canter_testkit::read_some;
use common::Server;

#[test]
fn node_builtin_websocket_client() {
    let server = Server::start();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/js/ws_client.mjs");
    // Node 20 has the client behind a flag; later versions have it on and accept the flag.
    let out = Command::new("node")
        .args(["--experimental-websocket", script, &server.port.to_string()])
        .output()
        .expect("node is needed by this test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    for check in [
        "ok text",
        "ok binary",
        "ok 1 MiB",
        "ok 1000 in flight, in order",
        "ok close 1000, clean",
    ] {
        assert!(stdout.contains(check), "{check}: {stdout}");
    }
}

#[test]
fn the_live_page_talks_to_the_echo_in_headless_chromium() {
    let server = Server::start();
    let (dom, html) = common::chromium_dom(&server.url("/ws"), 5000);
    assert!(dom.status.success(), "{dom:?}");
    // Chromium offers permessage-deflate; the echo came back through it.
    assert!(html.contains("open: permessage-deflate"), "{html}");
    assert!(html.contains("<li>hello from Mozilla/5.0 ("), "{html}");
}

/// `canter load ws://…` with `args`; its JSON report and stderr.
fn load(url: &str, args: &[&str]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["load", url, "--json", "--no-progress"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = serde_json::from_slice(&out.stdout).unwrap();
    (report, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn canter_load_drives_the_echo_closed_and_open_loop_with_and_without_deflate() {
    let server = Server::start();
    let url = format!("ws://127.0.0.1:{}/ws/echo", server.port);
    for args in [
        &["-c", "4", "-n", "4000", "--pipeline", "8"][..],
        &["-c", "2", "-n", "400", "--ws-deflate", "--ws-size", "4096"],
        &["-c", "2", "-n", "300", "--ws-binary", "--ws-size", "100000"],
        &["-c", "2", "-n", "200", "--rate", "1000"],
    ] {
        let (report, stderr) = load(&url, args);
        let want: u64 = args[args.iter().position(|a| *a == "-n").unwrap() + 1]
            .parse()
            .unwrap();
        assert_eq!(report["protocol"], "websocket");
        assert_eq!(report["requests"], want, "{args:?}: {report}\n{stderr}");
        // The status line counts handshakes (one per connection), not messages.
        let connections: u64 = args[1].parse().unwrap();
        assert_eq!(report["status"]["101"], connections, "{report}");
        assert_eq!(report["status"].as_object().unwrap().len(), 1, "{report}");
        for (kind, n) in report["errors"].as_object().unwrap() {
            assert_eq!(n, 0, "{args:?}: {kind} errors: {report}\n{stderr}");
        }
    }
}

#[test]
fn canter_load_counts_a_route_that_does_not_upgrade_and_says_why() {
    let server = Server::start();
    let url = format!("ws://127.0.0.1:{}/plaintext", server.port);
    let (report, stderr) = load(&url, &["-c", "1", "-d", "300ms"]);
    assert_eq!(report["requests"], 0, "{report}");
    assert!(report["errors"]["parse"].as_u64().unwrap() > 0, "{report}");
    assert!(report["status"]["200"].as_u64().unwrap() > 0, "{report}");
    assert!(report["status"].get("101").is_none(), "{report}");
    assert!(stderr.contains("not 101"), "{stderr}");
}

#[test]
fn canter_load_broadcast_mode_counts_every_delivery_of_the_demo_room() {
    let server = Server::start();
    let url = format!("ws://127.0.0.1:{}/ws/broadcast", server.port);
    let (report, stderr) = load(
        &url,
        &[
            "--ws-broadcast",
            "-c",
            "20",
            "--rate",
            "100",
            "-d",
            "1s",
            "--ws-size",
            "64",
        ],
    );
    // 100 messages a second from one member to all 20, over the two workers' hub.
    let got = report["requests"].as_u64().unwrap();
    assert!(
        (1500..=2200).contains(&got),
        "{got} deliveries: {report}\n{stderr}"
    );
    for (kind, n) in report["errors"].as_object().unwrap() {
        assert_eq!(n, 0, "{kind} errors: {report}\n{stderr}");
    }
}

#[test]
fn canter_load_speaks_wss() {
    let server = Server::start_with(&["--tls-addr", "127.0.0.1:0", "--tls-self-signed"]);
    let url = format!("wss://127.0.0.1:{}/ws/echo", server.tls_port());
    let (report, stderr) = load(&url, &["-k", "-c", "4", "-n", "1000", "--ws-deflate"]);
    assert_eq!(report["requests"], 1000, "{report}\n{stderr}");
    for (kind, n) in report["errors"].as_object().unwrap() {
        assert_eq!(n, 0, "{kind} errors: {report}\n{stderr}");
    }
}

/// A WebSocket on the demo's `/ws/echo` over a plain socket, upgraded.
fn upgraded(port: u16) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(
        b"GET /ws/echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            read_some(&mut s, &mut byte).unwrap(),
            1,
            "closed in the upgrade"
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    s
}

/// The head of a client frame (masked with a zero key, so the payload goes as it is) of
/// `len` payload bytes.
fn frame_head(fin: bool, opcode: u8, len: usize) -> Vec<u8> {
    let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
    match len {
        0..=125 => f.push(0x80 | len as u8),
        126..=65535 => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&[0; 4]);
    f
}

/// Reads frames until the server's close; its code. Data frames before it are skipped.
fn close_code(s: &mut std::net::TcpStream) -> u16 {
    use std::io::Read;
    loop {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).unwrap();
        let len = match h[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                s.read_exact(&mut l).unwrap();
                u16::from_be_bytes(l) as usize
            }
            127 => {
                let mut l = [0u8; 8];
                s.read_exact(&mut l).unwrap();
                u64::from_be_bytes(l) as usize
            }
            n => n as usize,
        };
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).unwrap();
        if h[0] & 0x0f == 8 {
            return u16::from_be_bytes([payload[0], payload[1]]);
        }
    }
}

/// The default message limit is 16 MiB (uvicorn's and Bun's): a 17 MiB message in 1 MiB
/// fragments is refused with 1009 once its fragments pass the limit; `--ws-max-message`
/// moves it.
#[test]
fn a_message_over_16_mib_is_refused_with_1009() {
    use std::io::Write;
    let server = Server::start();
    let mut s = upgraded(server.port);
    let piece = vec![b'z'; 1 << 20];
    let mut sent = 0;
    for i in 0..17 {
        let opcode = if i == 0 { 2 } else { 0 };
        let mut frame = frame_head(i == 16, opcode, piece.len());
        frame.extend_from_slice(&piece);
        // The server may close while the rest is still on its way.
        if s.write_all(&frame).is_err() {
            break;
        }
        sent += 1;
    }
    assert!(sent >= 16, "the server closed after {sent} fragments");
    assert_eq!(close_code(&mut s), 1009);
    let server = Server::start_with(&["--ws-max-message", "1048576"]);
    let mut s = upgraded(server.port);
    let mut frame = frame_head(true, 2, (1 << 20) + 1);
    frame.extend_from_slice(&vec![0; (1 << 20) + 1]);
    let _ = s.write_all(&frame);
    assert_eq!(close_code(&mut s), 1009);
}

/// The bytes the server's workers hold in WebSocket messages being assembled (`/metrics`).
fn assembling(server: &Server) -> u64 {
    let m = common::fetch(server.addr(), "GET", "/metrics", "");
    common::metric(m.text(), "canter_ws_assembling_bytes")
}

/// Messages still being assembled on one worker hold at most `--ws-worker-budget` bytes at
/// once: a message that would go past it closes its connection with 1013 (try again later),
/// while the messages within it go on and are echoed whole.
#[test]
fn messages_being_assembled_share_a_bounded_budget_per_worker() {
    use std::io::{Read, Write};
    let server = Server::start_with(&[
        "--workers",
        "1",
        "--ws-worker-budget",
        "4194304",
        "--metrics",
    ]);
    const FRAME: usize = 2 << 20;
    const PART: usize = 1536 << 10;
    let body = vec![b'q'; FRAME];
    // Two connections each hold 1.5 MiB of a 2 MiB frame: 3 MiB of the 4 MiB budget.
    let mut held: Vec<_> = (0..2)
        .map(|_| {
            let mut s = upgraded(server.port);
            let mut f = frame_head(true, 2, FRAME);
            f.extend_from_slice(&body[..PART]);
            s.write_all(&f).unwrap();
            s
        })
        .collect();
    // Wait until the server has read them: the worker holds both parts (its gauge in
    // `/metrics`). An echo on another connection is no proof: the reads of the two parts may
    // still be going on, a budget's worth per turn.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let held = assembling(&server);
        // Each part's frame head is held with it.
        if held >= 2 * PART as u64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server holds {held} bytes of the two parts after 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // A third large message would take the worker past its budget: refused with 1013.
    let mut late = upgraded(server.port);
    let mut f = frame_head(true, 2, FRAME);
    f.extend_from_slice(&body[..PART]);
    let _ = late.write_all(&f);
    assert_eq!(close_code(&mut late), 1013);
    // The two within the budget complete and are echoed whole.
    for s in &mut held {
        s.write_all(&body[PART..]).unwrap();
        let mut head = [0u8; 10];
        s.read_exact(&mut head).unwrap();
        assert_eq!(head[..2], [0x82, 127]);
        assert_eq!(
            u64::from_be_bytes(head[2..].try_into().unwrap()),
            FRAME as u64
        );
        let mut echoed = vec![0u8; FRAME];
        s.read_exact(&mut echoed).unwrap();
        assert!(echoed == body);
    }
    // Their share is given back (the refused one's too): a new large message fits again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while assembling(&server) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server still holds {} bytes after 60 s",
            assembling(&server)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut again = upgraded(server.port);
    let mut f = frame_head(true, 2, FRAME);
    f.extend_from_slice(&body);
    again.write_all(&f).unwrap();
    let mut head = [0u8; 10];
    again.read_exact(&mut head).unwrap();
    assert_eq!(head[..2], [0x82, 127]);
}

/// Big messages' buffers go back to the system once they are done with: after four 16 MiB
/// echoes the server's resident memory returns to near where it was (it stayed at the peak
/// of the largest messages: 124 MiB from 10).
#[test]
fn memory_of_big_messages_is_given_back() {
    use std::io::{Read, Write};
    let server = Server::start_with(&["--workers", "1"]);
    // Settled: one small echo first, so that the buffers any connection needs exist.
    let mut s = upgraded(server.port);
    let mut f = frame_head(true, 1, 2);
    f.extend_from_slice(b"hi");
    s.write_all(&f).unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).unwrap();
    drop(s);
    let before = server.rss_kib();
    let body = vec![b'm'; 16 << 20];
    for _ in 0..4 {
        let mut s = upgraded(server.port);
        let mut f = frame_head(true, 2, body.len());
        f.extend_from_slice(&body);
        s.write_all(&f).unwrap();
        let mut echoed = vec![0u8; body.len() + 10];
        s.read_exact(&mut echoed).unwrap();
        s.write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8]).unwrap();
        assert_eq!(close_code(&mut s), 1000);
    }
    // Wait for what the connections held to be freed (an event: the resident size falls).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut after = server.rss_kib();
    while after > before + 12 * 1024 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = server.rss_kib();
    }
    assert!(
        after <= before + 12 * 1024,
        "resident memory {before} KiB before four 16 MiB echoes, {after} KiB after"
    );
}
