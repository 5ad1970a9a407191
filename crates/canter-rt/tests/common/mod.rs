//! Shared helpers for the runtime's integration tests: run a [`canter_rt::Server`] in a
//! background thread on 127.0.0.1:0, and talk raw HTTP/1.1 to it with the strict client of
//! `canter-testkit` (re-exported here).
//!
//! Every socket operation has a timeout so a hung server fails a test instead of hanging the
//! suite.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

pub mod ws_client;

use canter_rt::{
    Config, ConfigBuilder, ParkHooks, Server, Service, ShutdownHandle, Stats, Timeouts,
    TimeoutsBuilder,
};
// Not every test binary uses every re-export.
#[allow(unused_imports)]
pub use canter_testkit::{chunked, Client, Response, IO_TIMEOUT};

/// A server running `serve()` on a background thread; shut down (and joined with a timeout)
/// by [`TestServer::stop`] or on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The TLS listener's address, if the config has one.
    #[allow(dead_code)]
    pub tls_addr: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    pub handle: ShutdownHandle,
    done: Option<mpsc::Receiver<io::Result<()>>>,
}

/// A config for tests: 127.0.0.1:0, one worker, short timeouts.
pub fn test_config() -> Config {
    test_builder().build().expect("valid config")
}

/// The settings of [`test_config`], to change some of them.
#[allow(dead_code)]
pub fn test_builder() -> ConfigBuilder {
    Config::builder()
        .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
        .workers(1)
        .handler_timeout(Duration::from_secs(5))
        .drain_timeout(Duration::from_secs(3))
        .backlog(1024)
        .timeouts(test_timeouts().build().expect("valid timeouts"))
}

/// The timeouts of [`test_config`], to change some of them.
pub fn test_timeouts() -> TimeoutsBuilder {
    Timeouts::builder()
        .idle(Duration::from_secs(10))
        .head(Duration::from_secs(5))
        .body(Duration::from_secs(5))
        .write(Duration::from_secs(5))
}

impl TestServer {
    /// Binds `config` and serves `factory(worker)` on a background thread.
    pub fn start<S, F>(config: Config, factory: F) -> TestServer
    where
        S: Service,
        F: Fn(usize) -> S + Send + Sync + 'static,
    {
        let server = Server::bind(config).expect("bind");
        let addr = server.local_addr();
        let tls_addr = server.tls_local_addr();
        let stats = server.stats();
        let handle = server.shutdown_handle();
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("test-server".into())
            .spawn(move || {
                let _ = tx.send(server.serve(factory));
            })
            .unwrap();
        TestServer {
            addr,
            tls_addr,
            stats,
            handle,
            done: Some(rx),
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Polls until no connection is open; returns how long it took, or panics after `timeout`.
    pub fn wait_idle(&self, timeout: Duration, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            let open = self.stats.open_connections();
            if open == 0 {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{what}: {open} connection(s) still open after {timeout:?} (accepted {})",
                self.stats.accepted()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Polls until `accepted()` reaches `n` (or panics after `timeout`).
    pub fn wait_accepted(&self, n: u64, timeout: Duration) {
        let start = Instant::now();
        while self.stats.accepted() < n {
            assert!(
                start.elapsed() < timeout,
                "accepted {} < {n} after {timeout:?}",
                self.stats.accepted()
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Starts the graceful shutdown without waiting.
    pub fn begin_shutdown(&self) {
        self.handle.shutdown();
    }

    /// Shuts down and waits up to `timeout` for `serve()` to return; returns its result and how
    /// long the wait took.
    pub fn stop_within(&mut self, timeout: Duration) -> (io::Result<()>, Duration) {
        let start = Instant::now();
        self.handle.shutdown();
        let rx = self.done.take().expect("server already stopped");
        match rx.recv_timeout(timeout) {
            Ok(result) => (result, start.elapsed()),
            Err(_) => panic!("serve() did not return within {timeout:?} of shutdown"),
        }
    }

    /// Shuts down, asserting `serve()` returns Ok within 5 s.
    pub fn stop(mut self) {
        let (result, _) = self.stop_within(Duration::from_secs(5));
        result.expect("serve() failed");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(rx) = self.done.take() {
            // Bounded: a stuck server must not hang the suite (the thread is then leaked).
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }
}

/// Reads the whole request body and answers its length, or the body error with its status
/// (413, 408, 400).
pub fn sum_body(mut req: canter_rt::Request) -> canter_rt::Reply {
    canter_rt::Reply::future(async move {
        let body = req.body_mut();
        let mut total = 0usize;
        while let Some(chunk) = body.chunk().await {
            match chunk {
                Ok(data) => total += data.len(),
                Err(e) => {
                    let status = canter_rt::http::StatusCode::from_u16(e.status())
                        .unwrap_or(canter_rt::http::StatusCode::BAD_REQUEST);
                    return canter_rt::Response::text(format!("body error: {e}\n"))
                        .with_status(status);
                }
            }
        }
        canter_rt::Response::text(total.to_string())
    })
}

/// Park hooks that count the worker's parks and wake-ups: the hooks, then the two counts.
pub fn counting_park_hooks() -> (ParkHooks, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let parked = Arc::new(AtomicUsize::new(0));
    let unparked = Arc::new(AtomicUsize::new(0));
    let (p, u) = (parked.clone(), unparked.clone());
    let hooks = ParkHooks {
        before_park: Arc::new(move || {
            p.fetch_add(1, Ordering::SeqCst);
        }),
        after_unpark: Arc::new(move || {
            u.fetch_add(1, Ordering::SeqCst);
        }),
    };
    (hooks, parked, unparked)
}
