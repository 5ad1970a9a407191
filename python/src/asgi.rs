//! ASGI 3 applications on the engine: `http` scopes built in Rust, `receive` and `send` as
//! Rust callables sharing one exchange with the connection's task.
//!
//! The app runs as an asyncio task on the worker's loop. The connection's task waits for the
//! response start and its first body message; a response sent whole (`more_body` false) goes
//! out as one full body, anything else streams, pulled as the client keeps up: `send` of a body
//! message waits while more than [`HIGH_WATER`] bytes are queued. The request body is read only
//! when the app awaits `receive`. When the connection ends (the client left, or the response
//! is complete), a waiting `receive` gets `http.disconnect`, and `send` raises
//! `ClientDisconnected` once the client is gone.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use canter_rt::http::{header, HeaderName, HeaderValue, StatusCode};
use canter_rt::{Body, BodyStream, Reply, Request, RequestBody, Response as RtResponse};
use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::on_worker::{self, OnWorker};
use crate::{aio, request};

/// Body bytes `send` may queue before it waits for the client.
const HIGH_WATER: usize = 64 * 1024;

pyo3::create_exception!(
    canter,
    ClientDisconnected,
    pyo3::exceptions::PyOSError,
    "Raised by an ASGI `send` once the client has gone."
);

/// One request's exchange between the app and the connection.
#[derive(Default)]
struct Exchange {
    status: Option<StatusCode>,
    headers: Vec<(HeaderName, HeaderValue)>,
    content_length: Option<u64>,
    chunks: VecDeque<Bytes>,
    queued: usize,
    body_done: bool,
    /// The app ended (returned or raised) without completing the response.
    app_ended: bool,
    /// The connection's task (the reply future or the body stream) waiting for the app.
    waker: Option<Waker>,
    /// A `send` waiting for the queue to drain: an asyncio future.
    send_waiter: Option<Py<PyAny>>,
    /// The request body, until read to its end.
    body: Option<RequestBody>,
    /// `receive` calls waiting for the body or the disconnect: asyncio futures, oldest first.
    /// Several may wait at once (Starlette polls for the disconnect while another task
    /// listens for it); body messages go to the oldest that is still waiting.
    recv_waiters: VecDeque<Py<PyAny>>,
    /// The connection is over (client gone or response complete).
    closed: bool,
}

type Shared = Rc<RefCell<Exchange>>;

impl Exchange {
    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Feeds a waiting `receive` from the request body; called from the connection's task.
    fn serve_receive(&mut self, py: Python<'_>, cx: &mut Context<'_>) {
        // Waiters cancelled meanwhile (a timeout around `receive`) are gone.
        while let Some(fut) = self.recv_waiters.front() {
            if is_done(py, fut) {
                self.recv_waiters.pop_front();
            } else {
                break;
            }
        }
        if self.recv_waiters.is_empty() {
            return;
        }
        let Some(body) = self.body.as_mut() else {
            return; // body over: the waiter gets http.disconnect when the connection ends
        };
        let msg = match body.poll_chunk(cx) {
            Poll::Pending => return,
            Poll::Ready(Some(Ok(chunk))) => request_message(py, &chunk, true),
            Poll::Ready(None) => {
                self.body = None;
                request_message(py, b"", false)
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!("ASGI request body: {e}");
                self.body = None;
                disconnect_message(py)
            }
        };
        if let (Some(fut), Ok(msg)) = (self.recv_waiters.pop_front(), msg) {
            resolve(py, &fut, msg.into_any());
        }
    }

    /// The connection is over: wake everything the app waits on.
    fn close(&mut self, py: Python<'_>) {
        if self.closed {
            return;
        }
        self.closed = true;
        for fut in std::mem::take(&mut self.recv_waiters) {
            if let Ok(msg) = disconnect_message(py) {
                resolve(py, &fut, msg.into_any());
            }
        }
        if let Some(fut) = self.send_waiter.take() {
            let err = ClientDisconnected::new_err("the client has gone");
            let done = fut
                .bind(py)
                .call_method0("done")
                .and_then(|d| d.is_truthy());
            if let Ok(false) = done {
                let _ = fut.bind(py).call_method1("set_exception", (err.value(py),));
            }
        }
    }
}

pub(crate) fn is_done(py: Python<'_>, fut: &Py<PyAny>) -> bool {
    fut.bind(py)
        .call_method0(pyo3::intern!(py, "done"))
        .and_then(|d| d.is_truthy())
        .unwrap_or(true)
}

/// Sets an asyncio future's result unless it is already done (cancelled, say).
pub(crate) fn resolve(py: Python<'_>, fut: &Py<PyAny>, value: Bound<'_, PyAny>) {
    if !is_done(py, fut) {
        if let Err(e) = fut.bind(py).call_method1("set_result", (value,)) {
            crate::log_exception(py, &e);
        }
    }
}

