//! The router: a compiled path matcher (`matchit`, a radix tree) from route patterns to
//! per-method handler tables.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use canter_rt::http::{header, HeaderValue, Method, StatusCode};
use canter_rt::{BodyKind, Reply, Request, RequestHead, Response, Service};
use smallvec::SmallVec;

use super::extract::{
    Params, Parts, Rejection, States, DEFAULT_BODY_LIMIT, DEFAULT_JSON_DEPTH_LIMIT,
};
use super::handler::{Erased, ErasedHandler, Handler};
use super::response::IntoResponse;
use crate::middleware::{Layered, Middleware};

type Endpoint = Rc<dyn ErasedHandler>;

fn endpoint<H: Handler<T>, T: 'static>(handler: H) -> Endpoint {
    Rc::new(Erased {
        handler,
        _marker: PhantomData,
    })
}

/// The handlers of one route, by method. HEAD requests go to the GET handler unless a HEAD
/// handler is set (the runtime drops the body of a response to HEAD).
///
/// ```
/// use canter::{get, Router};
///
/// fn read() -> &'static str { "read\n" }
/// fn write() -> &'static str { "written\n" }
/// let app = Router::new().route("/doc", get(read).post(write).put(write));
/// # let _ = app;
/// ```
#[derive(Clone, Default)]
pub struct MethodRouter {
    endpoints: Vec<(Method, Endpoint)>,
    /// The handler for methods without their own (see [`any`]).
    any: Option<Endpoint>,
    limits: RouteLimits,
    /// `limits` is not the default (checked once here instead of per request).
    limited: bool,
}

/// Limits of one route, stricter than the server's (which apply while the request is parsed,
/// before any routing). Checked as soon as the route is known, before the handler runs and
/// before any body byte is read: a larger head or more fields get 431, a longer target 414, a
/// declared body over `max_body` 413 (and no `100 Continue`); `max_body` also bounds the body
/// extractors (`Json`, `Form`, `Bytes`, `String`) when the body is chunked.
///
/// ```
/// use canter::{post, RouteLimits, Router};
///
/// fn upload(body: bytes::Bytes) -> String { format!("{} bytes\n", body.len()) }
///
/// let limits = RouteLimits { max_body: Some(64 * 1024), max_headers: Some(20), ..RouteLimits::default() };
/// let app = Router::new().route("/upload", post(upload).limits(limits));
/// # let _ = app;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteLimits {
    /// Largest request head (request line and header section), in bytes.
    pub max_head: Option<usize>,
    /// Most header fields.
    pub max_headers: Option<usize>,
    /// Longest request target, in bytes.
    pub max_target: Option<usize>,
    /// Largest request body, in bytes.
    pub max_body: Option<usize>,
    /// Longest chunk extension in a chunked body, in bytes.
    pub max_chunk_ext: Option<usize>,
}

impl RouteLimits {
    /// The first limit `head` breaks, as the rejection to answer with.
    fn check(&self, head: &RequestHead) -> Result<(), Rejection> {
        if self.max_head.is_some_and(|max| head.raw().len() > max) {
            return Err(Rejection::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request head too large for this route",
            ));
        }
        if self
            .max_headers
            .is_some_and(|max| head.headers().count() > max)
        {
            return Err(Rejection::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header fields for this route",
            ));
        }
        if self.max_target.is_some_and(|max| head.target().len() > max) {
            return Err(Rejection::new(
                StatusCode::URI_TOO_LONG,
                "request target too long for this route",
            ));
        }
        let declared = match head.body_kind() {
            BodyKind::Length(n) => n,
            BodyKind::Chunked => 0,
        };
        if self.max_body.is_some_and(|max| declared > max as u64) {
            return Err(Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large for this route",
            ));
        }
        Ok(())
    }
}

