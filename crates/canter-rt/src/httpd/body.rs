//! Bodies: the streaming request body a handler reads, and the response body it returns.
//!
//! The request body is fed by the connection task itself (no channel, no second task): while the
//! handler's future waits on [`RequestBody::chunk`], the connection reads the socket, decodes the
//! next piece and polls the handler again. The pipe between them holds at most
//! [`PIPE_CAPACITY`] bytes; beyond that the connection stops reading (backpressure to the peer).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

/// Bytes of decoded body the connection buffers ahead of the handler.
pub const PIPE_CAPACITY: usize = 256 * 1024;

/// Why reading the request body failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyError {
    /// The body is larger than the limit (the server's, or the one given to
    /// [`RequestBody::collect`]): answer 413.
    TooLarge,
    /// The body's framing is invalid: answer 400.
    Malformed(canter_h1::Error),
    /// The peer closed the connection mid-body.
    Disconnected,
    /// The body made no progress within the body timeout (answer 408).
    TimedOut,
    /// The body was used after the handler returned its response.
    Detached,
}

impl BodyError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            BodyError::TooLarge => 413,
            BodyError::Malformed(e) => e.status(),
            BodyError::TimedOut => 408,
            BodyError::Disconnected | BodyError::Detached => 400,
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("request body too large"),
            BodyError::Malformed(e) => e.fmt(f),
            BodyError::Disconnected => f.write_str("client went away during the request body"),
            BodyError::TimedOut => f.write_str("request body timed out"),
            BodyError::Detached => f.write_str("request body read after the response"),
        }
    }
}

impl std::error::Error for BodyError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PipeState {
    Open,
    End,
    Failed(BodyError),
}

/// The connection side of a request body: decoded pieces waiting for the handler.
#[derive(Debug)]
pub(crate) struct Pipe {
    chunks: VecDeque<Bytes>,
    buffered: usize,
    pub(crate) state: PipeState,
    /// The handler asked for data the pipe does not have.
    pub(crate) wanted: bool,
    waker: Option<Waker>,
    /// Body bytes delivered so far.
    received: u64,
    /// Time the handler has spent waiting for body bytes (the minimum data rate is measured
    /// over it only, so a handler that is slow to read does not count against the client).
    waited: Duration,
    /// Since when the handler has been waiting, if it is.
    wait_started: Option<Instant>,
    /// Tighter body and chunk-extension limits asked for by the application, not yet handed
    /// to the decoder.
    pub(crate) restrict: Option<(u64, usize)>,
}

impl Pipe {
    pub(crate) fn new() -> Pipe {
        Pipe {
            chunks: VecDeque::new(),
            buffered: 0,
            state: PipeState::Open,
            wanted: false,
            waker: None,
            received: 0,
            waited: Duration::ZERO,
            wait_started: None,
            restrict: None,
        }
    }

    pub(crate) fn has_room(&self) -> bool {
        self.state == PipeState::Open && self.buffered < PIPE_CAPACITY
    }

    pub(crate) fn push(&mut self, data: Bytes) {
        self.received += data.len() as u64;
        if let Some(started) = self.wait_started.take() {
            self.waited += crate::core::worker::clock().saturating_duration_since(started);
        }
        self.buffered += data.len();
        self.chunks.push_back(data);
        self.wake();
    }

    pub(crate) fn close(&mut self, state: PipeState) {
        if self.state == PipeState::Open {
            self.state = state;
        }
        self.wake();
    }

    fn wake(&mut self) {
        self.wanted = false;
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// When the client falls below `rate` bytes per second of waiting time (after `grace`), if
    /// the handler is waiting now and a rate is set.
    pub(crate) fn rate_deadline(&self, rate: u64, grace: Duration) -> Option<Instant> {
        let started = self.wait_started?;
        if rate == 0 {
            return None;
        }
        // The next byte is due once the wait covers it at `rate`, and never before the grace.
        let due = Duration::from_secs_f64((self.received + 1) as f64 / rate as f64).max(grace);
        Some(started + due.saturating_sub(self.waited))
    }

    #[cfg_attr(not(feature = "http2"), allow(dead_code))]
    /// Body bytes put into the pipe so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.received
    }

