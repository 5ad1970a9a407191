//! ASGI `websocket` scopes: an upgrade (HTTP/1.1's, or HTTP/2's extended CONNECT) is handed
//! to the app as the ASGI spec says. Its first `receive` is `websocket.connect`; the app answers
//! `websocket.accept` (the connection switches and the socket opens) or `websocket.close`
//! (refused: 403). Then `receive` yields `websocket.receive` (text or bytes) and, at the end,
//! `websocket.disconnect` with the close code; `send` takes `websocket.send` and
//! `websocket.close`.
//!
//! A bridge on the connection's task moves messages between the socket and the app: what the
//! app sends is queued and written as the peer takes it (`send` waits while more than
//! [`HIGH_WATER`] bytes are queued), what arrives is held for `receive` (the socket is read only
//! while fewer than [`HIGH_WATER`] bytes wait for the app).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use canter_rt::http::{HeaderName, HeaderValue, StatusCode};
use canter_rt::ws::{CloseFrame, Message, WebSocket, WsError};
use canter_rt::{Reply, Request, Response as RtResponse, WsUpgrade};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::aio;
use crate::asgi::{field, ready, resolve, Asgi, ClientDisconnected};
use crate::on_worker::{self, OnWorker};

/// Bytes of messages queued either way before the other side waits.
const HIGH_WATER: usize = 64 * 1024;

/// Where the handshake is.
#[derive(Default)]
enum Phase {
    /// `websocket.connect` not yet taken by the app, or taken and unanswered.
    #[default]
    Connecting,
    /// The app accepted: the subprotocol and extra header fields it chose.
    Accepted(Option<String>, Vec<(HeaderName, HeaderValue)>),
    /// The app closed before accepting: 403.
    Refused,
    /// The app denies the upgrade with a response of its own (the `websocket.http.response`
    /// extension): its status and header fields, the body so far, and whether it is complete.
    Denied(StatusCode, Vec<(HeaderName, HeaderValue)>, Vec<u8>, bool),
    /// The socket is open (or was).
    Open,
}

/// One WebSocket's exchange between the app and the connection.
#[derive(Default)]
struct Exchange {
    phase: Phase,
    connect_taken: bool,
    /// Arrived for the app, oldest first, and their bytes.
    inbound: VecDeque<Message>,
    inbound_bytes: usize,
    /// `receive` calls waiting: asyncio futures, oldest first.
    recv_waiters: VecDeque<Py<PyAny>>,
    /// Sent by the app, not yet taken by the socket, and their bytes.
    outbound: VecDeque<Message>,
    outbound_bytes: usize,
    /// A `send` waiting for the queue to drain: an asyncio future.
    send_waiter: Option<Py<PyAny>>,
    /// The connection's task, waiting for the app.
    waker: Option<Waker>,
    app_ended: bool,
    /// The app sent its close.
    close_sent: bool,
    /// The connection is over: how (the code `websocket.disconnect` reports).
    closed: Option<u16>,
    /// Why, for `websocket.disconnect`'s reason.
    reason: String,
}

type Shared = Rc<RefCell<Exchange>>;

impl Exchange {
    fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Hands what arrived to waiting `receive` calls; the disconnect once the connection is
    /// over and nothing is left.
    fn serve_receive(&mut self, py: Python<'_>) {
        while let Some(fut) = self.recv_waiters.front() {
            if crate::asgi::is_done(py, fut) {
                self.recv_waiters.pop_front();
                continue;
            }
            let msg = match self.inbound.pop_front() {
                Some(msg) => {
                    self.inbound_bytes -= msg.len();
                    message(py, &msg)
                }
                None => match self.closed {
                    Some(code) => disconnect(py, code, &self.reason),
                    None => return,
                },
            };
            if let (Some(fut), Ok(msg)) = (self.recv_waiters.pop_front(), msg) {
                resolve(py, &fut, msg.into_any());
            }
        }
    }

    /// The connection is over with `code`: every waiter hears it.
    fn close(&mut self, py: Python<'_>, code: u16, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(code);
        reason.clone_into(&mut self.reason);
        self.serve_receive(py);
        if let Some(fut) = self.send_waiter.take() {
            if !crate::asgi::is_done(py, &fut) {
                let err = ClientDisconnected::new_err("the client has gone");
                let _ = fut.bind(py).call_method1("set_exception", (err.value(py),));
            }
        }
    }
}

