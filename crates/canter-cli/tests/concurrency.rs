//! Many concurrent keep-alive connections.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use canter_testkit::open_files_limit;
use common::{echo_request, Client, Server};

const CONNECTIONS: usize = 1000;
const THREADS: usize = 8;
const ROUNDS: usize = 3;

#[test]
fn thousand_concurrent_keep_alive_connections() {
    // The test process holds 1000 sockets, the server (which raises its own limit) another
    // 1000; raise ours to the hard limit, and fail rather than skip if that is too low.
    let _ = canter::rt::raise_open_files_limit();
    let limit = open_files_limit();
    assert!(
        limit.is_some_and(|n| n >= 2 * CONNECTIONS as u64 + 100),
        "open files limit {limit:?} is too low for {CONNECTIONS} connections (raise ulimit -n)"
    );
    let server = Server::start();
    let addr = server.addr();
    let per_thread = CONNECTIONS / THREADS;
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                let mut conns: Vec<Client> =
                    (0..per_thread).map(|_| Client::connect(addr)).collect();
                // All 1000 connections are open before any request is sent.
                barrier.wait();
                let mut ok = 0;
                for round in 0..ROUNDS {
                    for (i, c) in conns.iter_mut().enumerate() {
                        match round {
                            0 => c.send("GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n"),
                            1 => c.send("GET /json HTTP/1.1\r\nHost: x\r\n\r\n"),
                            _ => c.send(echo_request(format!("t{t} c{i}").as_bytes())),
                        }
                    }
                    for (i, c) in conns.iter_mut().enumerate() {
                        let r = c.response();
                        assert_eq!(r.status, 200, "thread {t} conn {i} round {round}");
                        assert!(!r.closes());
                        let want = match round {
                            0 => "Hello, World!".to_owned(),
                            1 => r#"{"message":"Hello, World!"}"#.to_owned(),
                            _ => format!("t{t} c{i}"),
                        };
                        assert_eq!(r.text(), want, "thread {t} conn {i} round {round}");
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, CONNECTIONS * ROUNDS);
}