    #[cfg_attr(not(feature = "http2"), allow(dead_code))]
    /// Body bytes the handler has taken out of the pipe so far.
    pub(crate) fn consumed(&self) -> u64 {
        self.received - self.buffered as u64
    }

    /// The driver polls the handler itself; it only needs wakers from other tasks.
    pub(crate) fn forget_waker_if(&mut self, driver: &Waker) {
        if self.waker.as_ref().is_some_and(|w| w.will_wake(driver)) {
            self.waker = None;
        }
    }
}

/// The request body, streamed: call [`RequestBody::chunk`] until it yields `None`, or
/// [`RequestBody::collect`] it up to a limit.
pub struct RequestBody {
    pipe: Option<Rc<RefCell<Pipe>>>,
    declared: Option<u64>,
}

impl RequestBody {
    /// A body of zero bytes (what a request without one carries).
    pub fn empty() -> RequestBody {
        RequestBody {
            pipe: None,
            declared: Some(0),
        }
    }

    pub(crate) fn piped(pipe: Rc<RefCell<Pipe>>, declared: Option<u64>) -> RequestBody {
        RequestBody {
            pipe: Some(pipe),
            declared,
        }
    }

    /// The Content-Length the client declared (`Some(0)` for no body, `None` for chunked).
    pub fn content_length(&self) -> Option<u64> {
        self.declared
    }

    /// Tightens the server's limits for the rest of this body: at most `max_body` bytes in all
    /// (413 beyond) and chunk extensions of at most `max_chunk_ext` bytes (400 beyond). Call it
    /// before reading; bytes already read are not checked again. Never loosens a limit.
    pub fn restrict(&mut self, max_body: u64, max_chunk_ext: usize) {
        if let Some(pipe) = &self.pipe {
            let mut pipe = pipe.borrow_mut();
            let (body, ext) = pipe.restrict.unwrap_or((u64::MAX, usize::MAX));
            pipe.restrict = Some((body.min(max_body), ext.min(max_chunk_ext)));
        }
    }

    /// Polls for the next piece of the body.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        let Some(pipe) = &self.pipe else {
            return Poll::Ready(None);
        };
        let mut pipe = pipe.borrow_mut();
        if let Some(chunk) = pipe.chunks.pop_front() {
            pipe.buffered -= chunk.len();
            return Poll::Ready(Some(Ok(chunk)));
        }
        match &pipe.state {
            PipeState::End => Poll::Ready(None),
            PipeState::Failed(e) => Poll::Ready(Some(Err(e.clone()))),
            PipeState::Open => {
                pipe.wanted = true;
                if pipe.wait_started.is_none() {
                    pipe.wait_started = Some(crate::core::worker::clock());
                }
                if !pipe.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    pipe.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// The next piece of the body; `None` at its end.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, BodyError>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// Reads the whole body into memory, failing with [`BodyError::TooLarge`] beyond `limit`
    /// bytes. A declared Content-Length over the limit fails before any byte is read (and
    /// before `100 Continue` is sent).
    pub async fn collect(&mut self, limit: usize) -> Result<Bytes, BodyError> {
        if self.declared.is_some_and(|n| n > limit as u64) {
            return Err(BodyError::TooLarge);
        }
        let mut first: Option<Bytes> = None;
        let mut all = BytesMut::new();
        while let Some(chunk) = self.chunk().await {
            let chunk = chunk?;
            let total = all.len() + first.as_ref().map_or(0, Bytes::len) + chunk.len();
            if total > limit {
                return Err(BodyError::TooLarge);
            }
            match first.take() {
                None if all.is_empty() => first = Some(chunk),
                prev => {
                    if let Some(prev) = prev {
                        all.reserve(self.declared.map_or(prev.len() * 2, |n| n as usize));
                        all.extend_from_slice(&prev);
                    }
                    all.extend_from_slice(&chunk);
                }
            }
        }
        Ok(first.unwrap_or_else(|| all.freeze()))
    }
}

impl fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBody")
            .field("declared", &self.declared)
            .finish_non_exhaustive()
    }
}

/// A source of response body pieces, pulled by the connection only while the peer keeps up.
pub trait BodyStream {
    /// The next piece; `None` at the end. An error aborts the response and closes the
    /// connection (the client sees a truncated body, never a false end).
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>>;
}

