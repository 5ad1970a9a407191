//! Extractors: typed handler arguments built from the request.
//!
//! Two kinds. [`FromParts`] extractors read the head (path parameters, query, headers, state)
//! synchronously, so a handler made only of them answers with `Reply::Ready` (no future, no
//! allocation). [`FromBody`] extractors ([`Json`], [`Form`], [`Bytes`], `String`) read the body
//! and may only be a handler's last argument; they make the handler's reply a future.
//!
//! Every failure is a [`Rejection`]: a status and a message, answered as
//! `{"error": "...", "status": N}`.

use std::any::{type_name, Any, TypeId};
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::rc::Rc;

use bytes::Bytes;
use canter_rt::http::{header, Extensions, HeaderName, HeaderValue, Method, StatusCode};
use canter_rt::RequestHead;
use canter_rt::{BodyError, Request, RequestBody, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use smallvec::SmallVec;

use super::path_de;
use super::response::IntoResponse;

/// Default limit for bodies read by [`Json`], [`Form`], [`Bytes`] and `String`: 1 MiB.
///
/// ```
/// assert_eq!(canter::app::DEFAULT_BODY_LIMIT, 1 << 20);
/// ```
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// Default nesting limit for JSON bodies read by [`Json`] and
/// [`JsonLines`](super::JsonLines): 64 levels of arrays and objects.
///
/// ```
/// assert_eq!(canter::app::DEFAULT_JSON_DEPTH_LIMIT, 64);
/// ```
pub const DEFAULT_JSON_DEPTH_LIMIT: usize = 64;

/// The request as extractors see it: method, head, the body (until an extractor takes it), the
/// matched path parameters and the router's state. Custom [`FromParts`] and [`FromBody`]
/// extractors read it.
///
/// ```
/// use canter::{FromParts, Parts, Rejection};
///
/// /// The raw, still percent-encoded value of the `{id}` parameter.
/// struct RawId(String);
///
/// impl FromParts for RawId {
///     fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
///         Ok(RawId(parts.param("id").unwrap_or_default().to_owned()))
///     }
/// }
/// ```
pub struct Parts {
    /// The request as the runtime handed it over (moved in whole: one copy, not one per part).
    pub(crate) req: Request,
    /// Set once an extractor has taken the body.
    pub(crate) body_taken: bool,
    pub(crate) params: Params,
    pub(crate) states: Rc<States>,
    pub(crate) body_limit: usize,
    pub(crate) json_depth_limit: usize,
}

impl Parts {
    /// The request method.
    pub fn method(&self) -> &Method {
        self.req.method()
    }

    /// The parsed head: target, version, every header field.
    pub fn head(&self) -> &RequestHead {
        self.req.head()
    }

    /// The path, still percent-encoded.
    pub fn path(&self) -> &str {
        self.req.path()
    }

    /// The query string without `?`.
    pub fn query(&self) -> Option<&str> {
        self.req.query()
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.req.header(name)
    }

    /// The raw (percent-encoded) value of path parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter(self.req.path())
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// Every path parameter of the matched route, in the pattern's order: its name and its raw
    /// (percent-encoded) value.
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.params.iter(self.req.path())
    }

    /// The request itself (head, body unless an extractor took it, extensions), for a handler
    /// that hands it on whole, such as a binding to another language.
    pub fn into_request(self) -> Request {
        self.req
    }

    /// Takes the request body; `None` if an extractor took it already.
    pub fn take_body(&mut self) -> Option<RequestBody> {
        if std::mem::replace(&mut self.body_taken, true) {
            return None;
        }
        Some(std::mem::replace(self.req.body_mut(), RequestBody::empty()))
    }

    /// Values middleware attached to the request (see [`Extension`]).
    pub fn extensions(&self) -> &Extensions {
        self.req.extensions()
    }

    /// The extensions, to insert into or take from.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        self.req.extensions_mut()
    }

    /// The body limit set with [`Router::body_limit`](super::Router::body_limit).
    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// The JSON nesting limit set with
    /// [`Router::json_depth_limit`](super::Router::json_depth_limit).
    pub fn json_depth_limit(&self) -> usize {
        self.json_depth_limit
    }

    /// Takes the body for an extractor that streams it, refusing (413) a declared length over
    /// [`Parts::body_limit`] before any byte is read; the extractor counts the rest.
    pub(crate) fn take_body_within_limit(&mut self) -> Result<RequestBody, Rejection> {
        let Some(body) = self.take_body() else {
            return Err(Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request body was already taken by another extractor",
            ));
        };
        let limit = self.body_limit;
        if body.content_length().is_some_and(|n| n > limit as u64) {
            return Err(Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {limit} bytes"),
            ));
        }
        Ok(body)
    }

    /// Reads the whole body up to [`Parts::body_limit`].
    pub async fn collect_body(&mut self) -> Result<Bytes, Rejection> {
        let Some(mut body) = self.take_body() else {
            return Err(Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request body was already taken by another extractor",
            ));
        };
        body.collect(self.body_limit).await.map_err(Rejection::from)
    }
}