/// The largest body of a denial response (`websocket.http.response.body`), held whole.
const MAX_DENIAL_BODY: usize = 1 << 20;

/// The `headers` of an ASGI message: `[(name, value), ...]` as bytes.
fn header_fields(
    py: Python<'_>,
    message: &Bound<'_, PyAny>,
) -> PyResult<Vec<(HeaderName, HeaderValue)>> {
    let mut headers = Vec::new();
    if let Some(list) = field(message, pyo3::intern!(py, "headers"))? {
        for pair in list.try_iter()? {
            let pair = pair?;
            let (name, value) = (pair.get_item(0)?, pair.get_item(1)?);
            let (name, value) = (
                name.cast::<PyBytes>()?.as_bytes(),
                value.cast::<PyBytes>()?.as_bytes(),
            );
            let bad = || {
                PyValueError::new_err(format!(
                    "invalid header {:?}",
                    String::from_utf8_lossy(name)
                ))
            };
            headers.push((
                HeaderName::from_bytes(name).map_err(|_| bad())?,
                HeaderValue::from_bytes(value).map_err(|_| bad())?,
            ));
        }
    }
    Ok(headers)
}

fn message<'py>(py: Python<'py>, msg: &Message) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(
        pyo3::intern!(py, "type"),
        pyo3::intern!(py, "websocket.receive"),
    )?;
    match msg {
        Message::Text(t) => d.set_item(pyo3::intern!(py, "text"), t.as_str())?,
        Message::Binary(b) => d.set_item(pyo3::intern!(py, "bytes"), PyBytes::new(py, b))?,
        _ => {}
    }
    Ok(d)
}

fn disconnect<'py>(py: Python<'py>, code: u16, reason: &str) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(
        pyo3::intern!(py, "type"),
        pyo3::intern!(py, "websocket.disconnect"),
    )?;
    d.set_item(pyo3::intern!(py, "code"), code)?;
    d.set_item(pyo3::intern!(py, "reason"), reason)?;
    Ok(d)
}

/// The `receive` callable of one WebSocket.
#[pyclass(module = "canter")]
pub struct WsReceive {
    ex: OnWorker<Shared>,
    loop_: Py<PyAny>,
}

#[pymethods]
impl WsReceive {
    fn __call__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut ex = self.ex.get()?.borrow_mut();
        if !ex.connect_taken {
            ex.connect_taken = true;
            let d = PyDict::new(py);
            d.set_item(
                pyo3::intern!(py, "type"),
                pyo3::intern!(py, "websocket.connect"),
            )?;
            return ready(py, Some(d.into_any()));
        }
        if ex.recv_waiters.is_empty() {
            if let Some(msg) = ex.inbound.pop_front() {
                let was_full = ex.inbound_bytes >= HIGH_WATER;
                ex.inbound_bytes -= msg.len();
                if was_full {
                    ex.wake();
                }
                return ready(py, Some(message(py, &msg)?.into_any()));
            }
            if let Some(code) = ex.closed {
                return ready(py, Some(disconnect(py, code, &ex.reason)?.into_any()));
            }
        }
        let fut = self.loop_.bind(py).call_method0("create_future")?;
        ex.recv_waiters.push_back(fut.clone().unbind());
        ex.wake();
        Ok(fut)
    }
}

/// The `send` callable of one WebSocket.
#[pyclass(module = "canter")]
pub struct WsSend {
    ex: OnWorker<Shared>,
    loop_: Py<PyAny>,
}

