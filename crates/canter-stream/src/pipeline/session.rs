//! Event-time session windows: a key's items close together in time (no gap longer than the
//! window's) make one session.

use std::sync::Arc;
use std::time::Duration;

use super::codecs::{put_u64, Checkpointable, Codecs};
use super::state::{Aggregate, Emit, KeyedState, Span, Stateful};

/// One key's open session.
pub struct Session<K, A> {
    key: K,
    acc: Option<A>,
    /// The earliest and the latest item time in the session (ns).
    first: u64,
    last: u64,
}

/// An event-time session window (Bytewax's `SessionWindower`): a key's items whose times are
/// no more than `gap` apart make one session. An item that comes more than `gap` after the
/// session's latest closes it and opens the next; one within `gap` before its earliest
/// extends it backwards; one older than that belongs to a session already closed and is late
/// (counted and dropped). The last session of a key closes when the input ends. The output's
/// [`Span`] runs from the session's first item time to one past its last.
pub struct SessionWindow<K, T, A, O> {
    state: KeyedState<K, Session<K, A>>,
    gap: u64,
    time: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    agg: Aggregate<K, T, A, O>,
    late: u64,
}

impl<K, T, A, O> Clone for SessionWindow<K, T, A, O> {
    fn clone(&self) -> Self {
        SessionWindow {
            state: self.state.clone(),
            gap: self.gap,
            time: self.time.clone(),
            agg: self.agg.clone(),
            late: 0,
        }
    }
}

impl<K: Clone + Send + Sync + 'static, T, A: 'static, O> SessionWindow<K, T, A, O> {
    pub(crate) fn new(
        name: &str,
        gap: Duration,
        time: impl Fn(&T) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, T, A, O>,
    ) -> Self {
        SessionWindow {
            state: KeyedState::new(name, |k: &K| Session {
                key: k.clone(),
                acc: None,
                first: 0,
                last: 0,
            }),
            gap: u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX),
            time: Arc::new(time),
            agg,
            late: 0,
        }
    }

    fn close(&self, s: &mut Session<K, A>, emit: &mut Emit<'_, O>) {
        if let Some(acc) = s.acc.take() {
            let span = Span {
                start: s.first,
                end: s.last.saturating_add(1),
            };
            emit.emit((self.agg.output)(&s.key, acc, span));
        }
    }
}

impl<K: 'static, T, A: 'static, O> Checkpointable<K> for SessionWindow<K, T, A, O> {
    type Value = A;
    /// The key, the open session's first and last times, and its value (if any).
    fn with_codecs(mut self, codecs: Codecs<K, A>) -> Self {
        self.state = self.state.with_codecs(
            codecs,
            |c, s: &Session<K, A>, b| {
                c.put_key(&s.key, b);
                put_u64(b, s.first);
                put_u64(b, s.last);
                c.put_option(&s.acc, b);
            },
            |c, b| {
                Some(Session {
                    key: c.take_key(b)?,
                    first: b.u64().ok()?,
                    last: b.u64().ok()?,
                    acc: c.take_option(b)?,
                })
            },
        );
        self
    }
}

impl<K, T, A, O> Stateful<K, T> for SessionWindow<K, T, A, O>
where
    K: Clone + Send + Sync + 'static,
    T: 'static,
    A: Send + 'static,
    O: Send + 'static,
{
    type State = Session<K, A>;
    type Out = O;
    fn state(&self) -> KeyedState<K, Session<K, A>> {
        self.state.clone()
    }
    fn update(&mut self, s: &mut Session<K, A>, item: T, emit: &mut Emit<'_, O>) {
        let t = (self.time)(&item);
        if s.acc.is_some() {
            if t > s.last.saturating_add(self.gap) {
                self.close(s, emit);
            } else if t.saturating_add(self.gap) < s.first {
                self.late += 1;
                return;
            }
        }
        if s.acc.is_none() {
            (s.first, s.last) = (t, t);
        }
        s.first = s.first.min(t);
        s.last = s.last.max(t);
        let acc = s.acc.get_or_insert_with(|| (self.agg.init)());
        (self.agg.update)(acc, item);
    }
    fn finish(&mut self, _: &K, s: &mut Session<K, A>, emit: &mut Emit<'_, O>) {
        self.close(s, emit);
        emit.discard();
    }
    fn late(&self) -> u64 {
        self.late
    }
}
