//! `canter._native`: the canter engine under Python handlers.
//!
//! A worker process runs the canter worker on its main thread (`Server::serve_inline`). That
//! thread holds the interpreter lock while it works and gives it up only while its event loop
//! waits for events (the runtime's park hooks), so a request costs no lock handover: parsing, routing, limits, pipelining and writes
//! stay in Rust, and only the handler itself runs Python. Async handlers run as asyncio tasks on
//! a loop driven by the same thread ([`aio`]).

use std::cell::Cell;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Once};
use std::time::Duration;

use bytes::Bytes;
use canter::{MethodRouter, Parts, Router};
use canter_rt::http::{Method, StatusCode};
use canter_rt::{Config, ParkHooks, Reply, Response as RtResponse, Server};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

mod aio;
mod asgi;
mod asgi_ws;
mod json;
mod on_worker;
mod pipeline;
mod request;
mod response;
mod soon;
mod stream;

use request::Request;

create_exception!(
    canter,
    HTTPError,
    PyException,
    "Raise `HTTPError(status, message)` in a handler to answer with that status and \
     `{\"error\": message, \"status\": status}`."
);

/// A route as `App` passes it: method, pattern, function, whether it is async, and the names of
/// its arguments after the request.
type RouteArgs = (String, String, Py<PyAny>, bool, Vec<String>);

/// A route as Python registered it.
struct RouteSpec {
    method: Method,
    pattern: String,
    func: Py<PyAny>,
    is_async: bool,
    /// For each parameter of the function after the request, its index among the pattern's.
    order: Vec<usize>,
    names: Vec<Arc<str>>,
}

/// One route's handler on one worker.
struct Route {
    func: Py<PyAny>,
    is_async: bool,
    order: Vec<usize>,
    names: Vec<Arc<str>>,
    body_limit: usize,
}

/// The canter handler that calls a Python function.
#[derive(Clone)]
struct PyHandler(std::rc::Rc<Route>);

/// Marker type for [`canter::Handler`].
#[doc(hidden)]
pub enum Python_ {}

impl canter::Handler<Python_> for PyHandler {
    fn call(&self, parts: Parts) -> Reply {
        let params: Vec<(Arc<str>, String)> = parts
            .params()
            .zip(&self.0.names)
            .map(|((_, v), n)| (n.clone(), request::decode(v).into_owned()))
            .collect();
        let peer = canter_rt::peer_addr();
        let tls = canter_rt::peer_is_tls();
        let (head, mut body, _) = parts.into_request().into_parts();
        if body.content_length() == Some(0) {
            let req = Request {
                head,
                body: Bytes::new(),
                params,
                peer,
                tls,
            };
            return self.0.run(req);
        }
        let route = self.0.clone();
        Reply::future(async move {
            let body = match body.collect(route.body_limit).await {
                Ok(b) => b,
                Err(e) => {
                    let status =
                        StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
                    return error_json(status, &e.to_string());
                }
            };
            let req = Request {
                head,
                body,
                params,
                peer,
                tls,
            };
            route.run(req).await
        })
    }
}

/// The canter handler of a native WebSocket route (`App.websocket`): the upgrade is accepted by
/// `canter._app._run_websocket`, which then calls the function with the socket.
#[derive(Clone)]
struct PyWebSocket(std::rc::Rc<Route>);

impl canter::Handler<Python_> for PyWebSocket {
    fn call(&self, parts: Parts) -> Reply {
        let params: Vec<String> = {
            let all: Vec<String> = parts
                .params()
                .map(|(_, v)| request::decode(v).into_owned())
                .collect();
            self.0
                .order
                .iter()
                .map(|&i| all.get(i).cloned().unwrap_or_default())
                .collect()
        };
        let loop_ = match Python::attach(aio::event_loop) {
            Ok(l) => l,
            Err(e) => return Reply::Ready(Python::attach(|py| error_response(py, &e))),
        };
        let route = self.0.clone();
        asgi_ws::start(
            parts.into_request(),
            &loop_,
            move |py, _head, upgrade, receive, send| {
                let run = py.import("canter._app")?.getattr("_run_websocket")?;
                let offered = PyTuple::new(py, upgrade.offered_protocols())?;
                let args = PyTuple::new(py, params)?;
                run.call1((route.func.bind(py), receive, send, args, offered))
            },
        )
    }
}

