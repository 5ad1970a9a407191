//! Transports under the connection actor: what a connection reads from and writes to.
//!
//! The actor is generic over [`Transport`], so the same code drives a plain TCP socket, a TLS
//! session over one, or (in tests) an in-memory pipe. Each implementation is monomorphised into
//! its own copy of the actor: the plain TCP path keeps its fast paths (`try_write` while the
//! socket is writable, `sendfile(2)` for files) and pays nothing for TLS existing.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A byte stream the connection actor can drive.
///
/// Besides reading and writing it answers one question the actor needs for its memory
/// discipline: [`Transport::poll_read_ready`] says when a read would find something, so an idle
/// connection holds no read buffer while it waits.
pub trait Transport: Unpin + 'static {
    /// Ready when a read may make progress (data, end of input or an error); registers the task
    /// for a wake-up otherwise. May be ready spuriously, never falsely pending.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Reads into `buf`; no new bytes with `Ready(Ok(()))` means end of input.
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>>;

    /// Writes some of `buf`, returning how much was taken.
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;

    /// Writes some of `bufs`, in order, returning how much was taken.
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>>;

    /// Pushes out what the transport itself buffers (TLS records); plain sockets buffer nothing.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    /// Ends the sending side (TLS: `close_notify` first).
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// The TCP socket when bytes written to it reach the peer as they are, so that files can go
    /// out with `sendfile(2)`; `None` when the transport transforms them (TLS).
    fn raw_tcp(&self) -> Option<&TcpStream> {
        None
    }

    /// The certificate chain the peer presented and the TLS layer verified, if any.
    fn peer_certificates(&self) -> Option<crate::tls::PeerCertificates> {
        None
    }

    /// Whether the bytes are encrypted (TLS): what [`crate::peer_is_tls`] tells handlers.
    fn encrypted(&self) -> bool {
        false
    }

    /// Whether the transport holds output of its own that [`Transport::poll_flush`] has yet to
    /// push out (TLS records the socket could not take). The actor keeps flushing while it does,
    /// even with its own queue empty.
    fn has_pending_output(&self) -> bool {
        false
    }
}

impl Transport for TcpStream {
    #[inline]
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    #[inline]
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        AsyncRead::poll_read(Pin::new(self), cx, buf)
    }

    #[inline]
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // While the socket is known writable (the usual case) `try_write` skips the waker and
        // budget bookkeeping of `poll_write`; once it is not, `poll_write` arranges the wake-up.
        match self.try_write(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                AsyncWrite::poll_write(Pin::new(self), cx, buf)
            }
            done => Poll::Ready(done),
        }
    }

    #[inline]
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write_vectored(Pin::new(self), cx, bufs)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(Pin::new(self), cx)
    }

    #[inline]
    fn raw_tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

/// The write half of a `Transport` that is a tokio `AsyncWrite` as it is.
macro_rules! forward_writes {
    () => {
        fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            AsyncWrite::poll_write(Pin::new(self), cx, buf)
        }

        fn poll_write_vectored(
            &mut self,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            // For TLS, rustls encrypts the pieces as one plaintext (`OutboundChunks`), so a
            // pipelined batch leaves in as few records as its size allows.
            AsyncWrite::poll_write_vectored(Pin::new(self), cx, bufs)
        }

        fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            AsyncWrite::poll_flush(Pin::new(self), cx)
        }

        fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            AsyncWrite::poll_shutdown(Pin::new(self), cx)
        }
    };
}

/// A TLS session over TCP, either side.
pub type TlsStream = tokio_rustls::TlsStream<TcpStream>;

impl Transport for TlsStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (tcp, session) = self.get_ref();
        // Decrypted bytes still inside the session (a record larger than the last read took),
        // a close_notify received: a read finds them without touching the socket.
        if !session.wants_read() {
            return Poll::Ready(Ok(()));
        }
        tcp.poll_read_ready(cx)
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match AsyncRead::poll_read(Pin::new(&mut *self), cx, buf) {
            // A peer that closes the TCP connection without close_notify: the end of input as
            // far as the protocol above is concerned (it frames its own messages), as browsers
            // and most servers treat it.
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                debug_assert_eq!(buf.filled().len(), before);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }

    forward_writes!();

    fn has_pending_output(&self) -> bool {
        self.get_ref().1.wants_write()
    }

    fn encrypted(&self) -> bool {
        true
    }

    fn peer_certificates(&self) -> Option<crate::tls::PeerCertificates> {
        let chain = self.get_ref().1.peer_certificates()?;
        Some(crate::tls::PeerCertificates(std::sync::Arc::new(
            chain.to_vec(),
        )))
    }
}

/// A connection's transport that can change from plain TCP to TLS mid-connection
/// ([`crate::proto`]'s `start_tls`), or be an outbound connection of either kind.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: a TLS session is large and most connections are plain).
    Tls(Box<TlsStream>),
}

impl Stream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// The protocol agreed by ALPN, if TLS and one was agreed.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

/// `Stream` as a tokio byte stream, for code written against `AsyncRead`/`AsyncWrite` (the load
/// generator, clients).
impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Transport::poll_read(self.get_mut(), cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Transport::poll_write(self.get_mut(), cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Transport::poll_write_vectored(self.get_mut(), cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Transport::poll_flush(self.get_mut(), cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Transport::poll_shutdown(self.get_mut(), cx)
    }
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Stream::Plain($s) => $e,
            Stream::Tls($s) => {
                let $s = &mut **$s;
                $e
            }
        }
    };
}

impl Transport for Stream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => Transport::poll_read_ready(s, cx))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        both!(self, s => Transport::poll_read(s, cx, buf))
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        both!(self, s => Transport::poll_write(s, cx, buf))
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => Transport::poll_write_vectored(s, cx, bufs))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => Transport::poll_flush(s, cx))
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => Transport::poll_shutdown(s, cx))
    }

    fn raw_tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Plain(s) => Some(s),
            Stream::Tls(_) => None,
        }
    }

    fn encrypted(&self) -> bool {
        self.is_tls()
    }

    fn peer_certificates(&self) -> Option<crate::tls::PeerCertificates> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.peer_certificates(),
        }
    }

    fn has_pending_output(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(s) => s.has_pending_output(),
        }
    }
}

/// An in-memory transport for tests: one end of a `tokio::io::duplex` pipe, driven by a
/// scripted peer on the other end (with tokio's paused clock, on virtual time).
impl Transport for tokio::io::DuplexStream {
    fn poll_read_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A duplex pipe has no readiness of its own; the read itself registers the waker.
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        AsyncRead::poll_read(Pin::new(self), cx, buf)
    }

    forward_writes!();
}

/// Reads into the spare capacity of `buf` (growing nothing), returning the count; 0 is end of
/// input.
pub(crate) fn poll_read_buf<T: Transport + ?Sized>(
    io: &mut T,
    cx: &mut Context<'_>,
    buf: &mut bytes::BytesMut,
) -> Poll<io::Result<usize>> {
    let spare = buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(spare);
    ready!(io.poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: `poll_read` initialized the first `n` bytes of the spare capacity, which
    // directly follows the buffer's current length.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}
