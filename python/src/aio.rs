//! The worker's asyncio event loop, driven from the canter event loop of the same thread.
//!
//! The loop is a standard `asyncio.SelectorEventLoop` whose selector never blocks
//! (`canter/_runtime.py`): one turn of it (`_run_once`) runs what is ready and returns. The
//! driver task below turns it whenever something may be ready: the selector's epoll descriptor
//! became readable (its sockets, its self-pipe woken by other threads), its next timer is due,
//! or Rust code handed it a task. Coroutines thus run on the worker's own thread, next to the
//! connections, with no thread switch and no lock between them.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

thread_local! {
    static LOOP: RefCell<Option<Rc<WorkerLoop>>> = const { RefCell::new(None) };
}

/// This worker's loop: how to start a coroutine on it, and how to wake its driver.
struct WorkerLoop {
    /// `start(awaitable) -> asyncio.Task`.
    start: Py<PyAny>,
    /// The asyncio loop itself.
    event_loop: Py<PyAny>,
    wake: Rc<Notify>,
}

/// Starts driving `wl` (a `canter._runtime.WorkerLoop`) from the calling worker thread.
pub fn install(wl: &Bound<'_, PyAny>) -> PyResult<()> {
    let wake = Rc::new(Notify::new());
    wl.call_method1("attach", (Wake(wake.clone()),))?;
    // The loop's call_soon in Rust while it is driven (see `soon`).
    let turning = Rc::new(Cell::new(false));
    let event_loop = wl.getattr("loop")?;
    let call_soon =
        crate::soon::CallSoon::new(wl.py(), &event_loop, turning.clone(), wake.clone())?;
    event_loop.setattr("call_soon", Bound::new(wl.py(), call_soon)?)?;
    let fd: RawFd = wl.getattr("fd")?.extract()?;
    let tick = wl.getattr("tick")?.unbind();
    LOOP.with(|l| {
        *l.borrow_mut() = Some(Rc::new(WorkerLoop {
            start: wl.getattr("start")?.unbind(),
            event_loop: event_loop.clone().unbind(),
            wake: wake.clone(),
        }));
        Ok::<_, PyErr>(())
    })?;
    tokio::task::spawn_local(drive(tick, fd, wake, turning));
    Ok(())
}

/// Stops driving the loop (after the worker's event loop has ended).
pub fn uninstall(wl: &Bound<'_, PyAny>) -> PyResult<()> {
    LOOP.with(|l| l.borrow_mut().take());
    // Back to the class's own call_soon (the loop may still run, e.g. the ASGI lifespan's
    // shutdown after the drain).
    wl.getattr("loop")?.delattr("call_soon")?;
    wl.call_method0("detach").map(drop)
}

/// Turns the asyncio loop whenever it may have work, and sleeps otherwise.
async fn drive(tick: Py<PyAny>, fd: RawFd, wake: Rc<Notify>, turning: Rc<Cell<bool>>) {
    // A duplicate of the selector's descriptor, owned here, so it stays open as long as it
    // is registered whatever Python does with the original.
    // SAFETY: `fd` is the open epoll descriptor of the loop's selector; dup only reads it.
    let dup = unsafe { libc::dup(fd) };
    if dup < 0 {
        tracing::error!(
            "asyncio loop: cannot watch its selector: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: `dup` is a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the AsyncFd owns `owned`, so the descriptor stays open while it is registered.
    let afd = match unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) } {
        Ok(afd) => afd,
        Err(e) => {
            tracing::error!("asyncio loop: cannot watch its selector: {e}");
            return;
        }
    };
    loop {
        // Seconds until the loop wants another turn: 0 (it has callbacks ready, or its
        // selector just reported events that may not be drained), a timer's delay, or
        // negative for "only when woken".
        turning.set(true);
        let next = Python::attach(|py| {
            tick.call0(py)
                .and_then(|t| t.extract::<f64>(py))
                .unwrap_or_else(|e| {
                    crate::log_exception(py, &e);
                    0.001
                })
        });
        turning.set(false);
        if next == 0.0 {
            // Let the connections run between turns.
            tokio::task::yield_now().await;
            continue;
        }
        let timer = async {
            if next > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(next.min(86_400.0))).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            ready = afd.readable() => {
                // Cleared before the turn that handles it: an event that comes during the turn
                // sets it again.
                if let Ok(mut g) = ready {
                    g.clear_ready();
                }
            }
            () = timer => {}
            () = wake.notified() => {}
        }
    }
}

