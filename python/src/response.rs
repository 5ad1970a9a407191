//! What handlers return, and how it becomes a canter response.

use std::path::PathBuf;

use bytes::Bytes;
use canter_rt::{Body, Response as RtResponse};
use http::{header, HeaderName, HeaderValue, StatusCode};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::stream;

const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const JSON: HeaderValue = HeaderValue::from_static("application/json");
const OCTETS: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// The body a [`Response`] was made with.
enum Content {
    Empty,
    Full(Bytes),
    /// A file, opened (and its length taken) each time the response is sent.
    File(PathBuf),
    /// An iterator or async iterator of str or bytes pieces, sent chunked.
    Stream(Py<PyAny>),
}

/// A response: `Response(body=None, *, status=200, headers=None, json=None, content_type=None,
/// file=None, stream=None)`.
///
/// - `body`: str (sent as `text/plain; charset=utf-8`) or bytes (`application/octet-stream`).
/// - `json`: any JSON value (dict, list, str, int, float, bool, None), serialized now.
/// - `file`: a path, sent with `sendfile(2)`; its type guessed from the extension.
/// - `stream`: an iterator or async iterator (a generator or an async generator) of str or
///   bytes pieces, sent chunked as the client takes them.
/// - `headers`: a dict or a list of `(name, value)` pairs; `content_type` sets Content-Type.
///
/// A response holds no state that sending it uses up (except a stream), so a module-level
/// constant may be returned again and again.
#[pyclass(module = "canter", frozen)]
pub struct Response {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    headers: Vec<(HeaderName, HeaderValue)>,
    content: Content,
}

#[pymethods]
impl Response {
    #[new]
    #[pyo3(signature = (body=None, *, status=200, headers=None, json=None, content_type=None, file=None, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        body: Option<&Bound<'_, PyAny>>,
        status: u16,
        headers: Option<&Bound<'_, PyAny>>,
        json: Option<&Bound<'_, PyAny>>,
        content_type: Option<&str>,
        file: Option<PathBuf>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Response> {
        let status = StatusCode::from_u16(status)
            .map_err(|_| PyValueError::new_err(format!("invalid status {status}")))?;
        let given = [
            body.is_some(),
            json.is_some(),
            file.is_some(),
            stream.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(PyTypeError::new_err(
                "give at most one of body, json, file and stream",
            ));
        }
        let mut ct = None;
        let content = if let Some(body) = body {
            if let Ok(s) = body.cast::<PyString>() {
                ct = Some(TEXT);
                Content::Full(Bytes::copy_from_slice(s.to_str()?.as_bytes()))
            } else if let Ok(b) = body.cast::<PyBytes>() {
                ct = Some(OCTETS);
                Content::Full(Bytes::copy_from_slice(b.as_bytes()))
            } else {
                return Err(PyTypeError::new_err(format!(
                    "body must be str or bytes, not {}",
                    body.get_type().name()?
                )));
            }
        } else if let Some(json) = json {
            let mut out = Vec::with_capacity(64);
            crate::json::write(&mut out, json)?;
            ct = Some(JSON);
            Content::Full(Bytes::from(out))
        } else if let Some(path) = file {
            if !path.is_file() {
                return Err(pyo3::exceptions::PyFileNotFoundError::new_err(format!(
                    "{}: not a readable file",
                    path.display()
                )));
            }
            ct = guess_type(&path);
            Content::File(path)
        } else if let Some(stream) = stream {
            Content::Stream(stream.clone().unbind())
        } else {
            Content::Empty
        };
        if let Some(t) = content_type {
            ct = Some(
                HeaderValue::from_str(t)
                    .map_err(|_| PyValueError::new_err(format!("invalid content_type {t:?}")))?,
            );
        }
        let mut list = Vec::new();
        if let Some(h) = headers {
            let pairs: Vec<(String, String)> = if let Ok(d) = h.cast::<PyDict>() {
                d.iter()
                    .map(|(k, v)| Ok((k.extract()?, v.extract()?)))
                    .collect::<PyResult<_>>()?
            } else {
                h.extract()?
            };
            for (k, v) in pairs {
                let name = HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| PyValueError::new_err(format!("invalid header name {k:?}")))?;
                let value = HeaderValue::from_str(&v).map_err(|_| {
                    PyValueError::new_err(format!("invalid value for header {k}: {v:?}"))
                })?;
                if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
                    return Err(PyValueError::new_err(format!(
                        "{k} is set by the server from the body"
                    )));
                }
                if name == header::CONTENT_TYPE {
                    ct = Some(value);
                } else {
                    list.push((name, value));
                }
            }
        }
        let _ = py;
        Ok(Response {
            status,
            content_type: ct,
            headers: list,
            content,
        })
    }

    /// The status code.
    #[getter]
    fn status(&self) -> u16 {
        self.status.as_u16()
    }

    /// The header fields, Content-Type first when set.
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        let ct = self.content_type.iter().map(|v| (header::CONTENT_TYPE, v));
        ct.chain(self.headers.iter().map(|(n, v)| (n.clone(), v)))
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect()
    }

    /// The body, when it is known in full (`None` for files and streams).
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.content {
            Content::Empty => Some(PyBytes::new(py, b"")),
            Content::Full(b) => Some(PyBytes::new(py, b)),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!("<Response {}>", self.status.as_u16())
    }
}

