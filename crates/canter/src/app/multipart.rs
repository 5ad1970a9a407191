//! `multipart/form-data` bodies, streamed: [`Multipart`] and its [`Field`]s, parsed by `multer`.
//!
//! multer wants a `Send` stream of bytes, and the request body is not `Send` (it lives on the
//! connection's thread). So multer reads from a one-piece slot, and this module fills the slot
//! from the body each time multer runs dry: multer never holds more than one piece (at most
//! [`FEED`] bytes) beyond what it is parsing, and nothing is read ahead of the handler.

use std::convert::Infallible;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use canter_rt::http::{header, StatusCode};
use canter_rt::RequestBody;
use futures_core::Stream;

use super::extract::{content_type_is, FromBody, Parts, Rejection};

/// Default for [`Multipart::max_fields`]: 100 fields.
///
/// ```
/// assert_eq!(canter::app::DEFAULT_MAX_FIELDS, 100);
/// ```
pub const DEFAULT_MAX_FIELDS: usize = 100;

/// Longest boundary line and header section of one part (with the preamble before the first
/// part): 16 KiB. Longer is answered with 400.
///
/// ```
/// assert_eq!(canter::app::PART_HEAD_LIMIT, 16 * 1024);
/// ```
pub const PART_HEAD_LIMIT: usize = 16 * 1024;

/// Largest piece of body handed to multer at once.
const FEED: usize = 8 * 1024;

/// A `multipart/form-data` request body, read field by field as it arrives.
///
/// Refused before any field with 415 unless the Content-Type is `multipart/form-data` (a
/// missing one included), with 400 if it has no valid `boundary` parameter (1 to 70
/// characters), and with 413 if it declares a Content-Length over the router's
/// [body limit](super::Router::body_limit).
///
/// While reading, the errors are: the whole body over the body limit (413), a field over the
/// [field limit](Multipart::field_limit) (413, default: the body limit), more fields than
/// [`Multipart::max_fields`] (413, default [`DEFAULT_MAX_FIELDS`]), a part's boundary line and
/// headers over [`PART_HEAD_LIMIT`] or anything malformed (400), a failed body read (400,
/// 408). After an error every later call fails the same way. A `Rejection` is a response, so
/// `?` in a handler that returns `Result<_, Rejection>` answers with it.
///
/// A field that is not read to its end is skipped by the next [`Multipart::next_field`].
///
/// ```
/// use canter::{post, Multipart, Rejection, Router};
///
/// async fn upload(mut form: Multipart) -> Result<String, Rejection> {
///     let mut report = String::new();
///     while let Some(mut field) = form.next_field().await? {
///         let name = field.name().unwrap_or("").to_owned();
///         let file = field.file_name().map(str::to_owned);
///         let mut size = 0;
///         while let Some(chunk) = field.chunk().await? {
///             size += chunk.len();
///         }
///         report.push_str(&format!("{name} {file:?}: {size} bytes\n"));
///     }
///     Ok(report)
/// }
/// let app = Router::new().route("/upload", post(upload)).body_limit(64 << 20);
/// # let _ = app;
/// ```
pub struct Multipart {
    parser: multer::Multipart<'static>,
    source: Source,
    /// The field handed out last, kept here so that the next call can skip what is left of it.
    current: Option<multer::Field<'static>>,
    fields: usize,
    /// Bytes of the current field read so far.
    field_read: u64,
    max_fields: usize,
    field_limit: u64,
}

impl Multipart {
    /// Sets the largest field accepted, in bytes (413 beyond). Set it before reading.
    ///
    /// ```
    /// use canter::Multipart;
    ///
    /// async fn avatar(form: Multipart) -> &'static str {
    ///     let mut form = form.field_limit(256 * 1024).max_fields(4);
    ///     while let Ok(Some(_field)) = form.next_field().await {}
    ///     "ok\n"
    /// }
    /// # let _ = avatar;
    /// ```
    pub fn field_limit(mut self, bytes: usize) -> Multipart {
        self.field_limit = bytes as u64;
        self
    }

    /// Sets the most fields accepted (413 beyond). Set it before reading.
    pub fn max_fields(mut self, fields: usize) -> Multipart {
        self.max_fields = fields;
        self
    }

    /// The next field; `None` after the last one. Skips the unread rest of the previous field.
    pub async fn next_field(&mut self) -> Result<Option<Field<'_>>, Rejection> {
        poll_fn(|cx| self.poll_next_field(cx)).await?;
        Ok(self.current.is_some().then_some(Field { form: self }))
    }

    /// Moves to the next field (into `self.current`).
    fn poll_next_field(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        // Skip what the handler left of the previous field (not counted against the field
        // limit: it is not kept).
        while let Some(field) = &mut self.current {
            let step = self.source.pump(cx, None, |cx| poll_field(field, cx));
            match step {
                Poll::Ready(Ok(Some(_))) => {}
                Poll::Ready(Ok(None)) => self.current = None,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        // The part's head (boundary line and header section) starts here, give or take what
        // multer holds from the last piece.
        let head_start = *self.source.head_start.get_or_insert(self.source.given);
        let parser = &mut self.parser;
        let next = self
            .source
            .pump(cx, Some(head_start), |cx| parser.poll_next_field(cx));
        let field = match next {
            Poll::Ready(Ok(field)) => field,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        self.source.head_start = None;
        let Some(field) = field else {
            return Poll::Ready(Ok(()));
        };
        self.fields += 1;
        if self.fields > self.max_fields {
            let e = Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("more than {} multipart fields", self.max_fields),
            );
            return Poll::Ready(Err(self.source.fail(e)));
        }
        self.field_read = 0;
        self.current = Some(field);
        Poll::Ready(Ok(()))
    }
}

impl fmt::Debug for Multipart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Multipart")
            .field("fields", &self.fields)
            .field("read", &self.source.read)
            .finish_non_exhaustive()
    }
}

