//! The connection actor against a scripted peer on virtual time: the transport is an in-memory
//! pipe (`tokio::io::duplex`) and the clock is tokio's paused clock, which jumps straight to the
//! next timer when everything is idle. No sleeps on real time, no sockets: each test is
//! deterministic and runs in milliseconds whatever the timeouts.

#![allow(clippy::unwrap_used, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canter_rt::proto::{
    self, Close, Conn, Protocol, Settings, StartTls, StartTlsError, TlsUpgrade,
};
use canter_rt::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4000))
}

/// What the protocol saw, in order.
#[derive(Default)]
struct Log {
    events: Vec<String>,
}

impl Log {
    fn push(&mut self, e: impl Into<String>) {
        self.events.push(e.into());
    }
}

/// Runs `protocol` against `script` (the peer's side of the pipe) until both are done.
async fn converse<P: Protocol, F>(
    mut protocol: P,
    settings: Settings,
    capacity: usize,
    script: impl FnOnce(DuplexStream) -> F,
) -> (P, Close)
where
    F: std::future::Future<Output = ()>,
{
    let (ours, theirs) = tokio::io::duplex(capacity);
    let actor = async {
        let why = proto::run(ours, peer(), &mut protocol, &settings).await;
        (why, Instant::now())
    };
    let ((why, ended), ()) = tokio::join!(actor, script(theirs));
    ENDED.with(|e| e.set(Some(ended)));
    (protocol, why)
}

thread_local! {
    /// When the last `converse` saw its actor finish (virtual time).
    static ENDED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

fn ended() -> Instant {
    ENDED.with(|e| e.get()).unwrap()
}

/// Sends "tick" when its timer fires, 30 s after opening, then closes.
struct Ticker(Log);

impl Protocol for Ticker {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.0.push("open");
        conn.set_timer(Duration::from_secs(30));
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, input: &mut BytesMut) {
        self.0.push(format!("data {}", input.len()));
        input.clear();
    }
    fn on_timer(&mut self, conn: &mut Conn<'_>) {
        self.0.push("timer");
        conn.send(Bytes::from_static(b"tick")).unwrap();
        conn.close();
    }
    fn on_close(&mut self, why: &Close) {
        self.0.push(format!("close {why}"));
    }
}

#[tokio::test(start_paused = true)]
async fn timer_fires_on_virtual_time() {
    let start = Instant::now();
    let (ticker, why) = converse(
        Ticker(Log::default()),
        Settings::default(),
        4096,
        |mut p| async move {
            let mut got = Vec::new();
            p.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"tick");
            assert!(Instant::now() - start >= Duration::from_secs(30));
        },
    )
    .await;
    assert!(matches!(why, Close::Local), "{why}");
    assert_eq!(ticker.0.events, ["open", "timer", "close closed"]);
}

/// Queues 64 KiB on open; the peer never reads: closed after the write timeout, not before.
struct Flood;

impl Protocol for Flood {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        conn.send(vec![0u8; 64 * 1024]).unwrap();
        // At the high-water mark: refused, and the data is handed back.
        let refused = conn.send(Bytes::from_static(b"more")).unwrap_err();
        assert_eq!(refused.0, Bytes::from_static(b"more"));
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, _input: &mut BytesMut) {}
}

#[tokio::test(start_paused = true)]
async fn write_timeout_when_the_peer_never_reads() {
    let start = Instant::now();
    let settings = Settings::builder()
        .write_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (_, why) = converse(Flood, settings, 1024, |p| async move {
        // Hold the pipe open without reading until the actor gives up.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(p);
    })
    .await;
    assert!(matches!(why, Close::WriteTimeout), "{why}");
    let waited = ended() - start;
    assert!(
        waited >= Duration::from_secs(20) && waited < Duration::from_secs(60),
        "{waited:?}"
    );
}

/// Mutes on the first bytes without consuming them; unmutes from a timer. The leftover input
/// must come back without the peer sending anything new.
struct Hesitant(Log);

impl Protocol for Hesitant {
    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        self.0
            .push(format!("data {}", String::from_utf8_lossy(input)));
        if self.0.events.len() == 1 {
            conn.mute();
            conn.set_timer(Duration::from_secs(1));
            return;
        }
        let echo = input.split().freeze();
        conn.send(echo).unwrap();
        conn.close();
    }
    fn on_timer(&mut self, conn: &mut Conn<'_>) {
        self.0.push("timer");
        conn.unmute();
    }
}

#[tokio::test(start_paused = true)]
async fn unmute_hands_back_leftover_input() {
    let (p, why) = converse(
        Hesitant(Log::default()),
        Settings::default(),
        4096,
        |mut p| async move {
            p.write_all(b"hello").await.unwrap();
            let mut got = Vec::new();
            p.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"hello");
        },
    )
    .await;
    assert!(matches!(why, Close::Local), "{why}");
    assert_eq!(p.0.events, ["data hello", "timer", "data hello"]);
}