impl fmt::Debug for Parts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parts")
            .field("method", self.method())
            .field("target", &self.head().target())
            .finish_non_exhaustive()
    }
}

/// Path parameters of the matched route: names shared with the route, values as byte ranges of
/// the (percent-encoded) path so that matching allocates nothing.
#[derive(Default)]
pub(crate) struct Params {
    pub(crate) names: Option<Rc<[Box<str>]>>,
    pub(crate) spans: SmallVec<[(u32, u32); 4]>,
}

impl Params {
    pub(crate) fn iter<'a>(&'a self, path: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        let names = self.names.as_deref().unwrap_or(&[]);
        names
            .iter()
            .zip(&self.spans)
            .map(move |(n, &(s, e))| (&**n, path.get(s as usize..e as usize).unwrap_or_default()))
    }
}

/// Shared state registered with [`Router::with_state`](super::Router::with_state), by type.
#[derive(Default, Clone)]
pub(crate) struct States(pub(crate) Vec<(TypeId, Rc<dyn Any>)>);

impl States {
    fn get<T: 'static>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.0
            .iter()
            .find(|(t, _)| *t == id)
            .and_then(|(_, v)| v.downcast_ref())
    }
}

/// Why an extractor refused the request: a status and a message. Answered as JSON,
/// `{"error": "<message>", "status": <status>}`.
///
/// ```
/// use canter::rt::http::StatusCode;
/// use canter::{IntoResponse, Rejection};
///
/// let r = Rejection::new(StatusCode::BAD_REQUEST, "no").into_response();
/// assert_eq!(r.status(), 400);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    status: StatusCode,
    message: Cow<'static, str>,
    /// Header fields the answer needs (a 426's `Sec-WebSocket-Version`); empty, and
    /// allocation-free, for most.
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Rejection {
    /// A rejection with `status` and a message for the client.
    pub fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection {
            status,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// Adds a header field to the answer.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Rejection {
        self.headers.push((name, value));
        self
    }

    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for Rejection {}

impl From<BodyError> for Rejection {
    fn from(e: BodyError) -> Rejection {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
        Rejection::new(status, e.to_string())
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    status: u16,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
            status: self.status.as_u16(),
        };
        // Serializing a &str and a u16 cannot fail; keep a fallback anyway.
        let bytes = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        let mut res = Response::json_bytes(bytes).with_status(self.status);
        for (name, value) in self.headers {
            res.append_header(name, value);
        }
        res
    }
}

/// An argument built from the request head, synchronously.
///
/// ```
/// use canter::rt::http::StatusCode;
/// use canter::{FromParts, Parts, Rejection};
///
/// /// The `X-Api-Key` header, required.
/// struct ApiKey(String);
///
/// impl FromParts for ApiKey {
///     fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
///         parts
///             .header("x-api-key")
///             .and_then(|v| std::str::from_utf8(v).ok())
///             .map(|v| ApiKey(v.to_owned()))
///             .ok_or(Rejection::new(StatusCode::UNAUTHORIZED, "missing X-Api-Key"))
///     }
/// }
/// ```
pub trait FromParts: Sized {
    /// Extracts the value or says why not.
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection>;
}

