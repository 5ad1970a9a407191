//! The output queue of a connection: what it has encoded or been given to send, written with
//! one `write` or `writev` per flush.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};

use crate::core::transport::Transport;
use crate::core::worker::Worker;

/// A body piece at least this large is queued for `writev` instead of copied.
const ZERO_COPY_MIN: usize = 16 * 1024;

/// The output queue: small writes are copied into `buf`; large body pieces are queued as they
/// are and written with `writev`.
#[derive(Default)]
pub(crate) struct Out {
    pub(crate) buf: BytesMut,
    queue: VecDeque<Bytes>,
    queued: usize,
}

impl Out {
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.queued + self.buf.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether everything queued is in the copy buffer, and there is something.
    #[inline]
    pub(crate) fn is_single(&self) -> bool {
        self.queue.is_empty() && !self.buf.is_empty()
    }

    /// Makes sure the copy buffer has an allocation (it is returned to the pool while idle).
    #[inline]
    pub(crate) fn prepare(&mut self, worker: &Worker) {
        if self.buf.capacity() == 0 {
            self.buf = worker.take_buf();
        }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, data: Bytes) {
        if data.len() < ZERO_COPY_MIN {
            self.buf.extend_from_slice(&data);
            return;
        }
        if !self.buf.is_empty() {
            let head = self.buf.split().freeze();
            self.queued += head.len();
            self.queue.push_back(head);
        }
        self.queued += data.len();
        self.queue.push_back(data);
    }

    pub(crate) fn poll_write<T: Transport>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            let n = if self.queue.is_empty() {
                ready!(io.poll_write(cx, &self.buf))?
            } else {
                let mut iov = [IoSlice::new(&[]); 64];
                let mut k = 0;
                for piece in self.queue.iter().take(iov.len()) {
                    iov[k] = IoSlice::new(piece);
                    k += 1;
                }
                if k < iov.len() && k == self.queue.len() && !self.buf.is_empty() {
                    iov[k] = IoSlice::new(&self.buf);
                    k += 1;
                }
                ready!(io.poll_write_vectored(cx, &iov[..k]))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume(n);
        }
        // What the transport keeps of its own (TLS records not yet on the wire).
        io.poll_flush(cx)
    }

    pub(crate) fn consume(&mut self, mut n: usize) {
        while n > 0 {
            match self.queue.front_mut() {
                Some(front) if front.len() <= n => {
                    n -= front.len();
                    self.queued -= front.len();
                    self.queue.pop_front();
                }
                Some(front) => {
                    front.advance(n);
                    self.queued -= n;
                    return;
                }
                None if n >= self.buf.len() => {
                    // All of it written (the usual case): emptied in place, so the buffer keeps
                    // its whole allocation and goes back to the pool without being reclaimed.
                    self.buf.clear();
                    return;
                }
                None => {
                    self.buf.advance(n);
                    return;
                }
            }
        }
    }
}
