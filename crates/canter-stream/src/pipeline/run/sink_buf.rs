//! A sink's buffer on one worker: encoded results waiting for their socket or file, with the read times their latency is measured from.

use std::collections::VecDeque;
use std::io::{self};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use super::super::metrics::PipeMetrics;
use super::super::Encoder;
use crate::resend::Seq;

use super::wait::Waiter;
use super::{lock, now_ns};

/// The sink buffer's starting capacity.
pub(super) const SINK_CHUNK: usize = 64 * 1024;

/// A buffer that grew past this while the sink's peer lagged is given back once it empties.
pub(super) const SINK_KEEP: usize = 4 * SINK_CHUNK;

/// A sink's buffer on one worker: framed records waiting for the connection or file.
///
/// For a TCP sink the connected socket sits here too, so that the code producing records writes
/// them at the end of each read (see [`SinkBuf::flush`]) instead of waiting for the sink's task
/// to be scheduled after the rest of the worker's turn; the task writes only when the socket
/// had no room, and it owns reconnecting.
pub(crate) struct SinkBuf {
    pub(super) data: Vec<u8>,
    /// (read time, records) of what is in `data`, oldest first, for the latency histogram.
    pub(super) segs: VecDeque<(u64, u64)>,
    pub(super) high: usize,
    pub(super) low: usize,
    /// The TCP sink's socket while it is connected.
    pub(super) socket: Option<Rc<tokio::net::TcpStream>>,
    /// Bytes the socket has taken, for telling a peer that reads slowly from one that stopped.
    pub(super) written: u64,
    pub(super) driver: Option<Waiter>,
    /// When the worker began shutting down (the sink then has `drain_timeout` to deliver).
    pub(super) closing_since: Option<Instant>,
    pub(super) metrics: Arc<PipeMetrics>,
    pub(super) me: usize,
    /// Results carry a sequence header (the topology checkpoints).
    pub(super) sequenced: bool,
    /// Records are lines (a newline after each) instead of length-prefixed frames.
    pub(super) lines: bool,
    /// Frames written to the current connection and not yet acknowledged by the receiver
    /// (sequenced TCP sinks: sent again on the next connection).
    retained: Vec<u8>,
    /// The acknowledged prefix of `retained` (dropped once it is half the buffer: each byte is
    /// moved at most once on average, however often acknowledgements come).
    retained_at: usize,
    /// Whether this connection's frames are kept until acknowledged.
    retain: bool,
    /// Frames of this connection acknowledged so far, and whether any acknowledgement came.
    acked: u64,
    acks_seen: bool,
    /// A partly received acknowledgement.
    ack_part: [u8; 8],
    ack_have: usize,
}

impl SinkBuf {
    pub(super) fn new(high: usize, metrics: Arc<PipeMetrics>, me: usize) -> Self {
        SinkBuf {
            data: Vec::with_capacity(SINK_CHUNK),
            segs: VecDeque::new(),
            high,
            low: high / 4,
            socket: None,
            written: 0,
            driver: None,
            closing_since: None,
            metrics,
            me,
            sequenced: false,
            lines: false,
            retained: Vec::new(),
            retained_at: 0,
            retain: false,
            acked: 0,
            acks_seen: false,
            ack_part: [0; 8],
            ack_have: 0,
        }
    }

    /// A new connection: what the last one's receiver did not acknowledge goes first.
    pub(super) fn reconnected(&mut self) {
        if self.retained_len() > 0 {
            let mut data = self.retained.split_off(self.retained_at);
            data.extend_from_slice(&self.data);
            self.data = data;
        }
        self.retained.clear();
        self.retained_at = 0;
        self.retain = self.sequenced;
        self.acked = 0;
        self.acks_seen = false;
        self.ack_have = 0;
    }

    /// Bytes the receiver sent: acknowledgements (u64 big-endian, frames received on this
    /// connection); the frames they cover are forgotten.
    pub(super) fn on_read(&mut self, mut bytes: &[u8]) {
        if !self.retain {
            return;
        }
        while !bytes.is_empty() {
            let n = (8 - self.ack_have).min(bytes.len());
            self.ack_part[self.ack_have..self.ack_have + n].copy_from_slice(&bytes[..n]);
            self.ack_have += n;
            bytes = &bytes[n..];
            if self.ack_have < 8 {
                return;
            }
            self.ack_have = 0;
            self.acks_seen = true;
            let upto = u64::from_be_bytes(self.ack_part);
            let mut at = self.retained_at;
            while self.acked < upto && self.retained.len() - at >= 4 {
                let mut len = [0u8; 4];
                len.copy_from_slice(&self.retained[at..at + 4]);
                let end = at + 4 + u32::from_be_bytes(len) as usize;
                if end > self.retained.len() {
                    break;
                }
                at = end;
                self.acked += 1;
            }
            self.retained_at = at;
            if at == self.retained.len() {
                self.retained.clear();
                self.retained_at = 0;
            } else if at > self.retained.len() / 2 {
                self.retained.drain(..at);
                self.retained_at = 0;
            }
        }
    }

