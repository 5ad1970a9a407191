//! The server against Python's http.client (tests/py/client.py); skipped without python3.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::Server;

#[test]
fn python_http_client() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/client.py");
    let server = Server::start();
    let mut child = match Command::new("python3")
        .arg(script)
        .arg(server.port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("skipping: cannot run python3: {e}");
            return;
        }
    };
    // Bound the run: kill the client if it hangs.
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client.py failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log()
    );
    for check in [
        "ok keep-alive 50 requests on one connection",
        "ok POST /echo",
        "ok chunked upload",
        "ok HEAD",
        "ok 404 and 405",
        "ok response headers",
        "ALL OK",
    ] {
        assert!(
            stdout.lines().any(|l| l == check),
            "missing {check:?} in:\n{stdout}"
        );
    }
}
