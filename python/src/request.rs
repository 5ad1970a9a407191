//! The request as Python handlers see it: built from the parsed head without copying it; every
//! attribute is computed when first asked for.

use std::borrow::Cow;

use bytes::Bytes;
use canter_rt::RequestHead;
use percent_encoding::percent_decode_str;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::HTTPError;

/// A request: method, path, query, headers, body and path parameters.
#[pyclass(module = "canter", frozen)]
pub struct Request {
    pub(crate) head: RequestHead,
    pub(crate) body: Bytes,
    /// Path parameters, decoded, in the route pattern's order.
    pub(crate) params: Vec<(std::sync::Arc<str>, String)>,
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// The request came over TLS.
    pub(crate) tls: bool,
}

/// Percent-decodes `s` (invalid UTF-8 replaced), borrowing it when it has no escapes.
pub(crate) fn decode(s: &str) -> Cow<'_, str> {
    percent_decode_str(s).decode_utf8_lossy()
}

#[pymethods]
impl Request {
    /// The method, e.g. `"GET"`.
    #[getter]
    fn method<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        PyString::intern(py, self.head.method_str())
    }

    /// The path, percent-decoded, without the query.
    #[getter]
    fn path(&self) -> Cow<'_, str> {
        decode(self.head.path())
    }

    /// The path as it came, still percent-encoded.
    #[getter]
    fn raw_path<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.head.path().as_bytes())
    }

    /// The query string without `?` (empty when there is none).
    #[getter]
    fn query_string(&self) -> &str {
        self.head.query().unwrap_or("")
    }

    /// The query parameters, decoded; a name given twice keeps its first value.
    #[getter]
    fn query<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        if let Some(q) = self.head.query() {
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let k = form_decode(k);
                if !dict.contains(&*k)? {
                    dict.set_item(&*k, &*form_decode(v))?;
                }
            }
        }
        Ok(dict)
    }

    /// The header fields (case-insensitive lookup).
    #[getter]
    fn headers(&self) -> Headers {
        Headers {
            head: self.head.clone(),
        }
    }

    /// The body, read in full before the handler ran (within the body limit).
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.body)
    }

    /// The body decoded as UTF-8 (invalid sequences replaced).
    fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// The body parsed as JSON. A body that is not `application/json` (or `…+json`) raises
    /// `HTTPError(415)`; one that does not parse raises `HTTPError(400)`: left uncaught, they
    /// answer the request with that status.
    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ct = self.head.header("content-type").unwrap_or_default();
        let essence = ct.split(|&b| b == b';').next().unwrap_or_default();
        let essence = std::str::from_utf8(essence).unwrap_or("").trim();
        let json = essence.eq_ignore_ascii_case("application/json")
            || essence
                .rsplit_once('+')
                .is_some_and(|(_, s)| s.eq_ignore_ascii_case("json"));
        if !json {
            return Err(HTTPError::new_err((
                415u16,
                "expected a JSON body (Content-Type: application/json)",
            )));
        }
        crate::json::parse(py, &self.body)
            .map_err(|e| HTTPError::new_err((400u16, format!("invalid JSON body: {e}"))))
    }

    /// The path parameters of the matched route, decoded.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (k, v) in &self.params {
            dict.set_item(&**k, v)?;
        }
        Ok(dict)
    }

    /// The client's address as `(host, port)`: the connection's peer, or the client a load
    /// balancer named in a PROXY protocol header.
    #[getter]
    fn client<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match self.peer {
            Some(a) => Ok(Some(PyTuple::new(
                py,
                [
                    a.ip().to_string().into_pyobject(py)?.into_any(),
                    a.port().into_pyobject(py)?.into_any(),
                ],
            )?)),
            None => Ok(None),
        }
    }

    /// `"https"` for a request that came over TLS, else `"http"`.
    #[getter]
    fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// The HTTP version, e.g. `"1.1"`.
    #[getter]
    fn http_version(&self) -> &'static str {
        match self.head.version() {
            canter_rt::Version::Http10 => "1.0",
            canter_rt::Version::Http11 => "1.1",
            canter_rt::Version::Http3 => "3",
            _ => "2",
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<Request {} {}>",
            self.head.method_str(),
            self.head.target()
        )
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, then percent escapes.
fn form_decode(s: &str) -> Cow<'_, str> {
    if s.contains('+') {
        Cow::Owned(decode(&s.replace('+', " ")).into_owned())
    } else {
        decode(s)
    }
}

/// The request's header fields: `headers["content-type"]`, `headers.get(name, default)`,
/// `name in headers`, `headers.items()`, `headers.getall(name)`. Names are matched without
/// regard to case; values are str (bytes that are not UTF-8 are replaced).
#[pyclass(module = "canter", frozen)]
pub struct Headers {
    head: RequestHead,
}

#[pymethods]
impl Headers {
    fn __getitem__(&self, name: &str) -> PyResult<Cow<'_, str>> {
        self.head
            .header(name)
            .map(String::from_utf8_lossy)
            .ok_or_else(|| PyKeyError::new_err(name.to_owned()))
    }

    #[pyo3(signature = (name, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.head.header(name) {
            Some(v) => Ok(PyString::new(py, &String::from_utf8_lossy(v)).into_any()),
            None => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
        }
    }

    /// Every value of `name`, in order.
    fn getall(&self, name: &str) -> Vec<String> {
        self.head
            .headers()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.head.header(name).is_some()
    }

    fn __len__(&self) -> usize {
        self.head.headers().count()
    }

    /// `(name, value)` pairs in the order received, names lower-cased.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for (n, v) in self.head.headers() {
            list.append((n.to_ascii_lowercase(), String::from_utf8_lossy(v)))?;
        }
        Ok(list)
    }

    /// The lower-cased names, in order received.
    fn keys(&self) -> Vec<String> {
        self.head
            .headers()
            .map(|(n, _)| n.to_ascii_lowercase())
            .collect()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PyList::new(py, self.keys())?
            .into_any()
            .try_iter()
            .map(Bound::into_any)
    }

    fn __repr__(&self) -> String {
        let items: Vec<String> = self
            .head
            .headers()
            .map(|(n, v)| {
                format!(
                    "{:?}: {:?}",
                    n.to_ascii_lowercase(),
                    String::from_utf8_lossy(v)
                )
            })
            .collect();
        format!("Headers({{{}}})", items.join(", "))
    }
}