    /// Keeps what the socket took until the receiver acknowledges it; a receiver that has
    /// acknowledged nothing by the high-water mark does not acknowledge: keeping stops.
    fn keep_written(&mut self, n: usize) {
        if !self.retain {
            return;
        }
        self.retained.extend_from_slice(&self.data[..n]);
        if !self.acks_seen && self.retained.len() >= self.high {
            self.retain = false;
            self.retained = Vec::new();
            self.retained_at = 0;
            tracing::warn!(
                worker = self.me,
                "the sink's receiver does not acknowledge: results lost with a connection \
                 are not sent again (canter receive --dedupe acknowledges)"
            );
        }
    }

    /// Bytes written and not yet acknowledged.
    pub(super) fn retained_len(&self) -> usize {
        self.retained.len() - self.retained_at
    }

    /// The worker is shutting down: deliver what is held, then end.
    pub(super) fn closing(&self) -> bool {
        self.closing_since.is_some()
    }

    pub(super) fn full(&self) -> bool {
        self.data.len() + self.retained_len() >= self.high
    }

    /// Encodes `record` straight into the buffer, framed.
    #[inline]
    pub(super) fn push<O>(
        &mut self,
        encode: &Encoder<O>,
        record: &O,
        read_ns: u64,
        seq: Option<Seq>,
    ) {
        if self.lines {
            encode(record, &mut self.data);
            self.data.push(b'\n');
            mark(&mut self.segs, read_ns);
            return;
        }
        let start = self.data.len();
        self.data.extend_from_slice(&[0; 4]);
        if let Some(seq) = seq {
            seq.encode(&mut self.data);
        }
        encode(record, &mut self.data);
        let Ok(len) = u32::try_from(self.data.len() - start - 4) else {
            tracing::error!("a record of 4 GiB or more cannot be framed; dropped");
            self.data.truncate(start);
            return;
        };
        self.data[start..start + 4].copy_from_slice(&len.to_be_bytes());
        mark(&mut self.segs, read_ns);
    }

    /// Takes everything buffered, recording its latency as written now.
    pub(super) fn take(&mut self) -> Vec<u8> {
        record_latency(&self.metrics, self.me, self.segs.drain(..));
        std::mem::replace(&mut self.data, Vec::with_capacity(SINK_CHUNK))
    }

    /// Writes what is buffered to the socket, as much as it takes without waiting. A record's
    /// latency is taken when the buffer is written out to its end (a record finished by a
    /// partial write counts from the write that empties the buffer, so none counts early).
    pub(super) fn write_out(&mut self) -> io::Result<()> {
        let Some(socket) = self.socket.clone() else {
            return Ok(());
        };
        while !self.data.is_empty() {
            let taken = socket.try_write(&self.data);
            if let Ok(n) = taken {
                self.written += n as u64;
                self.keep_written(n);
            }
            match taken {
                Ok(n) if n == self.data.len() => {
                    record_latency(&self.metrics, self.me, self.segs.drain(..));
                    if self.data.capacity() > SINK_KEEP {
                        self.data = Vec::with_capacity(SINK_CHUNK);
                    } else {
                        self.data.clear();
                    }
                }
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.data.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Called where records were produced, at the end of each read: a connected TCP sink is
    /// written at once; otherwise, or when the socket is full or failed, or when this made room
    /// that sources may be waiting for, the sink's task is woken to carry on.
    pub(super) fn flush(&mut self) {
        if self.data.is_empty() {
            return;
        }
        if self.socket.is_none() {
            self.wake_driver();
            return;
        }
        let was_full = self.full();
        let ok = self.write_out().is_ok();
        if !ok || !self.data.is_empty() || was_full {
            self.wake_driver();
        }
    }

    pub(super) fn wake_driver(&self) {
        if let Some(d) = &self.driver {
            d.wake();
        }
    }
}

#[inline]
pub(super) fn mark(segs: &mut VecDeque<(u64, u64)>, read_ns: u64) {
    match segs.back_mut() {
        Some((ns, n)) if *ns == read_ns => *n += 1,
        _ => segs.push_back((read_ns, 1)),
    }
}

pub(super) fn record_latency(
    metrics: &PipeMetrics,
    me: usize,
    segs: impl Iterator<Item = (u64, u64)>,
) {
    let now = now_ns();
    let mut l = lock(&metrics.workers[me].latency);
    for (ns, n) in segs {
        // Records emitted when windows are flushed at the end have no read time.
        if ns != 0 {
            l.record(now, ns, n);
        }
    }
}
