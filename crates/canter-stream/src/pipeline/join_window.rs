//! A join by key within event-time windows (Bytewax's `join_window`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::codecs::{put_opt_u64, put_u32, put_u64, take_opt_u64};
use super::codecs::{Checkpointable, Codecs};
use super::state::{join_rows, Emit, KeyedState, Span, Stateful};

/// One key's open windows: by start, each side's records; and the key's latest time.
pub struct JoinWindows<K, V> {
    key: K,
    open: BTreeMap<u64, Vec<Vec<V>>>,
    latest: Option<u64>,
}

/// A join of several sides by key within tumbling windows of event time (Bytewax's
/// `join_window`): its items are `(key, side, record)` as for [`Join`](super::Join), and when a
/// window closes it emits `(key, span, row)`: with `product` false, one row of each side's
/// latest record in the window (None for a side with none); with `product` true, a row for
/// every combination of the sides' records. A window closes once the key's clock (its latest
/// item time less `wait`) has passed its end, or when the input ends: records of several
/// streams come out of order between them, and `wait` is how far. An item whose window has
/// closed is late (counted and dropped).
pub struct JoinWindow<K, V> {
    state: KeyedState<K, JoinWindows<K, V>>,
    sides: usize,
    size: u64,
    wait: u64,
    product: bool,
    time: Arc<dyn Fn(&V) -> u64 + Send + Sync>,
    late: u64,
}

impl<K, V> Clone for JoinWindow<K, V> {
    fn clone(&self) -> Self {
        JoinWindow {
            state: self.state.clone(),
            sides: self.sides,
            size: self.size,
            wait: self.wait,
            product: self.product,
            time: self.time.clone(),
            late: 0,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<K: Clone + Send + Sync + 'static, V: 'static> JoinWindow<K, V> {
    pub(crate) fn new(
        name: &str,
        sides: usize,
        size: Duration,
        wait: Duration,
        product: bool,
        time: impl Fn(&V) -> u64 + Send + Sync + 'static,
    ) -> Self {
        JoinWindow {
            state: KeyedState::new(name, |k: &K| JoinWindows {
                key: k.clone(),
                open: BTreeMap::new(),
                latest: None,
            }),
            sides,
            size: nanos(size).max(1),
            wait: nanos(wait),
            product,
            time: Arc::new(time),
            late: 0,
        }
    }
}

impl<K: 'static, V: 'static> Checkpointable<K> for JoinWindow<K, V> {
    type Value = V;
    /// The key, its latest time, then each open window's start and its sides' records.
    fn with_codecs(mut self, codecs: Codecs<K, V>) -> Self {
        self.state = self.state.with_codecs(
            codecs,
            |c, w: &JoinWindows<K, V>, b| {
                c.put_key(&w.key, b);
                put_opt_u64(b, w.latest);
                put_u32(b, w.open.len());
                for (start, sides) in &w.open {
                    put_u64(b, *start);
                    c.put_sides(sides, b);
                }
            },
            |c, b| {
                let (key, latest) = (c.take_key(b)?, take_opt_u64(b)?);
                let mut open = BTreeMap::new();
                for _ in 0..b.u32().ok()? {
                    open.insert(b.u64().ok()?, c.take_sides(b)?);
                }
                Some(JoinWindows { key, open, latest })
            },
        );
        self
    }
}

impl<K: Clone, V: Clone> JoinWindow<K, V> {
    fn close(
        &self,
        key: &K,
        start: u64,
        sides: &[Vec<V>],
        emit: &mut Emit<'_, (K, Span, Vec<Option<V>>)>,
    ) {
        let span = Span {
            start,
            end: start.saturating_add(self.size),
        };
        join_rows(sides, |row| emit.emit((key.clone(), span, row)));
    }
}

impl<K, V> Stateful<K, (K, usize, V)> for JoinWindow<K, V>
where
    K: Clone + Send + Sync + 'static,
    V: Clone + Send + 'static,
{
    type State = JoinWindows<K, V>;
    type Out = (K, Span, Vec<Option<V>>);
    fn state(&self) -> KeyedState<K, JoinWindows<K, V>> {
        self.state.clone()
    }
    fn update(
        &mut self,
        w: &mut JoinWindows<K, V>,
        (_, side, v): (K, usize, V),
        emit: &mut Emit<'_, Self::Out>,
    ) {
        if side >= self.sides {
            return;
        }
        let t = (self.time)(&v);
        let latest = w.latest.map_or(t, |l| l.max(t));
        w.latest = Some(latest);
        let clock = latest.saturating_sub(self.wait);
        while let Some(entry) = w.open.first_entry() {
            if entry.key().saturating_add(self.size) > clock {
                break;
            }
            let (start, sides) = entry.remove_entry();
            self.close(&w.key, start, &sides, emit);
        }
        let start = t - t % self.size;
        if start.saturating_add(self.size) <= clock {
            self.late += 1;
            return;
        }
        let sides = w
            .open
            .entry(start)
            .or_insert_with(|| vec![Vec::new(); self.sides]);
        if self.product {
            sides[side].push(v);
        } else {
            sides[side] = vec![v];
        }
    }
    fn finish(&mut self, _: &K, w: &mut JoinWindows<K, V>, emit: &mut Emit<'_, Self::Out>) {
        for (start, sides) in std::mem::take(&mut w.open) {
            self.close(&w.key, start, &sides, emit);
        }
        emit.discard();
    }
    fn late(&self) -> u64 {
        self.late
    }
}
