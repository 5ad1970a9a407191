//! Broadcast to WebSocket connections on every worker: [`Hub`] (`canter_rt::WsHub`).
//!
//! Subscribers are kept per worker thread, in the thread's own list: a publish hands the one
//! [`Prepared`] frame (shared bytes, not a copy) to each worker that has subscribers, through a
//! bounded queue, and that worker's fan-out task gives it to each of its connections without
//! waiting on any: a connection whose output is at its high-water mark misses the message
//! (counted in [`Hub::skipped`]), as does a whole worker whose queue is full
//! ([`Hub::dropped`]), rather than holding the others back or queueing without bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::ws::{Prepared, WsSender};

/// Messages a worker's queue holds before publishes to it are dropped.
const WORKER_QUEUE: usize = 1024;

static NEXT_HUB: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's subscribers, per hub.
    static LOCAL: RefCell<HashMap<usize, Rc<RefCell<Vec<WsSender>>>>> = RefCell::new(HashMap::new());
}

/// A broadcast group of WebSocket connections across workers. Clone it (it is shared) into
/// every worker's service; [`Hub::subscribe`] from a connection's handler, [`Hub::publish`]
/// from anywhere.
///
/// ```no_run
/// use canter_rt::ws::{Message, Prepared};
/// use canter_rt::{Reply, Request, WsHub, WsUpgrade};
///
/// fn chat(hub: WsHub) -> impl Fn(Request) -> Reply {
///     move |req: Request| match WsUpgrade::from_request(&req) {
///         Ok(ws) => {
///             let hub = hub.clone();
///             ws.on_upgrade(move |socket| async move {
///                 let (tx, rx) = socket.split();
///                 hub.subscribe(tx);
///                 while let Some(Ok(Message::Text(line))) = rx.recv().await {
///                     hub.publish(&Prepared::text(&line));
///                 }
///             })
///             .into()
///         }
///         Err(refused) => canter_rt::Response::from(refused).into(),
///     }
/// }
/// # let _ = chat;
/// ```
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    id: usize,
    /// The queue of each worker that has subscribers.
    workers: Mutex<Vec<mpsc::Sender<Prepared>>>,
    dropped: AtomicU64,
    skipped: AtomicU64,
    delivered: AtomicU64,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("delivered", &self.delivered())
            .field("skipped", &self.skipped())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new()
    }
}

impl Hub {
    /// An empty hub.
    pub fn new() -> Hub {
        Hub {
            inner: Arc::new(Inner {
                id: NEXT_HUB.fetch_add(1, Ordering::Relaxed),
                workers: Mutex::new(Vec::new()),
                dropped: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
                delivered: AtomicU64::new(0),
            }),
        }
    }

    /// Adds a connection (its sending half) on the calling worker; it leaves the hub when it
    /// closes. Call it from a connection's handler: the first subscriber of a worker starts
    /// that worker's fan-out task (a task of the worker's event loop).
    pub fn subscribe(&self, sender: WsSender) {
        let list = LOCAL.with(|local| {
            let mut local = local.borrow_mut();
            if let Some(list) = local.get(&self.inner.id) {
                return list.clone();
            }
            let list: Rc<RefCell<Vec<WsSender>>> = Rc::default();
            local.insert(self.inner.id, list.clone());
            let (tx, rx) = mpsc::channel(WORKER_QUEUE);
            if let Ok(mut workers) = self.inner.workers.lock() {
                workers.push(tx);
            }
            tokio::task::spawn_local(fan_out(rx, list.clone(), self.inner.clone()));
            list
        });
        list.borrow_mut().push(sender);
    }

    /// Sends `msg` to every subscriber on every worker, without waiting: a worker whose queue
    /// is full misses it (counted in [`Hub::dropped`]). The frame's bytes are shared, not
    /// copied per connection.
    pub fn publish(&self, msg: &Prepared) {
        let Ok(mut workers) = self.inner.workers.lock() else {
            return;
        };
        workers.retain(|tx| match tx.try_send(msg.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.inner.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            // The worker's fan-out ended (its thread is gone).
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    /// Messages handed to connections.
    pub fn delivered(&self) -> u64 {
        self.inner.delivered.load(Ordering::Relaxed)
    }

    /// Messages a connection missed because its output was at its high-water mark.
    pub fn skipped(&self) -> u64 {
        self.inner.skipped.load(Ordering::Relaxed)
    }

    /// Messages a whole worker missed because its queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Subscribers on the calling worker (closed ones leave at the next message).
    pub fn local_subscribers(&self) -> usize {
        LOCAL.with(|local| {
            local
                .borrow()
                .get(&self.inner.id)
                .map_or(0, |list| list.borrow().len())
        })
    }
}

/// One worker's fan-out: each message to each open subscriber, none waited on.
async fn fan_out(
    mut rx: mpsc::Receiver<Prepared>,
    list: Rc<RefCell<Vec<WsSender>>>,
    inner: Arc<Inner>,
) {
    while let Some(msg) = rx.recv().await {
        let (mut delivered, mut skipped) = (0, 0);
        list.borrow_mut()
            .retain(|sender| match sender.try_send_prepared(&msg) {
                Ok(true) => {
                    delivered += 1;
                    true
                }
                Ok(false) => {
                    skipped += 1;
                    true
                }
                Err(_) => false,
            });
        inner.delivered.fetch_add(delivered, Ordering::Relaxed);
        inner.skipped.fetch_add(skipped, Ordering::Relaxed);
    }
}
