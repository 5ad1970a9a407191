//! What a Kafka pipeline runs: a [`KeyedTask`], called once per input record with the state
//! of the record's task and an [`Out`] for its results.

use std::hash::Hash;

use canter_kafka::{partition_for, Error, Producer, TopicHandle};

use super::state::Keyed;

/// Why a record was refused (counted and skipped; the message is logged, rate-limited).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl<E: std::fmt::Display> From<E> for Refused {
    fn from(e: E) -> Refused {
        Refused(e.to_string())
    }
}

/// A keyed computation over co-partitioned input topics.
pub trait KeyedTask: Send + Sync + 'static {
    /// The key of the state.
    type Key: Hash + Eq + Clone + 'static;
    /// A key's state.
    type State: 'static;

    /// Processes one record of input `input` (its index in [`super::KafkaJob::inputs`]):
    /// reads and updates `state`, emits results to `out`.
    fn process(
        &self,
        input: usize,
        key: Option<&[u8]>,
        value: &[u8],
        state: &mut Keyed<Self::Key, Self::State>,
        out: &mut Out<'_>,
    ) -> Result<(), Refused>;

    /// A state key's bytes in the changelog.
    fn encode_key(&self, key: &Self::Key, buf: &mut Vec<u8>);
    /// A state key from the changelog (`None`: not one of ours, skipped).
    fn decode_key(&self, bytes: &[u8]) -> Option<Self::Key>;
    /// A state's bytes in the changelog.
    fn encode_state(&self, state: &Self::State, buf: &mut Vec<u8>);
    /// A state from the changelog (`None`: unreadable, skipped).
    fn decode_state(&self, bytes: &[u8]) -> Option<Self::State>;

    /// Whether the task has halted (an error policy that stops the pipeline at a failing
    /// record): the workers then process no further record, and the positions they commit
    /// end before the record that halted it, so that the next run starts there. Under
    /// exactly-once, the worker where it halted aborts its open transaction instead (the
    /// record may have changed its key's state and sent results before it failed): its tasks
    /// commit nothing since their last commit.
    fn halted(&self) -> bool {
        false
    }

    /// `key`'s wake-up came (the time [`Keyed::wake_at`] set for it, now cleared): runs the
    /// task's timers for it (Bytewax's `on_notify`, a state's expiry), with `out` for results
    /// (stamped with the present time). Called between records, in the task's commit.
    fn wake(&self, key: &Self::Key, state: &mut Keyed<Self::Key, Self::State>, out: &mut Out<'_>) {
        let _ = (key, state, out);
    }

    /// A bounded read ([`KafkaJob::bounded`](super::KafkaJob::bounded)) has read every input
    /// of the task to its end: emits what waits for the end (final aggregations, open
    /// windows) to `out` and drops what no longer has a use ([`Keyed::remove`]). Committed
    /// with the ends.
    fn end(&self, state: &mut Keyed<Self::Key, Self::State>, out: &mut Out<'_>) {
        let _ = (state, out);
    }

    /// The task's state was just read from the changelog: sets its keys' wake-ups again
    /// ([`Keyed::wake_at`]), which the changelog does not keep.
    fn restored(&self, state: &mut Keyed<Self::Key, Self::State>) {
        let _ = state;
    }
}

/// Where a task's results go: the output topic, each record to its key's partition (Kafka's
/// own partitioner), stamped with the input record's timestamp.
pub struct Out<'a> {
    pub(super) producer: &'a mut Producer,
    pub(super) topic: TopicHandle,
    pub(super) partitions: i32,
    pub(super) timestamp: i64,
    pub(super) read_ns: u64,
    pub(super) emitted: u64,
    pub(super) refused: Option<Error>,
    pub(super) scratch: &'a mut Vec<u8>,
}

impl Out<'_> {
    /// Sends a result keyed by `key`. A record over the producer's maximum size is refused:
    /// counted, and reported by the worker.
    #[inline]
    pub fn emit(&mut self, key: &[u8], value: &[u8]) {
        let p = partition_for(key, self.partitions);
        match self
            .producer
            .send(self.topic, p, Some(key), value, self.timestamp)
        {
            Ok(()) => self.emitted += 1,
            Err(e) => self.refused = Some(e),
        }
    }

    /// Sends a result keyed by `key` whose value `write` appends to an empty buffer (reused
    /// from one result to the next: no allocation per result).
    #[inline]
    pub fn emit_with(&mut self, key: &[u8], write: impl FnOnce(&mut Vec<u8>)) {
        let mut buf = std::mem::take(self.scratch);
        buf.clear();
        write(&mut buf);
        self.emit(key, &buf);
        *self.scratch = buf;
    }

    /// The input record's timestamp (ms since the Unix epoch).
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// When the input record's fetch arrived, ns since the Unix epoch.
    pub fn read_time_ns(&self) -> u64 {
        self.read_ns
    }

    /// Results made without an input record (wake-ups, a bounded read's end) are stamped with
    /// `now` (ns since the Unix epoch).
    pub(super) fn stamp(&mut self, now: u64) {
        self.timestamp = i64::try_from(now / 1_000_000).unwrap_or(i64::MAX);
        self.read_ns = now;
    }
}
