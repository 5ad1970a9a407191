//! Transports under the connection actor: what a connection reads from and writes to.
//!
//! The actor is generic over [`Transport`], so the same code drives a plain TCP socket, a TLS
//! session over one, or (in tests) an in-memory pipe. Each implementation is monomorphised into
//! its own copy of the actor: the plain TCP path keeps its fast paths (`try_write` while the
//! socket is writable, `sendfile(2)` for files) and pays nothing for TLS existing.

use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::core::syscall::retry;

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

    /// Writes some of `buf`, the last bytes of the connection, which is closed right after and
    /// whose peer sends nothing more. Plain TCP outside the event loop holds them back
    /// (`MSG_MORE`) so that the close's FIN leaves in the same segment.
    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write(cx, buf)
    }

    /// Pushes out what the transport itself buffers (TLS records); plain sockets buffer nothing.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    /// Ends the sending side (TLS: `close_notify` first).
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// The TCP socket when bytes written to it reach the peer as they are, so that files can go
    /// out with `sendfile(2)`; `None` when the transport transforms them (TLS), and for a
    /// `LazyTcp` until [`Transport::register`] has made it a socket of the event loop.
    fn raw_tcp(&self) -> Option<&TcpStream> {
        None
    }

    /// The socket's descriptor when bytes written to it reach the peer as they are (what
    /// [`Transport::raw_tcp`] gives, or a socket of canter's own): for writes made beside the
    /// transport, such as WebSocket's direct broadcasts.
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.raw_tcp().map(AsRawFd::as_raw_fd)
    }

    /// Sends up to `count` bytes of file `src` from `offset` (advanced by what went) with
    /// `sendfile(2)`, once the socket is writable; `Ok(0)` means the file ended. Plain TCP only
    /// (after [`Transport::register`]); the others answer `Unsupported`.
    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        src: std::os::fd::RawFd,
        offset: &mut libc::off_t,
        count: usize,
    ) -> Poll<io::Result<usize>> {
        let Some(tcp) = self.raw_tcp() else {
            return Poll::Ready(Err(io::ErrorKind::Unsupported.into()));
        };
        loop {
            ready!(tcp.poll_write_ready(cx))?;
            let dst = tcp.as_raw_fd();
            let sent = tcp.try_io(tokio::io::Interest::WRITABLE, || {
                // SAFETY: both descriptors are open for the duration of the call (`tcp` is
                // borrowed, `src` is the caller's), `offset` is a valid, exclusively borrowed
                // off_t that the kernel reads and advances, and no user-space buffer is involved.
                let n = unsafe { libc::sendfile(dst, src, &mut *offset, count) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match sent {
                // Readiness was cleared: the next `poll_write_ready` registers for it.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                done => return Poll::Ready(done),
            }
        }
    }

    /// Whether the bytes reach the peer as they are written (plain TCP): a close then needs no
    /// protocol of its own, and files can go out with `sendfile(2)` once [`Transport::register`]
    /// has run.
    fn plain_tcp(&self) -> bool {
        self.raw_tcp().is_some()
    }

    /// Makes the transport a socket of the event loop, if it is not yet one (`LazyTcp`), so
    /// that [`Transport::raw_tcp`] returns it; nothing for the others.
    fn register(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// The certificate chain the peer presented and the TLS layer verified, if any.
    #[cfg(feature = "tls")]
    fn peer_certificates(&self) -> Option<PeerCertificates> {
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

    /// How many bytes the kernel still holds for the peer on the socket underneath (sent and
    /// not acknowledged, or not yet sent: `SIOCOUTQ`); `None` where there is no socket. The
    /// actor's write timeout reads it when its own output has waited long: a queue that went
    /// down means the peer is still taking data, slowly, through a send buffer that the kernel
    /// grew so large that the socket stays unwritable for long.
    fn kernel_queued(&self) -> Option<u32> {
        None
    }
}

/// `SIOCOUTQ` on a socket: the bytes its send queue holds.
pub(crate) fn send_queue(fd: std::os::fd::RawFd) -> Option<u32> {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is an open socket borrowed by the caller for the duration of the call, and
    // `TIOCOUTQ` (`SIOCOUTQ` for TCP) writes one `int` through the pointer, which points at a
    // live, writable `c_int`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    if rc < 0 {
        return None;
    }
    u32::try_from(queued).ok()
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

    fn kernel_queued(&self) -> Option<u32> {
        send_queue(self.as_raw_fd())
    }
}

/// A plain TCP connection that joins the event loop only when it has to wait.
///
/// An accepted socket starts outside the loop: reads and writes go straight to the kernel, and
/// only when one of them would block is the socket registered with epoll (and from then on it
/// is a tokio `TcpStream` like any other). A connection whose request is there when it is
/// accepted, and that is answered and closed in one go (a new connection per request), so makes
/// neither the `epoll_ctl` that adds it nor the one that removes it: four system calls in all
/// (accept4, recv, send, close).
///
/// Outside the loop readiness is unknown, so [`Transport::poll_read_ready`] says "ready" and the
/// first read finds out; a connection whose first read finds nothing (a client silent past the
/// listener's deferred accept) then waits with its read buffer taken, as a keep-alive
/// connection does after a stale readiness.
#[derive(Debug)]
pub(crate) struct LazyTcp(Lazy);

#[derive(Debug)]
enum Lazy {
    /// Not (yet) in the event loop; nonblocking.
    Outside(std::net::TcpStream),
    /// Registered with the event loop.
    Inside(TcpStream),
    /// Registration failed: the socket is closed and every call fails.
    Closed,
}

impl LazyTcp {
    /// Wraps an accepted, nonblocking socket.
    pub(crate) fn new(tcp: std::net::TcpStream) -> LazyTcp {
        LazyTcp(Lazy::Outside(tcp))
    }

    /// A read before the socket is in the event loop: straight to the kernel, and when that
    /// finds nothing, registration and the event loop's read.
    #[inline(never)]
    fn poll_read_outside(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Lazy::Outside(tcp) = &self.0 {
            let fd = tcp.as_raw_fd();
            // SAFETY: the kernel only writes to the unfilled part, and `assume_init` below
            // covers exactly the bytes it reports written.
            let spare = unsafe { buf.unfilled_mut() };
            let read = retry(|| {
                // SAFETY: `fd` is the open socket borrowed above; the pointer and length
                // describe `spare`, writable memory owned by `buf` for the call's duration.
                unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), spare.len(), 0) }
            });
            if !would_block(&read) {
                let n = read?;
                // SAFETY: `recv` initialized the first `n` bytes of the unfilled part.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
        }
        // Nothing to read yet: from now on the event loop says when there is.
        let tcp = self.register_now()?;
        AsyncRead::poll_read(Pin::new(tcp), cx, buf)
    }

    /// A write before the socket is in the event loop, as [`LazyTcp::poll_read_outside`].
    #[inline(never)]
    fn poll_write_outside(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Lazy::Outside(tcp) = &self.0 {
            let written = match bufs {
                [one] => (&*tcp).write(one),
                _ => (&*tcp).write_vectored(bufs),
            };
            if !would_block(&written) {
                return Poll::Ready(written);
            }
        }
        let tcp = self.register_now()?;
        match bufs {
            [one] => Transport::poll_write(tcp, cx, one),
            _ => Transport::poll_write_vectored(tcp, cx, bufs),
        }
    }

    /// Registers the socket with the event loop (the first time an I/O would block).
    #[cold]
    #[inline(never)]
    fn register_now(&mut self) -> io::Result<&mut TcpStream> {
        if let Lazy::Outside(_) = self.0 {
            if let Lazy::Outside(tcp) = std::mem::replace(&mut self.0, Lazy::Closed) {
                self.0 = Lazy::Inside(TcpStream::from_std(tcp)?);
            }
        }
        match &mut self.0 {
            Lazy::Inside(tcp) => Ok(tcp),
            _ => Err(io::Error::from(io::ErrorKind::NotConnected)),
        }
    }
}

fn would_block<T>(r: &io::Result<T>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl Transport for LazyTcp {
    #[inline]
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.0 {
            // Unknown outside the loop: a read finds out (the first one usually finds the
            // request, which came with the connection or just after it).
            Lazy::Outside(_) => Poll::Ready(Ok(())),
            Lazy::Inside(tcp) => TcpStream::poll_read_ready(tcp, cx),
            Lazy::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    #[inline]
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Lazy::Inside(tcp) = &mut self.0 {
            return AsyncRead::poll_read(Pin::new(tcp), cx, buf);
        }
        self.poll_read_outside(cx, buf)
    }

    #[inline]
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Lazy::Inside(tcp) = &mut self.0 {
            return Transport::poll_write(tcp, cx, buf);
        }
        self.poll_write_outside(cx, &[IoSlice::new(buf)])
    }

    #[inline]
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Lazy::Inside(tcp) = &mut self.0 {
            return Transport::poll_write_vectored(tcp, cx, bufs);
        }
        self.poll_write_outside(cx, bufs)
    }

    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Lazy::Outside(tcp) = &self.0 {
            let fd = tcp.as_raw_fd();
            let sent = retry(|| {
                // SAFETY: `fd` is the open socket borrowed above; the pointer and length
                // describe `buf`, readable for the call's duration.
                unsafe {
                    libc::send(
                        fd,
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_NOSIGNAL | libc::MSG_MORE,
                    )
                }
            });
            if !would_block(&sent) {
                return Poll::Ready(sent);
            }
            // The socket is full: wait for room in the event loop (a plain write then, whose
            // push also sends what `MSG_MORE` held back).
            let tcp = self.register_now()?;
            return Transport::poll_write(tcp, cx, buf);
        }
        Transport::poll_write(self, cx, buf)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.0 {
            Lazy::Outside(tcp) => Poll::Ready(tcp.shutdown(std::net::Shutdown::Write)),
            Lazy::Inside(tcp) => Transport::poll_shutdown(tcp, cx),
            Lazy::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    #[inline]
    fn raw_tcp(&self) -> Option<&TcpStream> {
        match &self.0 {
            Lazy::Inside(tcp) => Some(tcp),
            _ => None,
        }
    }

    #[inline]
    fn plain_tcp(&self) -> bool {
        true
    }

    fn register(&mut self) -> io::Result<()> {
        self.register_now().map(|_| ())
    }

    fn kernel_queued(&self) -> Option<u32> {
        match &self.0 {
            Lazy::Outside(tcp) => send_queue(tcp.as_raw_fd()),
            Lazy::Inside(tcp) => send_queue(tcp.as_raw_fd()),
            Lazy::Closed => None,
        }
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
#[cfg(feature = "tls")]
pub type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// TLS over any socket transport: tokio's (`TlsStream`) or a socket of the worker's connection
/// set.
#[cfg(feature = "tls")]
impl<IO: Transport + AsyncRead + AsyncWrite> Transport for tokio_rustls::TlsStream<IO> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (io, session) = self.get_mut();
        // Decrypted bytes still inside the session (a record larger than the last read took),
        // a close_notify received: a read finds them without touching the socket.
        if !session.wants_read() {
            return Poll::Ready(Ok(()));
        }
        io.poll_read_ready(cx)
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

    fn kernel_queued(&self) -> Option<u32> {
        self.get_ref().0.kernel_queued()
    }

    fn encrypted(&self) -> bool {
        true
    }

    fn peer_certificates(&self) -> Option<PeerCertificates> {
        let chain = self.get_ref().1.peer_certificates()?;
        Some(PeerCertificates(std::sync::Arc::new(chain.to_vec())))
    }
}

/// A connection's transport that can change from plain TCP to TLS mid-connection
/// ([`crate::proto`]'s `start_tls`), or be an outbound connection of either kind.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: a TLS session is large and most connections are plain).
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream>),
}

