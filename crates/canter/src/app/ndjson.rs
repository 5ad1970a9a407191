//! Newline-delimited JSON both ways: [`JsonLines`] reads typed items one by one while the
//! request body streams in; [`NdJson`] streams a response of serialized items.
//!
//! A JSON text cannot hold a raw line feed (strings escape it), so a line is exactly one item.
//! Lines end with `\n`; a `\r` before it is dropped; empty (all-whitespace) lines are skipped;
//! the last line need not end with `\n`.

use std::error::Error;
use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::{Body, BodyStream, RequestBody, Response};
use futures_core::Stream;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::extract::{check_json_depth, content_type_is, json_status, FromBody, Parts, Rejection};
use super::response::IntoResponse;

/// Default limit of one line read by [`JsonLines`]: 64 KiB.
///
/// ```
/// assert_eq!(canter::app::DEFAULT_LINE_LIMIT, 64 * 1024);
/// ```
pub const DEFAULT_LINE_LIMIT: usize = 64 * 1024;

const NDJSON: HeaderValue = HeaderValue::from_static("application/x-ndjson");

/// Serialized items an [`NdJson`] response gathers into one piece when the stream has them
/// ready at once (items that are not ready yet are never waited for).
const COALESCE: usize = 16 * 1024;

/// The media types [`JsonLines`] accepts.
fn is_ndjson(mime: &str) -> bool {
    matches!(
        mime,
        "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonl"
            | "application/jsonlines"
            | "application/x-jsonlines"
    )
}