/// Never consumes its input: the actor closes at `max_input` instead of buffering forever.
struct Hoarder;

impl Protocol for Hoarder {
    fn on_data(&mut self, _conn: &mut Conn<'_>, _input: &mut BytesMut) {}
}

#[tokio::test(start_paused = true)]
async fn unconsumed_input_is_bounded() {
    let settings = Settings::builder().max_input(64 * 1024).build().unwrap();
    let (_, why) = converse(Hoarder, settings, 16 * 1024, |mut p| async move {
        let chunk = vec![1u8; 8192];
        let mut sent = 0;
        while p.write_all(&chunk).await.is_ok() {
            sent += chunk.len();
            assert!(sent <= 1024 * 1024, "still reading after {sent} bytes");
        }
    })
    .await;
    assert!(matches!(why, Close::InputLimit), "{why}");
}

/// The order of calls around the peer's end of input, and the default `on_eof`.
struct Recorder(Log);

impl Protocol for Recorder {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.0.push(if conn.is_tls() { "open tls" } else { "open" });
    }
    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        self.0.push(format!("data {}", input.len()));
        conn.send(input.split().freeze()).unwrap();
    }
    fn on_eof(&mut self, conn: &mut Conn<'_>) {
        self.0.push("eof");
        conn.send(Bytes::from_static(b"bye")).unwrap();
        conn.close();
    }
    fn on_close(&mut self, why: &Close) {
        self.0.push(format!("close {why}"));
    }
}

#[tokio::test(start_paused = true)]
async fn peer_end_of_input_then_close() {
    let (r, why) = converse(
        Recorder(Log::default()),
        Settings::default(),
        4096,
        |mut p| async move {
            p.write_all(b"abc").await.unwrap();
            let mut three = [0u8; 3];
            p.read_exact(&mut three).await.unwrap();
            p.shutdown().await.unwrap();
            let mut rest = Vec::new();
            p.read_to_end(&mut rest).await.unwrap();
            assert_eq!(rest, b"bye");
        },
    )
    .await;
    assert!(matches!(why, Close::PeerClosed), "{why}");
    assert_eq!(
        r.0.events,
        ["open", "data 3", "eof", "close closed by the peer"]
    );
}

/// Sends until refused, then again on each `on_writable`: the peer reads slowly, and every
/// byte arrives, in order, with the queue never above the high-water mark plus one piece.
struct Producer {
    next: u32,
    total: u32,
    writable_calls: u32,
    max_queued: usize,
}

impl Protocol for Producer {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        self.on_writable(conn);
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, input: &mut BytesMut) {
        input.clear();
    }
    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        self.writable_calls += 1;
        while self.next < self.total {
            if conn
                .send(Bytes::copy_from_slice(&self.next.to_be_bytes()))
                .is_err()
            {
                return;
            }
            self.max_queued = self.max_queued.max(conn.queued());
            self.next += 1;
        }
        conn.close();
    }
}

#[tokio::test(start_paused = true)]
async fn refused_sends_resume_on_writable() {
    let total = 100_000u32;
    let settings = Settings::builder().high_water(4096).build().unwrap();
    let producer = Producer {
        next: 0,
        total,
        writable_calls: 0,
        max_queued: 0,
    };
    let (p, why) = converse(producer, settings, 1024, |mut p| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            let n = p.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(got.len(), total as usize * 4);
        for (i, w) in got.chunks(4).enumerate() {
            assert_eq!(u32::from_be_bytes(w.try_into().unwrap()), i as u32);
        }
    })
    .await;
    assert!(matches!(why, Close::Local), "{why}");
    assert!(
        p.writable_calls > 10,
        "{} on_writable calls",
        p.writable_calls
    );
    assert!(
        p.max_queued <= 4096,
        "queued {} over the high-water mark",
        p.max_queued
    );
}

/// `start_tls` on a transport that cannot be upgraded: refused, the connection closed.
struct Upgrader;

impl Protocol for Upgrader {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        conn.start_tls(TlsUpgrade::Client {
            tls: canter_rt::ClientTls::insecure(&[]),
            server_name: "localhost".into(),
        });
        assert!(conn.is_upgrading());
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, _input: &mut BytesMut) {}
}

#[tokio::test(start_paused = true)]
async fn start_tls_on_an_in_memory_pipe_is_refused() {
    let (_, why) = converse(Upgrader, Settings::default(), 1024, |mut p| async move {
        let mut rest = Vec::new();
        p.read_to_end(&mut rest).await.unwrap();
    })
    .await;
    assert!(
        matches!(why, Close::Tls(StartTlsError::Unsupported)),
        "{why}"
    );
}

/// A wake from another task of the same thread reaches `on_wake`.
struct Woken(Option<tokio::sync::oneshot::Sender<proto::Handle>>);

