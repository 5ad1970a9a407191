//! Streamed response bodies from a [`futures_core::Stream`]: [`StreamBody`].
//!
//! The runtime pulls the stream only while the client keeps up (the connection's output is
//! under its high-water mark), so a fast producer is slowed down to the client's pace instead
//! of being buffered for; nothing here reads ahead.

use std::error::Error;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::{Body, BodyStream, Response};
use futures_core::Stream;

use super::response::IntoResponse;

const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// An item of a [`StreamBody`]'s stream: a piece of the body, or (for `Result`) a failure that
/// aborts the response.
///
/// Implemented for `Bytes`, `BytesMut`, `Vec<u8>`, `String`, `&'static str`, `&'static [u8]`
/// and `Result<C, E>` where `C` is one of those and `E` converts into a boxed error.
///
/// ```
/// use canter::IntoChunk;
///
/// assert_eq!(&"abc".into_chunk().unwrap()[..], b"abc");
/// let failed: Result<String, std::io::Error> = Err(std::io::Error::other("disk gone"));
/// assert!(failed.into_chunk().is_err());
/// ```
pub trait IntoChunk {
    /// The piece of body, or the error that ends the response.
    fn into_chunk(self) -> io::Result<Bytes>;
}

impl IntoChunk for Bytes {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(self)
    }
}

impl IntoChunk for BytesMut {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(self.freeze())
    }
}

impl IntoChunk for Vec<u8> {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(Bytes::from(self))
    }
}

impl IntoChunk for String {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(Bytes::from(self))
    }
}

impl IntoChunk for &'static str {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(Bytes::from_static(self.as_bytes()))
    }
}

impl IntoChunk for &'static [u8] {
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        Ok(Bytes::from_static(self))
    }
}

impl<C, E> IntoChunk for Result<C, E>
where
    C: IntoChunk,
    E: Into<Box<dyn Error + Send + Sync>>,
{
    #[inline]
    fn into_chunk(self) -> io::Result<Bytes> {
        self.map_err(io::Error::other)?.into_chunk()
    }
}

/// A response body pulled from a [`Stream`] as the client reads it: 200,
/// `application/octet-stream` (override it with a header tuple), sent chunked, or with
/// Content-Length when [`StreamBody::content_length`] gives it.
///
/// An `Err` item aborts the response: the connection closes and the client sees a truncated
/// body (a chunked body without its last chunk, or fewer bytes than the Content-Length), never
/// a false end. So does a stream that ends short of its declared length; one that goes past it
/// is cut off at the length and the connection closed.
///
/// ```
/// use std::pin::Pin;
/// use std::task::{Context, Poll};
///
/// use canter::rt::http::{header, HeaderValue};
/// use canter::{get, Router, StreamBody};
///
/// /// Counts down from `n`, one line per item.
/// struct Countdown(u32);
///
/// impl futures_core::Stream for Countdown {
///     type Item = String;
///     fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<String>> {
///         if self.0 == 0 {
///             return Poll::Ready(None);
///         }
///         self.0 -= 1;
///         Poll::Ready(Some(format!("{}\n", self.0)))
///     }
/// }
///
/// fn countdown() -> impl canter::IntoResponse {
///     let text = HeaderValue::from_static("text/plain; charset=utf-8");
///     ([(header::CONTENT_TYPE, text)], StreamBody::new(Countdown(10)))
/// }
/// let app = Router::new().route("/countdown", get(countdown));
/// # let _ = app;
/// ```
pub struct StreamBody<S> {
    stream: S,
    len: Option<u64>,
}

impl<S> StreamBody<S>
where
    S: Stream + 'static,
    S::Item: IntoChunk,
{
    /// A chunked body made of the stream's items.
    pub fn new(stream: S) -> StreamBody<S> {
        StreamBody { stream, len: None }
    }

    /// Sends the body with `Content-Length: len`; the stream must yield exactly `len` bytes.
    ///
    /// ```
    /// use canter::{IntoResponse, StreamBody};
    ///
    /// struct Once(Option<&'static str>);
    /// impl futures_core::Stream for Once {
    ///     type Item = &'static str;
    ///     fn poll_next(
    ///         mut self: std::pin::Pin<&mut Self>,
    ///         _: &mut std::task::Context<'_>,
    ///     ) -> std::task::Poll<Option<&'static str>> {
    ///         std::task::Poll::Ready(self.0.take())
    ///     }
    /// }
    /// let r = StreamBody::new(Once(Some("hello"))).content_length(5).into_response();
    /// assert!(matches!(r.body(), canter::rt::Body::Stream { len: Some(5), .. }));
    /// ```
    pub fn content_length(mut self, len: u64) -> StreamBody<S> {
        self.len = Some(len);
        self
    }
}

impl<S> fmt::Debug for StreamBody<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamBody")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<S> IntoResponse for StreamBody<S>
where
    S: Stream + 'static,
    S::Item: IntoChunk,
{
    fn into_response(self) -> Response {
        let chunks = Chunks {
            stream: Box::pin(self.stream),
        };
        Response::new(StatusCode::OK)
            .with_header(header::CONTENT_TYPE, OCTET_STREAM)
            .with_body(Body::stream(self.len, chunks))
    }
}

/// The runtime's view of a [`Stream`]: each item converted with [`IntoChunk`].
struct Chunks<S> {
    /// Boxed so that a `!Unpin` stream can be polled without unsafe pin projection.
    stream: Pin<Box<S>>,
}

impl<S> BodyStream for Chunks<S>
where
    S: Stream,
    S::Item: IntoChunk,
{
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        match self.stream.as_mut().poll_next(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Some(item.into_chunk())),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