/// Called by the loop when something outside a turn schedules work on it.
#[pyclass(unsendable)]
struct Wake(Rc<Notify>);

#[pymethods]
impl Wake {
    fn __call__(&self) {
        self.0.notify_one();
    }
}

/// What a task's done callback and the future awaiting it share.
#[derive(Default)]
struct Wait {
    done: bool,
    waker: Option<Waker>,
}

/// Called by asyncio when the task finishes.
#[pyclass(unsendable)]
struct Done(Rc<RefCell<Wait>>);

#[pymethods]
impl Done {
    fn __call__(&self, _task: &Bound<'_, PyAny>) {
        let mut w = self.0.borrow_mut();
        w.done = true;
        if let Some(waker) = w.waker.take() {
            waker.wake();
        }
    }
}

/// The worker's asyncio loop.
pub fn event_loop(py: Python<'_>) -> PyResult<Py<PyAny>> {
    LOOP.with(|l| l.borrow().as_ref().map(|wl| wl.event_loop.clone_ref(py)))
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("no worker loop"))
}

/// Starts `awaitable` as a task on the worker's loop and lets it run on its own.
pub fn start(py: Python<'_>, awaitable: &Bound<'_, PyAny>) -> PyResult<()> {
    let wl = LOOP
        .with(|l| l.borrow().clone())
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("no worker loop"))?;
    wl.start.bind(py).call1((awaitable,))?;
    wl.wake.notify_one();
    Ok(())
}

/// An awaitable running as an asyncio task on this worker's loop; resolves to its result.
/// Dropped before the end (the client went away, the handler timed out), it cancels the task.
pub struct Task {
    task: Option<Py<PyAny>>,
    wait: Rc<RefCell<Wait>>,
}

/// Starts `awaitable` as a task on the worker's loop. On Python 3.12 and later it runs at once
/// up to its first suspension (an eager task), so a handler that never waits is done here.
pub fn spawn(py: Python<'_>, awaitable: &Bound<'_, PyAny>) -> PyResult<Task> {
    let wl = LOOP
        .with(|l| l.borrow().clone())
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("no worker loop"))?;
    let task = wl.start.bind(py).call1((awaitable,))?;
    let wait = Rc::new(RefCell::new(Wait::default()));
    if task.call_method0(pyo3::intern!(py, "done"))?.is_truthy()? {
        wait.borrow_mut().done = true;
    } else {
        task.call_method1(
            pyo3::intern!(py, "add_done_callback"),
            (Done(wait.clone()),),
        )?;
        wl.wake.notify_one();
    }
    Ok(Task {
        task: Some(task.unbind()),
        wait,
    })
}

impl Future for Task {
    type Output = PyResult<Py<PyAny>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        {
            let mut w = this.wait.borrow_mut();
            if !w.done {
                if !w.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                    w.waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        let Some(task) = this.task.take() else {
            return Poll::Ready(Err(pyo3::exceptions::PyRuntimeError::new_err(
                "task polled after completion",
            )));
        };
        Poll::Ready(Python::attach(|py| {
            task.bind(py)
                .call_method0(pyo3::intern!(py, "result"))
                .map(Bound::unbind)
        }))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            if !self.wait.borrow().done {
                Python::attach(|py| {
                    let _ = task.bind(py).call_method0(pyo3::intern!(py, "cancel"));
                });
                LOOP.with(|l| {
                    if let Some(wl) = &*l.borrow() {
                        wl.wake.notify_one();
                    }
                });
            }
        }
    }
}