macro_rules! method_fns {
    ($($(#[$doc:meta])* $name:ident => $method:ident,)*) => {
        impl MethodRouter {
            $($(#[$doc])*
            pub fn $name<H: Handler<T>, T: 'static>(self, handler: H) -> MethodRouter {
                self.on(Method::$method, handler)
            })*
        }

        $($(#[$doc])*
        pub fn $name<H: Handler<T>, T: 'static>(handler: H) -> MethodRouter {
            MethodRouter::new().on(Method::$method, handler)
        })*
    };
}

method_fns! {
    /// Routes GET (and HEAD, unless HEAD has its own handler) to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::get(|| "hi\n"));
    /// # let _ = app;
    /// ```
    get => GET,
    /// Routes POST to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::post(|body: String| body));
    /// # let _ = app;
    /// ```
    post => POST,
    /// Routes PUT to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::put(|| "put\n"));
    /// # let _ = app;
    /// ```
    put => PUT,
    /// Routes DELETE to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::delete(|| "gone\n"));
    /// # let _ = app;
    /// ```
    delete => DELETE,
    /// Routes PATCH to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::patch(|| "patched\n"));
    /// # let _ = app;
    /// ```
    patch => PATCH,
    /// Routes HEAD to `handler` (instead of the GET handler).
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::head(|| ()));
    /// # let _ = app;
    /// ```
    head => HEAD,
    /// Routes OPTIONS to `handler`.
    ///
    /// ```
    /// let app = canter::Router::new().route("/", canter::options(|| ()));
    /// # let _ = app;
    /// ```
    options => OPTIONS,
}

/// Routes every method to `handler` (methods given their own handler, e.g. with
/// `any(h).post(p)`, still go to that one).
///
/// ```
/// use canter::{any, Router};
/// use canter::rt::http::Method;
///
/// let app = Router::new().route("/anything", any(|m: Method| format!("{m}\n")));
/// # let _ = app;
/// ```
pub fn any<H: Handler<T>, T: 'static>(handler: H) -> MethodRouter {
    MethodRouter::new().any(handler)
}

impl MethodRouter {
    /// An empty table (every method answered with 405).
    pub fn new() -> MethodRouter {
        MethodRouter::default()
    }

    /// Routes the methods that have no handler of their own to `handler` (no more 405s).
    ///
    /// ```
    /// use canter::rt::http::StatusCode;
    /// use canter::{get, Router};
    ///
    /// let app = Router::new().route(
    ///     "/doc",
    ///     get(|| "doc\n").any(|| (StatusCode::IM_A_TEAPOT, "not here\n")),
    /// );
    /// # let _ = app;
    /// ```
    pub fn any<H: Handler<T>, T: 'static>(mut self, handler: H) -> MethodRouter {
        self.any = Some(endpoint(handler));
        self
    }

    /// Routes `method` to `handler`, replacing an earlier handler for it.
    ///
    /// ```
    /// use canter::rt::http::Method;
    /// use canter::{MethodRouter, Router};
    ///
    /// let purge = MethodRouter::new().on(Method::from_bytes(b"PURGE").unwrap(), || "purged\n");
    /// let app = Router::new().route("/cache", purge);
    /// # let _ = app;
    /// ```
    pub fn on<H: Handler<T>, T: 'static>(mut self, method: Method, handler: H) -> MethodRouter {
        self.set(method, endpoint(handler));
        self
    }

    /// Sets limits for this route (all its methods); see [`RouteLimits`].
    pub fn limits(mut self, limits: RouteLimits) -> MethodRouter {
        self.limits = limits;
        self.limited = limits != RouteLimits::default();
        self
    }

    fn set(&mut self, method: Method, endpoint: Endpoint) {
        match self.endpoints.iter_mut().find(|(m, _)| *m == method) {
            Some(slot) => slot.1 = endpoint,
            None => self.endpoints.push((method, endpoint)),
        }
    }

    fn merge(&mut self, other: MethodRouter) {
        for (method, endpoint) in other.endpoints {
            self.set(method, endpoint);
        }
        if other.any.is_some() {
            self.any = other.any;
        }
        // Limits are per route: the later ones set for a pattern apply to all its methods.
        if other.limited {
            self.limits = other.limits;
            self.limited = true;
        }
    }

    #[inline]
    fn find(&self, method: &Method) -> Option<&Endpoint> {
        let exact = self.endpoints.iter().find(|(m, _)| m == method);
        match exact {
            Some((_, e)) => Some(e),
            None if *method == Method::HEAD => self
                .endpoints
                .iter()
                .find(|(m, _)| *m == Method::GET)
                .map(|(_, e)| e)
                .or(self.any.as_ref()),
            None => self.any.as_ref(),
        }
    }

    /// The `Allow` value: the standard methods in a fixed order (HEAD after GET), then others.
    fn allow(&self) -> HeaderValue {
        allow_value(self.endpoints.iter().map(|(m, _)| m))
    }
}

