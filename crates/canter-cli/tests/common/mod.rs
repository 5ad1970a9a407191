//! Shared helpers for the integration tests, one copy each:
//!
//! - [`Server`]: the `canter serve` binary on a free port, killed on drop;
//! - [`InProcess`]: any [`canter::rt::Service`] served on a free port inside the test process,
//!   shut down and joined on drop;
//! - [`Client`] and [`Response`]: the strict raw HTTP/1.1 client of `canter-testkit`
//!   (re-exported), with [`fetch`] and [`fetch_raw`] for one request on a new connection;
//! - external clients: [`have`] and [`curl`] (and its variants), [`run_python`] and the
//!   http.client scripts in `tests/py/` ([`run_py_checks`]);
//! - [`TempFile`], removed on drop.
//!
//! Every socket read has a timeout ([`IO_TIMEOUT`]) and every external client a time limit, so
//! a hung server fails a test instead of hanging the suite.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use canter::rt::{Config, ConfigBuilder, ShutdownHandle};

pub mod kafka;
pub mod market_spread;
mod postgres;
#[allow(unused_imports)]
pub use postgres::Postgres;

// Not every test binary uses every re-export.
#[allow(unused_imports)]
pub use canter_testkit::{random_bytes, Client, Response, IO_TIMEOUT};

/// `canter receive ARGS` on a free port with a JSON report (its stdout, piped), and the address
/// it listens on (from its log, whose lines are echoed to the test's output).
pub fn receive(args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "receive",
            "--listen",
            "127.0.0.1:0",
            "--json",
            "--interval",
            "0s",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.split("listening on ").nth(1) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>().unwrap());
                }
            }
            eprintln!("receive: {line}");
        }
    });
    (child, rx.recv_timeout(Duration::from_secs(10)).unwrap())
}