/// An argument built from the request body; only a handler's last argument can be one.
pub trait FromBody: Sized {
    /// Reads the body (see [`Parts::collect_body`]) and extracts the value.
    fn from_body(parts: Parts) -> impl Future<Output = Result<Self, Rejection>> + 'static;
}

/// Path parameters, percent-decoded and deserialized: a single value, a tuple (in route order)
/// or a struct (by name). Failure: 400.
///
/// ```
/// use canter::{get, Path, Router};
///
/// fn hello(Path(name): Path<String>) -> String {
///     format!("Hello, {name}!")
/// }
/// fn item(Path((shelf, n)): Path<(String, u32)>) -> String {
///     format!("{shelf}/{n}")
/// }
/// let app = Router::new()
///     .route("/hello/{name}", get(hello))
///     .route("/shelf/{shelf}/{n}", get(item));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path<T>(pub T);

impl<T: DeserializeOwned> FromParts for Path<T> {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        let path = parts.req.path();
        let mut decoded: SmallVec<[(&str, Cow<'_, str>); 4]> = SmallVec::new();
        for (name, raw) in parts.params.iter(path) {
            // The path is ASCII already: only escapes need decoding and UTF-8 checking.
            if !raw.contains('%') {
                decoded.push((name, Cow::Borrowed(raw)));
                continue;
            }
            match percent_encoding::percent_decode_str(raw).decode_utf8() {
                Ok(v) => decoded.push((name, v)),
                Err(_) => {
                    return Err(Rejection::new(
                        StatusCode::BAD_REQUEST,
                        format!("path parameter `{name}` is not valid UTF-8 once decoded"),
                    ))
                }
            }
        }
        T::deserialize(path_de::PathDeserializer::new(&decoded))
            .map(Path)
            .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, format!("invalid path: {e}")))
    }
}

/// The query string deserialized with `serde_urlencoded`; a missing query is an empty one.
/// Failure: 400.
///
/// ```
/// use canter::Query;
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Page {
///     name: Option<String>,
/// }
/// fn page(Query(p): Query<Page>) -> String {
///     p.name.unwrap_or_default()
/// }
/// # let _ = page;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned> FromParts for Query<T> {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        serde_urlencoded::from_str(parts.query().unwrap_or(""))
            .map(Query)
            .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, format!("invalid query: {e}")))
    }
}

/// Shared state registered with [`Router::with_state`](super::Router::with_state), cloned per
/// request: use `Arc<T>` for state shared by all workers, `Rc<T>` for per-worker state (build
/// the router in the worker factory). Missing state is a programming error: 500.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use canter::{get, Router, State};
///
/// fn hits(State(n): State<Arc<AtomicU64>>) -> String {
///     n.fetch_add(1, Ordering::Relaxed).to_string()
/// }
/// let counter = Arc::new(AtomicU64::new(0));
/// let app = Router::new().route("/hits", get(hits)).with_state(counter);
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct State<T>(pub T);

impl<T: Clone + 'static> FromParts for State<T> {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        match parts.states.get::<T>() {
            Some(v) => Ok(State(v.clone())),
            None => Err(Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("no state of type {} registered", type_name::<T>()),
            )),
        }
    }
}

/// A value attached to the request by middleware, cloned out of the request's extensions
/// (for example the [`RequestId`](crate::middleware::RequestId)). Missing → 500: the middleware
/// that provides it is not installed.
///
/// ```
/// use canter::middleware::RequestId;
/// use canter::{get, Extension, Router};
///
/// fn show(Extension(id): Extension<RequestId>) -> String {
///     format!("request {}\n", id.as_str())
/// }
/// let app = Router::new().route("/", get(show)).layer(RequestId::layer());
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct Extension<T>(pub T);

impl<T: Clone + Send + Sync + 'static> FromParts for Extension<T> {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        match parts.extensions().get::<T>() {
            Some(v) => Ok(Extension(v.clone())),
            None => Err(Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("no {} in the request extensions", type_name::<T>()),
            )),
        }
    }
}

