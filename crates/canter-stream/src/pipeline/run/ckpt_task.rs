//! A worker's side of a checkpoint, on its event loop: the barriers out and its sources
//! stopped, each inbox's alignment, the snapshot (the keys changed since the last checkpoint,
//! the source streams' positions) sent to the coordinator, and the acknowledgements to the
//! source connections once a checkpoint is durable.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::ckpt::{Part, SendBarrier};
use super::env::Env;
use super::process::Process;

/// A drain's inbox is aligned for the checkpoint in progress (its pipeline writes
/// `channels`).
pub(super) fn aligned(env: &Env, channels: &[u64]) {
    let Some(ck) = &env.ckpt else { return };
    // The barriers of the channels' readers go out before the snapshot can be taken (after
    // it, this pipeline runs again and writes what comes after the checkpoint).
    let ready = ck.channels.borrow_mut().writer_done(channels, true, false);
    send_barriers(env, ready);
    let left = ck.waiting.get().saturating_sub(1);
    ck.waiting.set(left);
    if left == 0 && ck.pending().is_some() {
        snapshot(env);
    }
}

/// A drain has ended: it no longer takes part (aligned, if it had not said so yet).
pub(super) fn leave(env: &Env, reported: bool, channels: &[u64]) {
    let Some(ck) = &env.ckpt else { return };
    ck.active.set(ck.active.get().saturating_sub(1));
    let unreported = ck.pending().is_some() && !reported;
    let ready = ck
        .channels
        .borrow_mut()
        .writer_done(channels, unreported, true);
    send_barriers(env, ready);
    if unreported {
        aligned(env, &[]);
    }
}

/// Sends the checkpoint in progress's barriers from the heads of pipelines reading channels.
fn send_barriers(env: &Env, heads: Vec<SendBarrier>) {
    let Some(epoch) = env.ckpt.as_ref().and_then(|c| c.pending()) else {
        return;
    };
    for h in heads {
        h(epoch);
    }
}

/// Takes this worker's snapshot for the checkpoint in progress and sends it to the
/// coordinator; the sources read again and the inboxes' held batches run.
fn snapshot(env: &Env) {
    let Some(ck) = &env.ckpt else { return };
    let Some(epoch) = ck.pending() else { return };
    if env.shutting.get() {
        // A worker that has seen the shutdown lets its inboxes' held batches run, so that its
        // drains end: what came after the barriers may be in its state already, which is then
        // not the checkpoint's. It sends no part: the checkpoint is abandoned and the last
        // durable one stands (its sources no longer wait for it: `Env::must_wait`).
        return;
    }
    let states = env
        .snaps
        .borrow()
        .iter()
        .map(|s| {
            let mut s = s.borrow_mut();
            (s.name().to_owned(), s.delta())
        })
        .collect();
    let positions = {
        let mut p = ck.positions.borrow_mut();
        let out = p
            .iter()
            .map(|((pipe, stream), (pos, _))| (pipe.clone(), *stream, *pos))
            .collect();
        // Streams whose connection closed are in this part for the last time.
        p.retain(|_, (_, attached)| *attached);
        out
    };
    let _ = ck.parts.send(Part {
        epoch,
        positions,
        states,
        complete: true,
    });
    ck.done.set(epoch);
    ck.aligning.set(false);
    env.resume_all();
    ck.wake_drains();
}

/// Each worker's checkpoint task: on a trigger, sends the barriers and stops the sources until
/// the snapshot; on a durable checkpoint, has the source connections acknowledge it.
///
/// `heads` are the pipelines' heads with the channel each reads, if it reads one: those send
/// their barriers once the channel's writers here are aligned ([`ChannelBarriers`]).
///
/// [`ChannelBarriers`]: super::ckpt::ChannelBarriers
pub(super) async fn worker_task(env: Rc<Env>, heads: Vec<(Option<u64>, Rc<RefCell<dyn Process>>)>) {
    let Some(ck) = &env.ckpt else { return };
    let heads: Vec<_> = {
        let mut c = ck.channels.borrow_mut();
        heads
            .into_iter()
            .filter_map(|(reads, h)| match reads {
                Some(id) => {
                    let send: SendBarrier = Rc::new(move |epoch| h.borrow_mut().barrier(epoch));
                    c.readers.entry(id).or_default().push(send);
                    None
                }
                None => Some(h),
            })
            .collect()
    };
    let coord = ck.coord.clone();
    let wake = coord.wakes[env.me].clone();
    let mut acked = 0;
    loop {
        wake.notified().await;
        if env.shutting.get() {
            return;
        }
        let e = coord.trigger[env.me].load(Ordering::SeqCst);
        if e > ck.epoch.get() {
            ck.epoch.set(e);
            ck.waiting.set(ck.active.get());
            ck.aligning.set(true);
            for h in &heads {
                h.borrow_mut().barrier(e);
            }
            let ready = ck.channels.borrow_mut().start();
            send_barriers(&env, ready);
            if ck.active.get() == 0 {
                snapshot(&env);
            } else {
                ck.wake_drains();
            }
        }
        let a = coord.acks[env.me].load(Ordering::SeqCst);
        if a > acked {
            acked = a;
            for h in env.sources.borrow().iter() {
                h.wake();
            }
        }
    }
}

/// The input has ended on this worker (not a shutdown): waits for a checkpoint taken after the
/// end, so that what the end did (final aggregations emitted and dropped, windows flushed, the
/// sources at their end) is durable, and a run started again on the same directory does not
/// do it again. Bounded by two intervals and ten seconds, or a shutdown.
pub(super) async fn end_in_checkpoint(env: &Env, stopped: &Cell<bool>) {
    let (Some(ck), Some(opts)) = (&env.ckpt, &env.opts.checkpoint) else {
        return;
    };
    let after = ck.done.get();
    let deadline = Instant::now() + opts.interval * 2 + Duration::from_secs(10);
    loop {
        let done = ck.done.get();
        if done > after && ck.coord.acks[env.me].load(Ordering::SeqCst) >= done {
            return;
        }
        if stopped.get() || env.shutting.get() {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                worker = env.me,
                "no checkpoint was made durable after the end of the input: a run started again \
                 on this directory repeats what came after the last one"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