#[pymethods]
impl WsSend {
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kind = message.get_item(pyo3::intern!(py, "type"))?;
        let kind = kind.cast::<PyString>()?.to_str()?;
        let mut ex = self.ex.get()?.borrow_mut();
        match (kind, &ex.phase) {
            ("websocket.accept", Phase::Connecting) => {
                let subprotocol = match field(message, pyo3::intern!(py, "subprotocol"))? {
                    Some(p) if !p.is_none() => Some(p.extract::<String>()?),
                    _ => None,
                };
                let headers = header_fields(py, message)?;
                ex.phase = Phase::Accepted(subprotocol, headers);
                ex.wake();
                ready(py, None)
            }
            ("websocket.close", Phase::Connecting) => {
                ex.phase = Phase::Refused;
                ex.wake();
                ready(py, None)
            }
            ("websocket.http.response.start", Phase::Connecting) => {
                let status = match field(message, pyo3::intern!(py, "status"))? {
                    Some(s) => s.extract::<u16>()?,
                    None => {
                        return Err(PyValueError::new_err(
                            "websocket.http.response.start needs a status",
                        ))
                    }
                };
                let status = StatusCode::from_u16(status)
                    .ok()
                    .filter(|s| !s.is_informational() && !s.is_success())
                    .ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "websocket.http.response.start: {status} is no denial's status \
                             (4xx or 5xx, or a redirect)"
                        ))
                    })?;
                ex.phase = Phase::Denied(status, header_fields(py, message)?, Vec::new(), false);
                ready(py, None)
            }
            ("websocket.http.response.body", Phase::Denied(_, _, _, false)) => {
                let more = match field(message, pyo3::intern!(py, "more_body"))? {
                    Some(m) => m.is_truthy()?,
                    None => false,
                };
                let piece = field(message, pyo3::intern!(py, "body"))?;
                let Phase::Denied(_, _, body, complete) = &mut ex.phase else {
                    return ready(py, None);
                };
                if let Some(piece) = piece.filter(|b| !b.is_none()) {
                    let piece = piece.cast::<PyBytes>()?.as_bytes();
                    if body.len() + piece.len() > MAX_DENIAL_BODY {
                        return Err(PyValueError::new_err(format!(
                            "websocket.http.response.body: a denial's body is at most \
                             {MAX_DENIAL_BODY} bytes"
                        )));
                    }
                    body.extend_from_slice(piece);
                }
                if !more {
                    *complete = true;
                    ex.wake();
                }
                ready(py, None)
            }
            ("websocket.send", Phase::Accepted(..) | Phase::Open) => {
                if ex.closed.is_some() || ex.close_sent {
                    return Err(ClientDisconnected::new_err("the WebSocket is closed"));
                }
                let msg = match (
                    field(message, pyo3::intern!(py, "bytes"))?.filter(|b| !b.is_none()),
                    field(message, pyo3::intern!(py, "text"))?.filter(|t| !t.is_none()),
                ) {
                    (Some(b), _) => Message::Binary(bytes::Bytes::copy_from_slice(
                        b.cast::<PyBytes>()?.as_bytes(),
                    )),
                    (None, Some(t)) => Message::Text(t.extract::<String>()?.into()),
                    (None, None) => {
                        return Err(PyValueError::new_err("websocket.send needs bytes or text"))
                    }
                };
                ex.outbound_bytes += msg.len();
                ex.outbound.push_back(msg);
                ex.wake();
                if ex.outbound_bytes > HIGH_WATER {
                    let fut = self.loop_.bind(py).call_method0("create_future")?;
                    ex.send_waiter = Some(fut.clone().unbind());
                    return Ok(fut);
                }
                ready(py, None)
            }
            ("websocket.close", Phase::Accepted(..) | Phase::Open) => {
                if !ex.close_sent && ex.closed.is_none() {
                    let code: u16 = match field(message, pyo3::intern!(py, "code"))? {
                        Some(c) if !c.is_none() => c.extract()?,
                        _ => 1000,
                    };
                    let reason: String = match field(message, pyo3::intern!(py, "reason"))? {
                        Some(r) if !r.is_none() => r.extract()?,
                        _ => String::new(),
                    };
                    ex.close_sent = true;
                    ex.outbound
                        .push_back(Message::Close(Some(CloseFrame { code, reason })));
                    ex.wake();
                }
                ready(py, None)
            }
            (other, _) => Err(PyRuntimeError::new_err(format!(
                "unexpected ASGI message {other:?} at this point of the WebSocket"
            ))),
        }
    }

    /// Called by the task wrapper when the app returned, or raised (`failed`): an open
    /// connection then closes with 1011 (internal error), unless the app closed it itself.
    #[pyo3(signature = (failed = false))]
    fn ended(&self, failed: bool) -> PyResult<()> {
        let mut ex = self.ex.get()?.borrow_mut();
        ex.app_ended = true;
        if failed && matches!(ex.phase, Phase::Accepted(..) | Phase::Open) && !ex.close_sent {
            ex.close_sent = true;
            ex.outbound.push_back(Message::Close(Some(CloseFrame {
                code: 1011,
                reason: String::new(),
            })));
        }
        ex.wake();
        Ok(())
    }
}