impl FromBody for Multipart {
    fn from_body(mut parts: Parts) -> impl Future<Output = Result<Self, Rejection>> + 'static {
        let boundary = boundary(&parts);
        async move {
            let boundary = boundary?;
            let body = parts.take_body_within_limit()?;
            let slot = Arc::new(Mutex::new(Slot::default()));
            let parser = multer::Multipart::new(Feed(slot.clone()), boundary);
            let limit = parts.body_limit() as u64;
            Ok(Multipart {
                parser,
                source: Source {
                    body,
                    slot,
                    piece: Bytes::new(),
                    read: 0,
                    given: 0,
                    head_start: None,
                    limit,
                    failed: None,
                },
                current: None,
                fields: 0,
                field_read: 0,
                max_fields: DEFAULT_MAX_FIELDS,
                field_limit: limit,
            })
        }
    }
}

/// The boundary of a `multipart/form-data` Content-Type, or why there is none.
fn boundary(parts: &Parts) -> Result<String, Rejection> {
    if !content_type_is(parts, |m| m == "multipart/form-data") {
        return Err(Rejection::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: multipart/form-data",
        ));
    }
    let value = parts
        .header(header::CONTENT_TYPE.as_str())
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or_default();
    match multer::parse_boundary(value) {
        Ok(b) if (1..=70).contains(&b.len()) => Ok(b),
        _ => Err(Rejection::new(
            StatusCode::BAD_REQUEST,
            "multipart/form-data needs a boundary parameter of 1 to 70 characters",
        )),
    }
}

/// One field of a [`Multipart`] body: its name, file name and content type, and its data
/// read piece by piece ([`Field::chunk`]) or whole ([`Field::bytes`], [`Field::text`]).
///
/// ```
/// use canter::{Multipart, Rejection};
///
/// async fn names(mut form: Multipart) -> Result<String, Rejection> {
///     let mut out = String::new();
///     while let Some(field) = form.next_field().await? {
///         if field.name() == Some("name") {
///             out = field.text().await?;
///         }
///     }
///     Ok(out)
/// }
/// # let _ = names;
/// ```
pub struct Field<'a> {
    form: &'a mut Multipart,
}

impl Field<'_> {
    fn inner(&self) -> Option<&multer::Field<'static>> {
        self.form.current.as_ref()
    }

    /// The `name` of its Content-Disposition.
    pub fn name(&self) -> Option<&str> {
        self.inner().and_then(multer::Field::name)
    }

    /// The `filename` of its Content-Disposition (a path as the client sent it: never use it
    /// as a path unchecked).
    pub fn file_name(&self) -> Option<&str> {
        self.inner().and_then(multer::Field::file_name)
    }

    /// Its Content-Type, if it has a valid one.
    pub fn content_type(&self) -> Option<&str> {
        self.inner()
            .and_then(multer::Field::content_type)
            .map(|m| m.as_ref())
    }

    /// The first value of its header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.inner()
            .and_then(|f| f.headers().get(name))
            .map(|v| v.as_bytes())
    }

    /// The next piece of its data; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Rejection> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, Rejection>> {
        let form = &mut *self.form;
        let Some(field) = &mut form.current else {
            return Poll::Ready(Ok(None));
        };
        let piece = match form.source.pump(cx, None, |cx| poll_field(field, cx)) {
            Poll::Ready(Ok(Some(piece))) => piece,
            Poll::Ready(Ok(None)) => {
                form.current = None;
                return Poll::Ready(Ok(None));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        form.field_read += piece.len() as u64;
        if form.field_read > form.field_limit {
            let name = field.name().unwrap_or_default();
            let e = Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "multipart field `{name}` larger than {} bytes",
                    form.field_limit
                ),
            );
            return Poll::Ready(Err(form.source.fail(e)));
        }
        Poll::Ready(Ok(Some(piece)))
    }

    /// All of its data (at most the field limit).
    pub async fn bytes(mut self) -> Result<Bytes, Rejection> {
        let Some(first) = self.chunk().await? else {
            return Ok(Bytes::new());
        };
        let Some(second) = self.chunk().await? else {
            return Ok(first);
        };
        let mut all = BytesMut::with_capacity(first.len() + second.len());
        all.extend_from_slice(&first);
        all.extend_from_slice(&second);
        while let Some(piece) = self.chunk().await? {
            all.extend_from_slice(&piece);
        }
        Ok(all.freeze())
    }

    /// All of its data as UTF-8 text (400 if it is not).
    pub async fn text(self) -> Result<String, Rejection> {
        let name = self.name().unwrap_or_default().to_owned();
        let data = self.bytes().await?;
        String::from_utf8(data.into()).map_err(|_| {
            Rejection::new(
                StatusCode::BAD_REQUEST,
                format!("multipart field `{name}` is not valid UTF-8"),
            )
        })
    }
}

