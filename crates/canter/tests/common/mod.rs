//! Shared helpers for the integration tests: start the `canter serve` binary on a free port and
//! talk raw HTTP/1.1 to it with the strict client of `canter-testkit` (re-exported here).
//!
//! Every socket read has a timeout ([`IO_TIMEOUT`]) so a hung server fails a test instead of
//! hanging the suite.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// Not every test binary uses every re-export.
#[allow(unused_imports)]
pub use canter_testkit::{Client, Response, IO_TIMEOUT};

/// A running `canter serve` child process; killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
    pub pid: u32,
    log: Arc<Mutex<Vec<String>>>,
    exited: Option<ExitStatus>,
}

impl Server {
    /// `canter serve --addr 127.0.0.1:0 --workers 2`.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Like [`Server::start`] with extra `serve` flags (e.g. `["--head-timeout", "1"]`); if they
    /// include `--workers`, that count replaces the default of 2.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_logging(extra, "info")
    }

    /// Like [`Server::start_with`] with `RUST_LOG` set to `filter` (the address line the port is
    /// read from is logged at info level by target `canter`, so `filter` must keep it).
    pub fn start_logging(extra: &[&str], filter: &str) -> Server {
        let workers: &[&str] = if extra.contains(&"--workers") {
            &[]
        } else {
            &["--workers", "2"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(workers)
            .args(extra)
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn canter serve");
        let pid = child.id();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            thread::spawn(move || {
                // Keep draining so the pipe never fills; report the port once.
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(port) = parse_port(&line) {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(port);
                        }
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let port = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not report its address; stderr:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Server {
            child,
            port,
            pid,
            log,
            exited: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A raw client connected to the server.
    pub fn client(&self) -> Client {
        Client::connect(self.addr())
    }

    /// The server's resident set size in KiB (from /proc/<pid>/status).
    pub fn rss_kib(&self) -> u64 {
        canter_testkit::rss_kib(self.pid)
    }

    /// Sends a signal with `kill -<sig> <pid>`.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} {} failed", self.pid);
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(status);
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Panics (with the server's stderr) if the process has exited.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            self.exited = Some(status);
            panic!("server exited: {status}; stderr:\n{}", self.log());
        }
    }

    /// The server's stderr so far (for failure messages).
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn parse_port(line: &str) -> Option<u16> {
    let rest = line
        .split("serving the demo app on http://127.0.0.1:")
        .nth(1)?;
    rest.split('/').next()?.parse().ok()
}

/// Headers every canter response carries: `Server: canter` and a 29-byte IMF-fixdate.
pub fn assert_standard_headers(r: &Response) {
    assert_eq!(r.header("server"), Some("canter"), "Server header: {r:?}");
    assert_eq!(r.count("date"), 1, "one Date header: {r:?}");
    assert_imf_fixdate(r.header("date").unwrap());
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn assert_imf_fixdate(d: &str) {
    let b = d.as_bytes();
    assert_eq!(b.len(), 29, "Date is 29 bytes: {d:?}");
    assert!(d.ends_with(" GMT"), "Date ends in GMT: {d:?}");
    let days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    assert!(days.contains(&&d[..3]), "day name: {d:?}");
    assert_eq!(&d[3..5], ", ", "{d:?}");
    assert!(d[5..7].bytes().all(|c| c.is_ascii_digit()), "{d:?}");
    assert_eq!(b[7], b' ', "{d:?}");
    assert!(months.contains(&&d[8..11]), "month name: {d:?}");
    assert_eq!(b[11], b' ', "{d:?}");
    assert!(d[12..16].bytes().all(|c| c.is_ascii_digit()), "{d:?}");
    assert_eq!(b[16], b' ', "{d:?}");
    for (i, &c) in b[17..25].iter().enumerate() {
        if i == 2 || i == 5 {
            assert_eq!(c, b':', "{d:?}");
        } else {
            assert!(c.is_ascii_digit(), "{d:?}");
        }
    }
}

/// `n` pseudo-random bytes (xorshift; deterministic for a seed).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A POST /echo request with a Content-Length body.
pub fn echo_request(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}
