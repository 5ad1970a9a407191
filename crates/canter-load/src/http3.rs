//! HTTP/3 connection driver (`--h3`): one QUIC connection per `-c`, each on a UDP socket of its
//! own (so the server's workers see distinct addresses, as they would from distinct clients),
//! up to `-m` requests in flight on it.
//!
//! The client is quinn with hyperium's h3: an implementation other than the server's, so a run
//! against canter is also an interoperability check. Closed loop, each of the `-m` slots sends
//! its next request when its last answer is read; open loop (`--rate`), a connection sends on
//! its schedule while fewer than `-m` are in flight, and a slot that finds all `-m` busy waits,
//! its latency counted from when it was due (coordinated omission corrected). With
//! `--no-keepalive`, every request has a connection of its own, closed after its answer: a
//! handshake each (a full one with `--tls-no-resume`), its latency counted from the connect.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes};

use crate::h1::{ConnConfig, ThreadShared, CONNECT_BACKOFF};
use crate::schedule::{corrected_latency, RateSchedule};
use crate::stats::ErrorKind;
use crate::target::H2Request;

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// The QUIC client settings of a run: the TLS settings with ALPN `h3`.
pub fn client_config(tls: &canter_rt::ClientTls) -> Result<quinn::ClientConfig, String> {
    let mut rustls = rustls::ClientConfig::clone(&tls.rustls_config());
    rustls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(rustls)
        .map_err(|e| format!("TLS settings unusable for QUIC: {e}"))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// Drives one connection until the run ends or the budget is spent.
pub async fn run_connection(cfg: &ConnConfig, shared: &ThreadShared, index: usize) {
    let (Some(request), Some((quic, name))) = (cfg.h2.as_ref(), cfg.quic.as_ref()) else {
        return;
    };
    let schedule = cfg
        .rate
        .map(|(rate, conns)| RateSchedule::new(rate, conns, index));
    let slots = Cell::new(0u64);
    if cfg.new_connection_per_request {
        return one_per_connection(cfg, shared, request, quic, name).await;
    }
    loop {
        let now = Instant::now();
        if cfg.end.is_some_and(|e| now >= e) {
            return;
        }
        let Some((send, _endpoint, driver)) = connect(cfg, shared, quic, name).await else {
            continue;
        };
        let answered = Rc::new(Cell::new(false));
        let spent = Rc::new(Cell::new(false));
        let lanes = (0..cfg.streams.max(1)).map(|_| {
            lane(
                cfg,
                shared,
                request,
                send.clone(),
                schedule.as_ref(),
                &slots,
                answered.clone(),
                spent.clone(),
            )
        });
        let results = futures_join_all(lanes).await;
        driver.abort();
        if spent.get() || cfg.end.is_some_and(|e| Instant::now() >= e) {
            return;
        }
        if results.iter().all(|r| r.is_ok()) {
            return;
        }
        if !answered.get() {
            // Nothing was answered on this connection: do not spin on a server that refuses.
            tokio::time::sleep(CONNECT_BACKOFF).await;
        }
    }
}

/// `--no-keepalive`: connect, one request, close; again until the run ends.
async fn one_per_connection(
    cfg: &ConnConfig,
    shared: &ThreadShared,
    request: &H2Request,
    quic: &quinn::ClientConfig,
    name: &str,
) {
    loop {
        if cfg.end.is_some_and(|e| Instant::now() >= e) {
            return;
        }
        if shared.claim(1) == 0 {
            return;
        }
        let start = Instant::now();
        let Some((mut send, endpoint, driver)) = connect(cfg, shared, quic, name).await else {
            continue;
        };
        let result =
            tokio::time::timeout(cfg.timeout, exchange(&mut send, request, cfg.head_only)).await;
        let now = Instant::now();
        match result {
            Ok(Ok((status, bytes))) => {
                if now >= cfg.measure_start {
                    let mut stats = shared.stats.borrow_mut();
                    stats.record(status, now.saturating_duration_since(start));
                    stats.bytes_read += bytes;
                }
                shared.progress.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(kind)) if now >= cfg.measure_start => shared.stats.borrow_mut().error(kind, 1),
            Err(_) if now >= cfg.measure_start => {
                shared.stats.borrow_mut().error(ErrorKind::Timeout, 1)
            }
            _ => {}
        }
        drop(send);
        endpoint.close(0u32.into(), b"");
        driver.abort();
    }
}

/// Runs the futures to completion on this task, all at once.
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

type Connected = (SendRequest, quinn::Endpoint, tokio::task::JoinHandle<()>);

async fn connect(
    cfg: &ConnConfig,
    shared: &ThreadShared,
    quic: &quinn::ClientConfig,
    name: &str,
) -> Option<Connected> {
    let fail = |what: &str| {
        let now = Instant::now();
        if now >= cfg.measure_start {
            shared.stats.borrow_mut().error(ErrorKind::Connect, 1);
        }
        crate::explain::connect_failed(cfg.addr, &std::io::Error::other(what.to_owned()));
    };
    let bind: std::net::SocketAddr = if cfg.addr.is_ipv6() {
        "[::1]:0".parse().ok()?
    } else {
        "127.0.0.1:0".parse().ok()?
    };
    let attempt = async {
        let mut endpoint = quinn::Endpoint::client(bind).map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(quic.clone());
        let conn = endpoint
            .connect(cfg.addr, name)
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::task::spawn_local(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok::<_, String>((send, endpoint, driver))
    };
    match tokio::time::timeout(cfg.timeout, attempt).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            fail(&e);
            tokio::time::sleep(CONNECT_BACKOFF).await;
            None
        }
        Err(_) => {
            fail("QUIC handshake timed out");
            tokio::time::sleep(CONNECT_BACKOFF).await;
            None
        }
    }
}

