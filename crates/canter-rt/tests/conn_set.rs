//! The worker's set of TCP connections (`core::tcp_loop`), plain and TLS: its connections are
//! woken by the set's own events, by tokio's timers on the worker, and from other threads; a
//! worker with more connections ready than the set polls in one turn answers them all.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use canter_rt::{ClientTls, Reply, Request, Response, ServerTls, TlsListener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{test_builder, test_config, Client, TestServer};

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

/// Tests that answer `/thread/N` serialize on this lock (`ANSWERERS` is one).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Installs a thread outside the worker that answers every `/thread/N` handler (the wake-up
/// crosses threads); joined, it says how many it answered.
fn answerer() -> thread::JoinHandle<usize> {
    let (tx, rx) = mpsc::channel::<tokio::sync::oneshot::Sender<String>>();
    *ANSWERERS.lock().unwrap() = Some(tx);
    thread::spawn(move || {
        let mut answered = 0;
        while let Ok(reply) = rx.recv_timeout(Duration::from_secs(30)) {
            let _ = reply.send("from a thread".to_owned());
            answered += 1;
        }
        answered
    })
}

#[test]
fn connections_woken_from_another_thread_and_by_timers_are_answered() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let answerer = answerer();
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

/// Reads one response with a Content-Length from `s` (`buf` keeps what came after it): its
/// status line and body.
async fn tls_response(s: &mut canter_rt::Stream, buf: &mut Vec<u8>) -> (String, String) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end].to_vec()).unwrap();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a Content-Length");
            if buf.len() >= end + 4 + len {
                let body = String::from_utf8(buf[end + 4..end + 4 + len].to_vec()).unwrap();
                buf.drain(..end + 4 + len);
                return (head.lines().next().unwrap().to_owned(), body);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn tls_connections_of_the_set_are_woken_and_all_answered() {
    // Requests answered from another thread and after a timer: on a few connections one at a
    // time, then on more connections than the set polls in one turn, their handshakes at once.
    const CONNS: usize = 300;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let answerer = answerer();
    let config = test_builder()
        .tls(Some(TlsListener {
            addr: ([127, 0, 0, 1], 0).into(),
            acceptor: ServerTls::new().self_signed().build().unwrap(),
        }))
        .build()
        .unwrap();
    let server = TestServer::start(config, |_| app);
    let addr = server.tls_addr.unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tls = ClientTls::insecure(&[b"http/1.1"]);
    let connect = |tls: ClientTls| async move {
        canter_rt::connect_tls(addr, "localhost", &tls, Duration::from_secs(30))
            .await
            .unwrap()
    };
    let ok = |body: String| ("HTTP/1.1 200 OK".to_owned(), body);
    rt.block_on(async {
        // A few connections, one request at a time: the worker has nothing else to do when
        // the answer comes from the other thread.
        let mut few = Vec::new();
        for _ in 0..4 {
            few.push((connect(tls.clone()).await, Vec::new()));
        }
        for round in 0..10 {
            for (i, (s, buf)) in few.iter_mut().enumerate() {
                let get = |path: String| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
                s.write_all(get(format!("/thread/{i}-{round}")).as_bytes())
                    .await
                    .unwrap();
                let got = tls_response(s, buf).await;
                assert_eq!(got, ok(format!("{i}-{round} from a thread")));
                s.write_all(get("/timer".to_owned()).as_bytes())
                    .await
                    .unwrap();
                assert_eq!(tls_response(s, buf).await, ok("timer".to_owned()));
            }
        }
        drop(few);
        // Many at once, each with two requests pipelined.
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CONNS {
            let s = connect(tls.clone());
            tasks.spawn(async move {
                let mut s = s.await;
                s.write_all(
                    format!(
                        "GET /thread/{i} HTTP/1.1\r\nHost: x\r\n\r\nGET /timer HTTP/1.1\r\nHost: x\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
                let mut buf = Vec::new();
                let a = tls_response(&mut s, &mut buf).await;
                let b = tls_response(&mut s, &mut buf).await;
                assert_eq!(a, ("HTTP/1.1 200 OK".to_owned(), format!("{i} from a thread")));
                assert_eq!(b, ("HTTP/1.1 200 OK".to_owned(), "timer".to_owned()));
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    });
    server.wait_idle(Duration::from_secs(30), "after the TLS clients left");
    server.stop();
    *ANSWERERS.lock().unwrap() = None;
    assert_eq!(answerer.join().unwrap(), 40 + CONNS);
}