impl Route {
    /// Calls the function; converts what it returns, or starts the coroutine it returns.
    fn run(&self, req: Request) -> Reply {
        Python::attach(|py| {
            let out = match self.call(py, req) {
                Ok(out) => out,
                Err(e) => return Reply::Ready(error_response(py, &e)),
            };
            if self.is_async || is_awaitable(py, &out) {
                let task = match aio::spawn(py, &out) {
                    Ok(t) => t,
                    Err(e) => return Reply::Ready(error_response(py, &e)),
                };
                return Reply::future(async move {
                    let out = task.await;
                    Python::attach(|py| match out {
                        Ok(v) => respond(py, v.bind(py)),
                        Err(e) => error_response(py, &e),
                    })
                });
            }
            Reply::Ready(respond(py, &out))
        })
    }

    fn call<'py>(&self, py: Python<'py>, req: Request) -> PyResult<Bound<'py, PyAny>> {
        let func = self.func.bind(py);
        if self.order.is_empty() {
            return func.call1((Bound::new(py, req)?,));
        }
        let values: Vec<String> = self
            .order
            .iter()
            .map(|&i| {
                req.params
                    .get(i)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            })
            .collect();
        let mut args = Vec::with_capacity(values.len() + 1);
        args.push(Bound::new(py, req)?.into_any());
        for v in values {
            args.push(v.into_pyobject(py)?.into_any());
        }
        func.call1(PyTuple::new(py, args)?)
    }
}

/// Whether a sync function returned an awaitable (a coroutine from a function `inspect` did not
/// see as async, say). The common results are told apart by type first: `hasattr` on a str
/// raises and clears an AttributeError, which costs more than the rest of the request.
fn is_awaitable(py: Python<'_>, v: &Bound<'_, PyAny>) -> bool {
    use pyo3::types::{PyBytes, PyDict, PyList, PyString};
    if v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyDict>()
        || v.is_exact_instance_of::<PyBytes>()
        || v.is_exact_instance_of::<PyList>()
        || v.is_none()
        || v.is_instance_of::<response::Response>()
    {
        return false;
    }
    v.hasattr(pyo3::intern!(py, "__await__")).unwrap_or(false)
}

/// The response for a handler's return value; a value of the wrong kind is a 500.
fn respond(py: Python<'_>, v: &Bound<'_, PyAny>) -> RtResponse {
    match response::convert(py, v) {
        Ok(r) => r,
        Err(e) => error_response(py, &e),
    }
}

/// The answer to an exception: its status for [`HTTPError`], else 500 with the traceback
/// logged. A cancelled task (the client left) is not logged as an error.
pub(crate) fn error_response(py: Python<'_>, e: &PyErr) -> RtResponse {
    if e.is_instance_of::<HTTPError>(py) {
        let args = e.value(py).getattr("args").ok();
        let status = args
            .as_ref()
            .and_then(|a| a.get_item(0).ok())
            .and_then(|s| s.extract::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = args
            .as_ref()
            .and_then(|a| a.get_item(1).ok())
            .and_then(|m| m.str().ok().map(|s| s.to_string()))
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned());
        return error_json(status, &message);
    }
    log_exception(py, e);
    error_json(StatusCode::INTERNAL_SERVER_ERROR, "internal server error")
}

/// `{"error": message, "status": n}` with `status`, as canter's own rejections answer.
pub(crate) fn error_json(status: StatusCode, message: &str) -> RtResponse {
    let body = serde_json::json!({ "error": message, "status": status.as_u16() });
    RtResponse::json_bytes(Bytes::from(body.to_string())).with_status(status)
}