/// Runs `canter ARGS` expecting it to exit by itself within 10 s (a refused start): its status
/// and what it wrote to stderr. Killed, and the test failed, if it is still running then.
pub fn canter_exits(args: &[&std::ffi::OsStr]) -> (ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = read_all(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("canter {args:?} did not exit");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let err = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
    (status, err)
}

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

    /// The TLS listener's port (`--tls-addr 127.0.0.1:0`), read from the log line that comes
    /// before the plain address line.
    pub fn tls_port(&self) -> u16 {
        let log = self.log.lock().unwrap();
        log.iter()
            .find_map(|line| {
                let rest = line.split("over TLS on https://127.0.0.1:").nth(1)?;
                rest.split('/').next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no TLS address in the log:\n{}", log.join("\n")))
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
    let rest = line.split(" app on http://127.0.0.1:").nth(1)?;
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

// ---- in-process servers ----------------------------------------------------------------------

/// A [`canter::rt::Server`] running `app` on 127.0.0.1 (a free port) in this process; shut down
/// gracefully and joined when dropped (or by [`InProcess::stop`]), unless [`detached`].
///
/// [`detached`]: InProcess::detach
pub struct InProcess {
    pub addr: SocketAddr,
    handle: ShutdownHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl InProcess {
    /// The configuration [`InProcess::start`] uses: 127.0.0.1:0 and `workers` workers, the
    /// defaults otherwise (e.g. a 10 s `drain_timeout`). Start from it to change more.
    pub fn config(workers: usize) -> ConfigBuilder {
        Config::builder()
            .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .workers(workers)
    }

    /// Serves `app` (called once per worker with its index) with one worker.
    pub fn start<S: canter::rt::Service>(
        app: impl Fn(usize) -> S + Send + Sync + 'static,
    ) -> InProcess {
        InProcess::start_with(InProcess::config(1).build().unwrap(), app)
    }

    /// Serves `app` with `config` (bind it to port 0: start from [`InProcess::config`]).
    pub fn start_with<S: canter::rt::Service>(
        config: Config,
        app: impl Fn(usize) -> S + Send + Sync + 'static,
    ) -> InProcess {
        let server = canter::rt::Server::bind(config).unwrap();
        let (addr, handle) = (server.local_addr(), server.shutdown_handle());
        let thread = thread::spawn(move || server.serve(app).unwrap());
        InProcess {
            addr,
            handle,
            thread: Some(thread),
        }
    }

    /// Leaves the server running until the test process exits; its address.
    pub fn detach(mut self) -> SocketAddr {
        // Dropping the join handle detaches the thread; `drop` then has nothing to stop.
        self.thread = None;
        self.addr
    }

    /// Shuts the server down and joins it, panicking if serving failed (where dropping only
    /// waits).
    pub fn stop(mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// A raw client connected to the server.
    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// One request with `Connection: close` on a new connection: `headers`, then a
    /// `Content-Length` for `body` unless `headers` has a `Transfer-Encoding` (then `body` must
    /// be framed already, e.g. with [`canter_testkit::chunked`]); the response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut c = self.client();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
        {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        c.send(req);
        c.send(body);
        c.response()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = t.join();
        }
    }
}

// ---- one request on a new connection ---------------------------------------------------------

/// Sends the raw request `raw` on a new connection and reads one response to it (a non-HEAD
/// request).
pub fn fetch_raw(addr: SocketAddr, raw: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(raw);
    c.response()
}

/// `method path` with the raw header lines `headers` (each ending in CRLF) after `Host: x`, on
/// a new connection; the response (without a body for HEAD).
pub fn fetch(addr: SocketAddr, method: &str, path: &str, headers: &str) -> Response {
    let mut c = Client::connect(addr);
    c.send(format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n"
    ));
    c.response_to(method == "HEAD")
}

/// The value of metric `name` (with its labels, if any) in a `/metrics` page; panics naming it
/// if the page has none.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

// ---- external clients ------------------------------------------------------------------------

/// Fails the test when `tool` cannot run: a test that skips silently proves nothing. A tool
/// missing from a fresh machine is installed first from its Debian package (see
/// [`apt_install`]); curl, python3 and openssl are on every machine the suite runs on.
pub fn need(tool: &str) {
    // HAProxy prints its version for `-v` only (`--version` exits with an error).
    let flag = if tool == "haproxy" { "-v" } else { "--version" };
    let runs = || {
        Command::new(tool)
            .arg(flag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !runs() {
        if let Some(package) = debian_package(tool) {
            apt_install(package);
        }
    }
    assert!(
        runs(),
        "{tool} is needed by this test and could not run (apt-get install {})",
        debian_package(tool).unwrap_or(tool)
    );
}

/// The Debian package that provides `tool`, for the tools the suite installs itself.
fn debian_package(tool: &str) -> Option<&'static str> {
    match tool {
        "h2load" => Some("nghttp2-client"),
        "curl" => Some("curl"),
        "haproxy" => Some("haproxy"),
        _ => None,
    }
}

/// Installs `package` with apt-get (the suite runs as root on its machines), one test at a time
/// (apt holds a lock of its own and fails a second caller instead of waiting): the package lists
/// are refreshed when the first try fails. Failures are left to the caller's check.
pub fn apt_install(package: &str) {
    let script = format!(
        "export DEBIAN_FRONTEND=noninteractive; \
         apt-get install -y -q {package} >/dev/null 2>&1 || \
         {{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q {package} >/dev/null 2>&1; }}"
    );
    let status = Command::new("flock")
        .args(["/tmp/canter-tests-apt.lock", "sh", "-c", &script])
        .status();
    eprintln!("apt-get install {package}: {status:?}");
}

/// The overall time limit (`--max-time`, seconds) of every curl run.
pub const CURL_MAX_TIME: &str = "20";

/// Runs `curl --max-time 20 --fail -s ARGS` (stdin empty); asserts it succeeded, so an HTTP
/// status of 400 or more fails the test.
pub fn curl(args: &[&str]) -> Output {
    run_curl(&["--fail", "-s"], args, None)
}

/// Like [`curl`] with `stdin` written to curl's standard input (e.g. for `-T -`).
pub fn curl_with_stdin(args: &[&str], stdin: Vec<u8>) -> Output {
    run_curl(&["--fail", "-s"], args, Some(stdin))
}

/// Runs `curl --max-time 20 -s -S ARGS` (no `--fail`: an error status is a success, its body on
/// stdout); asserts curl itself succeeded.
pub fn curl_any_status(args: &[&str]) -> Output {
    run_curl(&["-s", "-S"], args, None)
}

fn run_curl(flags: &[&str], args: &[&str], stdin: Option<Vec<u8>>) -> Output {
    let out = run(
        Command::new("curl")
            .args(["--max-time", CURL_MAX_TIME])
            .args(flags)
            .args(args),
        stdin,
        None,
    )
    .expect("run curl");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How long a Python client may run before it is killed.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `python3 ARGS` with `stdin` written to its standard input (empty if `None`), killed if
/// it runs longer than [`PYTHON_TIMEOUT`] (the output then shows it was killed). Fails the test
/// when python3 cannot be started. Writes no bytecode next to the scripts.
pub fn run_python(args: &[&str], stdin: Option<Vec<u8>>) -> Output {
    run_python_within(args, stdin, PYTHON_TIMEOUT)
}

/// [`run_python`] for a script of many steps, killed after `limit` instead.
pub fn run_python_within(args: &[&str], stdin: Option<Vec<u8>>, limit: Duration) -> Output {
    let mut cmd = Command::new("python3");
    cmd.args(args).env("PYTHONDONTWRITEBYTECODE", "1");
    match run(&mut cmd, stdin, Some(limit)) {
        Ok(out) => out,
        Err(e) => panic!("python3 is needed by this test and could not run: {e}"),
    }
}

/// Runs the http.client script `tests/py/<name>` against 127.0.0.1:`port` (the protocol is in
/// `tests/py/common.py`) and asserts that it exited successfully and printed each line of
/// `checks`; `context()` (e.g. the server's log) ends the failure message.
pub fn run_py_checks(name: &str, port: u16, checks: &[&str], context: impl FnOnce() -> String) {
    let script = format!("{}/tests/py/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = run_python(&[&script, &port.to_string()], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{stderr}{}",
        out.status,
        context()
    );
    for check in checks {
        assert!(
            stdout.lines().any(|l| l == *check),
            "missing {check:?} in:\n{stdout}"
        );
    }
}

/// Runs `cmd` with `stdin` written from a thread (empty if `None`) and stdout and stderr read
/// from threads, so no pipe can fill up and stall it; kills it after `limit`, if any.
fn run(
    cmd: &mut Command,
    stdin: Option<Vec<u8>>,
    limit: Option<Duration>,
) -> std::io::Result<Output> {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let writer = stdin.map(|data| {
        let mut pipe = child.stdin.take().unwrap();
        thread::spawn(move || pipe.write_all(&data))
    });
    let stdout = read_all(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    let status = match limit {
        None => child.wait()?,
        Some(limit) => {
            let start = Instant::now();
            loop {
                if let Some(status) = child.try_wait()? {
                    break status;
                }
                if start.elapsed() > limit {
                    let _ = child.kill();
                    break child.wait()?;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    };
    if let Some(w) = writer {
        let written = w.join().unwrap();
        // A child that failed may have stopped reading; its output says more than the EPIPE.
        if status.success() {
            written.expect("write the child's stdin");
        }
    }
    Ok(Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    })
}

fn read_all(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut out = Vec::new();
        let _ = pipe.read_to_end(&mut out);
        out
    })
}

// ---- files -----------------------------------------------------------------------------------

/// A file in the temporary directory, named after the test process and `name`; removed on
/// drop.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn new(name: &str, data: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("canter-test-{}-{name}", std::process::id()));
        std::fs::write(&path, data).unwrap();
        TempFile(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Chromium from Debian's package, installed when missing; the test fails when it cannot be.
pub fn chromium() -> std::path::PathBuf {
    let find = || {
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return p;
    }
    apt_install("chromium");
    find().expect(
        "Chromium is needed by this test and could not be installed (apt-get install chromium)",
    )
}

/// `url` rendered by headless Chromium, scripts run for `budget_ms` of virtual time: the process
/// output and the DOM it dumped.
pub fn chromium_dom(url: &str, budget_ms: u32) -> (std::process::Output, String) {
    chromium_dom_with(url, budget_ms, &[])
}

/// [`chromium_dom`] with more of Chromium's flags.
pub fn chromium_dom_with(
    url: &str,
    budget_ms: u32,
    flags: &[String],
) -> (std::process::Output, String) {
    let profile = std::env::temp_dir().join(format!(
        "canter-chromium-{}-{}",
        std::process::id(),
        budget_ms
    ));
    let result = chromium_dom_in(url, budget_ms, flags, &profile);
    let _ = std::fs::remove_dir_all(&profile);
    result
}

/// [`chromium_dom_with`] in the profile directory `profile`, which is kept (what Chromium
/// learned, such as alternative services, is in its files).
pub fn chromium_dom_in(
    url: &str,
    budget_ms: u32,
    flags: &[String],
    profile: &std::path::Path,
) -> (std::process::Output, String) {
    let out = Command::new(chromium())
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
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(flags)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("running Chromium");
    let html = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, html)
}
