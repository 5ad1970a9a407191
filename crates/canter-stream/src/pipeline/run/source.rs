//! Sources on one worker: a TCP source's connections (on the runtime's server), a file, a generator.

use std::cell::RefCell;
use std::io::Read;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use canter_rt::proto::{self, Conn, Protocol, Settings};
use canter_rt::ServerWorker;
use tokio::sync::Notify;

use super::super::Framing;
use super::env::Env;
use super::process::Process;
use super::wait::{RateLog, Waiter};
use crate::frame::FrameError;

/// A source connection: frames in, the pipeline run inline.
pub(super) struct SourceConn {
    pub(super) head: Rc<RefCell<dyn Process>>,
    pub(super) env: Rc<Env>,
    pub(super) framing: Framing,
    pub(super) peer: SocketAddr,
    /// Counted in [`Env::open_sources`] (it was not over the bound when it opened).
    pub(super) counted: bool,
    /// Rate-limits the warnings of refused connections, for the worker.
    pub(super) refusals: Rc<RefCell<RateLog>>,
}

impl SourceConn {
    pub(super) fn hold(&self, conn: &mut Conn<'_>) {
        conn.mute();
        self.env.wait(Waiter::Conn(conn.handle()));
    }
}

impl Protocol for SourceConn {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        // Each connection may hold up to a frame of input: their number is bounded.
        if self.env.open_sources.get() >= self.env.opts.max_source_connections {
            if let Some(held) = self.refusals.borrow_mut().allow() {
                let peer = self.peer;
                tracing::warn!(%peer, held, "source connection refused: at max_source_connections");
            }
            conn.close();
            return;
        }
        self.env.open_sources.set(self.env.open_sources.get() + 1);
        self.counted = true;
        let mut sources = self.env.sources.borrow_mut();
        sources.retain(|h| !h.is_closed());
        sources.push(conn.handle());
    }

    fn on_data(&mut self, conn: &mut Conn<'_>, input: &mut BytesMut) {
        if self.env.shutting.get() {
            conn.close();
            return;
        }
        if self.env.must_wait() {
            self.hold(conn);
            return;
        }
        let mut head = self.head.borrow_mut();
        head.begin();
        match head.records(self.framing, input) {
            Ok(used) => {
                let _ = input.split_to(used);
            }
            Err(e) => {
                head.frame_error(Some(conn.peer_addr()), &e);
                input.clear();
                conn.close();
            }
        }
        head.end_turn();
        drop(head);
        if !conn.is_closing() && self.env.must_wait() {
            self.hold(conn);
        }
    }

    fn on_wake(&mut self, conn: &mut Conn<'_>) {
        if self.env.shutting.get() {
            conn.close();
        } else if conn.is_muted() {
            if self.env.must_wait() {
                self.env.wait(Waiter::Conn(conn.handle()));
            } else {
                conn.unmute();
            }
        }
    }

    fn on_shutdown(&mut self, conn: &mut Conn<'_>) {
        conn.close();
    }

    fn on_close(&mut self, why: &proto::Close) {
        if self.counted {
            self.env.open_sources.set(self.env.open_sources.get() - 1);
        }
        tracing::debug!(peer = %self.peer, %why, "source connection closed");
    }
}

/// Serves a TCP source on this worker: the runtime's accept loop for the source's server,
/// each connection a [`SourceConn`], until shutdown.
pub(super) async fn serve_source(
    server: ServerWorker,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
    framing: Framing,
) {
    let built = Settings::builder()
        .read_budget(env.opts.read_budget)
        .read_size((256 * 1024).min(env.opts.read_budget).max(1024))
        .max_input(match framing {
            Framing::LengthPrefixed { max } | Framing::Lines { max } => max + 64 * 1024,
        })
        .build();
    let settings = match built {
        Ok(settings) => settings,
        Err(e) => {
            tracing::error!(error = %e, "source connection settings");
            return;
        }
    };
    let refusals = Rc::new(RefCell::new(RateLog::default()));
    let make = {
        let env = env.clone();
        move |peer| SourceConn {
            head: head.clone(),
            env: env.clone(),
            framing,
            peer,
            counted: false,
            refusals: refusals.clone(),
        }
    };
    if let Err(e) = server.serve_protocol(Some(settings), make).await {
        tracing::error!(error = %e, "source listener failed");
    }
}

/// Waits until the sources may read.
pub(super) async fn room(env: &Env, wake: &Rc<Notify>) {
    while env.must_wait() {
        env.wait(Waiter::Task(wake.clone()));
        wake.notified().await;
    }
}

pub(super) async fn file_source(
    path: std::path::PathBuf,
    framing: Framing,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
) {
    let wake = Rc::new(Notify::new());
    match std::fs::File::open(&path) {
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "source file cannot be opened")
        }
        Ok(mut file) => {
            let mut buf: Vec<u8> = Vec::new();
            let mut chunk = vec![0u8; 256 * 1024];
            while !env.shutting.get() {
                room(&env, &wake).await;
                let n = match file.read(&mut chunk) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "source file read failed");
                        break;
                    }
                };
                if n == 0 {
                    if !buf.is_empty() {
                        let e = FrameError::Truncated { missing: 0 };
                        head.borrow_mut().frame_error(None, &e);
                    }
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                let r = {
                    let mut h = head.borrow_mut();
                    h.begin();
                    let r = h.records(framing, &buf);
                    h.end_turn();
                    if let Err(e) = &r {
                        h.frame_error(None, e);
                    }
                    r
                };
                match r {
                    Ok(used) => {
                        buf.drain(..used);
                    }
                    Err(_) => break,
                }
                tokio::task::yield_now().await;
            }
        }
    }
    head.borrow_mut().end_of_input();
}

pub(super) async fn generate_source(
    count: u64,
    make: Arc<dyn Fn(u64, &mut Vec<u8>) + Send + Sync>,
    head: Rc<RefCell<dyn Process>>,
    env: Rc<Env>,
) {
    let wake = Rc::new(Notify::new());
    let mut scratch = Vec::with_capacity(256);
    let mut i = 0;
    while i < count && !env.shutting.get() {
        room(&env, &wake).await;
        {
            let mut h = head.borrow_mut();
            h.begin();
            let end = (i + 1024).min(count);
            while i < end {
                scratch.clear();
                make(i, &mut scratch);
                h.record(&scratch);
                i += 1;
            }
            h.end_turn();
        }
        tokio::task::yield_now().await;
    }
    head.borrow_mut().end_of_input();
}