impl fmt::Debug for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Field")
            .field("name", &self.name())
            .field("file_name", &self.file_name())
            .field("content_type", &self.content_type())
            .finish_non_exhaustive()
    }
}

/// Polls multer's field stream as a `Result<Option<_>>`.
fn poll_field(
    field: &mut multer::Field<'static>,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, multer::Error>> {
    match Pin::new(field).poll_next(cx) {
        Poll::Ready(Some(Ok(piece))) => Poll::Ready(Ok(Some(piece))),
        Poll::Ready(Some(Err(e))) => Poll::Ready(Err(e)),
        Poll::Ready(None) => Poll::Ready(Ok(None)),
        Poll::Pending => Poll::Pending,
    }
}

/// What multer reads next.
#[derive(Default)]
struct Slot {
    next: Option<Bytes>,
    end: bool,
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    // Nothing panics while holding the lock; if it did, the slot is still consistent.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// multer's input: the slot, emptied on each read.
struct Feed(Arc<Mutex<Slot>>);

impl Stream for Feed {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut slot = lock(&self.0);
        match slot.next.take() {
            Some(piece) => Poll::Ready(Some(Ok(piece))),
            None if slot.end => Poll::Ready(None),
            // `Source::pump` fills the slot and polls multer again; no waker needed.
            None => Poll::Pending,
        }
    }
}

/// The request body as the slot's supplier.
struct Source {
    body: RequestBody,
    slot: Arc<Mutex<Slot>>,
    /// The part of the last body piece not handed to multer yet.
    piece: Bytes,
    /// Body bytes read.
    read: u64,
    /// Body bytes handed to multer.
    given: u64,
    /// `given` when the head of the coming part (or the preamble) started, while it is read.
    head_start: Option<u64>,
    /// The body limit.
    limit: u64,
    failed: Option<Rejection>,
}

impl Source {
    /// Polls multer through `poll`, feeding it from the body each time it runs dry. With
    /// `head_start`, multer is reading a part's head: at most [`PART_HEAD_LIMIT`] bytes past
    /// `head_start` are given to it.
    fn pump<T>(
        &mut self,
        cx: &mut Context<'_>,
        head_start: Option<u64>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<Result<T, multer::Error>>,
    ) -> Poll<Result<T, Rejection>> {
        loop {
            if let Some(e) = &self.failed {
                return Poll::Ready(Err(e.clone()));
            }
            match poll(cx) {
                Poll::Ready(Ok(v)) => return Poll::Ready(Ok(v)),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(rejection(e)))),
                Poll::Pending => {}
            }
            {
                let slot = lock(&self.slot);
                if slot.next.is_some() || slot.end {
                    // multer waits, but not for input: it never does; refuse rather than hang.
                    drop(slot);
                    let e = Rejection::new(StatusCode::BAD_REQUEST, "malformed multipart body");
                    return Poll::Ready(Err(self.fail(e)));
                }
            }
            if head_start.is_some_and(|start| self.given - start >= PART_HEAD_LIMIT as u64) {
                let e = Rejection::new(
                    StatusCode::BAD_REQUEST,
                    format!("multipart part head longer than {PART_HEAD_LIMIT} bytes"),
                );
                return Poll::Ready(Err(self.fail(e)));
            }
            if self.piece.is_empty() {
                match self.body.poll_chunk(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(piece))) => {
                        self.read += piece.len() as u64;
                        if self.read > self.limit {
                            let e = Rejection::new(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                format!("request body larger than {} bytes", self.limit),
                            );
                            return Poll::Ready(Err(self.fail(e)));
                        }
                        self.piece = piece;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(self.fail(Rejection::from(e))))
                    }
                    Poll::Ready(None) => {
                        lock(&self.slot).end = true;
                        continue;
                    }
                }
            }
            let piece = self.piece.split_to(self.piece.len().min(FEED));
            self.given += piece.len() as u64;
            lock(&self.slot).next = Some(piece);
        }
    }

    /// Records `e`: every later call fails with it.
    fn fail(&mut self, e: Rejection) -> Rejection {
        self.failed = Some(e.clone());
        self.piece.clear();
        e
    }
}

/// The answer to a multer error.
fn rejection(e: multer::Error) -> Rejection {
    use multer::Error;
    let status = match e {
        Error::FieldSizeExceeded { .. } | Error::StreamSizeExceeded { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        Error::NoMultipart | Error::DecodeContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Error::LockFailure => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    Rejection::new(status, format!("malformed multipart body: {e}"))
}
