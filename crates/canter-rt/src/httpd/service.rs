//! What the runtime hands to user code and gets back: [`Request`], [`Response`], [`Reply`] and
//! the [`Service`] trait.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use bytes::Bytes;
use canter_http::RequestHead;
use http::{Extensions, HeaderName, HeaderValue, Method, StatusCode};

use crate::httpd::body::{Body, RequestBody};

/// A request as the handler sees it: the parsed head and a streaming body.
pub struct Request {
    head: RequestHead,
    method: Method,
    body: RequestBody,
    /// `None` until something is inserted: dropping `None` is one test, inline.
    extensions: Option<Extensions>,
}

impl Request {
    #[inline(always)]
    pub(crate) fn new(head: RequestHead, body: RequestBody) -> Request {
        let method = head.http_method();
        Request {
            head,
            method,
            body,
            extensions: None,
        }
    }

    /// A request with `method` and `head`, an empty body and no connection behind it: for
    /// benchmarks and tests of services. Not part of the stable API.
    #[doc(hidden)]
    pub fn detached(method: Method, head: RequestHead) -> Request {
        Request {
            head,
            method,
            body: RequestBody::empty(),
            extensions: None,
        }
    }

    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The path, percent-encoded, without the query.
    pub fn path(&self) -> &str {
        self.head.path()
    }

    /// The query string without `?`.
    pub fn query(&self) -> Option<&str> {
        self.head.query()
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head.header(name)
    }

    /// The full parsed head (target, version, all headers).
    pub fn head(&self) -> &RequestHead {
        &self.head
    }

    /// The body (its declared length, before reading it).
    pub fn body(&self) -> &RequestBody {
        &self.body
    }

    /// The body, to read while the handler runs.
    pub fn body_mut(&mut self) -> &mut RequestBody {
        &mut self.body
    }

    /// Typed values attached to this request by middleware (a request id, an authenticated
    /// user…). Empty, and allocation-free, unless something is inserted.
    pub fn extensions(&self) -> &Extensions {
        static EMPTY: LazyLock<Extensions> = LazyLock::new(Extensions::new);
        self.extensions.as_ref().unwrap_or(&EMPTY)
    }

    /// The extensions, to insert into.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions.get_or_insert_with(Extensions::new)
    }

    /// Splits the request into head, body and extensions.
    pub fn into_parts(self) -> (RequestHead, RequestBody, Extensions) {
        (self.head, self.body, self.extensions.unwrap_or_default())
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("target", &self.head.target())
            .finish_non_exhaustive()
    }
}

/// The `:protocol` of an HTTP/2 extended CONNECT (RFC 8441), e.g. `websocket`: in the
/// request's [`Request::extensions`] when the client sent one. A 200 to such a request makes the
/// stream a tunnel for that protocol ([`crate::WsUpgrade`] does this for WebSocket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectProtocol(pub String);