/// A newline-delimited JSON request body, read item by item as it arrives: each
/// [`next`](JsonLines::next) yields one line deserialized as `T`. Nothing is read before the
/// first call, and at most one line is held in memory.
///
/// The request is refused before any item with 415 unless its Content-Type is
/// `application/x-ndjson`, `application/ndjson`, `application/jsonl`, `application/x-jsonl`,
/// `application/jsonlines` or `application/x-jsonlines` (parameters ignored; a missing
/// Content-Type is refused too, as for [`Json`](super::Json); `application/json-seq`, whose
/// records start with a control character, is not accepted), and with 413 if it declares a
/// Content-Length over the router's [body limit](super::Router::body_limit).
///
/// While reading, an item is an `Err(Rejection)` for: the whole body over the body limit
/// (413), a line longer than the [line limit](JsonLines::line_limit) (413, default
/// [`DEFAULT_LINE_LIMIT`]), a line that is not JSON or nests deeper than the
/// [depth limit](super::Router::json_depth_limit) (400), a line of the wrong shape or types
/// (422), or a failed body read (400, 408). Each message names the line (counted from 1, empty
/// lines included). After an error the stream ends. A `Rejection` is a response, so `?` in a
/// handler that returns `Result<_, Rejection>` answers with it.
///
/// ```
/// use canter::{post, JsonLines, Rejection, Router};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Reading {
///     value: f64,
/// }
///
/// async fn sum(mut lines: JsonLines<Reading>) -> Result<String, Rejection> {
///     let (mut n, mut total) = (0u64, 0.0);
///     while let Some(reading) = lines.next().await {
///         total += reading?.value;
///         n += 1;
///     }
///     Ok(format!("{n} readings, total {total}\n"))
/// }
/// let app = Router::new().route("/readings", post(sum));
/// # let _ = app;
/// ```
pub struct JsonLines<T> {
    /// `None` once the body has ended or failed.
    body: Option<RequestBody>,
    /// The unread rest of the last piece of body.
    piece: Bytes,
    /// The start of a line that spans pieces (at most `line_limit` bytes).
    partial: BytesMut,
    /// Lines completed so far.
    line: u64,
    /// Body bytes read so far.
    read: u64,
    body_limit: u64,
    line_limit: usize,
    depth_limit: usize,
    _item: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> JsonLines<T> {
    /// Sets the longest line accepted (in bytes, without its line ending); longer lines end
    /// the stream with 413. Set it before reading.
    ///
    /// ```
    /// use canter::JsonLines;
    ///
    /// async fn small(lines: JsonLines<serde_json::Value>) -> String {
    ///     let mut lines = lines.line_limit(1024);
    ///     let mut n = 0;
    ///     while let Some(Ok(_)) = lines.next().await {
    ///         n += 1;
    ///     }
    ///     format!("{n}\n")
    /// }
    /// # let _ = small;
    /// ```
    pub fn line_limit(mut self, bytes: usize) -> JsonLines<T> {
        self.line_limit = bytes;
        self
    }

    /// The next item; `None` at the end of the body or after an error.
    pub async fn next(&mut self) -> Option<Result<T, Rejection>> {
        poll_fn(|cx| self.poll_item(cx)).await
    }

    /// Polls for the next item (see [`JsonLines::next`]).
    pub fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Rejection>>> {
        loop {
            if let Some(end) = self.piece.iter().position(|&b| b == b'\n') {
                let rest_of_line = self.piece.split_to(end);
                self.piece.advance(1);
                if self.partial.len() + rest_of_line.len() > self.line_limit {
                    self.line += 1;
                    return Poll::Ready(Some(Err(self.fail(self.too_long()))));
                }
                let line = if self.partial.is_empty() {
                    rest_of_line
                } else {
                    self.partial.extend_from_slice(&rest_of_line);
                    self.partial.split().freeze()
                };
                self.line += 1;
                if let Some(item) = self.item(&line) {
                    return Poll::Ready(Some(item));
                }
                continue;
            }
            // No line end in what is left of the piece: keep it and read on.
            if self.partial.len() + self.piece.len() > self.line_limit {
                self.line += 1;
                return Poll::Ready(Some(Err(self.fail(self.too_long()))));
            }
            if !self.piece.is_empty() {
                self.partial.extend_from_slice(&self.piece);
                self.piece.clear();
            }
            let Some(body) = &mut self.body else {
                return Poll::Ready(None);
            };
            match body.poll_chunk(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(piece))) => {
                    self.read += piece.len() as u64;
                    if self.read > self.body_limit {
                        let limit = self.body_limit;
                        let e = Rejection::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!("request body larger than {limit} bytes"),
                        );
                        return Poll::Ready(Some(Err(self.fail(e))));
                    }
                    self.piece = piece;
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(self.fail(Rejection::from(e)))));
                }
                Poll::Ready(None) => {
                    // The last line, if it has no line end.
                    self.body = None;
                    let line = self.partial.split().freeze();
                    self.line += 1;
                    return Poll::Ready(self.item(&line));
                }
            }
        }
    }

    /// Deserializes one line; `None` for an empty one.
    fn item(&mut self, line: &[u8]) -> Option<Result<T, Rejection>> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let n = self.line;
        if let Err(e) = check_json_depth(line, self.depth_limit) {
            let message = e.message().trim_start_matches("invalid JSON body: ");
            let e = Rejection::new(e.status(), format!("line {n}: {message}"));
            return Some(Err(self.fail(e)));
        }
        match serde_json::from_slice(line) {
            Ok(item) => Some(Ok(item)),
            Err(e) => {
                // serde_json counts lines and columns within this one line: keep the column.
                let text = e.to_string();
                let position = format!(" at line {} column {}", e.line(), e.column());
                let message = text.strip_suffix(&position).unwrap_or(&text);
                let e = Rejection::new(
                    json_status(&e),
                    format!("line {n}, column {}: {message}", e.column()),
                );
                Some(Err(self.fail(e)))
            }
        }
    }

    fn too_long(&self) -> Rejection {
        Rejection::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("line {}: longer than {} bytes", self.line, self.line_limit),
        )
    }

    /// Ends the stream after `e`.
    fn fail(&mut self, e: Rejection) -> Rejection {
        self.body = None;
        self.piece.clear();
        self.partial = BytesMut::new();
        e
    }
}

impl<T: DeserializeOwned> Stream for JsonLines<T> {
    type Item = Result<T, Rejection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}

impl<T> fmt::Debug for JsonLines<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLines")
            .field("line", &self.line)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + 'static> FromBody for JsonLines<T> {
    fn from_body(mut parts: Parts) -> impl Future<Output = Result<Self, Rejection>> + 'static {
        let typed = content_type_is(&parts, is_ndjson);
        async move {
            if !typed {
                return Err(Rejection::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "expected Content-Type: application/x-ndjson",
                ));
            }
            let body = parts.take_body_within_limit()?;
            Ok(JsonLines {
                body: Some(body),
                piece: Bytes::new(),
                partial: BytesMut::new(),
                line: 0,
                read: 0,
                body_limit: parts.body_limit() as u64,
                line_limit: DEFAULT_LINE_LIMIT,
                depth_limit: parts.json_depth_limit(),
                _item: PhantomData,
            })
        }
    }
}