/// Logs `e` with its traceback through Python's `logging` (logger `canter`).
pub(crate) fn log_exception(py: Python<'_>, e: &PyErr) {
    let logged = py
        .import("canter._runtime")
        .and_then(|m| m.getattr("log_exception"))
        .and_then(|f| f.call1((e.value(py), e.traceback(py))));
    if logged.is_err() {
        e.print(py);
    }
}

thread_local! {
    /// Set while this thread runs a worker and holds the interpreter lock.
    static HOLDS_GIL: Cell<bool> = const { Cell::new(false) };
    /// The thread state saved while the worker is parked.
    static SAVED: Cell<*mut ffi::PyThreadState> = const { Cell::new(std::ptr::null_mut()) };
}

/// Releases the interpreter lock while the worker's event loop waits for events, and takes it
/// back when it wakes: the worker holds it all the time it works, so a request costs no
/// hand-over, and other threads (an executor's, say) run while it waits.
pub(crate) fn park_hooks() -> ParkHooks {
    ParkHooks {
        before_park: Arc::new(|| {
            if HOLDS_GIL.with(Cell::get) {
                // SAFETY: this thread holds the lock (HOLDS_GIL) and runs no Python code while
                // parked; the state is restored by `after_unpark` before anything else runs.
                let ts = unsafe { ffi::PyEval_SaveThread() };
                SAVED.with(|s| s.set(ts));
            }
        }),
        after_unpark: Arc::new(|| {
            let ts = SAVED.with(|s| s.replace(std::ptr::null_mut()));
            if !ts.is_null() {
                // SAFETY: `ts` is this thread's state, saved by `before_park` just before.
                unsafe { ffi::PyEval_RestoreThread(ts) };
            }
        }),
    }
}

/// Whether this thread runs a worker holding the interpreter lock.
pub(crate) fn holds_gil() -> bool {
    HOLDS_GIL.with(Cell::get)
}

/// Marks this thread as a worker holding the interpreter lock (released while parked).
pub(crate) fn set_holds_gil(on: bool) {
    HOLDS_GIL.with(|h| h.set(on));
}

/// Names of a pattern's parameters, in order (`{name}` and `{*name}`).
fn pattern_params(pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(start) = rest.find('{') {
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        let name = &rest[start + 1..start + end];
        out.push(name.trim_start_matches('*').to_owned());
        rest = &rest[start + end + 1..];
    }
    out
}

/// Builds a worker's router on its own thread.
fn build_router(py: Python<'_>, routes: &[RouteSpec], body_limit: usize) -> Router {
    let mut router = Router::new();
    for r in routes {
        let route = std::rc::Rc::new(Route {
            func: r.func.clone_ref(py),
            is_async: r.is_async,
            order: r.order.clone(),
            names: r.names.clone(),
            body_limit,
        });
        // A WebSocket route answers the GET that upgrades (and HTTP/2's extended CONNECT,
        // which the router takes to the GET route).
        let methods = if r.method.as_str() == "WEBSOCKET" {
            MethodRouter::new().on(Method::GET, PyWebSocket(route))
        } else {
            MethodRouter::new().on(r.method.clone(), PyHandler(route))
        };
        router = router.route(&r.pattern, methods);
    }
    router
}

static LOG: Once = Once::new();

pub(crate) fn init_logging() {
    LOG.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("CANTER_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(canter_rt::LogStderr::default)
            .log_internal_errors(false)
            .with_ansi(colour())
            .finish();
        // Either may be set already by an embedding program: then its choice stands.
        if tracing::subscriber::set_global_default(subscriber).is_ok() {
            let _ = canter_rt::route_log_records();
        }
    });
}

/// Log lines are coloured on a terminal only, and not where `NO_COLOR` is set (no-color.org).
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// What a worker serves: native routes, or an ASGI app.
enum Target {
    Routes(Vec<RouteSpec>),
    Asgi {
        app: Py<PyAny>,
        run: Py<PyAny>,
        state: Option<Py<PyDict>>,
        root_path: String,
    },
}

