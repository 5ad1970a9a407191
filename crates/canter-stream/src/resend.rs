//! The two small protocols that make a TCP pipeline lose nothing across crashes and dropped
//! connections, for any sender and receiver to speak.
//!
//! **Resending, on a source connection** (framed records, 4-byte big-endian lengths). A
//! sender that wants its records kept across a pipeline's restart opens the connection with a
//! *hello*: the length word `0xFFFFFFFF` (never a record's: records are shorter), then its
//! stream id (u64 big-endian, not 0, unique per sender of a pipeline's source). The pipeline
//! answers with 9-byte messages on the same connection:
//!
//! | kind | then | meaning |
//! |------|------|---------|
//! | 1 `RESUME` | position: u64 | send from this record on (records counted from 0 over the stream's whole life); the first message, once |
//! | 2 `ACK` | position: u64 | a durable checkpoint holds every record before this one: the sender may forget them |
//!
//! The sender keeps every record from the last acknowledged position on; when the connection
//! fails it connects again, says hello, and sends from the `RESUME` position it is given
//! (records before it that it still holds are dropped). A stream is on one connection at a
//! time: a hello for a stream whose previous connection is still open, or that arrives while
//! a checkpoint is being taken, is answered by closing the connection; the sender tries again
//! shortly. A connection without a hello is read as before, without positions (what it sent
//! since the last checkpoint is lost in a crash). A source keeps the positions of at most
//! 65,536 stream ids (for ever: they are in every checkpoint); a hello for one more is
//! refused.
//!
//! **Sequence numbers, on a sink connection or file** (when the topology checkpoints). Each
//! result's frame starts with a 24-byte header before the record: the stream id and the
//! position of the input record it came from (u64 each), the index of the result among those
//! that input record made (u32), and the worker that made it (u32). After a restart the
//! pipeline makes again the results of the input since its last checkpoint, with the same
//! numbers; per (worker, stream), positions and indexes only grow, so a receiver drops a result
//! at or below the last it kept ([`Dedupe`]). Stream 0 is input without positions: never a
//! repeat. A receiver that acknowledges (it writes, on the sink connection, the number of
//! frames it has received on that connection as a u64 big-endian, as often as it likes) gets
//! the frames the connection lost resent on the next one; the sink keeps unacknowledged frames
//! within its high-water mark.

use std::collections::HashMap;

/// The length word that starts a hello.
pub const HELLO: u32 = 0xFFFF_FFFF;
/// The hello's size: the length word and the stream id.
pub const HELLO_LEN: usize = 12;
/// The pipeline's answer: send from this position.
pub const RESUME: u8 = 1;
/// The pipeline's answer: records before this position are in a durable checkpoint.
pub const ACK: u8 = 2;
/// A pipeline message's size: kind and position.
pub const MESSAGE_LEN: usize = 9;
/// The sequence header's size.
pub const SEQ_LEN: usize = 24;

/// A hello for `stream`.
pub fn hello(stream: u64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(&HELLO.to_be_bytes());
    b[4..].copy_from_slice(&stream.to_be_bytes());
    b
}

/// The stream a hello names, if `b` starts with one (`Some(None)`: a hello, not complete yet).
pub fn parse_hello(b: &[u8]) -> Option<Option<u64>> {
    if b.len() < 4 || b[..4] != HELLO.to_be_bytes() {
        return None;
    }
    if b.len() < HELLO_LEN {
        return Some(None);
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[4..HELLO_LEN]);
    Some(Some(u64::from_be_bytes(id)))
}

/// A pipeline message.
pub fn message(kind: u8, position: u64) -> [u8; MESSAGE_LEN] {
    let mut b = [0u8; MESSAGE_LEN];
    b[0] = kind;
    b[1..].copy_from_slice(&position.to_be_bytes());
    b
}

/// Reads a pipeline message: (kind, position).
pub fn parse_message(b: &[u8; MESSAGE_LEN]) -> (u8, u64) {
    let mut p = [0u8; 8];
    p.copy_from_slice(&b[1..]);
    (b[0], u64::from_be_bytes(p))
}

/// A result's sequence header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq {
    /// The input stream (0: input without positions).
    pub stream: u64,
    /// The input record's position in its stream.
    pub position: u64,
    /// The result's index among those its input record made.
    pub index: u32,
    /// The worker that made it.
    pub worker: u32,
}

impl Seq {
    /// Appends the header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
        out.extend_from_slice(&self.index.to_be_bytes());
        out.extend_from_slice(&self.worker.to_be_bytes());
    }

    /// Splits a sequenced record into its header and the record, if it is long enough.
    pub fn split(record: &[u8]) -> Option<(Seq, &[u8])> {
        if record.len() < SEQ_LEN {
            return None;
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&record[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let u32_at = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&record[at..at + 4]);
            u32::from_be_bytes(b)
        };
        Some((
            Seq {
                stream: u64_at(0),
                position: u64_at(8),
                index: u32_at(16),
                worker: u32_at(20),
            },
            &record[SEQ_LEN..],
        ))
    }
}

/// Drops repeated results: per (worker, stream), a result at or below the last one kept.
#[derive(Debug, Default)]
pub struct Dedupe {
    last: HashMap<(u32, u64), (u64, u32)>,
    /// Results dropped as repeats.
    pub repeats: u64,
}

impl Dedupe {
    /// Whether a result with this header is new (and now the last kept of its stream).
    pub fn keep(&mut self, seq: &Seq) -> bool {
        if seq.stream == 0 {
            return true;
        }
        let at = (seq.position, seq.index);
        match self.last.get_mut(&(seq.worker, seq.stream)) {
            Some(last) if *last >= at => {
                self.repeats += 1;
                false
            }
            Some(last) => {
                *last = at;
                true
            }
            None => {
                self.last.insert((seq.worker, seq.stream), at);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_and_messages_round_trip() {
        let h = hello(42);
        assert_eq!(parse_hello(&h), Some(Some(42)));
        assert_eq!(parse_hello(&h[..7]), Some(None));
        assert_eq!(parse_hello(&[0, 0, 0, 5, 1]), None);
        assert_eq!(parse_message(&message(ACK, 1 << 40)), (ACK, 1 << 40));
    }

    #[test]
    fn repeats_are_dropped_per_worker_and_stream() {
        let seq = |worker, stream, position, index| Seq {
            stream,
            position,
            index,
            worker,
        };
        let mut b = Vec::new();
        seq(3, 9, 77, 2).encode(&mut b);
        b.extend_from_slice(b"result");
        assert_eq!(Seq::split(&b), Some((seq(3, 9, 77, 2), &b"result"[..])));
        let mut d = Dedupe::default();
        for (s, keep) in [
            (seq(0, 1, 10, 0), true),
            (seq(0, 1, 10, 1), true),
            (seq(1, 1, 5, 0), true), // another worker's results interleave
            (seq(0, 1, 10, 0), false),
            (seq(0, 1, 9, 0), false),
            (seq(0, 2, 1, 0), true),
            (seq(0, 1, 11, 0), true),
            (seq(0, 0, 0, 0), true), // no positions: never a repeat
            (seq(0, 0, 0, 0), true),
        ] {
            assert_eq!(d.keep(&s), keep, "{s:?}");
        }
        assert_eq!(d.repeats, 2);
    }
}
