//! Several servers on one set of worker threads: `Server::into_workers` and `spawn_worker`, as
//! the stream pipelines use them (a server per source, all on the pipeline's workers).

#![allow(clippy::unwrap_used, missing_docs)]

use std::io::Write;
use std::net::TcpStream;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use canter_rt::proto::{Conn, Protocol};
use canter_rt::{Config, Server};
use canter_testkit::read_some;

/// Answers every chunk with the tag of its server and the worker thread's name.
struct Tagged {
    tag: &'static str,
}

impl Protocol for Tagged {
    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        let thread = std::thread::current();
        let line = format!("{} {}\n", self.tag, thread.name().unwrap_or("?"));
        input.clear();
        let _ = conn.send(line.into_bytes());
    }
}

fn ask(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"?").unwrap();
    let mut buf = [0u8; 256];
    let n = read_some(&mut s, &mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn two_servers_share_the_workers_and_stop_with_their_handles() {
    let config = |workers| {
        Config::builder()
            .addr("127.0.0.1:0".parse().unwrap())
            .workers(workers)
            .drain_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (a, b) = (
        Server::bind(config(2)).unwrap(),
        Server::bind(config(2)).unwrap(),
    );
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    let stops = [a.shutdown_handle(), b.shutdown_handle()];
    let mut b_workers = b.into_workers().into_iter();
    let threads: Vec<_> = a
        .into_workers()
        .into_iter()
        .map(|a_worker| {
            let b_worker = b_workers.next().unwrap();
            let i = a_worker.index();
            assert_eq!(i, b_worker.index());
            canter_rt::spawn_worker(i, &config(2), format!("shared-{i}"), move || async move {
                // Something only this thread holds, as a pipeline's state is.
                let local = Rc::new(());
                let (x, y) = (local.clone(), local);
                let a = a_worker.serve_protocol(None, move |_| {
                    let _ = &x;
                    Tagged { tag: "a" }
                });
                let b = b_worker.serve_protocol(None, move |_| {
                    let _ = &y;
                    Tagged { tag: "b" }
                });
                let (ra, rb) = tokio::join!(a, b);
                ra.and(rb)
            })
            .unwrap()
        })
        .collect();
    for _ in 0..8 {
        let (x, y) = (ask(a_addr), ask(b_addr));
        assert!(x.starts_with("a shared-"), "{x}");
        assert!(y.starts_with("b shared-"), "{y}");
    }
    // The workers end once both servers are stopped, not before.
    stops[0].shutdown();
    std::thread::sleep(Duration::from_millis(200));
    assert!(threads.iter().all(|t| !t.is_finished()));
    assert!(ask(b_addr).starts_with("b shared-"));
    stops[1].shutdown();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    assert!(TcpStream::connect(a_addr).is_err() || ask_fails(a_addr));
}

/// A connection to a stopped server is refused, or closed without an answer.
fn ask_fails(addr: std::net::SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return true;
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(b"?");
    let mut buf = [0u8; 16];
    matches!(read_some(&mut s, &mut buf), Ok(0) | Err(_))
}