impl Protocol for Woken {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(conn.handle());
        }
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, _input: &mut BytesMut) {}
    fn on_wake(&mut self, conn: &mut Conn<'_>) {
        conn.send(Bytes::from_static(b"woken")).unwrap();
        conn.close();
    }
}

#[tokio::test(start_paused = true)]
async fn handle_wakes_the_connection() {
    let (tx, rx) = tokio::sync::oneshot::channel::<proto::Handle>();
    let waker = async {
        let handle = rx.await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!handle.is_closed());
        handle.wake();
        handle
    };
    let talk = converse(
        Woken(Some(tx)),
        Settings::default(),
        1024,
        |mut p| async move {
            let mut got = Vec::new();
            p.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"woken");
        },
    );
    let (handle, (_, why)) = tokio::join!(waker, talk);
    assert!(matches!(why, Close::Local), "{why}");
    assert!(handle.is_closed());
}

/// A transport that, like a TLS session, accepts writes into a buffer of its own (up to 64 KiB)
/// and only moves them to the pipe as it can: what it holds goes out through `poll_flush`.
struct Holding {
    pipe: DuplexStream,
    held: Vec<u8>,
}

impl Holding {
    fn push_out(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use tokio::io::AsyncWrite;
        while !self.held.is_empty() {
            let n =
                std::task::ready!(std::pin::Pin::new(&mut self.pipe).poll_write(cx, &self.held))?;
            self.held.drain(..n);
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl Transport for Holding {
    fn poll_read_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Transport::poll_read(&mut self.pipe, cx, buf)
    }
    fn poll_write(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let room = (64 * 1024usize)
            .saturating_sub(self.held.len())
            .min(buf.len());
        if room == 0 {
            return match self.push_out(cx) {
                std::task::Poll::Ready(Ok(())) => self.poll_write(cx, buf),
                other => other.map(|r| r.map(|()| 0)),
            };
        }
        self.held.extend_from_slice(&buf[..room]);
        // Like tokio-rustls: try to move it on, but report what was accepted either way.
        let _ = self.push_out(cx);
        std::task::Poll::Ready(Ok(room))
    }
    fn poll_write_vectored(
        &mut self,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(b) => self.poll_write(cx, b),
            None => std::task::Poll::Ready(Ok(0)),
        }
    }
    fn poll_flush(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.push_out(cx)
    }
    fn poll_shutdown(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::ready!(self.push_out(cx))?;
        Transport::poll_shutdown(&mut self.pipe, cx)
    }
    fn has_pending_output(&self) -> bool {
        !self.held.is_empty()
    }
}

impl StartTls for Holding {
    fn is_tls(&self) -> bool {
        false
    }

    fn start_tls(
        self,
        _how: TlsUpgrade,
    ) -> impl std::future::Future<Output = Result<Self, StartTlsError>> + 'static {
        std::future::ready(Err(StartTlsError::Unsupported))
    }
}

/// Sends 256 KiB on open and nothing after: the peer starts reading late, when the actor's own
/// queue is already empty and the rest waits inside the transport. It must still arrive, with
/// no further event on the connection.
struct Burst;

impl Protocol for Burst {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        conn.send(vec![9u8; 256 * 1024]).unwrap();
    }
    fn on_data(&mut self, _conn: &mut Conn<'_>, input: &mut BytesMut) {
        input.clear();
    }
}

#[tokio::test(start_paused = true)]
async fn output_held_by_the_transport_is_flushed() {
    let (ours, mut theirs) = tokio::io::duplex(1024);
    let transport = Holding {
        pipe: ours,
        held: Vec::new(),
    };
    let mut burst = Burst;
    let settings = Settings::default();
    let actor = proto::run(transport, peer(), &mut burst, &settings);
    let reader = async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut got = vec![0u8; 256 * 1024];
        let read = tokio::time::timeout(Duration::from_secs(60), theirs.read_exact(&mut got)).await;
        assert!(read.is_ok(), "the last bytes stayed inside the transport");
        assert!(got.iter().all(|&b| b == 9));
    };
    tokio::select! {
        why = actor => panic!("the actor ended first: {why}"),
        () = reader => {}
    }
}

/// A protocol's settings are checked when built, and a value out of range names its setting.
#[test]
fn settings_out_of_range_are_refused_by_name() {
    use canter_rt::proto::Settings;
    for (built, name) in [
        (Settings::builder().high_water(0).build(), "high_water"),
        (Settings::builder().high_water(3).build(), "high_water"),
        (Settings::builder().read_budget(0).build(), "read_budget"),
        (Settings::builder().max_input(0).build(), "max_input"),
        (
            Settings::builder().write_timeout(Duration::ZERO).build(),
            "write_timeout",
        ),
        (Settings::builder().read_size(512).build(), "read_size"),
        (Settings::builder().read_size(32 << 20).build(), "read_size"),
    ] {
        let e = built.unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
    let s = Settings::builder().high_water(1000).build().unwrap();
    assert_eq!((s.high_water(), s.low_water()), (1000, 250));
}
