//! State and blocking work over real sockets: a per-worker value (`Rc<Cell<_>>`, no locks) and a
//! global one (`Arc<AtomicU64>`) seen by handlers, and `spawn_blocking` keeping the worker's
//! event loop free.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use canter::rt::spawn_blocking;
use canter::{get, Router, State};
use common::{Client, InProcess};

/// `app` on `workers` workers; the server lives until the test process exits.
fn start(workers: usize, app: impl Fn(usize) -> Router + Send + Sync + 'static) -> SocketAddr {
    InProcess::start_with(InProcess::config(workers).build().unwrap(), app).detach()
}

#[test]
fn per_worker_and_global_state() {
    let global = Arc::new(AtomicU64::new(0));
    let g = global.clone();
    let addr = start(2, move |worker| {
        Router::new()
            .route(
                "/count",
                get(
                    |State(local): State<Rc<Cell<u64>>>,
                     State(global): State<Arc<AtomicU64>>,
                     State(worker): State<usize>| {
                        local.set(local.get() + 1);
                        let all = global.fetch_add(1, Ordering::Relaxed) + 1;
                        format!("{worker} {} {all}", local.get())
                    },
                ),
            )
            .with_state(Rc::new(Cell::new(0u64)))
            .with_state(g.clone())
            .with_state(worker)
    });
    // Many connections: the kernel spreads them over both workers.
    let mut per_worker = [0u64; 2];
    for _ in 0..40 {
        let mut c = Client::connect(addr);
        let r = c.get("/count");
        let text = r.text().to_owned();
        let mut it = text.split(' ').map(|v| v.parse::<u64>().unwrap());
        let (w, local) = (it.next().unwrap() as usize, it.next().unwrap());
        // Each worker's counter counts only its own requests, in order.
        assert_eq!(local, per_worker[w] + 1, "{text}");
        per_worker[w] = local;
    }
    assert_eq!(per_worker.iter().sum::<u64>(), 40);
    // SO_REUSEPORT hashes connections over the workers: both served some (2^-39 to fail).
    assert!(per_worker.iter().all(|&n| n > 0), "{per_worker:?}");
    assert_eq!(global.load(Ordering::Relaxed), 40);
}

#[test]
fn blocking_work_does_not_stall_the_worker() {
    let addr = start(1, |_| {
        Router::new()
            .route(
                "/blocking",
                get(|| async {
                    spawn_blocking(|| {
                        thread::sleep(Duration::from_millis(700));
                        "done"
                    })
                    .await
                    .unwrap_or("failed")
                }),
            )
            .route("/fast", get(|| "fast"))
    });
    let slow = thread::spawn(move || {
        let mut c = Client::connect(addr);
        let t = Instant::now();
        let r = c.get("/blocking");
        (r.text().to_owned(), t.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    // One worker, and it answers other connections while the blocking job runs.
    let t = Instant::now();
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/fast").text(), "fast");
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    let (text, took) = slow.join().unwrap();
    assert_eq!(text, "done");
    assert!(took >= Duration::from_millis(700), "{took:?}");
}