/// Access to every header field (and the rest of the head): a cheap clone of the parsed head.
///
/// ```
/// use canter::Headers;
///
/// fn agent(h: Headers) -> String {
///     h.get_str("user-agent").unwrap_or("unknown").to_owned()
/// }
/// # let _ = agent;
/// ```
#[derive(Debug, Clone)]
pub struct Headers(pub RequestHead);

impl Headers {
    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.header(name)
    }

    /// The first value of `name` if it is valid UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

impl FromParts for Headers {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        Ok(Headers(parts.head().clone()))
    }
}

/// The client's address: the connection's peer, or the client a load balancer named in its
/// PROXY protocol header (`Config::proxy_protocol`, `canter serve --proxy-protocol`). Failure
/// (a request served without a connection, as in some tests): 500.
///
/// ```
/// use canter::{get, ClientAddr, Router};
///
/// let app = Router::new().route("/ip", get(|ClientAddr(addr): ClientAddr| addr.ip().to_string()));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::SocketAddr);

impl FromParts for ClientAddr {
    fn from_parts(_parts: &mut Parts) -> Result<Self, Rejection> {
        canter_rt::peer_addr().map(ClientAddr).ok_or(Rejection::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no client address",
        ))
    }
}

/// An optional extractor: `None` instead of a rejection.
impl<T: FromParts> FromParts for Option<T> {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        Ok(T::from_parts(parts).ok())
    }
}

impl FromParts for Method {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        Ok(parts.method().clone())
    }
}

/// The request body as a stream, not limited by the router: for handlers that read it
/// themselves (`collect` with their own limit, or chunk by chunk).
///
/// ```
/// use canter::RawBody;
///
/// async fn count(RawBody(mut body): RawBody) -> String {
///     let mut n = 0;
///     while let Some(Ok(chunk)) = body.chunk().await {
///         n += chunk.len();
///     }
///     format!("{n} bytes\n")
/// }
/// # let _ = count;
/// ```
#[derive(Debug)]
pub struct RawBody(pub RequestBody);

impl FromParts for RawBody {
    fn from_parts(parts: &mut Parts) -> Result<Self, Rejection> {
        parts.take_body().map(RawBody).ok_or_else(|| {
            Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request body was already taken by another extractor",
            )
        })
    }
}

impl FromBody for Bytes {
    async fn from_body(mut parts: Parts) -> Result<Self, Rejection> {
        parts.collect_body().await
    }
}

impl FromBody for String {
    async fn from_body(mut parts: Parts) -> Result<Self, Rejection> {
        let body = parts.collect_body().await?;
        String::from_utf8(body.to_vec())
            .map_err(|_| Rejection::new(StatusCode::BAD_REQUEST, "request body is not valid UTF-8"))
    }
}

/// JSON: as an extractor, the body deserialized (Content-Type `application/json` or
/// `application/*+json`, else 415; over the body limit 413; malformed 400; wrong shape or types
/// 422; arrays and objects nested deeper than the
/// [depth limit](super::Router::json_depth_limit), 64 by default, 400); as a response, `T`
/// serialized per call with `application/json`.
///
/// ```
/// use canter::rt::http::StatusCode;
/// use canter::{post, Json, Router};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Deserialize, Serialize)]
/// struct Item {
///     name: String,
/// }
/// fn create(Json(item): Json<Item>) -> (StatusCode, Json<Item>) {
///     (StatusCode::CREATED, Json(item))
/// }
/// let app = Router::new().route("/items", post(create));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned + 'static> FromBody for Json<T> {
    fn from_body(mut parts: Parts) -> impl Future<Output = Result<Self, Rejection>> + 'static {
        let typed = content_type_is(&parts, is_json);
        async move {
            if !typed {
                return Err(Rejection::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "expected Content-Type: application/json",
                ));
            }
            let body = parts.collect_body().await?;
            check_json_depth(&body, parts.json_depth_limit)?;
            json_from_slice(&body).map(Json)
        }
    }
}

