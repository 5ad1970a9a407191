//! WebSocket over an HTTP/2 stream (RFC 8441), and over an HTTP/3 stream alike (RFC 9220): the
//! session of `ws/driver.rs` as the stream's response body, fed by its request body.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::time::Sleep;

use crate::core::worker::{clock, Worker};
use crate::httpd::body::{BodyStream, RequestBody};
use crate::ws::driver::{Piece, Session};
use crate::ws::Upgrade;

/// A WebSocket over an HTTP/2 stream (RFC 8441): the stream's request body brings the
/// client's frames, and this, the response body, takes ours. The HTTP/2 driver pulls it only
/// while the stream has room in its flow-control window and queue, which is the session's
/// backpressure; the session's own timers run on a sleep of its own.
pub(crate) struct H2Tunnel {
    session: Session,
    body: RequestBody,
    input: BytesMut,
    sleep: Pin<Box<Sleep>>,
    worker: Rc<Worker>,
}

impl H2Tunnel {
    pub(crate) fn new(upgrade: Upgrade, body: RequestBody, worker: Rc<Worker>) -> H2Tunnel {
        let now = clock();
        H2Tunnel {
            session: Session::start(upgrade, worker.clone()),
            body,
            input: BytesMut::new(),
            sleep: Box::pin(tokio::time::sleep_until(now.into())),
            worker,
        }
    }
}

impl BodyStream for H2Tunnel {
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        let this = self.get_mut();
        loop {
            let now = clock();
            let draining = this.worker.draining();
            this.session.turn(cx, now, draining);
            // One shared frame goes as it is; anything more is joined.
            let mut frames: Option<Bytes> = None;
            let mut joined = BytesMut::new();
            this.session.take_output(|piece| {
                let data: &[u8] = match &piece {
                    Piece::Shared(frame) if frames.is_none() && joined.is_empty() => {
                        frames = Some(frame.clone());
                        return;
                    }
                    Piece::Shared(frame) => frame,
                    Piece::Copy(out) => out,
                };
                if let Some(first) = frames.take() {
                    joined.extend_from_slice(&first);
                }
                joined.extend_from_slice(data);
            });
            if !joined.is_empty() {
                frames = Some(joined.freeze());
            }
            // Pulled: the stream has room, and what it holds is the HTTP/2 engine's to send.
            if this.session.set_queued(0, cx) && frames.is_none() {
                continue;
            }
            if let Some(frames) = frames {
                return Poll::Ready(Some(Ok(frames)));
            }
            if let Some(end) = this.session.finished(true) {
                this.session.end(&end, Some(&this.worker));
                // END_STREAM: the tunnel's end.
                return Poll::Ready(None);
            }
            if this.session.wants_input() {
                match this.body.poll_chunk(cx) {
                    Poll::Ready(Some(Ok(data))) => {
                        this.input.extend_from_slice(&data);
                        this.session.take_input(&mut this.input, now, cx);
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(peer = ?this.session.peer, error = %e, "WebSocket stream's input failed");
                        this.session.eof = true;
                        continue;
                    }
                    Poll::Ready(None) => {
                        this.session.eof = true;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            let Some(next) = this.session.next_deadline() else {
                break;
            };
            if next > now {
                this.sleep.as_mut().reset(next.into());
                if this.sleep.as_mut().poll(cx).is_pending() {
                    break;
                }
            }
            if let Some(end) = this.session.on_timer(clock().max(next)) {
                this.session.end(&end, Some(&this.worker));
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "WebSocket close or keepalive timed out",
                ))));
            }
        }
        this.session.park(cx);
        Poll::Pending
    }
}