/// The `Allow` value for `methods`: the standard ones in a fixed order (HEAD with GET), then
/// the others in the order given, each once.
fn allow_value<'m>(methods: impl Iterator<Item = &'m Method> + Clone) -> HeaderValue {
    const ORDER: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    let has = |m: &Method| methods.clone().any(|x| x == m);
    let mut names: Vec<&str> = ORDER
        .iter()
        .filter(|m| has(m) || (**m == Method::HEAD && has(&Method::GET)))
        .map(Method::as_str)
        .collect();
    for m in methods.clone().filter(|m| !ORDER.contains(m)) {
        if !names.contains(&m.as_str()) {
            names.push(m.as_str());
        }
    }
    // Method names are tokens, so the joined list is a valid field value.
    HeaderValue::from_str(&names.join(", ")).unwrap_or(HeaderValue::from_static(""))
}

impl fmt::Debug for MethodRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.endpoints.iter().map(|(m, _)| m))
            .finish()
    }
}

#[derive(Clone)]
struct Route {
    pattern: String,
    methods: MethodRouter,
    /// The body limit of the router this route was defined in, if it set one and was nested.
    body_limit: Option<usize>,
    allow: HeaderValue,
    /// Parameter names in pattern order; `None` for a route without parameters.
    names: Option<Rc<[Box<str>]>>,
}

/// A word-at-a-time multiplicative hash (FxHash's mix) for maps keyed by paths the application
/// or the file system chose, never the client: the static-route map (only route patterns are
/// stored, so a request path crafted to collide can cost no more than comparisons with the few
/// stored keys of one probe group) and the static files' compression cache (only files that
/// exist are stored).
#[derive(Default, Clone, Copy)]
pub(crate) struct PathHasher(u64);

impl PathHasher {
    /// Folds one word into the state.
    #[inline]
    fn mix(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl std::hash::Hasher for PathHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            self.mix(tail_word(bytes, rest.len()));
        }
    }

    /// The statics map's keys are already path hashes: one more mix spreads them.
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type BuildPathHasher = std::hash::BuildHasherDefault<PathHasher>;