fn guess_type(path: &std::path::Path) -> Option<HeaderValue> {
    let mime = mime_guess::from_path(path).first_or_octet_stream();
    let text = mime.type_() == mime_guess::mime::TEXT
        || mime.subtype() == mime_guess::mime::JAVASCRIPT
        || mime.subtype() == mime_guess::mime::JSON;
    let value = if text && mime.get_param("charset").is_none() {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_string()
    };
    HeaderValue::from_str(&value).ok()
}

impl Response {
    /// The canter response for this one (each call a fresh one: the body's bytes are shared).
    fn to_rt(&self, py: Python<'_>) -> PyResult<RtResponse> {
        let mut res = RtResponse::new(self.status);
        if let Some(ct) = &self.content_type {
            res.append_header(header::CONTENT_TYPE, ct.clone());
        }
        for (n, v) in &self.headers {
            res.append_header(n.clone(), v.clone());
        }
        let body = match &self.content {
            Content::Empty => Body::Empty,
            Content::Full(b) => Body::Full(b.clone()),
            Content::File(path) => {
                let file = std::fs::File::open(path).map_err(PyErr::from)?;
                let len = file.metadata().map_err(PyErr::from)?.len();
                Body::file(file, 0, len)
            }
            Content::Stream(s) => stream::body(py, s.bind(py))?,
        };
        Ok(res.with_body(body))
    }
}

/// Turns a handler's return value into a response: str (text), bytes, dict or list (JSON),
/// [`Response`], or None (204).
pub fn convert(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<RtResponse> {
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(RtResponse::text(Bytes::copy_from_slice(
            s.to_str()?.as_bytes(),
        )));
    }
    if let Ok(r) = value.cast::<Response>() {
        return r.get().to_rt(py);
    }
    if value.cast::<PyDict>().is_ok() || value.cast::<PyList>().is_ok() {
        let mut out = Vec::with_capacity(64);
        crate::json::write(&mut out, value)?;
        return Ok(RtResponse::json_bytes(Bytes::from(out)));
    }
    if let Ok(b) = value.cast::<PyBytes>() {
        return Ok(RtResponse::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTETS)
            .with_body(Bytes::copy_from_slice(b.as_bytes())));
    }
    if value.is_none() {
        return Ok(RtResponse::new(StatusCode::NO_CONTENT));
    }
    if value.cast::<PyTuple>().is_ok() {
        return Err(PyTypeError::new_err(
            "a handler returned a tuple: return canter.Response(body, status=...) instead",
        ));
    }
    Err(PyTypeError::new_err(format!(
        "a handler returned {}: expected str, bytes, dict, list, None or canter.Response",
        value.get_type().name()?
    )))
}