const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const HTML: HeaderValue = HeaderValue::from_static("text/html; charset=utf-8");
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A response: status, header fields (beyond the Server, Date and framing headers the runtime
/// adds) and a body.
pub struct Response {
    pub(crate) status: StatusCode,
    /// Kept apart from `headers` so the common response (one Content-Type) allocates nothing.
    pub(crate) content_type: Option<HeaderValue>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Body,
}

impl Response {
    /// The answer to a request whose handler panicked, whichever protocol carried it.
    pub(crate) fn handler_panicked() -> Response {
        Response::text("Internal Server Error\n").with_status(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The answer to a request whose handler ran past [`crate::Config::handler_timeout`].
    pub(crate) fn handler_timed_out() -> Response {
        Response::text("Service Unavailable\n").with_status(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// A response with `status`, no extra headers and an empty body.
    #[inline]
    pub fn new(status: StatusCode) -> Response {
        Response {
            status,
            content_type: None,
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    /// 200 with a `text/plain; charset=utf-8` body.
    #[inline]
    pub fn text(body: impl Into<Body>) -> Response {
        Response {
            status: StatusCode::OK,
            content_type: Some(TEXT),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// 200 with a `text/html; charset=utf-8` body.
    pub fn html(body: impl Into<Body>) -> Response {
        Response {
            status: StatusCode::OK,
            content_type: Some(HTML),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// 200 with an `application/json` body (already serialized).
    pub fn json_bytes(body: impl Into<Body>) -> Response {
        Response {
            status: StatusCode::OK,
            content_type: Some(JSON),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Sets the status.
    #[inline]
    pub fn with_status(mut self, status: StatusCode) -> Response {
        self.status = status;
        self
    }

    /// Appends a header field. Content-Length and Transfer-Encoding are derived from the body
    /// and must not be set here; Server and Date are added by the runtime.
    #[inline]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Response {
        self.append_header(name, value);
        self
    }

    /// The Content-Type, if set.
    pub fn content_type(&self) -> Option<&HeaderValue> {
        self.content_type.as_ref()
    }

    /// Sets the body.
    #[inline]
    pub fn with_body(mut self, body: impl Into<Body>) -> Response {
        let old = std::mem::replace(&mut self.body, body.into());
        // Most responses come from `new` and get their body once. The drop of a `Body` is out
        // of line (one variant holds a protocol upgrade): an empty one is let go without it.
        if matches!(old, Body::Empty) {
            std::mem::forget(old);
        } else {
            drop(old);
        }
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The header fields set by the handler, other than Content-Type.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Body {
        &self.body
    }

    /// The body, to replace (e.g. by a compressed one).
    pub fn body_mut(&mut self) -> &mut Body {
        &mut self.body
    }

    /// Sets the status in place.
    pub fn set_status(&mut self, status: StatusCode) {
        self.status = status;
    }

    /// The first value of header `name`, Content-Type included.
    pub fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        if name == http::header::CONTENT_TYPE {
            return self.content_type.as_ref();
        }
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Appends a header field in place (see [`Response::with_header`]).
    #[inline]
    pub fn append_header(&mut self, name: HeaderName, value: HeaderValue) {
        if name == http::header::CONTENT_TYPE {
            self.content_type = Some(value);
        } else {
            self.headers.push((name, value));
        }
    }

    /// Sets header `name` to `value`, replacing every earlier value.
    pub fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        if name == http::header::CONTENT_TYPE {
            self.content_type = Some(value);
            return;
        }
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value));
    }

    /// Removes every value of header `name`.
    pub fn remove_header(&mut self, name: &HeaderName) {
        if name == http::header::CONTENT_TYPE {
            self.content_type = None;
        } else {
            self.headers.retain(|(n, _)| n != name);
        }
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl From<&'static str> for Response {
    fn from(s: &'static str) -> Response {
        Response::text(s)
    }
}

impl From<String> for Response {
    fn from(s: String) -> Response {
        Response::text(s)
    }
}

impl From<Bytes> for Response {
    fn from(b: Bytes) -> Response {
        Response::new(StatusCode::OK).with_body(b)
    }
}

/// What a [`Service`] returns: a response that is ready now (the synchronous fast path: no
/// allocation, no extra poll) or a future that produces one (the handler awaits I/O, the body…).
pub enum Reply {
    /// The response is ready.
    Ready(Response),
    /// The response will be ready when this future completes. It runs on the connection's own
    /// task, which also feeds it the request body.
    Pending(Pin<Box<dyn Future<Output = Response>>>),
}

impl Reply {
    /// Wraps an async handler's future.
    pub fn future(f: impl Future<Output = Response> + 'static) -> Reply {
        Reply::Pending(Box::pin(f))
    }

    /// Applies `f` to the response once it is ready: at once for [`Reply::Ready`] (no
    /// allocation), after the future for [`Reply::Pending`]. The building block of "after"
    /// middleware.
    ///
    /// ```
    /// use canter_rt::http::{HeaderName, HeaderValue};
    /// use canter_rt::{Reply, Response};
    ///
    /// let reply = Reply::from(Response::text("hi")).map(|mut res| {
    ///     res.set_header(HeaderName::from_static("x-served-by"), HeaderValue::from_static("canter"));
    ///     res
    /// });
    /// # let _ = reply;
    /// ```
    #[inline]
    pub fn map(self, f: impl FnOnce(Response) -> Response + 'static) -> Reply {
        match self {
            Reply::Ready(r) => Reply::Ready(f(r)),
            Reply::Pending(fut) => Reply::future(async move { f(fut.await) }),
        }
    }
}

impl From<Response> for Reply {
    fn from(r: Response) -> Reply {
        Reply::Ready(r)
    }
}

impl Future for Reply {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let this = self.get_mut();
        match this {
            Reply::Ready(_) => {
                let taken = std::mem::replace(this, Reply::Ready(Response::new(StatusCode::OK)));
                match taken {
                    Reply::Ready(r) => Poll::Ready(r),
                    Reply::Pending(_) => Poll::Pending,
                }
            }
            Reply::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

/// The application: turns each request into a reply. One instance lives on each worker thread
/// (built by the factory given to [`crate::Server::serve`]), so it needs neither `Send` nor
/// `Sync`; share state across workers with `Arc` explicitly.
pub trait Service: 'static {
    /// Handles one request. Runs on the connection's task; a slow synchronous body here stalls
    /// every connection of the worker, so block only in futures that offload (e.g.
    /// [`crate::spawn_blocking`]).
    fn call(&self, req: Request) -> Reply;
}

impl<F> Service for F
where
    F: Fn(Request) -> Reply + 'static,
{
    fn call(&self, req: Request) -> Reply {
        self(req)
    }
}