impl Stream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            #[cfg(feature = "tls")]
            Stream::Tls(_) => true,
        }
    }

    /// The protocol agreed by ALPN, if TLS and one was agreed.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

/// `AsyncRead` and `AsyncWrite` for a [`Transport`], through its own methods: the type as a
/// tokio byte stream, for code written against tokio's traits (the TLS layer, clients).
macro_rules! tokio_io_through_transport {
    ($t:ty) => {
        impl tokio::io::AsyncRead for $t {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                $crate::core::transport::Transport::poll_read(self.get_mut(), cx, buf)
            }
        }

        impl tokio::io::AsyncWrite for $t {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                $crate::core::transport::Transport::poll_write(self.get_mut(), cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                $crate::core::transport::Transport::poll_write_vectored(self.get_mut(), cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                $crate::core::transport::Transport::poll_flush(self.get_mut(), cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                $crate::core::transport::Transport::poll_shutdown(self.get_mut(), cx)
            }
        }
    };
}
pub(crate) use tokio_io_through_transport;

// `Stream` as a tokio byte stream (the load generator, clients).
tokio_io_through_transport!(Stream);

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Stream::Plain($s) => $e,
            #[cfg(feature = "tls")]
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
            #[cfg(feature = "tls")]
            Stream::Tls(_) => None,
        }
    }

    fn encrypted(&self) -> bool {
        self.is_tls()
    }

    #[cfg(feature = "tls")]
    fn peer_certificates(&self) -> Option<PeerCertificates> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.peer_certificates(),
        }
    }

    fn has_pending_output(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.has_pending_output(),
        }
    }

    fn kernel_queued(&self) -> Option<u32> {
        send_queue(self.tcp().as_raw_fd())
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

/// The verified certificate chain of a client (leaf first), attached to each request of a
/// connection that presented one ([`ServerTls::client_ca`](crate::ServerTls::client_ca)).
#[cfg(feature = "tls")]
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub std::sync::Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

#[cfg(feature = "tls")]
impl PeerCertificates {
    /// The SHA-256 fingerprint of the leaf certificate, as colon-separated hex pairs (the form
    /// `openssl x509 -fingerprint -sha256` prints).
    pub fn leaf_sha256(&self) -> Option<String> {
        self.0.first().map(|der| sha256_fingerprint(der))
    }
}

/// A certificate's SHA-256 fingerprint, as colon-separated upper-case hex pairs.
#[cfg(feature = "tls")]
pub(crate) fn sha256_fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream as StdStream};
    use std::time::Duration;

    /// A connected pair: the client, and the accepted end made nonblocking as the server's
    /// `accept4` makes it.
    fn pair() -> (StdStream, StdStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        (client, accepted)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    async fn read(io: &mut LazyTcp) -> Vec<u8> {
        let mut buf = bytes::BytesMut::with_capacity(64);
        let n = poll_fn(|cx| poll_read_buf(io, cx, &mut buf)).await.unwrap();
        buf[..n].to_vec()
    }

    /// Input already there and output the socket takes: the connection is served without
    /// ever joining the event loop.
    #[test]
    fn lazy_tcp_stays_outside_while_nothing_waits() {
        runtime().block_on(async {
            let (mut client, accepted) = pair();
            client.write_all(b"ping").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let mut io = LazyTcp::new(accepted);
            assert!(io.plain_tcp());
            assert_eq!(read(&mut io).await, b"ping");
            let n = poll_fn(|cx| io.poll_write(cx, b"pong")).await.unwrap();
            assert_eq!(n, 4);
            let n = poll_fn(|cx| io.poll_write_last(cx, b"!")).await.unwrap();
            assert_eq!(n, 1);
            assert!(io.raw_tcp().is_none(), "registered without having waited");
            drop(io);
            // The held-back last byte leaves with the close.
            let mut got = Vec::new();
            client.read_to_end(&mut got).unwrap();
            assert_eq!(got, b"pong!");
        });
    }

    /// A read that finds nothing registers the socket; the event loop then wakes the task
    /// when the input arrives.
    #[test]
    fn lazy_tcp_joins_the_event_loop_to_wait() {
        runtime().block_on(async {
            let (mut client, accepted) = pair();
            let mut io = LazyTcp::new(accepted);
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                client.write_all(b"late").unwrap();
                client
            });
            let got = tokio::time::timeout(Duration::from_secs(5), read(&mut io))
                .await
                .expect("the event loop never reported the input");
            assert_eq!(got, b"late");
            assert!(io.raw_tcp().is_some(), "waited without registering");
            drop(writer.join().unwrap());
            // End of input, reported through the event loop now.
            let eof = tokio::time::timeout(Duration::from_secs(5), read(&mut io)).await;
            assert_eq!(eof.unwrap(), b"");
        });
    }

    /// Writes beyond what the socket takes: the rest waits in the event loop for room.
    #[test]
    fn lazy_tcp_waits_for_room_to_write() {
        runtime().block_on(async {
            let (mut client, accepted) = pair();
            let mut io = LazyTcp::new(accepted);
            let body = vec![7u8; 16 << 20];
            let reader = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut got = Vec::new();
                client.read_to_end(&mut got).unwrap();
                got.len()
            });
            let mut sent = 0;
            while sent < body.len() {
                sent += poll_fn(|cx| io.poll_write_last(cx, &body[sent..]))
                    .await
                    .unwrap();
            }
            assert!(io.raw_tcp().is_some(), "a full socket was not waited on");
            drop(io);
            assert_eq!(reader.join().unwrap(), body.len());
        });
    }
}