/// The last `r` (1 to 7) bytes of `bytes` as a little-endian word, zero above them: read with
/// whole-word loads (overlapping what came before) rather than copied into a zeroed array,
/// which costs a call to memcpy and a stalled load.
#[inline]
fn tail_word(bytes: &[u8], r: usize) -> u64 {
    let n = bytes.len();
    let le8 = |i: usize| {
        bytes
            .get(i..i + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let le4 = |i: usize| {
        bytes
            .get(i..i + 4)
            .and_then(|s| s.try_into().ok())
            .map_or(0, |w| u64::from(u32::from_le_bytes(w)))
    };
    if n >= 8 {
        le8(n - 8) >> (8 * (8 - r))
    } else if r >= 4 {
        // Two overlapping halves; the bytes they share are equal, so OR is exact.
        le4(0) | (le4(n - 4) << (8 * (r - 4)))
    } else {
        bytes
            .iter()
            .rev()
            .fold(0u64, |w, &b| (w << 8) | u64::from(b))
    }
}

/// The key of a path in [`Statics::hashed`].
#[inline]
fn path_hash(path: &str) -> u64 {
    let mut h = PathHasher::default();
    std::hash::Hasher::write(&mut h, path.as_bytes());
    h.0
}

/// Routes without parameters, found by their exact path instead of a tree walk (the tree gives
/// static segments priority, so an exact match is its answer too). Candidates are checked
/// against the route's pattern.
#[derive(Clone)]
struct Statics {
    /// For paths shorter than [`Statics::SHORT`] bytes, by length: the routes of that length,
    /// compared in turn, or `None` once more than [`Statics::SCAN`] share it (then `hashed`
    /// answers). An index and a compare or two cost less than hashing the path.
    by_len: Vec<Option<SmallVec<[usize; 2]>>>,
    /// Every static route, by the hash of its path ([`path_hash`]).
    hashed: HashMap<u64, SmallVec<[usize; 1]>, BuildPathHasher>,
}

impl Statics {
    const SHORT: usize = 64;
    const SCAN: usize = 4;

    fn new() -> Statics {
        Statics {
            by_len: vec![Some(SmallVec::new()); Statics::SHORT],
            hashed: HashMap::default(),
        }
    }

    fn add(&mut self, pattern: &str, index: usize) {
        self.hashed
            .entry(path_hash(pattern))
            .or_default()
            .push(index);
        if let Some(slot) = self.by_len.get_mut(pattern.len()) {
            match slot {
                Some(same_len) if same_len.len() < Statics::SCAN => same_len.push(index),
                _ => *slot = None,
            }
        }
    }

    /// Indexes of the routes whose pattern may be `path` (exactly those of its length, or those
    /// of its hash).
    #[inline]
    fn candidates(&self, path: &str) -> &[usize] {
        match self.by_len.get(path.len()) {
            Some(Some(same_len)) => same_len,
            _ => self
                .hashed
                .get(&path_hash(path))
                .map_or(&[], |c| c.as_slice()),
        }
    }
}

#[derive(Clone)]
struct Table {
    matcher: matchit::Router<usize>,
    statics: Statics,
    routes: Vec<Route>,
    fallback: Option<Endpoint>,
    states: Rc<States>,
    /// Set with [`Router::body_limit`]; [`DEFAULT_BODY_LIMIT`] when `None`.
    body_limit: Option<usize>,
    /// Set with [`Router::json_depth_limit`].
    json_depth_limit: usize,
}

impl Table {
    /// The answer to `OPTIONS *`, a question about the server as a whole (RFC 9110 §9.3.7):
    /// 204 with every method some route serves, and OPTIONS itself. A route that takes any
    /// method adds the standard ones.
    #[cold]
    fn options_asterisk(&self) -> Response {
        let mut methods: Vec<Method> = vec![Method::OPTIONS];
        for route in &self.routes {
            methods.extend(route.methods.endpoints.iter().map(|(m, _)| m.clone()));
            if route.methods.any.is_some() {
                methods.extend([
                    Method::GET,
                    Method::POST,
                    Method::PUT,
                    Method::DELETE,
                    Method::PATCH,
                ]);
            }
        }
        Response::new(StatusCode::NO_CONTENT)
            .with_header(header::ALLOW, allow_value(methods.iter()))
    }

    /// Adds a route, or merges `methods` into the route with the same pattern.
    fn try_add(
        &mut self,
        pattern: String,
        methods: MethodRouter,
        body_limit: Option<usize>,
    ) -> Result<(), matchit::InsertError> {
        if let Some(route) = self.routes.iter_mut().find(|r| r.pattern == pattern) {
            route.methods.merge(methods);
            route.allow = route.methods.allow();
            return Ok(());
        }
        let index = self.routes.len();
        self.matcher.insert(pattern.clone(), index)?;
        if !pattern.contains(['{', '}']) {
            self.statics.add(&pattern, index);
        }
        let names: Vec<Box<str>> = param_names(&pattern);
        let allow = methods.allow();
        self.routes.push(Route {
            pattern,
            methods,
            body_limit,
            allow,
            names: (!names.is_empty()).then(|| names.into()),
        });
        Ok(())
    }
}

/// Routes requests to handlers by path and method; a [`Service`] for
/// [`Server::serve`](canter_rt::Server::serve).
///
/// - Patterns are matched by a compiled radix tree (`matchit`): `/users/{id}` captures one
///   segment, `/files/{*rest}` the rest of the path. Static segments win over parameters.
/// - A path that matches with a method that has no handler gets 405 with `Allow`; HEAD is
///   served by GET; a path that matches nothing goes to the [fallback](Router::fallback)
///   (default: 404 `not found`).
/// - The router holds `Rc`s (handlers need not be `Send`): build one per worker in the
///   factory given to `serve`. Cloning it is one reference count.
///
/// ```no_run
/// use canter::rt::{Config, Server};
/// use canter::{get, Path, Router};
///
/// fn hello(Path(name): Path<String>) -> String {
///     format!("Hello, {name}!")
/// }
///
/// fn app() -> Router {
///     Router::new().route("/hello/{name}", get(hello))
/// }
///
/// Server::bind(Config::default()).unwrap().serve(|_worker| app()).unwrap();
/// ```
#[derive(Clone)]
pub struct Router {
    table: Rc<Table>,
}

impl Default for Router {
    fn default() -> Router {
        Router::new()
    }
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for r in &self.table.routes {
            m.entry(&r.pattern, &r.methods);
        }
        m.finish()
    }
}

impl Router {
    /// A router with no routes.
    pub fn new() -> Router {
        Router {
            table: Rc::new(Table {
                matcher: matchit::Router::new(),
                statics: Statics::new(),
                routes: Vec::new(),
                fallback: None,
                states: Rc::new(States::default()),
                body_limit: None,
                json_depth_limit: DEFAULT_JSON_DEPTH_LIMIT,
            }),
        }
    }

    /// Adds `methods` at `pattern` (merged with earlier handlers for the same pattern).
    ///
    /// # Panics
    ///
    /// If the pattern is invalid or conflicts with another one (for example `/a/{x}` and
    /// `/a/{y}`): a programming error, caught when the router is built.
    ///
    /// ```
    /// use canter::{get, post, Router};
    ///
    /// let app = Router::new()
    ///     .route("/items", get(|| "list\n"))
    ///     .route("/items", post(|| "created\n"))
    ///     .route("/static/{*file}", get(|| "a file\n"));
    /// # let _ = app;
    /// ```
    pub fn route(mut self, pattern: &str, methods: MethodRouter) -> Router {
        self.add(pattern.to_owned(), methods, None);
        self
    }

    /// Mounts every route of `sub` under `prefix` (`"/api"` + `"/items"` is `"/api/items"`; the
    /// sub-router's `"/"` is `prefix` itself), and adds its state (values of a type this router
    /// already has are not replaced). The sub-router keeps its own [body
    /// limit](Router::body_limit), if it set one, and its [fallback](Router::fallback) answers
    /// the paths under `prefix` that none of its routes match.
    ///
    /// # Panics
    ///
    /// If `prefix` does not start with `/`, ends with `/`, or a mounted route conflicts.
    ///
    /// ```
    /// use canter::rt::http::StatusCode;
    /// use canter::{get, Router};
    ///
    /// let api = Router::new()
    ///     .route("/status", get(|| "ok\n"))
    ///     .fallback(|| (StatusCode::NOT_FOUND, "no such API\n"))
    ///     .body_limit(64 * 1024);
    /// let app = Router::new().nest("/api", api); // GET /api/status; /api/other: "no such API"
    /// # let _ = app;
    /// ```
    pub fn nest(mut self, prefix: &str, sub: Router) -> Router {
        assert!(
            prefix.starts_with('/') && !prefix.ends_with('/'),
            "nest prefix {prefix:?} must start with '/' and not end with it"
        );
        let sub = Rc::unwrap_or_clone(sub.table);
        for route in sub.routes {
            let pattern = if route.pattern == "/" {
                prefix.to_owned()
            } else {
                format!("{prefix}{}", route.pattern)
            };
            let limit = route.body_limit.or(sub.body_limit);
            self.add(pattern, route.methods, limit);
        }
        if let Some(fallback) = sub.fallback {
            // Everything under the prefix that no mounted route matches. A sub-router with a
            // catch-all of its own already covers these paths (the insert then fails: skip).
            let catch_all = MethodRouter {
                any: Some(fallback),
                ..MethodRouter::default()
            };
            let table = Rc::make_mut(&mut self.table);
            if !table.routes.iter().any(|r| r.pattern == prefix) {
                let _ = table.try_add(prefix.to_owned(), catch_all.clone(), sub.body_limit);
            }
            let _ = table.try_add(
                format!("{prefix}/{{*__canter_rest}}"),
                catch_all,
                sub.body_limit,
            );
        }
        let table = Rc::make_mut(&mut self.table);
        let states = Rc::make_mut(&mut table.states);
        for (id, value) in &sub.states.0 {
            if !states.0.iter().any(|(t, _)| t == id) {
                states.0.push((*id, value.clone()));
            }
        }
        self
    }

    /// The handler for paths no route matches (default: 404 with `not found`).
    ///
    /// ```
    /// use canter::rt::http::StatusCode;
    /// use canter::Router;
    ///
    /// let app = Router::new().fallback(|| (StatusCode::NOT_FOUND, "nothing here\n"));
    /// # let _ = app;
    /// ```
    pub fn fallback<H: Handler<T>, T: 'static>(mut self, handler: H) -> Router {
        Rc::make_mut(&mut self.table).fallback = Some(endpoint(handler));
        self
    }

    /// Registers `value` for the [`State<T>`](super::State) extractor (one value per type; a
    /// second one of the same type replaces the first).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use canter::{get, Router, State};
    ///
    /// let app = Router::new()
    ///     .route("/name", get(|State(name): State<Arc<str>>| name.to_string()))
    ///     .with_state::<Arc<str>>(Arc::from("canter"));
    /// # let _ = app;
    /// ```
    pub fn with_state<T: Clone + 'static>(mut self, value: T) -> Router {
        let table = Rc::make_mut(&mut self.table);
        let states = Rc::make_mut(&mut table.states);
        let id = TypeId::of::<T>();
        let value: Rc<dyn Any> = Rc::new(value);
        match states.0.iter_mut().find(|(t, _)| *t == id) {
            Some(slot) => slot.1 = value,
            None => states.0.push((id, value)),
        }
        self
    }

    /// The limit for bodies read by [`Json`](super::Json), [`Form`](super::Form), `Bytes`,
    /// `String`, [`JsonLines`](super::JsonLines) and [`Multipart`](super::Multipart) (default
    /// 1 MiB; more is answered with 413).
    ///
    /// ```
    /// let app = canter::Router::new().body_limit(64 * 1024);
    /// # let _ = app;
    /// ```
    pub fn body_limit(mut self, limit: usize) -> Router {
        Rc::make_mut(&mut self.table).body_limit = Some(limit);
        self
    }

    /// The deepest nesting of arrays and objects accepted in JSON bodies read by
    /// [`Json`](super::Json) and [`JsonLines`](super::JsonLines) (default 64; deeper is
    /// answered with 400 before deserializing). serde_json's own recursion limit of 128 still
    /// applies above that.
    ///
    /// ```
    /// let app = canter::Router::new().json_depth_limit(16);
    /// # let _ = app;
    /// ```
    pub fn json_depth_limit(mut self, levels: usize) -> Router {
        Rc::make_mut(&mut self.table).json_depth_limit = levels;
        self
    }

    fn add(&mut self, pattern: String, methods: MethodRouter, body_limit: Option<usize>) {
        let table = Rc::make_mut(&mut self.table);
        if let Err(e) = table.try_add(pattern.clone(), methods, body_limit) {
            panic!("invalid route {pattern:?}: {e}");
        }
    }

    /// Routes one request: match the path, pick the method's handler, run it.
    #[inline]
    fn dispatch(&self, mut req: Request) -> Reply {
        let table = &*self.table;
        let path = req.path();
        let exact = table
            .statics
            .candidates(path)
            .iter()
            .map(|&i| &table.routes[i])
            .find(|r| same_path(r.pattern.as_bytes(), path.as_bytes()));
        let (route, spans) = if let Some(route) = exact {
            (route, SmallVec::new())
        } else {
            let Ok(found) = table.matcher.at(path) else {
                // Only OPTIONS may have the asterisk-form target (the parsers refuse others).
                if path == "*" {
                    return Reply::Ready(table.options_asterisk());
                }
                return match &table.fallback {
                    Some(fallback) => fallback.call(Parts {
                        req,
                        body_taken: false,
                        params: Params::default(),
                        states: table.states.clone(),
                        body_limit: table.body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
                        json_depth_limit: table.json_depth_limit,
                    }),
                    None => Reply::Ready(
                        Response::text("not found\n").with_status(StatusCode::NOT_FOUND),
                    ),
                };
            };
            let route = &table.routes[*found.value];
            let mut spans: SmallVec<[(u32, u32); 4]> = SmallVec::new();
            if route.names.is_some() {
                let base = path.as_ptr() as usize;
                spans.extend(found.params.iter().map(|(_, v)| {
                    // Parameter values are slices of `path`; keep them as offsets.
                    let start = (v.as_ptr() as usize).wrapping_sub(base);
                    (start as u32, (start + v.len()) as u32)
                }));
            }
            (route, spans)
        };
        let found = route.methods.find(req.method()).or_else(|| {
            // HTTP/2's extended CONNECT (RFC 8441) is how a WebSocket opens there: the GET
            // route that upgrades over HTTP/1.1 serves it too.
            (*req.method() == Method::CONNECT
                && req
                    .extensions()
                    .get::<canter_rt::ConnectProtocol>()
                    .is_some())
            .then(|| route.methods.find(&Method::GET))
            .flatten()
        });
        let Some(endpoint) = found else {
            return Reply::Ready(
                Response::text("method not allowed\n")
                    .with_status(StatusCode::METHOD_NOT_ALLOWED)
                    .with_header(header::ALLOW, route.allow.clone()),
            );
        };
        let base = route
            .body_limit
            .or(table.body_limit)
            .unwrap_or(DEFAULT_BODY_LIMIT);
        let mut body_limit = base;
        if route.methods.limited {
            let limits = &route.methods.limits;
            if let Err(rejection) = limits.check(req.head()) {
                return Reply::Ready(rejection.into_response());
            }
            body_limit = limits.max_body.map_or(base, |max| max.min(base));
            if limits.max_body.is_some() || limits.max_chunk_ext.is_some() {
                req.body_mut().restrict(
                    limits.max_body.map_or(u64::MAX, |n| n as u64),
                    limits.max_chunk_ext.unwrap_or(usize::MAX),
                );
            }
        }
        endpoint.call(Parts {
            req,
            body_taken: false,
            params: Params {
                names: route.names.clone(),
                spans,
            },
            states: table.states.clone(),
            body_limit,
            json_depth_limit: table.json_depth_limit,
        })
    }

    /// Wraps the router in a [`Middleware`] (see [`crate::middleware`]); layers added later
    /// run first.
    ///
    /// ```
    /// use canter::middleware::AccessLog;
    /// use canter::{get, Router};
    ///
    /// let app = Router::new().route("/", get(|| "hi\n")).layer(AccessLog::new());
    /// # let _ = app;
    /// ```
    pub fn layer<M: Middleware>(self, middleware: M) -> Layered<M, Router> {
        Layered::new(middleware, self)
    }

    /// Routes a request given as a parsed head without a body. For benchmarks and tests that
    /// cannot build a runtime `Request`; not part of the stable API.
    #[doc(hidden)]
    pub fn dispatch_head(&self, method: Method, head: RequestHead) -> Reply {
        self.dispatch(Request::detached(method, head))
    }
}

