//! Request ids: one per request, taken from the client's `x-request-id` when it is sane,
//! otherwise generated; put in the request's extensions and echoed on the response.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use canter_rt::http::{HeaderName, HeaderValue};
use canter_rt::{Reply, Request};

use super::{Middleware, Next};

/// The header carrying the id both ways: `x-request-id`.
///
/// ```
/// assert_eq!(canter::middleware::REQUEST_ID.as_str(), "x-request-id");
/// ```
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied id that is reused; longer ones are replaced by a generated id.
const MAX_LEN: usize = 128;

/// The id of the current request, available to handlers as
/// [`Extension<RequestId>`](crate::Extension) once [`RequestId::layer`] is installed.
///
/// ```
/// use canter::middleware::RequestId;
/// use canter::{get, Extension, Router};
///
/// let app = Router::new()
///     .route("/", get(|Extension(id): Extension<RequestId>| format!("{}\n", id.as_str())))
///     .layer(RequestId::layer());
/// # let _ = app;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The middleware that assigns ids. Each instance (one per worker) generates ids from its
    /// own random 64-bit prefix and a counter: unique without coordination between workers.
    ///
    /// ```
    /// let app = canter::Router::new().layer(canter::middleware::RequestId::layer());
    /// # let _ = app;
    /// ```
    pub fn layer() -> RequestIdLayer {
        RequestIdLayer {
            prefix: RandomState::new().hash_one(std::thread::current().id()),
            counter: Cell::new(0),
        }
    }

    /// The id as text (visible ASCII).
    ///
    /// ```
    /// # let id = canter::middleware::RequestId::from_client(b"abc-1").unwrap();
    /// assert_eq!(id.as_str(), "abc-1");
    /// ```
    pub fn as_str(&self) -> &str {
        // Only visible ASCII is ever stored (see `from_client` and `generate`).
        self.0.to_str().unwrap_or("")
    }

    /// The id a client sent, if it is 1 to 128 characters of `A-Z a-z 0-9 - _ . : / + =`.
    ///
    /// ```
    /// use canter::middleware::RequestId;
    /// assert!(RequestId::from_client(b"4bf92f3577b34da6").is_some());
    /// assert!(RequestId::from_client(b"has space").is_none());
    /// ```
    pub fn from_client(value: &[u8]) -> Option<RequestId> {
        let ok = !value.is_empty()
            && value.len() <= MAX_LEN
            && value
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=".contains(b));
        if !ok {
            return None;
        }
        HeaderValue::from_bytes(value).ok().map(RequestId)
    }
}

/// The middleware made by [`RequestId::layer`].
///
/// ```
/// use canter::middleware::{RequestId, RequestIdLayer};
///
/// let layer: RequestIdLayer = RequestId::layer();
/// let app = canter::Router::new().layer(layer);
/// # let _ = app;
/// ```
#[derive(Debug)]
pub struct RequestIdLayer {
    prefix: u64,
    counter: Cell<u64>,
}

impl RequestIdLayer {
    fn generate(&self) -> RequestId {
        let n = self.counter.get().wrapping_add(1);
        self.counter.set(n);
        let mut buf = [0u8; 32];
        hex(self.prefix, &mut buf[..16]);
        hex(n, &mut buf[16..]);
        // 32 hex digits are always a valid header value.
        RequestId(HeaderValue::from_bytes(&buf).unwrap_or(HeaderValue::from_static("0")))
    }
}

fn hex(mut v: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in out.iter_mut().rev() {
        *b = DIGITS[(v & 15) as usize];
        v >>= 4;
    }
}

impl Middleware for RequestIdLayer {
    fn call(&self, mut req: Request, next: Next<'_>) -> Reply {
        let id = req
            .header(REQUEST_ID.as_str())
            .and_then(RequestId::from_client)
            .unwrap_or_else(|| self.generate());
        let value = id.0.clone();
        req.extensions_mut().insert(id);
        next.run(req).map(move |mut res| {
            res.set_header(REQUEST_ID, value);
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_differ_and_are_hex() {
        let layer = RequestId::layer();
        let a = layer.generate();
        let b = layer.generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(&a.as_str()[..16], &b.as_str()[..16]);
    }

    #[test]
    fn client_ids_are_checked() {
        assert!(RequestId::from_client(b"").is_none());
        assert!(RequestId::from_client(&[b'a'; 129]).is_none());
        assert!(RequestId::from_client(&[b'a'; 128]).is_some());
        assert!(RequestId::from_client(b"a\x7fb").is_none());
        assert!(RequestId::from_client(b"<script>").is_none());
    }
}
