//! The worker's set of plain TCP connections (`core::tcp_loop`): its connections are woken by
//! the set's own events, by tokio's timers on the worker, and from other threads; a worker with
//! more connections ready than the set polls in one turn answers them all.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use canter_rt::{Reply, Request, Response};

use common::{test_config, Client, TestServer};

/// `/thread/N`: answered by a thread outside the worker (its sender goes to `ANSWERERS`).
/// `/timer`: answered after a tokio timer on the worker. Else: the path, at once.
fn app(req: Request) -> Reply {
    let path = req.path().to_owned();
    if let Some(n) = path.strip_prefix("/thread/") {
        let n = n.to_owned();
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        ANSWERERS
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .send(tx)
            .unwrap();
        return Reply::future(async move {
            match rx.await {
                Ok(text) => Response::text(format!("{n} {text}")),
                Err(_) => Response::text("dropped"),
            }
        });
    }
    if path == "/timer" {
        return Reply::future(async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Response::text("timer")
        });
    }
    Response::text(path).into()
}

/// Where handlers of `/thread/N` send the sender their answer comes through.
static ANSWERERS: Mutex<Option<mpsc::Sender<tokio::sync::oneshot::Sender<String>>>> =
    Mutex::new(None);

#[test]
fn connections_woken_from_another_thread_and_by_timers_are_answered() {
    let (tx, rx) = mpsc::channel::<tokio::sync::oneshot::Sender<String>>();
    *ANSWERERS.lock().unwrap() = Some(tx);
    // Answers every handler from this thread, which is not the worker: the wake-up crosses.
    let answerer = thread::spawn(move || {
        let mut answered = 0;
        while let Ok(reply) = rx.recv_timeout(Duration::from_secs(30)) {
            let _ = reply.send("from a thread".to_owned());
            answered += 1;
        }
        answered
    });
    let server = TestServer::start(test_config(), |_| app);
    let mut clients: Vec<Client> = (0..4).map(|_| server.client()).collect();
    for round in 0..25 {
        for (i, c) in clients.iter_mut().enumerate() {
            let r = c.get(&format!("/thread/{i}-{round}"));
            assert_eq!(r.status, 200);
            assert_eq!(r.text(), format!("{i}-{round} from a thread"));
            let r = c.get("/timer");
            assert_eq!(r.status, 200);
            assert_eq!(r.text(), "timer");
        }
    }
    drop(clients);
    server.stop();
    *ANSWERERS.lock().unwrap() = None;
    assert_eq!(answerer.join().unwrap(), 100);
}

#[test]
fn more_connections_than_one_turn_are_all_answered() {
    // More than the set polls in one turn (256), each with two pipelined requests sent before
    // any answer is read.
    const CONNS: usize = 300;
    let server = TestServer::start(test_config(), |_| app);
    let mut clients: Vec<Client> = (0..CONNS).map(|_| server.client()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(format!(
            "GET /a{i} HTTP/1.1\r\nHost: x\r\n\r\nGET /b{i} HTTP/1.1\r\nHost: x\r\n\r\n"
        ));
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let a = c.response();
        let b = c.response();
        assert_eq!((a.status, a.text()), (200, format!("/a{i}").as_str()));
        assert_eq!((b.status, b.text()), (200, format!("/b{i}").as_str()));
    }
    drop(clients);
    server.wait_idle(Duration::from_secs(30), "after the clients left");
    server.stop();
}