fn request_message<'py>(py: Python<'py>, body: &[u8], more: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(pyo3::intern!(py, "type"), pyo3::intern!(py, "http.request"))?;
    d.set_item(pyo3::intern!(py, "body"), PyBytes::new(py, body))?;
    d.set_item(pyo3::intern!(py, "more_body"), more)?;
    Ok(d)
}

fn disconnect_message(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(
        pyo3::intern!(py, "type"),
        pyo3::intern!(py, "http.disconnect"),
    )?;
    Ok(d)
}

/// An awaitable that is done at once with `value` (what `receive` and `send` return when they
/// need not wait: cheaper than a finished asyncio future).
#[pyclass(module = "canter")]
pub struct Ready {
    value: Option<Py<PyAny>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Done at once: with no value, as the end of iteration (no exception object made, which
    /// is most of what an `await send(...)` costs otherwise); with one, as StopIteration(value).
    fn __next__(&mut self) -> PyResult<Option<()>> {
        match self.value.take() {
            None => Ok(None),
            Some(value) => Err(PyStopIteration::new_err((value,))),
        }
    }
}

pub(crate) fn ready<'py>(
    py: Python<'py>,
    value: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(Bound::new(
        py,
        Ready {
            value: value.map(Bound::unbind),
        },
    )?
    .into_any())
}

/// The `receive` callable of one request. It may be dropped on any thread (an app that keeps it
/// in a reference cycle has it freed by the cycle collector wherever that runs); the exchange
/// stays the worker's ([`OnWorker`]).
#[pyclass(module = "canter")]
pub struct Receive {
    ex: OnWorker<Shared>,
    loop_: Py<PyAny>,
}

#[pymethods]
impl Receive {
    fn __call__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut ex = self.ex.get()?.borrow_mut();
        if ex.closed {
            return ready(py, Some(disconnect_message(py)?.into_any()));
        }
        // No body at all: the one message now.
        if ex
            .body
            .as_ref()
            .is_some_and(|b| b.content_length() == Some(0))
        {
            ex.body = None;
            return ready(py, Some(request_message(py, b"", false)?.into_any()));
        }
        let fut = self.loop_.bind(py).call_method0("create_future")?;
        ex.recv_waiters.push_back(fut.clone().unbind());
        ex.wake();
        Ok(fut)
    }
}

/// The `send` callable of one request; dropped on any thread as [`Receive`] is.
#[pyclass(module = "canter")]
pub struct Send {
    ex: OnWorker<Shared>,
    loop_: Py<PyAny>,
}

#[pymethods]
impl Send {
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind = message.get_item(pyo3::intern!(py, "type"))?;
        let kind = kind.cast::<PyString>()?.to_str()?;
        let mut ex = self.ex.get()?.borrow_mut();
        match kind {
            "http.response.start" => {
                if ex.status.is_some() {
                    return Err(PyRuntimeError::new_err("http.response.start sent twice"));
                }
                let status: u16 = message.get_item(pyo3::intern!(py, "status"))?.extract()?;
                let status = StatusCode::from_u16(status)
                    .map_err(|_| PyValueError::new_err(format!("invalid status {status}")))?;
                if let Some(headers) = field(message, pyo3::intern!(py, "headers"))? {
                    for pair in headers.try_iter()? {
                        let pair = pair?;
                        let name = pair.get_item(0)?;
                        let value = pair.get_item(1)?;
                        let name = name.cast::<PyBytes>()?.as_bytes();
                        let value = value.cast::<PyBytes>()?.as_bytes();
                        add_header(&mut ex, name, value)?;
                    }
                }
                ex.status = Some(status);
                ex.wake();
                ready(py, None)
            }
            "http.response.body" => {
                if ex.status.is_none() {
                    return Err(PyRuntimeError::new_err(
                        "http.response.body sent before http.response.start",
                    ));
                }
                if ex.closed {
                    return Err(ClientDisconnected::new_err("the client has gone"));
                }
                if ex.body_done {
                    return Err(PyRuntimeError::new_err(
                        "http.response.body sent after the last one",
                    ));
                }
                if let Some(body) = field(message, pyo3::intern!(py, "body"))? {
                    let body = body.cast::<PyBytes>()?.as_bytes();
                    if !body.is_empty() {
                        ex.queued += body.len();
                        ex.chunks.push_back(Bytes::copy_from_slice(body));
                    }
                }
                let more = match field(message, pyo3::intern!(py, "more_body"))? {
                    Some(m) => m.is_truthy()?,
                    None => false,
                };
                if !more {
                    ex.body_done = true;
                }
                ex.wake();
                if ex.queued > HIGH_WATER && more {
                    let fut = self.loop_.bind(py).call_method0("create_future")?;
                    ex.send_waiter = Some(fut.clone().unbind());
                    return Ok(fut);
                }
                ready(py, None)
            }
            other => Err(PyValueError::new_err(format!(
                "unsupported ASGI message type {other:?}"
            ))),
        }
    }

    /// Called by the task wrapper when the app returned or raised.
    fn ended(&self, py: Python<'_>) -> PyResult<()> {
        let mut ex = self.ex.get()?.borrow_mut();
        ex.app_ended = true;
        ex.wake();
        let _ = py;
        Ok(())
    }
}