/// One of a connection's `-m` request slots: sends, reads the answer, records it, again.
/// `Err` when the connection failed (reconnect), `Ok` when the run is over for this slot.
#[allow(clippy::too_many_arguments)]
async fn lane(
    cfg: &ConnConfig,
    shared: &ThreadShared,
    request: &H2Request,
    mut send: SendRequest,
    schedule: Option<&RateSchedule>,
    slots: &Cell<u64>,
    answered: Rc<Cell<bool>>,
    spent: Rc<Cell<bool>>,
) -> Result<(), ()> {
    loop {
        let mut slot = None;
        if let Some(s) = schedule {
            let k = slots.get();
            slots.set(k + 1);
            let intended = s.intended(cfg.start, k);
            if cfg.end.is_some_and(|e| intended >= e) {
                return Ok(());
            }
            tokio::time::sleep_until(intended.into()).await;
            slot = Some((intended, Instant::now()));
        }
        if cfg.end.is_some_and(|e| Instant::now() >= e) {
            return Ok(());
        }
        if shared.claim(1) == 0 {
            spent.set(true);
            return Ok(());
        }
        let sent = Instant::now();
        let within = match cfg.end {
            Some(e) => cfg.timeout.min(e.saturating_duration_since(sent)),
            None => cfg.timeout,
        };
        match tokio::time::timeout(within, exchange(&mut send, request, cfg.head_only)).await {
            Ok(Ok((status, bytes))) => {
                answered.set(true);
                let now = Instant::now();
                if now >= cfg.measure_start {
                    let latency = match slot {
                        None => now.saturating_duration_since(sent),
                        Some((intended, ready)) => corrected_latency(intended, ready, sent, now),
                    };
                    let mut stats = shared.stats.borrow_mut();
                    stats.record(status, latency);
                    stats.bytes_read += bytes;
                }
                shared.progress.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(kind)) => {
                if Instant::now() >= cfg.measure_start {
                    shared.stats.borrow_mut().error(kind, 1);
                }
                return Err(());
            }
            Err(_) => {
                if cfg.end.is_some_and(|e| Instant::now() >= e) {
                    return Ok(());
                }
                crate::explain::timed_out(cfg.timeout);
                if Instant::now() >= cfg.measure_start {
                    shared.stats.borrow_mut().error(ErrorKind::Timeout, 1);
                }
                return Err(());
            }
        }
    }
}

/// One request and its whole response: `(status, body bytes)`.
async fn exchange(
    send: &mut SendRequest,
    request: &H2Request,
    head_only: bool,
) -> Result<(u16, u64), ErrorKind> {
    let mut req = http::Request::builder();
    let mut authority = "";
    let mut scheme = "https";
    let mut path = "/";
    for (n, v) in &request.fields {
        let v = std::str::from_utf8(v).map_err(|_| ErrorKind::Parse)?;
        match n.as_slice() {
            b":method" => req = req.method(v),
            b":authority" => authority = v,
            b":scheme" => scheme = v,
            b":path" => path = v,
            _ => req = req.header(n.as_slice(), v),
        }
    }
    let req = req
        .uri(format!("{scheme}://{authority}{path}"))
        .body(())
        .map_err(|_| ErrorKind::Parse)?;
    let mut stream = send.send_request(req).await.map_err(|_| ErrorKind::Write)?;
    if !request.body.is_empty() {
        stream
            .send_data(Bytes::copy_from_slice(&request.body))
            .await
            .map_err(|_| ErrorKind::Write)?;
    }
    stream.finish().await.map_err(|_| ErrorKind::Write)?;
    let res = stream.recv_response().await.map_err(|e| {
        if e.is_h3_no_error() {
            ErrorKind::Read
        } else {
            ErrorKind::Reset
        }
    })?;
    let mut bytes = 0u64;
    if !head_only {
        while let Some(mut chunk) = stream.recv_data().await.map_err(|_| ErrorKind::Read)? {
            let n = chunk.remaining();
            bytes += n as u64;
            chunk.advance(n);
        }
    }
    Ok((res.status().as_u16(), bytes))
}
