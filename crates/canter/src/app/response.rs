//! Turning handler results into responses: [`IntoResponse`] and the small wrappers that pick a
//! content type ([`Html`], [`Json`](super::Json)) or a status ([`Redirect`]).

use std::borrow::Cow;

use bytes::Bytes;
use canter_rt::http::{header, HeaderName, HeaderValue, StatusCode};
use canter_rt::{Body, Response};

const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// Anything a handler may return.
///
/// Implemented for strings (`text/plain`), byte buffers (`application/octet-stream`),
/// [`Json`](super::Json), [`Html`], [`maud::Markup`] (`text/html`), [`Redirect`], [`StatusCode`],
/// `(StatusCode, T)`, `(StatusCode, [(HeaderName, HeaderValue); N], T)`, the runtime's
/// [`Response`] and `Result<T, E>` where both sides implement it.
///
/// ```
/// use canter::rt::http::StatusCode;
/// use canter::IntoResponse;
///
/// fn teapot() -> impl IntoResponse {
///     (StatusCode::IM_A_TEAPOT, "short and stout\n")
/// }
/// assert_eq!(teapot().into_response().status(), 418);
/// ```
pub trait IntoResponse {
    /// Converts `self` into a response.
    fn into_response(self) -> Response;
}

impl IntoResponse for Response {
    #[inline]
    fn into_response(self) -> Response {
        self
    }
}

impl IntoResponse for &'static str {
    #[inline]
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

impl IntoResponse for String {
    #[inline]
    fn into_response(self) -> Response {
        Response::text(self)
    }
}

impl IntoResponse for Cow<'static, str> {
    #[inline]
    fn into_response(self) -> Response {
        match self {
            Cow::Borrowed(s) => Response::text(s),
            Cow::Owned(s) => Response::text(s),
        }
    }
}

impl IntoResponse for Bytes {
    #[inline]
    fn into_response(self) -> Response {
        Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTET_STREAM)
            .with_body(self)
    }
}

impl IntoResponse for Vec<u8> {
    #[inline]
    fn into_response(self) -> Response {
        Bytes::from(self).into_response()
    }
}

impl IntoResponse for &'static [u8] {
    #[inline]
    fn into_response(self) -> Response {
        Bytes::from_static(self).into_response()
    }
}

impl IntoResponse for () {
    /// An empty 200.
    #[inline]
    fn into_response(self) -> Response {
        Response::new(StatusCode::OK)
    }
}

impl IntoResponse for StatusCode {
    /// An empty response with this status.
    #[inline]
    fn into_response(self) -> Response {
        Response::new(self)
    }
}

impl IntoResponse for maud::Markup {
    /// `text/html; charset=utf-8`; maud has already escaped every interpolated value.
    #[inline]
    fn into_response(self) -> Response {
        Response::html(self.0)
    }
}

impl<T: IntoResponse, E: IntoResponse> IntoResponse for Result<T, E> {
    #[inline]
    fn into_response(self) -> Response {
        match self {
            Ok(t) => t.into_response(),
            Err(e) => e.into_response(),
        }
    }
}

impl<T: IntoResponse> IntoResponse for (StatusCode, T) {
    #[inline]
    fn into_response(self) -> Response {
        self.1.into_response().with_status(self.0)
    }
}

impl<T: IntoResponse, const N: usize> IntoResponse for ([(HeaderName, HeaderValue); N], T) {
    #[inline]
    fn into_response(self) -> Response {
        let mut r = self.1.into_response();
        for (name, value) in self.0 {
            r = r.with_header(name, value);
        }
        r
    }
}

impl<T: IntoResponse, const N: usize> IntoResponse
    for (StatusCode, [(HeaderName, HeaderValue); N], T)
{
    #[inline]
    fn into_response(self) -> Response {
        (self.1, self.2).into_response().with_status(self.0)
    }
}

/// An HTML body (`text/html; charset=utf-8`) from a string or bytes you trust; for HTML built
/// from user input use [`maud::html!`], which escapes.
///
/// ```
/// use canter::Html;
///
/// fn index() -> Html<&'static str> {
///     Html("<h1>canter</h1>")
/// }
/// # let _ = index;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Html<T>(pub T);

impl<T: Into<Body>> IntoResponse for Html<T> {
    #[inline]
    fn into_response(self) -> Response {
        Response::html(self.0)
    }
}

/// A redirect: `Location` plus 303 ([`Redirect::to`]), 307 ([`Redirect::temporary`]) or 308
/// ([`Redirect::permanent`]).
///
/// ```
/// use canter::{IntoResponse, Redirect};
///
/// let r = Redirect::permanent("/new").into_response();
/// assert_eq!(r.status(), 308);
/// ```
#[derive(Debug, Clone)]
pub struct Redirect {
    status: StatusCode,
    /// `None` if the target is not a valid field value (answered with 500).
    location: Option<HeaderValue>,
}

impl Redirect {
    /// 303 See Other: the client follows with a GET.
    pub fn to(uri: &str) -> Redirect {
        Redirect::with_status(StatusCode::SEE_OTHER, uri)
    }

    /// 307 Temporary Redirect: the client repeats the same method and body.
    pub fn temporary(uri: &str) -> Redirect {
        Redirect::with_status(StatusCode::TEMPORARY_REDIRECT, uri)
    }

    /// 308 Permanent Redirect: like 307, and cacheable.
    pub fn permanent(uri: &str) -> Redirect {
        Redirect::with_status(StatusCode::PERMANENT_REDIRECT, uri)
    }

    fn with_status(status: StatusCode, uri: &str) -> Redirect {
        Redirect {
            status,
            location: HeaderValue::from_str(uri).ok(),
        }
    }
}

impl IntoResponse for Redirect {
    fn into_response(self) -> Response {
        match self.location {
            Some(location) => Response::new(self.status).with_header(header::LOCATION, location),
            None => super::Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "redirect target is not a valid header value",
            )
            .into_response(),
        }
    }
}
