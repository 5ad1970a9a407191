//! Response bodies streamed from Python iterators and async iterators, pulled only while the
//! client keeps up (the connection asks for the next piece when its output has room).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use canter_rt::{Body, BodyStream};
use pyo3::exceptions::{PyStopAsyncIteration, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PyString};

use crate::aio;

/// The body for `Response(stream=obj)`: chunked, from an async iterator if `obj` has
/// `__aiter__`, else from `iter(obj)`.
pub fn body(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Body> {
    if obj.hasattr(pyo3::intern!(py, "__aiter__"))? {
        let it = obj.call_method0(pyo3::intern!(py, "__aiter__"))?;
        return Ok(Body::stream(
            None,
            AsyncPieces {
                it: it.unbind(),
                next: None,
            },
        ));
    }
    let it = obj.try_iter().map_err(|_| {
        PyTypeError::new_err("stream must be an iterable or an async iterable of str or bytes")
    })?;
    Ok(Body::stream(None, Pieces(it.into_any().unbind())))
}

/// One piece as bytes.
fn piece(v: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = v.cast::<PyBytes>() {
        Ok(Bytes::copy_from_slice(b.as_bytes()))
    } else if let Ok(s) = v.cast::<PyString>() {
        Ok(Bytes::copy_from_slice(s.to_str()?.as_bytes()))
    } else {
        Err(PyTypeError::new_err(format!(
            "a streamed piece must be str or bytes, not {}",
            v.get_type().name()?
        )))
    }
}

/// Logs the error with its traceback and aborts the body (the client sees a cut response).
fn abort(py: Python<'_>, e: &PyErr) -> Option<io::Result<Bytes>> {
    crate::log_exception(py, e);
    Some(Err(io::Error::other(
        "the response stream raised an exception",
    )))
}

struct Pieces(Py<PyAny>);

impl BodyStream for Pieces {
    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        Poll::Ready(Python::attach(|py| {
            let it = self.0.bind(py);
            let Ok(it) = it.cast::<PyIterator>() else {
                return Some(Err(io::Error::other("not an iterator")));
            };
            match it.clone().next()? {
                Ok(v) => match piece(&v) {
                    Ok(b) => Some(Ok(b)),
                    Err(e) => abort(py, &e),
                },
                Err(e) => abort(py, &e),
            }
        }))
    }
}

struct AsyncPieces {
    it: Py<PyAny>,
    next: Option<aio::Task>,
}

impl BodyStream for AsyncPieces {
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        let this = self.get_mut();
        if this.next.is_none() {
            let started = Python::attach(|py| {
                let aw = this
                    .it
                    .bind(py)
                    .call_method0(pyo3::intern!(py, "__anext__"))?;
                aio::spawn(py, &aw)
            });
            match started {
                Ok(t) => this.next = Some(t),
                Err(e) => return Poll::Ready(Python::attach(|py| abort(py, &e))),
            }
        }
        let Some(task) = this.next.as_mut() else {
            return Poll::Ready(None);
        };
        let out = match Pin::new(task).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(out) => out,
        };
        this.next = None;
        Poll::Ready(Python::attach(|py| match out {
            Ok(v) => match piece(v.bind(py)) {
                Ok(b) => Some(Ok(b)),
                Err(e) => abort(py, &e),
            },
            Err(e) if e.is_instance_of::<PyStopAsyncIteration>(py) => None,
            Err(e) => abort(py, &e),
        }))
    }
}