/// Deserializes a JSON body: syntax errors (including nesting past serde_json's recursion
/// limit of 128) are 400, a well-formed document of the wrong shape or types is 422.
pub(crate) fn json_from_slice<T: DeserializeOwned>(body: &[u8]) -> Result<T, Rejection> {
    serde_json::from_slice(body)
        .map_err(|e| Rejection::new(json_status(&e), format!("invalid JSON body: {e}")))
}

/// 422 for a well-formed document of the wrong shape or types, else 400.
pub(crate) fn json_status(e: &serde_json::Error) -> StatusCode {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
        Category::Syntax | Category::Eof | Category::Io => StatusCode::BAD_REQUEST,
    }
}

/// Refuses (400) a JSON text whose arrays and objects nest deeper than `limit`, before it is
/// deserialized: one pass over the bytes, counting brackets outside strings. The text need not
/// be valid JSON; what is not is left for the parser to reject.
pub(crate) fn check_json_depth(text: &[u8], limit: usize) -> Result<(), Rejection> {
    // `limit + 1` opening brackets are needed to go past the limit.
    if text.len() <= limit {
        return Ok(());
    }
    let mut depth = 0usize;
    let mut rest = text;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Err(Rejection::new(
                        StatusCode::BAD_REQUEST,
                        format!("invalid JSON body: nested deeper than {limit} levels"),
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'"' => rest = skip_string(rest),
            _ => {}
        }
    }
    Ok(())
}

/// The bytes after the closing quote of the string whose opening quote was just passed (empty
/// if it never closes).
fn skip_string(mut s: &[u8]) -> &[u8] {
    while let Some(i) = s.iter().position(|&b| b == b'"' || b == b'\\') {
        if s[i] == b'"' {
            return &s[i + 1..];
        }
        // A backslash escapes the next byte, whatever it is.
        s = s.get(i + 2..).unwrap_or_default();
    }
    &[]
}

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        // Room for a typical answer up front: growing from serde_json's 128 bytes costs a
        // reallocation and a copy at every doubling. 1 KiB (a 20-row TechEmpower answer) costs
        // the allocator no more than 512 bytes: /json measured 2,295 instructions either way.
        let mut body = Vec::with_capacity(1024);
        match serde_json::to_writer(&mut body, &self.0) {
            Ok(()) => Response::json_bytes(body),
            Err(e) => Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot serialize the response: {e}"),
            )
            .into_response(),
        }
    }
}

/// A form body (`application/x-www-form-urlencoded`, else 415) deserialized with
/// `serde_urlencoded`; over the body limit 413; wrong shape or types 422.
///
/// ```
/// use canter::Form;
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Login {
///     user: String,
/// }
/// fn login(Form(f): Form<Login>) -> String {
///     f.user
/// }
/// # let _ = login;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Form<T>(pub T);

impl<T: DeserializeOwned + 'static> FromBody for Form<T> {
    fn from_body(mut parts: Parts) -> impl Future<Output = Result<Self, Rejection>> + 'static {
        let typed = content_type_is(&parts, |m| m == "application/x-www-form-urlencoded");
        async move {
            if !typed {
                return Err(Rejection::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "expected Content-Type: application/x-www-form-urlencoded",
                ));
            }
            let body = parts.collect_body().await?;
            serde_urlencoded::from_bytes(&body).map(Form).map_err(|e| {
                Rejection::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("invalid form body: {e}"),
                )
            })
        }
    }
}

/// Whether the Content-Type's media type (lowercased, parameters dropped) passes `check`.
pub(crate) fn content_type_is(parts: &Parts, check: impl Fn(&str) -> bool) -> bool {
    let Some(value) = parts.header(header::CONTENT_TYPE.as_str()) else {
        return false;
    };
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    if essence.bytes().any(|b| b.is_ascii_uppercase()) {
        check(&essence.to_ascii_lowercase())
    } else {
        check(essence)
    }
}

fn is_json(mime: &str) -> bool {
    mime == "application/json"
        || mime
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}
