//! `loop.call_soon` for the driven asyncio loop, in Rust.
//!
//! Every asyncio task schedules each of its steps with `loop.call_soon`, and every finished
//! future its callbacks. In the standard loop that is four Python frames
//! (`BaseEventLoop.call_soon`, `_call_soon`, `events.Handle.__init__`, and the driven loop's
//! wake-up check on top) and one more to run the handle (`Handle._run`). Here it is one call
//! into Rust that makes a [`Handle`], appends it to the loop's ready queue and, when the loop
//! is not being turned, wakes its driver; the loop's `_run_once` runs it as it runs its own
//! handles (it reads `_cancelled` and calls `_run()`).

use std::cell::Cell;
use std::rc::Rc;

use pyo3::exceptions::{PyKeyboardInterrupt, PySystemExit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tokio::sync::Notify;

/// Installed as the driven loop's `call_soon` (an instance attribute, so it takes the place of
/// the class's method for every caller: tasks, futures, handlers).
#[pyclass(unsendable)]
pub struct CallSoon {
    /// The loop, for the handles (their exception reports go to its exception handler).
    loop_: Py<PyAny>,
    /// `loop._ready.append`.
    append: Py<PyAny>,
    /// `contextvars.copy_context`, for callers that give no context.
    copy_context: Py<PyAny>,
    /// Set by the driver while it turns the loop: a callback scheduled then runs in a later
    /// part of the same turn's cycle, with no wake-up needed.
    turning: Rc<Cell<bool>>,
    wake: Rc<Notify>,
}

impl CallSoon {
    pub fn new(
        py: Python<'_>,
        loop_: &Bound<'_, PyAny>,
        turning: Rc<Cell<bool>>,
        wake: Rc<Notify>,
    ) -> PyResult<CallSoon> {
        Ok(CallSoon {
            loop_: loop_.clone().unbind(),
            append: loop_.getattr("_ready")?.getattr("append")?.unbind(),
            copy_context: py.import("contextvars")?.getattr("copy_context")?.unbind(),
            turning,
            wake,
        })
    }
}

#[pymethods]
impl CallSoon {
    /// `call_soon(callback, *args, context=None)`, as asyncio's: returns the handle.
    #[pyo3(signature = (callback, *args, context=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        callback: Py<PyAny>,
        args: Py<PyTuple>,
        context: Option<Py<PyAny>>,
    ) -> PyResult<Py<Handle>> {
        let context = match context {
            Some(c) if !c.is_none(py) => c,
            _ => self.copy_context.call0(py)?,
        };
        let handle = Py::new(
            py,
            Handle {
                callback: Some(callback),
                args: Some(args),
                context,
                loop_: self.loop_.clone_ref(py),
                cancelled: false,
            },
        )?;
        self.append.call1(py, (handle.clone_ref(py),))?;
        if !self.turning.get() {
            self.wake.notify_one();
        }
        Ok(handle)
    }
}

/// A callback scheduled with [`CallSoon`]: what `asyncio.Handle` is to the standard loop, with
/// the same attributes and methods the loop and user code use.
#[pyclass(module = "canter._native")]
pub struct Handle {
    callback: Option<Py<PyAny>>,
    args: Option<Py<PyTuple>>,
    context: Py<PyAny>,
    loop_: Py<PyAny>,
    #[pyo3(get, name = "_cancelled")]
    cancelled: bool,
}

#[pymethods]
impl Handle {
    /// Runs the callback in its context. An exception other than SystemExit or
    /// KeyboardInterrupt goes to the loop's exception handler, as asyncio's handles do.
    fn _run(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let (callback, args, context) = {
            let h = slf.borrow();
            let (Some(callback), Some(args)) = (&h.callback, &h.args) else {
                return Ok(());
            };
            (
                callback.clone_ref(py),
                args.clone_ref(py),
                h.context.clone_ref(py),
            )
        };
        let run = intern!(py, "run");
        let context = context.bind(py);
        // A task's step has no arguments and a future's callback one: no list for those.
        let result = match args.bind(py).len() {
            0 => context.call_method1(run, (&callback,)),
            1 => context.call_method1(run, (&callback, args.bind(py).get_item(0)?)),
            n => {
                let mut call = Vec::with_capacity(1 + n);
                call.push(callback.clone_ref(py));
                call.extend(args.bind(py).iter().map(Bound::unbind));
                context.call_method1(run, PyTuple::new(py, call)?)
            }
        };
        let Err(e) = result else {
            return Ok(());
        };
        if e.is_instance_of::<PySystemExit>(py) || e.is_instance_of::<PyKeyboardInterrupt>(py) {
            return Err(e);
        }
        let report = PyDict::new(py);
        let source = callback
            .bind(py)
            .repr()
            .map_or_else(|_| "<callback>".to_owned(), |r| r.to_string());
        report.set_item("message", format!("Exception in callback {source}"))?;
        report.set_item("exception", e.value(py))?;
        report.set_item("handle", slf)?;
        let loop_ = slf.borrow().loop_.clone_ref(py);
        loop_
            .bind(py)
            .call_method1("call_exception_handler", (report,))?;
        Ok(())
    }

    /// Cancels the callback if it has not run (it is dropped now, as asyncio does).
    fn cancel(&mut self) {
        if !self.cancelled {
            self.cancelled = true;
            self.callback = None;
            self.args = None;
        }
    }

    fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn get_context(&self, py: Python<'_>) -> Py<PyAny> {
        self.context.clone_ref(py)
    }

    #[getter]
    fn _callback(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.callback.as_ref().map(|c| c.clone_ref(py))
    }

    #[getter]
    fn _args(&self, py: Python<'_>) -> Option<Py<PyTuple>> {
        self.args.as_ref().map(|a| a.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match (&self.callback, self.cancelled) {
            (_, true) => "<Handle cancelled>".to_owned(),
            (Some(c), false) => {
                let c = c
                    .bind(py)
                    .repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string());
                format!("<Handle {c}>")
            }
            (None, false) => "<Handle>".to_owned(),
        }
    }
}