/// An optional key of an ASGI message, without raising (and clearing) a KeyError when the
/// message is a dict, as it always is in practice.
pub(crate) fn field<'py>(
    message: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(d) = message.cast::<PyDict>() {
        return d.get_item(key);
    }
    match message.get_item(key) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(message.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

fn add_header(ex: &mut Exchange, name: &[u8], value: &[u8]) -> PyResult<()> {
    let bad = || {
        PyValueError::new_err(format!(
            "invalid response header {:?}: {:?}",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(value)
        ))
    };
    let name = HeaderName::from_bytes(name).map_err(|_| bad())?;
    let value = HeaderValue::from_bytes(value).map_err(|_| bad())?;
    if name == header::CONTENT_LENGTH {
        let n = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(bad)?;
        ex.content_length = Some(n);
    } else if name == header::TRANSFER_ENCODING
        || name == header::CONNECTION
        || name == header::SERVER
        || name == header::DATE
    {
        // The engine frames the body and writes Server and Date itself.
    } else {
        ex.headers.push((name, value));
    }
    Ok(())
}

/// Marks the exchange closed when the connection is done with it.
struct Closing(Shared);

impl Drop for Closing {
    fn drop(&mut self) {
        Python::attach(|py| self.0.borrow_mut().close(py));
    }
}

/// An ASGI app served on one worker.
pub struct Asgi {
    pub(crate) run: Py<PyAny>,
    pub(crate) app: Py<PyAny>,
    pub(crate) loop_: Py<PyAny>,
    pub(crate) state: Option<Py<PyDict>>,
    pub(crate) root_path: Py<PyString>,
    /// `(host, port)`, made once: tuples and str are immutable, so every scope shares them.
    pub(crate) server: Py<PyTuple>,
    pub(crate) asgi: Py<PyDict>,
}

impl Asgi {
    /// Starts the app on `req`; the reply waits for its response.
    pub fn call(&self, req: Request) -> Reply {
        // The exchanges of earlier requests whose `receive` or `send` another thread freed.
        on_worker::drop_returned();
        let upgrade = req
            .header("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case(b"websocket"))
            || req
                .extensions()
                .get::<canter_rt::ConnectProtocol>()
                .is_some();
        if upgrade {
            // Never an `http` scope (where an app that ignores the scope type would answer 200).
            return self.websocket(req);
        }
        let peer = canter_rt::peer_addr();
        let (head, body, _) = req.into_parts();
        let ex: Shared = Rc::new(RefCell::new(Exchange {
            body: Some(body),
            ..Exchange::default()
        }));
        let started = Python::attach(|py| -> PyResult<()> {
            let scope = self.scope(py, &head, peer)?;
            let receive = Bound::new(
                py,
                Receive {
                    ex: OnWorker::new(ex.clone()),
                    loop_: self.loop_.clone_ref(py),
                },
            )?;
            let send = Bound::new(
                py,
                Send {
                    ex: OnWorker::new(ex.clone()),
                    loop_: self.loop_.clone_ref(py),
                },
            )?;
            let coro = self
                .run
                .bind(py)
                .call1((self.app.bind(py), scope, receive, send))?;
            aio::start(py, &coro)
        });
        if let Err(e) = started {
            return Reply::Ready(Python::attach(|py| crate::error_response(py, &e)));
        }
        Reply::future(Respond {
            ex: Some(Closing(ex)),
        })
    }

    pub(crate) fn scope<'py>(
        &self,
        py: Python<'py>,
        head: &canter_rt::RequestHead,
        peer: Option<std::net::SocketAddr>,
    ) -> PyResult<Bound<'py, PyDict>> {
        use pyo3::intern;
        let d = PyDict::new(py);
        d.set_item(intern!(py, "type"), intern!(py, "http"))?;
        d.set_item(intern!(py, "asgi"), self.asgi.bind(py))?;
        let version = match head.version() {
            canter_rt::Version::Http10 => intern!(py, "1.0"),
            canter_rt::Version::Http11 => intern!(py, "1.1"),
            canter_rt::Version::Http3 => intern!(py, "3"),
            _ => intern!(py, "2"),
        };
        d.set_item(intern!(py, "http_version"), version)?;
        d.set_item(
            intern!(py, "method"),
            PyString::intern(py, head.method_str()),
        )?;
        let scheme = if canter_rt::peer_is_tls() {
            intern!(py, "https")
        } else {
            intern!(py, "http")
        };
        d.set_item(intern!(py, "scheme"), scheme)?;
        d.set_item(intern!(py, "path"), &*request::decode(head.path()))?;
        d.set_item(
            intern!(py, "raw_path"),
            PyBytes::new(py, head.path().as_bytes()),
        )?;
        d.set_item(
            intern!(py, "query_string"),
            PyBytes::new(py, head.query().unwrap_or("").as_bytes()),
        )?;
        d.set_item(intern!(py, "root_path"), self.root_path.bind(py))?;
        let headers = PyList::empty(py);
        let mut lower = Vec::new();
        for (n, v) in head.headers() {
            lower.clear();
            lower.extend(n.bytes().map(|b| b.to_ascii_lowercase()));
            headers.append(PyTuple::new(
                py,
                [PyBytes::new(py, &lower), PyBytes::new(py, v)],
            )?)?;
        }
        d.set_item(intern!(py, "headers"), headers)?;
        match peer {
            Some(a) => d.set_item(intern!(py, "client"), (a.ip().to_string(), a.port()))?,
            None => d.set_item(intern!(py, "client"), py.None())?,
        }
        d.set_item(intern!(py, "server"), self.server.bind(py))?;
        if let Some(state) = &self.state {
            d.set_item(intern!(py, "state"), state.bind(py).copy()?)?;
        }
        Ok(d)
    }
}