/// A worker's service.
enum PyService {
    Native(Router),
    Asgi(asgi::Asgi),
}

impl canter_rt::Service for PyService {
    #[inline]
    fn call(&self, req: canter_rt::Request) -> Reply {
        match self {
            PyService::Native(r) => r.call(req),
            PyService::Asgi(a) => a.call(req),
        }
    }
}

fn route_specs(routes: Vec<RouteArgs>) -> PyResult<Vec<RouteSpec>> {
    let mut specs = Vec::with_capacity(routes.len());
    for (method, pattern, func, is_async, args) in routes {
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| PyValueError::new_err(format!("invalid method {method:?}")))?;
        let names = pattern_params(&pattern);
        let order = args
            .iter()
            .map(|a| {
                names.iter().position(|n| n == a).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "handler argument {a:?} is not a parameter of route {pattern:?}"
                    ))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        specs.push(RouteSpec {
            method,
            pattern,
            func,
            is_async,
            order,
            names: names.into_iter().map(Arc::from).collect(),
        });
    }
    Ok(specs)
}

/// Serves `target` on `host:port` on the calling thread until SIGINT or SIGTERM, then drains.
/// `on_ready(port)` is called once the listener is bound; `worker_loop` (a
/// `canter._runtime.WorkerLoop`) is the asyncio loop the worker drives meanwhile.
///
/// `target`: a list of `(method, pattern, function, is_async, argument names)` tuples (the
/// native API), or a dict `{"app": asgi_app, "run": wrapper, "state": dict or None,
/// "root_path": str}` (an ASGI app; `wrapper(app, scope, receive, send)` runs it).
/// The engine's settings a Python caller may give (keyword arguments of `serve` and of
/// `check_settings`), built into the server's configuration: every value is checked here, so a
/// bad one is a `ValueError` naming it (a `TypeError` for an unknown name), before any worker
/// starts. Times are seconds (float); `None` keeps the engine's default.
struct Settings {
    config: canter_rt::ConfigBuilder,
    /// Also the router's body limit (the engine answers 413 above it before Python runs).
    body_limit: usize,
    /// Port, certificate chain and key of an HTTPS listener; loaded by each worker.
    tls: Option<(u16, std::path::PathBuf, std::path::PathBuf)>,
    /// HTTP/3 on the TLS port's number (needs `tls`).
    http3: bool,
}

/// The names [`Settings::from_kwargs`] takes.
const SETTINGS: &[&str] = &[
    "body_limit",
    "server_name",
    "max_connections",
    "idle_timeout",
    "head_timeout",
    "body_timeout",
    "write_timeout",
    "handler_timeout",
    "drain_timeout",
    "max_head",
    "max_headers",
    "max_target",
    "max_pipeline",
    "min_body_rate",
    "half_close",
    "http2",
    "http3",
    "tls_port",
    "tls_cert",
    "tls_key",
];

