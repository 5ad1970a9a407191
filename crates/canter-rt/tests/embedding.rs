//! The runtime as an embedding uses it (the Python front end): `Server::serve_inline` runs the
//! single worker on the calling thread, `Config::park_hooks` are called around every blocking
//! wait, and `peer_is_tls` tells a handler which listener its request came from.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

use canter_rt::{
    ClientTls, Config, ConfigBuilder, Reply, Request, Response, Server, ServerTls, TlsListener,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config() -> ConfigBuilder {
    Config::builder()
        .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
        .workers(1)
}

fn handler(_req: Request) -> Reply {
    let answer = format!(
        "tls={} peer={}",
        canter_rt::peer_is_tls(),
        canter_rt::peer_addr().is_some()
    );
    Response::text(answer).into()
}

fn get(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_inline_refuses_more_than_one_worker() {
    let server = Server::bind(config().workers(2).build().unwrap()).unwrap();
    let err = server.serve_inline(|_| handler).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn serve_inline_runs_on_the_calling_thread_with_park_hooks() {
    let (hooks, parked, unparked) = common::counting_park_hooks();
    let config = config()
        .park_hooks(Some(hooks))
        .tls(Some(TlsListener {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            acceptor: ServerTls::new().self_signed().build().unwrap(),
        }))
        .build()
        .unwrap();
    let server = Server::bind(config).unwrap();
    let (addr, tls_addr) = (server.local_addr(), server.tls_local_addr().unwrap());
    let shutdown = server.shutdown_handle();
    let thread = std::thread::spawn(move || {
        let me = std::thread::current().id();
        server
            .serve_inline(move |_| {
                // The factory, and so the worker, runs on the thread that called serve_inline.
                assert_eq!(std::thread::current().id(), me);
                handler
            })
            .unwrap();
    });

    let plain = get(addr);
    assert!(plain.ends_with("tls=false peer=true"), "{plain}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let over_tls = rt.block_on(async {
        let tls = ClientTls::insecure(&[b"http/1.1"]);
        let mut s = canter_rt::connect_tls(tls_addr, "localhost", &tls, Duration::from_secs(5))
            .await
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8(out).unwrap()
    });
    assert!(over_tls.ends_with("tls=true peer=true"), "{over_tls}");

    // The workers waited for events between the requests: every park was followed by a
    // wake-up, but for the one each of the two workers may be in now.
    let (before, after) = (
        parked.load(Ordering::SeqCst),
        unparked.load(Ordering::SeqCst),
    );
    assert!(before >= 2, "parked {before} times");
    assert!(
        before - after <= 2,
        "parked {before} times, woke {after} times"
    );
    shutdown.shutdown();
    thread.join().unwrap();
    assert_eq!(
        parked.load(Ordering::SeqCst),
        unparked.load(Ordering::SeqCst)
    );
}

/// With HTTP/2 off, a TLS client offering `h2` first gets `http/1.1` by ALPN, and is answered
/// in HTTP/1.1 (before, it could agree on `h2` and be served HTTP/2 regardless).
#[test]
fn with_http2_off_tls_does_not_offer_h2() {
    let tls = TlsListener {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        acceptor: ServerTls::new().self_signed().build().unwrap(),
    };
    let on = config().tls(Some(tls.clone())).build().unwrap();
    let on_alpn = on.tls().unwrap().acceptor.alpn_protocols().to_vec();
    assert_eq!(on_alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    let off = config().tls(Some(tls)).http2(None).build().unwrap();
    assert_eq!(
        off.tls().unwrap().acceptor.alpn_protocols(),
        [b"http/1.1".to_vec()]
    );

    let server = Server::bind(off).unwrap();
    let tls_addr = server.tls_local_addr().unwrap();
    let shutdown = server.shutdown_handle();
    let thread = std::thread::spawn(move || server.serve_inline(|_| handler).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (alpn, answer) = rt.block_on(async {
        let client = ClientTls::insecure(&[b"h2", b"http/1.1"]);
        let mut s = canter_rt::connect_tls(tls_addr, "localhost", &client, Duration::from_secs(5))
            .await
            .unwrap();
        let alpn = s.alpn_protocol().map(<[u8]>::to_vec);
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        (alpn, String::from_utf8(out).unwrap())
    });
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    shutdown.shutdown();
    thread.join().unwrap();
}