impl Asgi {
    /// Starts the app on a WebSocket upgrade; the reply waits for its accept or close.
    pub(crate) fn websocket(&self, req: Request) -> Reply {
        let peer = canter_rt::peer_addr();
        start(req, &self.loop_, |py, head, upgrade, receive, send| {
            let scope = self.scope(py, head, peer)?;
            scope.set_item(pyo3::intern!(py, "type"), pyo3::intern!(py, "websocket"))?;
            let scheme = if canter_rt::peer_is_tls() {
                "wss"
            } else {
                "ws"
            };
            scope.set_item(pyo3::intern!(py, "scheme"), scheme)?;
            scope.del_item(pyo3::intern!(py, "method"))?;
            let offered = PyList::new(py, upgrade.offered_protocols())?;
            scope.set_item(pyo3::intern!(py, "subprotocols"), offered)?;
            // The denial response: the app may answer the upgrade with a response of its own.
            let extensions = match scope.get_item(pyo3::intern!(py, "extensions"))? {
                Some(e) => e.cast_into::<PyDict>()?,
                None => {
                    let e = PyDict::new(py);
                    scope.set_item(pyo3::intern!(py, "extensions"), &e)?;
                    e
                }
            };
            extensions.set_item(
                pyo3::intern!(py, "websocket.http.response"),
                PyDict::new(py),
            )?;
            self.run
                .bind(py)
                .call1((self.app.bind(py), scope, receive, send))
        })
    }
}

/// Starts the coroutine `coro` makes (given the request's head, the checked upgrade, and the
/// `receive` and `send` callables) on the worker's loop `loop_`; the reply waits for its accept
/// or close. A request that is no valid upgrade is refused (400, 426) without Python.
pub(crate) fn start(
    req: Request,
    loop_: &Py<PyAny>,
    coro: impl for<'py> FnOnce(
        Python<'py>,
        &canter_rt::RequestHead,
        &WsUpgrade,
        Bound<'py, WsReceive>,
        Bound<'py, WsSend>,
    ) -> PyResult<Bound<'py, PyAny>>,
) -> Reply {
    let upgrade = match WsUpgrade::from_request(&req) {
        Ok(u) => u,
        Err(refused) => return Reply::Ready(RtResponse::from(refused)),
    };
    let ex: Shared = Rc::default();
    let started = Python::attach(|py| -> PyResult<()> {
        let (head, _, _) = req.into_parts();
        let receive = Bound::new(
            py,
            WsReceive {
                ex: OnWorker::new(ex.clone()),
                loop_: loop_.clone_ref(py),
            },
        )?;
        let send = Bound::new(
            py,
            WsSend {
                ex: OnWorker::new(ex.clone()),
                loop_: loop_.clone_ref(py),
            },
        )?;
        let coro = coro(py, &head, &upgrade, receive, send)?;
        aio::start(py, &coro)
    });
    if let Err(e) = started {
        return Reply::Ready(Python::attach(|py| crate::error_response(py, &e)));
    }
    on_worker::drop_returned();
    Reply::future(Accepting {
        ex: Some(ex),
        upgrade: Some(upgrade),
    })
}

/// Waits for the app to accept or refuse.
struct Accepting {
    ex: Option<Shared>,
    upgrade: Option<WsUpgrade>,
}