impl Settings {
    fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
        let get = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
            match kwargs {
                Some(d) => Ok(d.get_item(name)?.filter(|v| !v.is_none())),
                None => Ok(None),
            }
        };
        if let Some(d) = kwargs {
            for key in d.keys() {
                let key: String = key.extract()?;
                if !SETTINGS.contains(&key.as_str()) {
                    return Err(PyTypeError::new_err(format!(
                        "unknown setting '{key}' (known: {})",
                        SETTINGS.join(", ")
                    )));
                }
            }
        }
        let seconds = |name: &'static str| -> PyResult<Option<Duration>> {
            let Some(v) = get(name)? else {
                return Ok(None);
            };
            let t: f64 = v.extract()?;
            Duration::try_from_secs_f64(t).map(Some).map_err(|_| {
                PyValueError::new_err(format!("invalid {name}: {t} is not a number of seconds"))
            })
        };
        let invalid = |e: canter_rt::ConfigError| PyValueError::new_err(e.to_string());
        let mut timeouts = canter_rt::Timeouts::builder();
        if let Some(t) = seconds("idle_timeout")? {
            timeouts = timeouts.idle(t);
        }
        if let Some(t) = seconds("head_timeout")? {
            timeouts = timeouts.head(t);
        }
        if let Some(t) = seconds("body_timeout")? {
            timeouts = timeouts.body(t);
        }
        if let Some(t) = seconds("write_timeout")? {
            timeouts = timeouts.write(t);
        }
        let body_limit: usize = match get("body_limit")? {
            Some(v) => v.extract()?,
            None => 1 << 20,
        };
        let mut limits = canter_rt::Limits::builder().max_body(body_limit as u64);
        if let Some(v) = get("max_head")? {
            limits = limits.max_head(v.extract()?);
        }
        if let Some(v) = get("max_headers")? {
            limits = limits.max_headers(v.extract()?);
        }
        if let Some(v) = get("max_target")? {
            limits = limits.max_target(v.extract()?);
        }
        let mut config = Config::builder()
            .workers(1)
            .park_hooks(Some(park_hooks()))
            .timeouts(timeouts.build().map_err(invalid)?)
            .limits(limits.build().map_err(invalid)?);
        if let Some(v) = get("server_name")? {
            config = config.server_name(v.extract::<String>()?);
        }
        if let Some(v) = get("max_connections")? {
            config = config.max_connections(v.extract()?);
        }
        if let Some(t) = seconds("handler_timeout")? {
            config = config.handler_timeout(t);
        }
        if let Some(t) = seconds("drain_timeout")? {
            config = config.drain_timeout(t);
        }
        if let Some(v) = get("max_pipeline")? {
            config = config.max_pipeline(v.extract()?);
        }
        if let Some(v) = get("min_body_rate")? {
            config = config.min_body_rate(v.extract()?);
        }
        if let Some(v) = get("half_close")? {
            config = config.half_close(v.extract()?);
        }
        if let Some(v) = get("http2")? {
            if !v.extract::<bool>()? {
                config = config.http2(None);
            }
        }
        let http3 = match get("http3")? {
            Some(v) => v.extract::<bool>()?,
            None => false,
        };
        let tls = match (get("tls_port")?, get("tls_cert")?, get("tls_key")?) {
            (Some(port), Some(cert), Some(key)) => {
                Some((port.extract()?, cert.extract()?, key.extract()?))
            }
            (None, None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "TLS needs all of tls_port, tls_cert and tls_key",
                ))
            }
        };
        if http3 && tls.is_none() {
            return Err(PyValueError::new_err(
                "http3 needs TLS: tls_port, tls_cert and tls_key",
            ));
        }
        // Checked now, whole (the listener's address, TLS and HTTP/3 are set by the caller).
        config.clone().build().map_err(invalid)?;
        Ok(Settings {
            config,
            body_limit,
            tls,
            http3,
        })
    }
}

/// Checks the engine settings `serve` would be given, without serving: a `ValueError` or
/// `TypeError` names the first that is wrong. The supervisor calls it before forking workers.
/// Log lines the process could not write to its standard error (closed, or a pipe whose
/// reader left) and dropped: a failed log write never stops a server or a flow.
#[pyfunction]
fn log_lines_dropped() -> u64 {
    canter_rt::log_lines_dropped()
}

#[pyfunction]
#[pyo3(signature = (**settings))]
fn check_settings(settings: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    Settings::from_kwargs(settings).map(drop)
}

