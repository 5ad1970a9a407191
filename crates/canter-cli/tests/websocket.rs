//! The demo's WebSocket route (`/ws/echo`) and its live page (`/ws`) against the clients of
//! the runtimes users run: Node's built-in WebSocket client and headless Chromium. (Python's
//! `websockets` and `wsproto` are in the Python package's suite, python/tests/test_websocket.py.)

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::Command;

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
    let browser = common::chromium();
    let server = Server::start();
    let profile = std::env::temp_dir().join(format!("canter-chromium-ws-{}", std::process::id()));
    let dom = Command::new(&browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=5000", "--dump-dom"])
        .arg(server.url("/ws"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success(), "{dom:?}");
    // Chromium offers permessage-deflate; the echo came back through it.
    assert!(html.contains("open: permessage-deflate"), "{html}");
    assert!(html.contains("<li>hello from Mozilla/5.0 ("), "{html}");
}
