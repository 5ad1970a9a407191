//! Cross-origin resource sharing (the Fetch standard's CORS protocol).

use std::time::Duration;

use canter_rt::http::{header, HeaderValue, Method, StatusCode};
use canter_rt::{Reply, Request, Response};

use super::{Middleware, Next};

#[derive(Debug, Clone)]
enum Origins {
    Any,
    List(Vec<HeaderValue>),
}

#[derive(Debug, Clone)]
enum AllowHeaders {
    /// Echo `Access-Control-Request-Headers`.
    Mirror,
    List(HeaderValue),
}

const VARY_PREFLIGHT: HeaderValue = HeaderValue::from_static(
    "origin, access-control-request-method, access-control-request-headers",
);
const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("origin");
const TRUE: HeaderValue = HeaderValue::from_static("true");
const STAR: HeaderValue = HeaderValue::from_static("*");

/// CORS: answers preflight requests (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`) with 204 and the allowed methods and headers, and adds
/// `Access-Control-Allow-Origin` (plus credentials and exposed headers, if configured) to the
/// responses of allowed origins. Requests without `Origin` pass untouched. A disallowed origin
/// gets no CORS headers, so the browser refuses the response; the server does not.
///
/// ```
/// use std::time::Duration;
/// use canter::middleware::Cors;
/// use canter::rt::http::Method;
///
/// let cors = Cors::new()
///     .allow_origin("https://app.example")
///     .allow_methods(&[Method::GET, Method::POST])
///     .allow_headers(&["content-type", "authorization"])
///     .allow_credentials(true)
///     .max_age(Duration::from_secs(600));
/// let app = canter::Router::new().layer(cors);
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Origins,
    methods: HeaderValue,
    headers: AllowHeaders,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

impl Default for Cors {
    fn default() -> Cors {
        Cors::new()
    }
}

impl Cors {
    /// No origin allowed yet; methods GET, HEAD, POST; request headers mirrored.
    pub fn new() -> Cors {
        Cors {
            origins: Origins::List(Vec::new()),
            methods: HeaderValue::from_static("GET, HEAD, POST"),
            headers: AllowHeaders::Mirror,
            expose: None,
            credentials: false,
            max_age: None,
        }
    }

    /// Any origin (`*`), the common methods, any request header, preflights cached a day.
    ///
    /// ```
    /// let app = canter::Router::new().layer(canter::middleware::Cors::permissive());
    /// # let _ = app;
    /// ```
    pub fn permissive() -> Cors {
        Cors {
            origins: Origins::Any,
            methods: HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            headers: AllowHeaders::Mirror,
            expose: None,
            credentials: false,
            max_age: Some(HeaderValue::from_static("86400")),
        }
    }

    /// Allows `origin` (`scheme://host[:port]`, compared exactly).
    ///
    /// # Panics
    ///
    /// If `origin` is not a valid header value (a programming error).
    pub fn allow_origin(mut self, origin: &str) -> Cors {
        let value = HeaderValue::from_str(origin).expect("origin must be a valid header value");
        match &mut self.origins {
            Origins::Any => self.origins = Origins::List(vec![value]),
            Origins::List(list) => list.push(value),
        }
        self
    }

    /// Allows every origin.
    pub fn allow_any_origin(mut self) -> Cors {
        self.origins = Origins::Any;
        self
    }

    /// The methods preflights allow.
    pub fn allow_methods(mut self, methods: &[Method]) -> Cors {
        self.methods = join(methods.iter().map(Method::as_str));
        self
    }

    /// The request headers preflights allow (default: whatever the preflight asks for).
    ///
    /// # Panics
    ///
    /// If a name is not a valid header value (a programming error).
    pub fn allow_headers(mut self, headers: &[&str]) -> Cors {
        self.headers = AllowHeaders::List(join(headers.iter().copied()));
        self
    }

    /// Response headers the page's script may read.
    ///
    /// # Panics
    ///
    /// If a name is not a valid header value (a programming error).
    pub fn expose_headers(mut self, headers: &[&str]) -> Cors {
        self.expose = Some(join(headers.iter().copied()));
        self
    }

    /// Allows credentials (cookies, authorization). The allowed origin is then echoed instead
    /// of `*`, as browsers require.
    pub fn allow_credentials(mut self, yes: bool) -> Cors {
        self.credentials = yes;
        self
    }

    /// How long browsers may cache a preflight answer.
    pub fn max_age(mut self, age: Duration) -> Cors {
        self.max_age = Some(HeaderValue::from(age.as_secs()));
        self
    }

    /// The `Access-Control-Allow-Origin` value for `origin`, if it is allowed.
    fn allowed(&self, origin: &[u8]) -> Option<HeaderValue> {
        match &self.origins {
            Origins::Any if !self.credentials => Some(STAR),
            Origins::Any => HeaderValue::from_bytes(origin).ok(),
            Origins::List(list) => list.iter().find(|o| o.as_bytes() == origin).cloned(),
        }
    }

    fn preflight(&self, req: &Request, origin: &[u8]) -> Response {
        let mut res = Response::new(StatusCode::NO_CONTENT);
        res.append_header(header::VARY, VARY_PREFLIGHT);
        let Some(allow) = self.allowed(origin) else {
            return res;
        };
        res.append_header(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        res.append_header(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        let headers = match &self.headers {
            AllowHeaders::List(list) => Some(list.clone()),
            AllowHeaders::Mirror => req
                .header("access-control-request-headers")
                .and_then(|v| HeaderValue::from_bytes(v).ok()),
        };
        if let Some(headers) = headers {
            res.append_header(header::ACCESS_CONTROL_ALLOW_HEADERS, headers);
        }
        if self.credentials {
            res.append_header(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
        }
        if let Some(age) = &self.max_age {
            res.append_header(header::ACCESS_CONTROL_MAX_AGE, age.clone());
        }
        res
    }
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> HeaderValue {
    let joined = items.collect::<Vec<_>>().join(", ");
    HeaderValue::from_str(&joined).expect("method and header names are valid header values")
}

impl Middleware for Cors {
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        let Some(origin) = req.header("origin") else {
            return next.run(req);
        };
        if *req.method() == Method::OPTIONS && req.header("access-control-request-method").is_some()
        {
            return Reply::Ready(self.preflight(&req, origin));
        }
        let allow = self.allowed(origin);
        let wildcard = allow.as_ref() == Some(&STAR);
        let (credentials, expose) = (self.credentials, self.expose.clone());
        next.run(req).map(move |mut res| {
            if !wildcard {
                res.append_header(header::VARY, VARY_ORIGIN);
            }
            if let Some(allow) = allow {
                res.set_header(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
                if credentials {
                    res.set_header(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, TRUE);
                }
                if let Some(expose) = expose {
                    res.set_header(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose);
                }
            }
            res
        })
    }
}