impl Future for Accepting {
    type Output = RtResponse;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RtResponse> {
        let this = self.get_mut();
        let (Some(shared), Some(_)) = (this.ex.as_ref(), this.upgrade.as_ref()) else {
            return Poll::Ready(RtResponse::new(StatusCode::INTERNAL_SERVER_ERROR));
        };
        let shared = shared.clone();
        let mut ex = shared.borrow_mut();
        match std::mem::take(&mut ex.phase) {
            Phase::Connecting if ex.app_ended => {
                drop(ex);
                Python::attach(|py| shared.borrow_mut().close(py, 1006, ""));
                // Ended without accepting (the exception, if any, is logged by the wrapper).
                Poll::Ready(RtResponse::new(StatusCode::INTERNAL_SERVER_ERROR))
            }
            Phase::Connecting => {
                ex.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Phase::Denied(status, headers, body, complete) if complete || ex.app_ended => {
                if !complete {
                    tracing::warn!("ASGI app ended inside its WebSocket denial response");
                }
                ex.phase = Phase::Open;
                drop(ex);
                Python::attach(|py| shared.borrow_mut().close(py, 1006, ""));
                let mut res = RtResponse::new(status);
                // The body is whole: the server frames it (the app's own length would repeat).
                for (n, v) in headers {
                    if n != canter_rt::http::header::CONTENT_LENGTH
                        && n != canter_rt::http::header::TRANSFER_ENCODING
                    {
                        res.append_header(n, v);
                    }
                }
                Poll::Ready(res.with_body(body))
            }
            denying @ Phase::Denied(..) => {
                ex.phase = denying;
                ex.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Phase::Refused | Phase::Open => {
                ex.phase = Phase::Open;
                drop(ex);
                Python::attach(|py| shared.borrow_mut().close(py, 1006, ""));
                Poll::Ready(RtResponse::new(StatusCode::FORBIDDEN))
            }
            Phase::Accepted(subprotocol, headers) => {
                ex.phase = Phase::Open;
                drop(ex);
                let Some(upgrade) = this.upgrade.take() else {
                    return Poll::Ready(RtResponse::new(StatusCode::INTERNAL_SERVER_ERROR));
                };
                let upgrade = match &subprotocol {
                    Some(p) => upgrade.protocols([p.as_str()]),
                    None => upgrade,
                };
                let bridge = shared.clone();
                this.ex = None;
                let mut res = upgrade.on_upgrade(move |socket| run_bridge(socket, bridge));
                for (n, v) in headers {
                    res.append_header(n, v);
                }
                Poll::Ready(res)
            }
        }
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        // The connection went before the answer: the app hears the disconnect.
        if let Some(shared) = self.ex.take() {
            Python::attach(|py| shared.borrow_mut().close(py, 1006, ""));
        }
    }
}

/// Tells the app its connection is over when the bridge is dropped before it could say so:
/// the connection's driver drops its handler (this bridge) when the peer goes without a close
/// frame (a FIN or an RST), when an HTTP/2 stream is reset, or when the server stops. The app's
/// `receive` then gives `websocket.disconnect` with 1006 and its pending `send` fails, so its
/// loop ends and its memory goes.
struct Hangup(Shared);

impl Drop for Hangup {
    fn drop(&mut self) {
        if self.0.borrow().closed.is_none() {
            Python::attach(|py| self.0.borrow_mut().close(py, 1006, ""));
        }
    }
}

/// Moves messages between the socket and the app until either side ends.
async fn run_bridge(socket: WebSocket, ex: Shared) {
    let _hangup = Hangup(ex.clone());
    let (tx, rx) = socket.split();
    let (code, reason) = loop {
        // What the app sent, in order, as the peer takes it.
        let next = ex.borrow_mut().outbound.pop_front();
        if let Some(msg) = next {
            let len = msg.len();
            let closing = matches!(msg, Message::Close(_));
            let sent = tx.send(msg).await;
            let mut e = ex.borrow_mut();
            e.outbound_bytes -= len;
            if e.outbound_bytes <= HIGH_WATER / 2 {
                if let Some(fut) = e.send_waiter.take() {
                    Python::attach(|py| resolve(py, &fut, py.None().into_bound(py)));
                }
            }
            if sent.is_err() && !closing {
                break (1006, String::new());
            }
            continue;
        }
        if ex.borrow().app_ended {
            // A handler that returns closes normally (the driver sends 1000 if nothing was).
            break (1000, String::new());
        }
        let room = ex.borrow().inbound_bytes < HIGH_WATER;
        tokio::select! {
            biased;
            () = poll_fn(|cx| app_moved(&ex, room, cx)) => {}
            msg = rx.recv(), if room => match msg {
                Some(Ok(Message::Close(why))) => {
                    let (code, reason) = why.map_or((1005, String::new()), |c| (c.code, c.reason));
                    break (code, reason);
                }
                Some(Ok(msg)) => {
                    let mut e = ex.borrow_mut();
                    e.inbound_bytes += msg.len();
                    e.inbound.push_back(msg);
                    Python::attach(|py| e.serve_receive(py));
                }
                Some(Err(WsError::Protocol(e))) => break (e.close_code(), e.to_string()),
                Some(Err(_)) | None => break (1006, String::new()),
            },
        }
    };
    Python::attach(|py| ex.borrow_mut().close(py, code, &reason));
}

/// Ready when the app has queued something to send, has ended, or (the socket being paused)
/// has taken messages so that reading may go on.
fn app_moved(ex: &Shared, room: bool, cx: &mut Context<'_>) -> Poll<()> {
    let mut e = ex.borrow_mut();
    if !e.outbound.is_empty() || e.app_ended || (!room && e.inbound_bytes < HIGH_WATER) {
        return Poll::Ready(());
    }
    e.waker = Some(cx.waker().clone());
    Poll::Pending
}