/// A response body.
///
/// ```
/// use bytes::Bytes;
/// use canter_rt::Body;
///
/// let full = Body::from("hello");
/// let empty = Body::Empty;
/// # let _ = (full, empty, Bytes::new());
/// ```
pub enum Body {
    /// No body.
    Empty,
    /// A body known in full.
    Full(Bytes),
    /// A streamed body; with `len` it is sent with Content-Length, else chunked.
    Stream {
        /// The exact length, if known.
        len: Option<u64>,
        /// The source of pieces.
        stream: Pin<Box<dyn BodyStream>>,
    },
    /// `len` bytes of an open regular file from `offset`, sent with Content-Length `len` by
    /// `sendfile(2)`: from the page cache to the socket without passing through user space,
    /// in bounded pieces while the peer keeps up. Build it with [`Body::file`].
    ///
    /// If the file turns out shorter than `offset + len` (it was truncated meanwhile) or cannot
    /// be read, the connection is closed after the bytes already sent: the client sees a short
    /// body, never a false end. Reading a page that is not cached waits for the disk on the
    /// worker's thread, as any `std::fs` read would. The kernel queues file pages by reference,
    /// so bytes of a file rewritten in place while it is sent may go out changed: replace
    /// served files by renaming a new file over them.
    File {
        /// The open file; its position is neither used nor moved.
        file: File,
        /// Where the body starts in the file.
        offset: u64,
        /// How many bytes to send.
        len: u64,
    },
    /// No body: the connection switches protocols after this response (a 101), and the
    /// upgrade says to what. Made by [`crate::WsUpgrade::on_upgrade`].
    #[cfg(feature = "ws")]
    Upgrade(crate::ws::Upgrade),
}

impl Body {
    /// The body's length in bytes, if known before it is sent.
    ///
    /// ```
    /// use canter_rt::Body;
    /// assert_eq!(Body::from("hello").exact_len(), Some(5));
    /// assert_eq!(Body::Empty.exact_len(), Some(0));
    /// ```
    pub fn exact_len(&self) -> Option<u64> {
        match self {
            Body::Empty => Some(0),
            Body::Full(b) => Some(b.len() as u64),
            Body::Stream { len, .. } => *len,
            Body::File { len, .. } => Some(*len),
            #[cfg(feature = "ws")]
            Body::Upgrade(_) => Some(0),
        }
    }

    /// `len` bytes of `file` starting at `offset`, sent with `sendfile(2)` (see [`Body::File`]).
    ///
    /// ```no_run
    /// use canter_rt::{Body, Response};
    ///
    /// let file = std::fs::File::open("site/index.html")?;
    /// let len = file.metadata()?.len();
    /// let response = Response::html(Body::file(file, 0, len));
    /// # let _ = response;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn file(file: File, offset: u64, len: u64) -> Body {
        Body::File { file, offset, len }
    }

    /// A streamed body.
    pub fn stream(len: Option<u64>, stream: impl BodyStream + 'static) -> Body {
        Body::Stream {
            len,
            stream: Box::pin(stream),
        }
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Body::Empty => f.write_str("Body::Empty"),
            Body::Full(b) => write!(f, "Body::Full({} bytes)", b.len()),
            Body::Stream { len, .. } => write!(f, "Body::Stream(len: {len:?})"),
            Body::File { offset, len, .. } => {
                write!(f, "Body::File(offset: {offset}, len: {len})")
            }
            #[cfg(feature = "ws")]
            Body::Upgrade(up) => write!(f, "Body::Upgrade({up:?})"),
        }
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        Body::Full(b)
    }
}

impl From<&'static str> for Body {
    fn from(s: &'static str) -> Body {
        Body::Full(Bytes::from_static(s.as_bytes()))
    }
}

impl From<&'static [u8]> for Body {
    fn from(s: &'static [u8]) -> Body {
        Body::Full(Bytes::from_static(s))
    }
}

impl From<String> for Body {
    fn from(s: String) -> Body {
        Body::Full(Bytes::from(s))
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Body {
        Body::Full(Bytes::from(v))
    }
}
