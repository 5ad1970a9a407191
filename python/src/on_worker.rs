//! Worker state held by a Python object that may be dropped on any thread.
//!
//! An ASGI app's `receive` and `send` share the exchange with the connection's task: worker-only
//! state (`Rc`, `RefCell`). Python decides where they are dropped: an app that keeps them in a
//! reference cycle (Django does) has them freed by the cycle collector on whatever thread runs
//! it, a `sync_to_async` thread included. [`OnWorker`] makes that safe: the value is reached only
//! on the thread that made it, and a drop elsewhere hands it back to that thread, which drops
//! it when it next serves a request ([`drop_returned`]).

use std::any::Any;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::{self, ThreadId};

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

/// A value of the thread that made it.
pub(crate) struct OnWorker<T: 'static> {
    value: ManuallyDrop<T>,
    owner: ThreadId,
}

// SAFETY: the value is reached only on its owner thread (`get` checks the thread) and dropped
// only there (`Drop` hands it back to the owner from any other thread, moving it without
// touching it), so no two threads ever use it.
unsafe impl<T: 'static> Send for OnWorker<T> {}
// SAFETY: as for `Send`: a shared reference gives access to the value on the owner thread only.
unsafe impl<T: 'static> Sync for OnWorker<T> {}

impl<T: 'static> OnWorker<T> {
    /// Holds `value`, which belongs to the calling thread.
    pub(crate) fn new(value: T) -> OnWorker<T> {
        OnWorker {
            value: ManuallyDrop::new(value),
            owner: thread::current().id(),
        }
    }

    /// The value, on its owner thread; an error elsewhere.
    pub(crate) fn get(&self) -> PyResult<&T> {
        if thread::current().id() == self.owner {
            Ok(&self.value)
        } else {
            Err(PyRuntimeError::new_err(
                "an ASGI receive or send was called outside the worker thread of its request",
            ))
        }
    }
}

impl<T: 'static> Drop for OnWorker<T> {
    fn drop(&mut self) {
        // SAFETY: `value` is taken once, here, and `self` is not used after.
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        if thread::current().id() == self.owner {
            drop(value);
            return;
        }
        let mut returned = RETURNED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        returned.push((
            self.owner,
            Returned {
                _value: Box::new(value),
            },
        ));
        PENDING.fetch_add(1, Ordering::Release);
    }
}

/// A value dropped off its thread, on its way back.
struct Returned {
    _value: Box<dyn Any>,
}

// SAFETY: a `Returned` is only moved between threads, never used, and dropped on its owner
// thread (`drop_returned` takes only the calling thread's).
unsafe impl Send for Returned {}

/// Values dropped off their threads, with their owners.
static RETURNED: Mutex<Vec<(ThreadId, Returned)>> = Mutex::new(Vec::new());
/// How many values wait in `RETURNED`: read without the lock on every request.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Drops the values of the calling thread that were dropped elsewhere. Costs one atomic load
/// when there are none.
pub(crate) fn drop_returned() {
    if PENDING.load(Ordering::Acquire) == 0 {
        return;
    }
    let me = thread::current().id();
    let mine: Vec<Returned> = {
        let mut returned = RETURNED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (mine, others): (Vec<_>, Vec<_>) = returned.drain(..).partition(|(t, _)| *t == me);
        *returned = others;
        mine.into_iter().map(|(_, v)| v).collect()
    };
    PENDING.fetch_sub(mine.len(), Ordering::Release);
    drop(mine);
}
