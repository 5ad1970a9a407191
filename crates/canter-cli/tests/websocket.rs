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