/// Serves `target` (a list of native routes, or a dict describing an ASGI app) on this thread
/// until SIGINT or SIGTERM; `on_ready(port)` is called once the listener is bound. The keyword
/// arguments are the engine's settings (see `check_settings`).
#[pyfunction]
#[pyo3(signature = (target, host, port, on_ready, worker_loop, **settings))]
fn serve(
    py: Python<'_>,
    target: &Bound<'_, PyAny>,
    host: String,
    port: u16,
    on_ready: Py<PyAny>,
    worker_loop: Py<PyAny>,
    settings: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    init_logging();
    let target = if let Ok(d) = target.cast::<PyDict>() {
        let get = |k: &str| {
            d.get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("ASGI target without {k:?}")))
        };
        let state = get("state")?;
        Target::Asgi {
            app: get("app")?.unbind(),
            run: get("run")?.unbind(),
            state: if state.is_none() {
                None
            } else {
                Some(state.cast_into::<PyDict>()?.unbind())
            },
            root_path: get("root_path")?.extract()?,
        }
    } else {
        Target::Routes(route_specs(target.extract()?)?)
    };
    let addr: SocketAddr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| PyOSError::new_err(format!("{host}: {e}")))?
        .next()
        .ok_or_else(|| PyOSError::new_err(format!("{host}: no address")))?;
    let invalid = |e: canter_rt::ConfigError| PyValueError::new_err(e.to_string());
    let Settings {
        config,
        body_limit,
        tls,
        http3,
    } = Settings::from_kwargs(settings)?;
    // The supervisor holds the ports (bound, not listening, with SO_REUSEPORT) while its
    // workers bind them, and it has refused a port another process listens on: the workers
    // share theirs.
    let mut config = config.addr(addr).reuse_port(true);
    if let Some((tls_port, cert, key)) = tls {
        let acceptor = canter_rt::ServerTls::new()
            .cert(cert, key)
            .build()
            .map_err(|e| PyValueError::new_err(format!("TLS: {e}")))?;
        config = config
            .tls(Some(canter_rt::TlsListener {
                addr: SocketAddr::new(addr.ip(), tls_port),
                acceptor,
            }))
            .http3(http3);
    }
    let server = Server::bind(config.build().map_err(invalid)?)
        .map_err(|e| PyOSError::new_err(format!("{addr}: {e}")))?;
    // Big messages' and bodies' memory goes back once they are done with.
    canter_rt::map_large_blocks();
    let local = server.local_addr();
    on_ready.call1(py, (local.port(),))?;
    canter_rt::shutdown_on_signals(server.shutdown_handle())?;
    let wl = worker_loop.clone_ref(py);
    // The worker runs right here, on the thread that called (Python's main thread in a worker
    // process), holding the interpreter lock except while parked.
    let result = server.serve_inline(move |_worker| {
        HOLDS_GIL.with(|h| h.set(true));
        Python::attach(|py| {
            aio::install(worker_loop.bind(py))?;
            Ok::<_, PyErr>(match target {
                Target::Routes(specs) => PyService::Native(build_router(py, &specs, body_limit)),
                Target::Asgi {
                    app,
                    run,
                    state,
                    root_path,
                } => {
                    let info = PyDict::new(py);
                    info.set_item("version", "3.0")?;
                    info.set_item("spec_version", "2.4")?;
                    PyService::Asgi(asgi::Asgi {
                        run,
                        app,
                        loop_: worker_loop.bind(py).getattr("loop")?.unbind(),
                        state,
                        root_path: PyString::new(py, &root_path).unbind(),
                        server: (local.ip().to_string(), local.port())
                            .into_pyobject(py)?
                            .unbind(),
                        asgi: info.unbind(),
                    })
                }
            })
        })
        .unwrap_or_else(|e| {
            Python::attach(|py| log_exception(py, &e));
            PyService::Native(Router::new().fallback(|| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the Python worker failed to start\n",
                )
            }))
        })
    });
    HOLDS_GIL.with(|h| h.set(false));
    aio::uninstall(wl.bind(py))?;
    result.map_err(|e| PyOSError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(log_lines_dropped, m)?)?;
    m.add_function(wrap_pyfunction!(check_settings, m)?)?;
    pipeline::register(m)?;
    m.add_class::<Request>()?;
    m.add_class::<request::Headers>()?;
    m.add_class::<response::Response>()?;
    m.add("HTTPError", m.py().get_type::<HTTPError>())?;
    m.add(
        "ClientDisconnected",
        m.py().get_type::<asgi::ClientDisconnected>(),
    )?;
    Ok(())
}