/// Waits for the app's response start and first body message.
struct Respond {
    ex: Option<Closing>,
}

impl Future for Respond {
    type Output = RtResponse;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RtResponse> {
        let this = self.get_mut();
        let Some(closing) = this.ex.as_ref() else {
            return Poll::Ready(RtResponse::new(StatusCode::INTERNAL_SERVER_ERROR));
        };
        let shared = closing.0.clone();
        let mut ex = shared.borrow_mut();
        Python::attach(|py| ex.serve_receive(py, cx));
        let Some(status) = ex.status else {
            if ex.app_ended {
                // Ended without a response (the exception, if any, is logged by the wrapper).
                return Poll::Ready(crate::error_json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error",
                ));
            }
            ex.waker = Some(cx.waker().clone());
            return Poll::Pending;
        };
        if !ex.body_done && ex.chunks.is_empty() && !ex.app_ended {
            ex.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut res = RtResponse::new(status);
        for (n, v) in ex.headers.drain(..) {
            res.append_header(n, v);
        }
        if ex.body_done {
            // The whole body is here: one full body.
            let body = match ex.chunks.len() {
                0 => Bytes::new(),
                1 => ex.chunks.pop_front().unwrap_or_default(),
                _ => {
                    let mut all = BytesMut::with_capacity(ex.queued);
                    for c in ex.chunks.drain(..) {
                        all.extend_from_slice(&c);
                    }
                    all.freeze()
                }
            };
            ex.queued = 0;
            drop(ex);
            if let Some(n) = shared.borrow().content_length {
                if n != body.len() as u64 {
                    tracing::warn!(
                        "ASGI app declared Content-Length {n} and sent {} bytes",
                        body.len()
                    );
                }
            }
            // `closing` drops with `this.ex` when the connection drops this future.
            return Poll::Ready(res.with_body(body));
        }
        let len = ex.content_length;
        drop(ex);
        let stream = Pieces { ex: this.ex.take() };
        Poll::Ready(res.with_body(Body::stream(len, stream)))
    }
}

/// The body of a streamed ASGI response.
struct Pieces {
    ex: Option<Closing>,
}

impl BodyStream for Pieces {
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        let this = self.get_mut();
        let Some(closing) = this.ex.as_ref() else {
            return Poll::Ready(None);
        };
        let shared = closing.0.clone();
        let mut ex = shared.borrow_mut();
        Python::attach(|py| {
            ex.serve_receive(py, cx);
            if let Some(chunk) = ex.chunks.pop_front() {
                ex.queued -= chunk.len();
                if ex.queued <= HIGH_WATER / 2 {
                    if let Some(fut) = ex.send_waiter.take() {
                        resolve(py, &fut, py.None().into_bound(py));
                    }
                }
                return Poll::Ready(Some(Ok(chunk)));
            }
            if ex.body_done {
                return Poll::Ready(None);
            }
            if ex.app_ended {
                return Poll::Ready(Some(Err(io::Error::other(
                    "the ASGI app ended before its last body message",
                ))));
            }
            ex.waker = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}