/// A newline-delimited JSON response (`Content-Type: application/x-ndjson`, chunked): each
/// item of a [`Stream`] serialized on its own line as the client reads.
///
/// The stream is pulled only while the client keeps up, and items are sent as soon as they are
/// produced (ready items are gathered into pieces of about 16 KiB, never waited for). An item
/// that fails to serialize, or an `Err` from [`NdJson::try_new`]'s stream, aborts the
/// response: the connection closes after the lines before it, without the chunked body's end,
/// so the client knows the response is incomplete.
///
/// ```
/// use std::pin::Pin;
/// use std::task::{Context, Poll};
///
/// use canter::{get, NdJson, Router};
/// use serde::Serialize;
///
/// #[derive(Serialize)]
/// struct Square {
///     n: u32,
///     square: u32,
/// }
///
/// struct Squares(u32);
///
/// impl futures_core::Stream for Squares {
///     type Item = Square;
///     fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Square>> {
///         if self.0 == 10 {
///             return Poll::Ready(None);
///         }
///         self.0 += 1;
///         Poll::Ready(Some(Square { n: self.0, square: self.0 * self.0 }))
///     }
/// }
///
/// let app = Router::new().route("/squares", get(|| NdJson::new(Squares(0))));
/// # let _ = app;
/// ```
pub struct NdJson {
    body: Body,
}

impl NdJson {
    /// Serializes every item of `stream`.
    pub fn new<S>(stream: S) -> NdJson
    where
        S: Stream + 'static,
        S::Item: Serialize,
    {
        NdJson::lines(stream, |item, out| {
            serde_json::to_writer(out, &item).map_err(io::Error::other)
        })
    }

    /// Serializes every `Ok` item of `stream`; an `Err` aborts the response.
    ///
    /// ```
    /// use canter::{JsonLines, NdJson};
    ///
    /// /// Echoes each posted line back as it arrives; a bad line cuts the response short.
    /// async fn echo(lines: JsonLines<serde_json::Value>) -> NdJson {
    ///     NdJson::try_new(lines)
    /// }
    /// # let _ = echo;
    /// ```
    pub fn try_new<S, T, E>(stream: S) -> NdJson
    where
        S: Stream<Item = Result<T, E>> + 'static,
        T: Serialize,
        E: Into<Box<dyn Error + Send + Sync>>,
    {
        NdJson::lines(stream, |item, out| match item {
            Ok(item) => serde_json::to_writer(out, &item).map_err(io::Error::other),
            Err(e) => Err(io::Error::other(e)),
        })
    }

    fn lines<S, F>(stream: S, write: F) -> NdJson
    where
        S: Stream + 'static,
        F: FnMut(S::Item, &mut Vec<u8>) -> io::Result<()> + Unpin + 'static,
    {
        let lines = Lines {
            stream: Box::pin(stream),
            write,
            failed: None,
            done: false,
        };
        NdJson {
            body: Body::stream(None, lines),
        }
    }
}

impl fmt::Debug for NdJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NdJson").finish_non_exhaustive()
    }
}

impl IntoResponse for NdJson {
    fn into_response(self) -> Response {
        Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, NDJSON)
            .with_body(self.body)
    }
}

/// The body of an [`NdJson`]: one line per item.
struct Lines<S, F> {
    /// Boxed so that a `!Unpin` stream can be polled without unsafe pin projection.
    stream: Pin<Box<S>>,
    write: F,
    /// An error met after lines that were still to be sent: reported on the next poll.
    failed: Option<io::Error>,
    done: bool,
}

impl<S, F> BodyStream for Lines<S, F>
where
    S: Stream,
    F: FnMut(S::Item, &mut Vec<u8>) -> io::Result<()> + Unpin,
{
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        // Every field is Unpin (the stream is boxed, the writer captures nothing).
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            this.done = true;
            return Poll::Ready(Some(Err(e)));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let mut out = Vec::new();
        while out.len() < COALESCE {
            match this.stream.as_mut().poll_next(cx) {
                Poll::Ready(Some(item)) => {
                    let start = out.len();
                    if let Err(e) = (this.write)(item, &mut out) {
                        out.truncate(start);
                        if out.is_empty() {
                            this.done = true;
                            return Poll::Ready(Some(Err(e)));
                        }
                        this.failed = Some(e);
                        break;
                    }
                    out.push(b'\n');
                }
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        if out.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Ready(Some(Ok(Bytes::from(out))))
        }
    }
}