impl Service for Router {
    #[inline]
    fn call(&self, req: Request) -> Reply {
        self.dispatch(req)
    }
}

/// Path equality for the exact-route lookup, inlined: a word at a time, the last word
/// overlapping the one before. For these short strings a call to `memcmp` (what `==` on slices
/// becomes) costs more than the compare: 15 instructions more per pipelined request by callgrind.
#[inline(always)]
fn same_path(a: &[u8], b: &[u8]) -> bool {
    fn at<const N: usize>(s: &[u8], i: usize) -> Option<[u8; N]> {
        s.get(i..i + N)?.try_into().ok()
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if at::<8>(a, i) != at::<8>(b, i) {
                return false;
            }
            i += 8;
        }
        return at::<8>(a, n - 8) == at::<8>(b, n - 8);
    }
    if n >= 4 {
        return at::<4>(a, 0) == at::<4>(b, 0) && at::<4>(a, n - 4) == at::<4>(b, n - 4);
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// The names of `{name}` and `{*name}` segments, in order (`{{`/`}}` are escaped braces).
fn param_names(pattern: &str) -> Vec<Box<str>> {
    let mut names = Vec::new();
    let mut rest = pattern;
    while let Some(i) = rest.find('{') {
        if rest[i + 1..].starts_with('{') {
            rest = &rest[i + 2..];
            continue;
        }
        let Some(end) = rest[i..].find('}') else {
            break;
        };
        let name = rest[i + 1..i + end].trim_start_matches('*');
        names.push(name.into());
        rest = &rest[i + end + 1..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal to slice equality for every length and every position of a single difference.
    #[test]
    fn same_path_is_slice_equality() {
        let a: Vec<u8> = (0..70u8)
            .map(|b| b.wrapping_mul(31).wrapping_add(7))
            .collect();
        for n in 0..a.len() {
            let x = &a[..n];
            assert!(same_path(x, x), "{n}");
            assert!(!same_path(x, &a[..n + 1]), "{n} against {}", n + 1);
            for i in 0..n {
                let mut y = x.to_vec();
                y[i] ^= 0x01;
                assert!(!same_path(x, &y), "{n}: byte {i} differs");
            }
        }
    }

    #[test]
    fn tail_word_is_the_zero_padded_remainder() {
        let bytes: Vec<u8> = (1..=40u8).map(|b| b.wrapping_mul(37)).collect();
        for n in 1..=bytes.len() {
            let r = n % 8;
            if r == 0 {
                continue;
            }
            let mut w = [0u8; 8];
            w[..r].copy_from_slice(&bytes[n - r..n]);
            assert_eq!(
                tail_word(&bytes[..n], r),
                u64::from_le_bytes(w),
                "length {n}"
            );
        }
    }

    #[test]
    fn names_in_order() {
        let n = param_names("/a/{x}/b/{{lit}}/{*rest}");
        assert_eq!(n, vec!["x".into(), "rest".into()] as Vec<Box<str>>);
    }
}
