//! Event-time windows that may overlap (a new one every `slide`) and wait for items out of
//! order: Python's `time_window`, in Rust.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::codecs::{put_opt_u64, put_u32, put_u64, take_opt_u64};
use super::codecs::{Checkpointable, Codecs};
use super::state::{Aggregate, Emit, KeyedState, Span, Stateful};

/// One key's open windows, by start, and its latest item time.
pub struct TimeWindows<K, A> {
    key: K,
    open: BTreeMap<u64, A>,
    latest: Option<u64>,
}

/// Event-time windows of `size`, a new one every `slide` (tumbling when they are equal): an
/// item is aggregated into every window its time falls in. The key's clock (its watermark) is
/// its latest item time less `wait`: a window closes once the clock has reached its end, or
/// when the input ends, and an item whose time is behind the clock is late (counted and
/// dropped), even where a window holding it is still open: Bytewax's rule, so that the same
/// program on the same input gives the same windows. Built by
/// [`Keyed::time_window`](super::Keyed::time_window).
pub struct TimeWindow<K, T, A, O> {
    state: KeyedState<K, TimeWindows<K, A>>,
    size: u64,
    slide: u64,
    wait: u64,
    time: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    agg: Aggregate<K, T, A, O>,
    late: u64,
}

impl<K, T, A, O> Clone for TimeWindow<K, T, A, O> {
    fn clone(&self) -> Self {
        TimeWindow {
            state: self.state.clone(),
            size: self.size,
            slide: self.slide,
            wait: self.wait,
            time: self.time.clone(),
            agg: self.agg.clone(),
            late: 0,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<K: Clone + Send + Sync + 'static, T, A: 'static, O> TimeWindow<K, T, A, O> {
    /// Windows of `size` every `slide` (at least 1 ns, and at most `size`: a larger slide
    /// would skip items), waiting `wait` for items out of order.
    pub(crate) fn new(
        name: &str,
        size: Duration,
        slide: Duration,
        wait: Duration,
        time: impl Fn(&T) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, T, A, O>,
    ) -> Self {
        let size = nanos(size).max(1);
        TimeWindow {
            state: KeyedState::new(name, |k: &K| TimeWindows {
                key: k.clone(),
                open: BTreeMap::new(),
                latest: None,
            }),
            size,
            slide: nanos(slide).clamp(1, size),
            wait: nanos(wait),
            time: Arc::new(time),
            agg,
            late: 0,
        }
    }

    fn close(&self, key: &K, start: u64, acc: A, emit: &mut Emit<'_, O>) {
        let span = Span {
            start,
            end: start.saturating_add(self.size),
        };
        emit.emit((self.agg.output)(key, acc, span));
    }
}

impl<K: 'static, T, A: 'static, O> Checkpointable<K> for TimeWindow<K, T, A, O> {
    type Value = A;
    /// The key, its latest time, then each open window's start and value.
    fn with_codecs(mut self, codecs: Codecs<K, A>) -> Self {
        self.state = self.state.with_codecs(
            codecs,
            |c, w: &TimeWindows<K, A>, b| {
                c.put_key(&w.key, b);
                put_opt_u64(b, w.latest);
                put_u32(b, w.open.len());
                for (start, acc) in &w.open {
                    put_u64(b, *start);
                    c.put_value(acc, b);
                }
            },
            |c, b| {
                let (key, latest) = (c.take_key(b)?, take_opt_u64(b)?);
                let mut open = BTreeMap::new();
                for _ in 0..b.u32().ok()? {
                    open.insert(b.u64().ok()?, c.take_value(b)?);
                }
                Some(TimeWindows { key, open, latest })
            },
        );
        self
    }
}

impl<K, T, A, O> Stateful<K, T> for TimeWindow<K, T, A, O>
where
    K: Clone + Send + Sync + 'static,
    T: Clone + 'static,
    A: Send + 'static,
    O: Send + 'static,
{
    type State = TimeWindows<K, A>;
    type Out = O;
    fn state(&self) -> KeyedState<K, TimeWindows<K, A>> {
        self.state.clone()
    }
    fn update(&mut self, w: &mut TimeWindows<K, A>, item: T, emit: &mut Emit<'_, O>) {
        let t = (self.time)(&item);
        let latest = w.latest.map_or(t, |l| l.max(t));
        w.latest = Some(latest);
        let clock = latest.saturating_sub(self.wait);
        while let Some(entry) = w.open.first_entry() {
            if entry.key().saturating_add(self.size) > clock {
                break;
            }
            let (start, acc) = entry.remove_entry();
            self.close(&w.key, start, acc, emit);
        }
        if t < clock {
            // Behind the watermark: late, whichever windows are open.
            self.late += 1;
            return;
        }
        // The windows holding `t`, latest first: starts s = t - t % slide, s - slide, ...
        // while s + size > t (each still open: its end is past `t`, so past the clock).
        let mut starts = Vec::new();
        let mut s = t - t % self.slide;
        loop {
            if s.saturating_add(self.size) <= t {
                break;
            }
            starts.push(s);
            match s.checked_sub(self.slide) {
                Some(prev) => s = prev,
                None => break,
            }
        }
        let Some((last, rest)) = starts.split_last() else {
            self.late += 1;
            return;
        };
        for s in rest {
            let acc = w.open.entry(*s).or_insert_with(|| (self.agg.init)());
            (self.agg.update)(acc, item.clone());
        }
        let acc = w.open.entry(*last).or_insert_with(|| (self.agg.init)());
        (self.agg.update)(acc, item);
    }
    fn finish(&mut self, _: &K, w: &mut TimeWindows<K, A>, emit: &mut Emit<'_, O>) {
        for (start, acc) in std::mem::take(&mut w.open) {
            self.close(&w.key, start, acc, emit);
        }
        emit.discard();
    }
    fn late(&self) -> u64 {
        self.late
    }
}
