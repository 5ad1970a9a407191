//! The links between the workers of a group's processes: a task per link writes what the worker's pipelines put there; each worker's listener takes the links from the other processes' workers and hands their batches to its inboxes, waiting while an inbox is full.

use std::cell::RefCell;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use super::clock;
use super::env::{Env, WireIn};
use super::wait::{RateLog, Waiter};
use super::wire::{self, LinkBuf};

/// A pipeline's inboxes, as the links see them.
pub(super) type Inboxes = Rc<Vec<Arc<dyn WireIn + Send + Sync>>>;

/// Worker `env.gid`'s link to worker `to` of another process, whose socket is `path`: connects
/// (that process may start later), then writes what the pipelines put in `buf` until the worker
/// has ended and everything is written, or the link is lost (what comes then is dropped).
pub(super) async fn write_link(path: PathBuf, to: usize, buf: Rc<RefCell<LinkBuf>>, env: Rc<Env>) {
    let wake = buf.borrow().wake.clone();
    let started = clock();
    let mut log = RateLog::default();
    let mut backoff = Duration::from_millis(5);
    let mut stream = loop {
        match UnixStream::connect(&path).await {
            Ok(s) => break s,
            Err(e) => {
                let waited = clock().saturating_duration_since(started);
                let (closing, empty) = {
                    let b = buf.borrow();
                    (b.closing, b.data.is_empty())
                };
                // This worker has ended with nothing for that one (a worker that read no
                // input: a file's reader is the group's first), or that one has ended too
                // (its socket refuses): nothing is left to deliver there.
                if closing && (empty || e.kind() == std::io::ErrorKind::ConnectionRefused) {
                    if !empty {
                        lost(&buf, &env, to, &format!("its worker has ended: {e}"));
                    }
                    return;
                }
                if closing && waited > env.opts.drain_timeout {
                    lost(&buf, &env, to, &format!("never connected: {e}"));
                    return;
                }
                if waited > Duration::from_secs(2) {
                    if let Some(held) = log.allow() {
                        tracing::warn!(
                            worker = env.gid, to, path = %path.display(), error = %e, held,
                            "waiting for a worker of another process of the group"
                        );
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = wake.notified() => {}
                }
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    };
    tracing::debug!(worker = env.gid, to, "group link connected");
    if let Err(e) = stream.write_all(&wire::hello(env.gid, to, env.total)).await {
        lost(&buf, &env, to, &e.to_string());
        return;
    }
    let mut spare = Vec::new();
    loop {
        let (chunk, closing) = {
            let mut b = buf.borrow_mut();
            (
                std::mem::replace(&mut b.data, std::mem::take(&mut spare)),
                b.closing,
            )
        };
        if chunk.is_empty() {
            spare = chunk;
            if closing {
                let mut bye = Vec::new();
                let at = wire::begin_frame(&mut bye, wire::BYE, 0, 0);
                wire::end_frame(&mut bye, at);
                let _ = stream.write_all(&bye).await;
                let _ = stream.shutdown().await;
                return;
            }
            wake.notified().await;
            continue;
        }
        let was_full = chunk.len() >= buf.borrow().high;
        if let Err(e) = stream.write_all(&chunk).await {
            lost(&buf, &env, to, &e.to_string());
            return;
        }
        spare = chunk;
        spare.clear();
        if was_full {
            env.resume_all();
        }
    }
}

/// The link is lost: what it holds and what comes is dropped, and the sources waiting for its
/// room go on.
fn lost(buf: &RefCell<LinkBuf>, env: &Env, to: usize, why: &str) {
    {
        let mut b = buf.borrow_mut();
        tracing::error!(
            worker = env.gid,
            to,
            error = why,
            bytes = b.data.len(),
            "lost the link to a worker of another process: records for its keys are dropped"
        );
        b.dead = true;
        b.data = Vec::new();
    }
    env.resume_all();
}

/// Worker `env.gid`'s listener: takes a link from each worker of the other processes.
pub(super) async fn serve_links(listener: StdUnixListener, env: Rc<Env>, inboxes: Inboxes) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(worker = env.gid, error = %e, "group listener unusable");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                // Not among the tasks a shutdown stops: the other processes' ends come here.
                tokio::task::spawn_local(read_link(s, env.clone(), inboxes.clone()));
            }
            Err(e) => {
                tracing::warn!(worker = env.gid, error = %e, "group listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One link from a worker of another process: its batches go to this worker's inboxes.
async fn read_link(mut s: UnixStream, env: Rc<Env>, inboxes: Inboxes) {
    let mut hello = [0u8; wire::HELLO];
    if let Err(e) = s.read_exact(&mut hello).await {
        tracing::warn!(worker = env.gid, error = %e, "group link closed before its hello");
        return;
    }
    let word = |i: usize| {
        u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]) as usize
    };
    let (from, to, total) = (word(4), word(8), word(12));
    let local = env.base..env.base + env.workers;
    if hello[..4] != wire::MAGIC
        || to != env.gid
        || total != env.total
        || from >= total
        || local.contains(&from)
    {
        tracing::error!(
            worker = env.gid,
            from,
            to,
            total,
            "a group link that is not from this group's topology: closed"
        );
        return;
    }
    let mut ended = vec![false; inboxes.len()];
    let wake = Rc::new(Notify::new());
    let cap = env.opts.inbox_capacity;
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let why = 'link: loop {
        let mut at = 0;
        loop {
            let (kind, pipe, records, used, body) = match wire::parse(&buf[at..]) {
                Ok(Some((f, used))) => (f.kind, f.pipe as usize, f.records as usize, used, f.body),
                Ok(None) => break,
                Err(e) => break 'link e,
            };
            let Some(inbox) = inboxes.get(pipe) else {
                break 'link format!("pipeline {pipe} of {}", inboxes.len());
            };
            match kind {
                wire::DATA => inbox.push_wire(env.me, from, records, body.to_vec()),
                wire::END => {
                    if records == 1 {
                        env.peer_stopped.set(true);
                    }
                    inbox.push_end(env.me, from);
                    ended[pipe] = true;
                }
                wire::BARRIER => {
                    let Some(epoch) = body.get(..8).and_then(|b| b.try_into().ok()) else {
                        break 'link "a barrier frame without its epoch".to_owned();
                    };
                    inbox.push_barrier(env.me, from, u64::from_le_bytes(epoch));
                }
                wire::BYE => return,
                other => break 'link format!("a frame of kind {other}"),
            }
            at += used;
            // The inbox is full: read no more of this link until it has room.
            let gauge = inbox.gauge(env.me);
            while gauge.pending.load(Ordering::Acquire) >= cap {
                gauge.blocked.fetch_or(1 << env.me, Ordering::SeqCst);
                env.wait(Waiter::Task(wake.clone()));
                if gauge.pending.load(Ordering::SeqCst) < cap {
                    break;
                }
                wake.notified().await;
            }
        }
        buf.drain(..at);
        buf.reserve(64 * 1024);
        match s.read_buf(&mut buf).await {
            Ok(0) => break "closed without its goodbye".to_owned(),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    tracing::error!(
        worker = env.gid, from, error = %why,
        "lost the link from a worker of another process: its records in flight are lost"
    );
    // Not the end of the input: what the steps hold is not emitted as if it were.
    env.peer_stopped.set(true);
    for (inbox, ended) in inboxes.iter().zip(ended) {
        if !ended {
            inbox.push_end(env.me, from);
        }
    }
}
