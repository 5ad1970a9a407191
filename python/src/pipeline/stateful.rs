//! Stateful Python steps: a function over each key's state object, and windows (count or
//! event time, tumbling or sliding) folded or reduced by Python functions.

use std::collections::BTreeMap;
use std::sync::Arc;

use canter_stream::pipeline::{Emit, KeyedState, Stateful};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::key::Key;
use super::steps::Failures;
use super::{py, Obj};

/// What a state function gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `f(state, record)` changes the state in place; what it returns (unless None) goes on.
    InPlace,
    /// `f(state, record)` reads the state (`with_state`); what it returns (unless None) goes
    /// on.
    Read,
    /// `f(state, record)` returns `(new_state, output)`; the output (unless None) goes on.
    Replace,
}

/// A Python function over each key's state, shared by every pipeline given the same state.
pub(crate) struct Update {
    pub(crate) state: KeyedState<Key, Obj>,
    /// Makes a key's state.
    pub(crate) factory: Arc<Obj>,
    /// The state of a key whose factory raised (made again for its next record).
    pub(crate) missing: Arc<Obj>,
    pub(crate) f: Arc<Obj>,
    pub(crate) mode: Mode,
    /// `on_eof(state)` for each key when this pipeline's input ends: what it returns, unless
    /// None, goes on.
    pub(crate) on_eof: Option<Arc<Obj>>,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
}

impl Clone for Update {
    fn clone(&self) -> Self {
        Update {
            state: self.state.clone(),
            factory: self.factory.clone(),
            missing: self.missing.clone(),
            f: self.f.clone(),
            mode: self.mode,
            on_eof: self.on_eof.clone(),
            name: self.name.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl Stateful<Key, (Key, Obj)> for Update {
    type State = Obj;
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, Obj> {
        self.state.clone()
    }
    // Always inlined into the engine's tail (the hot path), also now that `Decoded` calls it
    // too: as a call of its own it cost some 50 instructions a record more (callgrind).
    #[inline(always)]
    fn update(&mut self, state: &mut Obj, (key, item): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        let py = py();
        if (state.is(&*self.missing) || self.mode == Mode::InPlace && immutable(state.bind(py)))
            && !self.make_state(py, state, &key, &item)
        {
            return;
        }
        super::set_read_ns(emit.source_time_ns());
        let r = self.f.bind(py).call1((state.bind(py), item.bind(py)));
        super::set_read_ns(0);
        match r {
            Ok(out) => match self.mode {
                Mode::InPlace | Mode::Read => {
                    if !out.is_none() {
                        emit.emit(out.unbind());
                    }
                }
                Mode::Replace => match out.cast::<PyTuple>() {
                    Ok(t) if t.len() == 2 => {
                        if let (Ok(s), Ok(o)) = (t.get_item(0), t.get_item(1)) {
                            // None as the new state drops the key's (Bytewax's rule): its
                            // next record starts from the factory's.
                            if s.is_none() {
                                emit.discard();
                            } else {
                                *state = s.unbind();
                            }
                            if !o.is_none() {
                                emit.emit(o.unbind());
                            }
                        }
                    }
                    _ => self.failures.fail(
                        py,
                        &self.name,
                        &pyo3::exceptions::PyTypeError::new_err(
                            "a stateful_map function must return (state, output)",
                        ),
                        Some(&item),
                    ),
                },
            },
            Err(e) => self.failures.fail(py, &self.name, &e, Some(&item)),
        }
    }

    fn finish(&mut self, key: &Key, state: &mut Obj, emit: &mut Emit<'_, Obj>) {
        let Some(on_eof) = &self.on_eof else { return };
        let py = py();
        if state.is(&*self.missing) {
            return;
        }
        match on_eof.bind(py).call1((state.bind(py),)) {
            Ok(out) if out.is_none() => {}
            Ok(out) => emit.emit(out.unbind()),
            Err(e) => {
                let step = format!("{} (on_eof, key {})", self.name, key_repr(py, key));
                self.failures.fail(py, &step, &e, None)
            }
        }
    }
}

/// `repr(key)` for messages.
pub(crate) fn key_repr(py: Python<'_>, key: &Key) -> String {
    key.to_py(py)
        .bind(py)
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_default()
}

impl Update {
    /// A key's state when the factory raised before (made again now), or an immutable one
    /// `update` cannot change (refused). False: the record failed and is not processed.
    #[cold]
    fn make_state(&self, py: Python<'_>, state: &mut Obj, key: &Key, item: &Obj) -> bool {
        let key = key_repr(py, key);
        if state.is(&*self.missing) {
            // Made just now, and the factory raised: that error; made before: try again.
            let made = match FACTORY_ERROR.with(|e| e.borrow_mut().take()) {
                Some(e) => Err(e),
                None => self.factory.bind(py).call0(),
            };
            match made {
                Ok(s) => *state = s.unbind(),
                Err(e) => {
                    let step = format!("{} (the state factory, for key {key})", self.name);
                    self.failures.fail(py, &step, &e, Some(item));
                    return false;
                }
            }
        }
        if self.mode == Mode::InPlace && immutable(state.bind(py)) {
            let kind = state
                .bind(py)
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            let e = pyo3::exceptions::PyTypeError::new_err(format!(
                "update() changes a key's state in place, and the state of key {key} is an \
                 immutable {kind}: a change to it would be lost; give keyed_state a factory of \
                 a mutable value (a dict, a list), or use stateful_map, whose function returns \
                 (new_state, output)"
            ));
            self.failures.fail(py, &self.name, &e, Some(item));
            return false;
        }
        true
    }
}

thread_local! {
    /// The error of the state factory that just raised on this thread, for the record that
    /// needed the state.
    static FACTORY_ERROR: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
}

/// The state factory raised `e` making a key's state on this thread.
pub(crate) fn factory_failed(e: PyErr) {
    FACTORY_ERROR.with(|slot| *slot.borrow_mut() = Some(e));
}

/// Whether `v` is of a type whose values never change (an int, a float, a str, bytes, a tuple,
/// a frozenset, None, a bool): `update` could not change it.
#[inline(always)]
fn immutable(v: &Bound<'_, PyAny>) -> bool {
    use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PyString};
    // The usual states first: a comparison or two per record.
    if v.is_exact_instance_of::<PyDict>() || v.is_exact_instance_of::<PyList>() {
        return false;
    }
    v.is_none()
        || v.is_exact_instance_of::<PyInt>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyBytes>()
        || v.is_exact_instance_of::<PyTuple>()
        || v.is_exact_instance_of::<PyFrozenSet>()
        || v.is_exact_instance_of::<PyBool>()
}

/// Which items a window takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Span {
    /// Items of the key, counted: windows of `size` items every `slide`.
    Count { size: u64, slide: u64 },
    /// Event time in ns, from `time`: windows of `size` ns starting every `slide` ns, closed
    /// once the key's clock (its latest time less `wait` ns) has passed their end.
    Time { size: i64, slide: i64, wait: i64 },
}

/// How a window's value is made.
pub(crate) enum Agg {
    /// `acc = fold(acc, item)` from `init()`.
    Fold { init: Obj, fold: Obj },
    /// `acc = reduce(acc, item)` from the window's first item.
    Reduce(Obj),
}

impl Agg {
    /// From a spec's `init`, `fold` and `reduce` (`reduce` when it is given).
    pub(crate) fn from_spec(
        init: Bound<'_, PyAny>,
        fold: Bound<'_, PyAny>,
        reduce: Bound<'_, PyAny>,
    ) -> Agg {
        if reduce.is_none() {
            Agg::Fold {
                init: init.unbind(),
                fold: fold.unbind(),
            }
        } else {
            Agg::Reduce(reduce.unbind())
        }
    }

    /// The value after `item`, from `acc` (None: the window's first item).
    fn step(&self, py: Python<'_>, acc: Option<Obj>, item: &Obj) -> PyResult<Obj> {
        match (self, acc) {
            (Agg::Fold { init, fold }, a) => {
                let a = match a {
                    Some(a) => a,
                    None => init.bind(py).call0()?.unbind(),
                };
                Ok(fold.bind(py).call1((a, item.bind(py)))?.unbind())
            }
            (Agg::Reduce(_), None) => Ok(item.clone_ref(py)),
            (Agg::Reduce(f), Some(a)) => Ok(f.bind(py).call1((a, item.bind(py)))?.unbind()),
        }
    }
}

/// A key's open windows, by start.
pub(crate) struct Windows {
    key: Key,
    open: BTreeMap<i64, Option<Obj>>,
    /// Count windows: items seen. Time windows: the latest event time seen.
    at: i64,
    seen: bool,
}

/// Windows per key, each closed window emitted as `(key, start, end, value)` (count windows:
/// item positions; time windows: seconds).
pub(crate) struct Window {
    pub(crate) state: KeyedState<Key, Windows>,
    pub(crate) span: Span,
    pub(crate) time: Option<Arc<Obj>>,
    pub(crate) agg: Arc<Agg>,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
    pub(crate) late: u64,
    /// Makes the object a late record goes on as (`late=True`), instead of only counting it.
    pub(crate) late_out: Option<Arc<Obj>>,
    /// Count windows: a window still short at the end of the input is emitted (or dropped and
    /// counted in `dropped`).
    pub(crate) partial: bool,
    pub(crate) dropped: u64,
}

impl Clone for Window {
    fn clone(&self) -> Self {
        Window {
            state: self.state.clone(),
            span: self.span,
            time: self.time.clone(),
            agg: self.agg.clone(),
            name: self.name.clone(),
            failures: self.failures.clone(),
            late: 0,
            late_out: self.late_out.clone(),
            partial: self.partial,
            dropped: 0,
        }
    }
}

/// A late record goes on as `late_out(key, record)`, when the step was asked to.
fn send_late(
    py: Python<'_>,
    late_out: &Option<Arc<Obj>>,
    key: &Key,
    item: Obj,
    emit: &mut Emit<'_, Obj>,
) {
    if let Some(mark) = late_out {
        if let Ok(l) = mark.bind(py).call1((key.to_py(py), item)) {
            emit.emit(l.unbind());
        }
    }
}

impl Windows {
    /// A key's windows before its first record.
    pub(crate) fn new(key: &Key) -> Windows {
        Windows {
            key: key.clone(),
            open: BTreeMap::new(),
            at: 0,
            seen: false,
        }
    }
}

impl Window {
    pub(crate) fn new_state(name: &str) -> KeyedState<Key, Windows> {
        KeyedState::new(name, Windows::new)
    }

    /// Folds `item` into the window starting at `start`.
    fn fold(&self, py: Python<'_>, acc: &mut Option<Obj>, item: &Obj) -> PyResult<()> {
        *acc = Some(self.agg.step(py, acc.take(), item)?);
        Ok(())
    }

    fn emit(&self, py: Python<'_>, key: &Key, start: i64, acc: Obj, emit: &mut Emit<'_, Obj>) {
        let span = match self.span {
            Span::Count { size, .. } => (int(py, start), int(py, start + size as i64)),
            Span::Time { size, .. } => (secs(py, start), secs(py, start.saturating_add(size))),
        };
        self.emit_span(py, key, span, acc, emit)
    }

    /// `(key, start, end, value)`.
    fn emit_span(
        &self,
        py: Python<'_>,
        key: &Key,
        (s, e): (Obj, Obj),
        acc: Obj,
        emit: &mut Emit<'_, Obj>,
    ) {
        if let Ok(t) = PyTuple::new(py, [key.to_py(py), s, e, acc]) {
            emit.emit(t.into_any().unbind());
        }
    }
}

fn int(py: Python<'_>, v: i64) -> Obj {
    v.into_pyobject(py)
        .map(|v| v.into_any().unbind())
        .unwrap_or_else(|_| py.None())
}

fn secs(py: Python<'_>, ns: i64) -> Obj {
    pyo3::types::PyFloat::new(py, ns as f64 / 1e9)
        .into_any()
        .unbind()
}

/// Event time in ns from what the time function gave: seconds (int or float).
fn time_ns(v: &Bound<'_, PyAny>) -> PyResult<i64> {
    if let Ok(i) = v.extract::<i64>() {
        return i
            .checked_mul(1_000_000_000)
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("time out of range"));
    }
    let f: f64 = v.extract()?;
    if !f.is_finite() || f.abs() > 9.2e9 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "time out of range (seconds since the epoch expected)",
        ));
    }
    Ok((f * 1e9).round() as i64)
}

impl Stateful<Key, (Key, Obj)> for Window {
    type State = Windows;
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, Windows> {
        self.state.clone()
    }

    fn update(&mut self, w: &mut Windows, (_, item): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        let py = py();
        match self.span {
            Span::Count { size, slide } => {
                let i = w.at;
                w.at += 1;
                if (i as u64).is_multiple_of(slide) {
                    w.open.insert(i, None);
                }
                for acc in w.open.values_mut() {
                    if let Err(e) = self.fold(py, acc, &item) {
                        self.failures.fail(py, &self.name, &e, Some(&item));
                        return;
                    }
                }
                while let Some(entry) = w.open.first_entry() {
                    if *entry.key() + size as i64 > i + 1 {
                        break;
                    }
                    let (start, acc) = entry.remove_entry();
                    if let Some(acc) = acc {
                        self.emit(py, &w.key, start, acc, emit);
                    }
                }
            }
            Span::Time { size, slide, wait } => {
                let Some(time) = &self.time else { return };
                let t = match time
                    .bind(py)
                    .call1((item.bind(py),))
                    .and_then(|v| time_ns(&v))
                {
                    Ok(t) => t,
                    Err(e) => {
                        self.failures.fail(py, &self.name, &e, Some(&item));
                        return;
                    }
                };
                if !w.seen || t > w.at {
                    w.at = t;
                    w.seen = true;
                }
                // Windows that ended at or before the key's clock (the latest time seen, less
                // the wait) close, in order.
                let clock = w.at.saturating_sub(wait);
                while let Some(entry) = w.open.first_entry() {
                    if entry.key().saturating_add(size) > clock {
                        break;
                    }
                    let (start, acc) = entry.remove_entry();
                    if let Some(acc) = acc {
                        self.emit(py, &w.key, start, acc, emit);
                    }
                }
                let mut start = t.div_euclid(slide) * slide;
                let mut taken = false;
                while start.saturating_add(size) > t {
                    if start.saturating_add(size) > clock {
                        let acc = w.open.entry(start).or_insert(None);
                        if let Err(e) = self.fold(py, acc, &item) {
                            self.failures.fail(py, &self.name, &e, Some(&item));
                            return;
                        }
                        taken = true;
                    }
                    // An event time near the bottom of the range has no earlier window.
                    match start.checked_sub(slide) {
                        Some(s) => start = s,
                        None => break,
                    }
                }
                if !taken {
                    self.late += 1;
                    send_late(py, &self.late_out, &w.key, item, emit);
                }
            }
        }
    }

    fn finish(&mut self, _: &Key, w: &mut Windows, emit: &mut Emit<'_, Obj>) {
        let py = py();
        for (start, acc) in std::mem::take(&mut w.open) {
            let Some(acc) = acc else { continue };
            match self.span {
                // A count window still short at the end: emitted, with the end it reached (or
                // dropped and counted, when only full ones are asked for).
                Span::Count { .. } if !self.partial => self.dropped += 1,
                Span::Count { .. } => {
                    let span = (int(py, start), int(py, w.at));
                    self.emit_span(py, &w.key, span, acc, emit)
                }
                Span::Time { .. } => self.emit(py, &w.key, start, acc, emit),
            }
        }
        emit.discard();
    }

    fn late(&self) -> u64 {
        self.late
    }

    fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A stateful step over records that crossed processes raw (a group whose key is read from the
/// records' bytes): each is decoded here, on the owner, then handed to `inner`.
pub(crate) struct Decoded<U> {
    pub(crate) inner: U,
    pub(crate) format: super::codec::Format,
    pub(crate) cache: super::codec::Interner,
    pub(crate) failures: Arc<Failures>,
}

impl<U: Clone> Clone for Decoded<U> {
    fn clone(&self) -> Self {
        Decoded {
            inner: self.inner.clone(),
            format: self.format.clone(),
            cache: self.cache.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl<U: Stateful<Key, (Key, Obj)>> Stateful<Key, (Key, super::wire::Raw)> for Decoded<U> {
    type State = U::State;
    type Out = U::Out;
    fn state(&self) -> KeyedState<Key, U::State> {
        self.inner.state()
    }
    #[inline]
    fn update(
        &mut self,
        state: &mut U::State,
        (key, raw): (Key, super::wire::Raw),
        emit: &mut Emit<'_, U::Out>,
    ) {
        let py = py();
        match self.format.unpack(py, &raw.0, Some(&mut self.cache)) {
            Ok(item) => self.inner.update(state, (key, item.unbind()), emit),
            Err(e) => self.failures.fail(py, "decode", &e, None),
        }
    }
    fn finish(&mut self, key: &Key, state: &mut U::State, emit: &mut Emit<'_, U::Out>) {
        self.inner.finish(key, state, emit)
    }
    fn late(&self) -> u64 {
        self.inner.late()
    }
    fn dropped(&self) -> u64 {
        self.inner.dropped()
    }
}

/// No state: each record goes on as it came (`key_by` straight to the sink: routed by key).
#[derive(Clone)]
pub(crate) struct Pass {
    state: KeyedState<Key, ()>,
}

impl Pass {
    pub(crate) fn new(name: &str) -> Pass {
        // Its codec writes nothing but the key (checkpoints need one for every state).
        Pass {
            state: KeyedState::new(name, |_: &Key| ()).checkpointed(
                |k: &Key, b: &mut Vec<u8>| k.tagged_bytes(b),
                |b: &[u8]| Key::from_tagged(b),
                |_, _| {},
                |_| Some(()),
            ),
        }
    }
}

impl Stateful<Key, (Key, Obj)> for Pass {
    type State = ();
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, ()> {
        self.state.clone()
    }
    #[inline]
    fn update(&mut self, _: &mut (), (_, item): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        emit.emit(item)
    }
}

/// What a final aggregation keeps per key.
pub(crate) enum FinalAgg {
    /// How many records.
    Count,
    /// `acc = fold(acc, record)` from `init()`.
    Fold { init: Obj, fold: Obj },
    /// `acc = reduce(acc, record)` from the key's first record.
    Reduce(Obj),
    /// The record with the largest `by(record)` (the record itself without `by`); the first of
    /// equals.
    Max(Option<Obj>),
    /// The record with the smallest `by(record)`; the first of equals.
    Min(Option<Obj>),
}

/// A key's final aggregation so far: the count, or the value.
pub(crate) struct Acc {
    pub(crate) n: u64,
    pub(crate) value: Option<Obj>,
}

/// A final aggregation (`count_final`, `fold_final`, `reduce_final`, `max_final`,
/// `min_final`): `(key, value)` for each key when the input ends, then the key's state is
/// dropped.
pub(crate) struct Final {
    pub(crate) state: KeyedState<Key, Acc>,
    pub(crate) agg: Arc<FinalAgg>,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
}

impl Clone for Final {
    fn clone(&self) -> Self {
        Final {
            state: self.state.clone(),
            agg: self.agg.clone(),
            name: self.name.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl Final {
    pub(crate) fn new_state(name: &str) -> KeyedState<Key, Acc> {
        KeyedState::new(name, |_: &Key| Acc { n: 0, value: None })
    }

    /// The key's value after `item`; None for "keep the one it has" (max and min).
    fn next(&self, py: Python<'_>, acc: &Option<Obj>, item: &Obj) -> PyResult<Option<Obj>> {
        let better = |by: &Option<Obj>, op: pyo3::basic::CompareOp| -> PyResult<Option<Obj>> {
            let Some(a) = acc else {
                return Ok(Some(item.clone_ref(py)));
            };
            let (x, y) = match by {
                Some(f) => (
                    f.bind(py).call1((item.bind(py),))?,
                    f.bind(py).call1((a.bind(py),))?,
                ),
                None => (item.bind(py).clone(), a.bind(py).clone()),
            };
            Ok(x.rich_compare(y, op)?
                .is_truthy()?
                .then(|| item.clone_ref(py)))
        };
        Ok(match &*self.agg {
            FinalAgg::Count => None,
            FinalAgg::Fold { init, fold } => {
                let a = match acc {
                    Some(a) => a.clone_ref(py),
                    None => init.bind(py).call0()?.unbind(),
                };
                Some(fold.bind(py).call1((a, item.bind(py)))?.unbind())
            }
            FinalAgg::Reduce(f) => Some(match acc {
                Some(a) => f.bind(py).call1((a.bind(py), item.bind(py)))?.unbind(),
                None => item.clone_ref(py),
            }),
            FinalAgg::Max(by) => better(by, pyo3::basic::CompareOp::Gt)?,
            FinalAgg::Min(by) => better(by, pyo3::basic::CompareOp::Lt)?,
        })
    }
}

impl Stateful<Key, (Key, Obj)> for Final {
    type State = Acc;
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, Acc> {
        self.state.clone()
    }

    #[inline]
    fn update(&mut self, acc: &mut Acc, (_, item): (Key, Obj), _: &mut Emit<'_, Obj>) {
        if let FinalAgg::Count = *self.agg {
            acc.n += 1;
            return;
        }
        let py = py();
        // A function that raises fails the record; the key's value stays as it was.
        match self.next(py, &acc.value, &item) {
            Ok(Some(v)) => acc.value = Some(v),
            Ok(None) => {}
            Err(e) => self.failures.fail(py, &self.name, &e, Some(&item)),
        }
    }

    fn finish(&mut self, key: &Key, acc: &mut Acc, emit: &mut Emit<'_, Obj>) {
        let py = py();
        let value = match *self.agg {
            FinalAgg::Count => Some(int(py, acc.n as i64)),
            _ => acc.value.take(),
        };
        if let Some(v) = value {
            if let Ok(t) = PyTuple::new(py, [key.to_py(py), v]) {
                emit.emit(t.into_any().unbind());
            }
        }
        emit.discard();
    }
}

/// A join's side: `(key, side, record)` goes on, for the join's pipeline (which keys it again
/// by the same key, so it stays on this worker).
#[derive(Clone)]
pub(crate) struct Tag {
    pub(crate) state: KeyedState<Key, ()>,
    pub(crate) side: usize,
}

impl Stateful<Key, (Key, Obj)> for Tag {
    type State = ();
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, ()> {
        self.state.clone()
    }
    #[inline]
    fn update(&mut self, _: &mut (), (key, item): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        let py = py();
        if let Ok(t) = PyTuple::new(py, [key.to_py(py), int(py, self.side as i64), item]) {
            emit.emit(t.into_any().unbind());
        }
    }
}

/// How a join keeps a side's records (Bytewax's `insert_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Insert {
    /// The side's first record.
    First,
    /// The side's latest record.
    Last,
    /// Every record of the side (the output is every combination).
    Product,
}

/// When a join emits (Bytewax's `emit_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinEmit {
    /// Once every side has a record; then the key's state is dropped.
    Complete,
    /// When the input ends, whatever the sides hold (None for a side without a record).
    Final,
    /// On every record, with None for the sides without one yet; the state is kept.
    Running,
}

/// A key's records, per side.
pub(crate) struct Sides(pub(crate) Vec<Vec<Obj>>);

impl Sides {
    /// `n` sides without a record.
    pub(crate) fn empty(n: usize) -> Sides {
        Sides((0..n).map(|_| Vec::new()).collect())
    }

    /// The sides' records as lists (what a checkpoint or a changelog pickles).
    pub(crate) fn lists(&self, py: Python<'_>) -> Vec<Vec<Obj>> {
        self.0
            .iter()
            .map(|v| v.iter().map(|o| o.clone_ref(py)).collect())
            .collect()
    }
}

/// A join of `sides` keyed streams: its input is the sides' `(key, side, record)` (see
/// [`Tag`]); it emits `(key, (record of side 0, record of side 1, ...))`.
pub(crate) struct Join {
    pub(crate) state: KeyedState<Key, Sides>,
    /// How many streams it joins.
    pub(crate) sides: usize,
    pub(crate) insert: Insert,
    pub(crate) when: JoinEmit,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
}

impl Clone for Join {
    fn clone(&self) -> Self {
        Join {
            state: self.state.clone(),
            sides: self.sides,
            insert: self.insert,
            when: self.when,
            name: self.name.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl Join {
    pub(crate) fn new_state(name: &str, sides: usize) -> KeyedState<Key, Sides> {
        KeyedState::new(name, move |_: &Key| Sides::empty(sides))
    }

    /// `(key, row)` for every combination of the sides' records (None for an empty side).
    fn rows(&self, py: Python<'_>, key: &Obj, sides: &Sides, emit: &mut Emit<'_, Obj>) {
        let none = [py.None()];
        let lists: Vec<&[Obj]> = sides
            .0
            .iter()
            .map(|v| if v.is_empty() { &none[..] } else { &v[..] })
            .collect();
        let mut at = vec![0usize; lists.len()];
        loop {
            let row = at.iter().zip(&lists).map(|(i, l)| l[*i].clone_ref(py));
            if let Ok(row) = PyTuple::new(py, row) {
                if let Ok(t) = PyTuple::new(py, [key.clone_ref(py), row.into_any().unbind()]) {
                    emit.emit(t.into_any().unbind());
                }
            }
            // The next combination, the last side fastest.
            let mut i = lists.len();
            loop {
                if i == 0 {
                    return;
                }
                i -= 1;
                at[i] += 1;
                if at[i] < lists[i].len() {
                    break;
                }
                at[i] = 0;
            }
        }
    }
}

impl Stateful<Key, (Key, Obj)> for Join {
    type State = Sides;
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, Sides> {
        self.state.clone()
    }

    fn update(&mut self, sides: &mut Sides, (_, tagged): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        let py = py();
        let parts = tagged.bind(py).extract::<(Obj, usize, Obj)>();
        let (key, side, item) = match parts {
            Ok(p) => p,
            Err(e) => return self.failures.fail(py, &self.name, &e, Some(&tagged)),
        };
        let Some(slot) = sides.0.get_mut(side) else {
            return;
        };
        match self.insert {
            Insert::First if !slot.is_empty() => {}
            Insert::First | Insert::Product => slot.push(item),
            Insert::Last => *slot = vec![item],
        }
        match self.when {
            JoinEmit::Complete if sides.0.iter().all(|v| !v.is_empty()) => {
                self.rows(py, &key, sides, emit);
                emit.discard();
            }
            JoinEmit::Running => self.rows(py, &key, sides, emit),
            _ => {}
        }
    }

    fn finish(&mut self, key: &Key, sides: &mut Sides, emit: &mut Emit<'_, Obj>) {
        if self.when == JoinEmit::Final && sides.0.iter().any(|v| !v.is_empty()) {
            let py = py();
            self.rows(py, &key.to_py(py), sides, emit);
        }
        emit.discard();
    }
}

/// A key's sessions: start → (end, value), ends being the times of their last records.
pub(crate) struct Sessions {
    key: Key,
    open: BTreeMap<i64, (i64, Option<Obj>)>,
    /// The latest event time of the key.
    at: i64,
    seen: bool,
}

impl Sessions {
    /// A key's sessions before its first record.
    pub(crate) fn new(key: &Key) -> Sessions {
        Sessions {
            key: key.clone(),
            open: BTreeMap::new(),
            at: 0,
            seen: false,
        }
    }
}

/// Session windows (Bytewax's `SessionWindower`): a key's records less than `gap` apart (or
/// exactly) are one session; a session closes once the key's clock (its latest time less
/// `wait`) is more than `gap` past its last record (or the input ends), and is emitted as
/// `(key, start, end, value)`,
/// start and end being the times of its first and last record. A record that bridges two
/// sessions merges them (`merge(a, b)` of their values; `reduce` merges with itself). A record
/// that can neither join an open session nor open one that is not closed already is late.
pub(crate) struct SessionWindow {
    pub(crate) state: KeyedState<Key, Sessions>,
    pub(crate) gap: i64,
    /// How far behind the key's latest time its clock runs (Bytewax's
    /// `wait_for_system_duration`): sessions close, and records are late, by that clock.
    pub(crate) wait: i64,
    pub(crate) time: Arc<Obj>,
    pub(crate) agg: Arc<Agg>,
    pub(crate) merge: Option<Arc<Obj>>,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
    pub(crate) late: u64,
    pub(crate) late_out: Option<Arc<Obj>>,
}

impl Clone for SessionWindow {
    fn clone(&self) -> Self {
        SessionWindow {
            state: self.state.clone(),
            gap: self.gap,
            wait: self.wait,
            time: self.time.clone(),
            agg: self.agg.clone(),
            merge: self.merge.clone(),
            name: self.name.clone(),
            failures: self.failures.clone(),
            late: 0,
            late_out: self.late_out.clone(),
        }
    }
}

impl SessionWindow {
    pub(crate) fn new_state(name: &str) -> KeyedState<Key, Sessions> {
        KeyedState::new(name, Sessions::new)
    }

    /// The value of two merged sessions, the earlier one's first.
    fn merged(&self, py: Python<'_>, a: Option<Obj>, b: Option<Obj>) -> PyResult<Option<Obj>> {
        Ok(match (a, b) {
            (None, x) | (x, None) => x,
            (Some(a), Some(b)) => {
                let f = match (&self.merge, &*self.agg) {
                    (Some(m), _) => m.bind(py).clone(),
                    (None, Agg::Reduce(r)) => r.bind(py).clone(),
                    (None, Agg::Fold { .. }) => {
                        return Err(pyo3::exceptions::PyValueError::new_err(
                            "a record joined two sessions, and session_window() has no merge= \
                             to combine their folded values",
                        ))
                    }
                };
                Some(f.call1((a, b))?.unbind())
            }
        })
    }

    fn emit(
        &self,
        py: Python<'_>,
        key: &Key,
        start: i64,
        end: i64,
        acc: Obj,
        emit: &mut Emit<'_, Obj>,
    ) {
        if let Ok(t) = PyTuple::new(py, [key.to_py(py), secs(py, start), secs(py, end), acc]) {
            emit.emit(t.into_any().unbind());
        }
    }
}

impl Stateful<Key, (Key, Obj)> for SessionWindow {
    type State = Sessions;
    type Out = Obj;
    fn state(&self) -> KeyedState<Key, Sessions> {
        self.state.clone()
    }

    fn update(&mut self, w: &mut Sessions, (_, item): (Key, Obj), emit: &mut Emit<'_, Obj>) {
        let py = py();
        let t = match self
            .time
            .bind(py)
            .call1((item.bind(py),))
            .and_then(|v| time_ns(&v))
        {
            Ok(t) => t,
            Err(e) => return self.failures.fail(py, &self.name, &e, Some(&item)),
        };
        if !w.seen || t > w.at {
            w.at = t;
            w.seen = true;
        }
        let gap = self.gap;
        let clock = w.at.saturating_sub(self.wait);
        // The open sessions this record touches (within gap of them, ends included).
        let touched: Vec<i64> = w
            .open
            .range(..=t.saturating_add(gap))
            .filter(|(_, (end, _))| end.saturating_add(gap) >= t)
            .map(|(s, _)| *s)
            .collect();
        if touched.is_empty() && t.saturating_add(gap) < clock {
            // A session of its own would be closed already: late.
            self.late += 1;
            send_late(py, &self.late_out, &w.key, item, emit);
        } else {
            let (mut start, mut end, mut acc) = (t, t, None);
            let mut failed = None;
            for s in touched {
                if let Some((e, a)) = w.open.remove(&s) {
                    start = start.min(s);
                    end = end.max(e);
                    match self.merged(py, acc.take(), a) {
                        Ok(v) => acc = v,
                        Err(e) => failed = Some(e),
                    }
                }
            }
            match failed {
                Some(e) => self.failures.fail(py, &self.name, &e, Some(&item)),
                None => match self
                    .agg
                    .step(py, acc.as_ref().map(|a| a.clone_ref(py)), &item)
                {
                    Ok(v) => acc = Some(v),
                    Err(e) => self.failures.fail(py, &self.name, &e, Some(&item)),
                },
            }
            // A merge that failed keeps the merged session without the record.
            w.open.insert(start, (end, acc));
        }
        // Sessions whose last record is more than gap behind the key's clock close, in order.
        let closed: Vec<i64> = w
            .open
            .iter()
            .filter(|(_, (end, _))| end.saturating_add(gap) < clock)
            .map(|(s, _)| *s)
            .collect();
        for s in closed {
            if let Some((e, Some(acc))) = w.open.remove(&s) {
                self.emit(py, &w.key, s, e, acc, emit);
            }
        }
    }

    fn finish(&mut self, _: &Key, w: &mut Sessions, emit: &mut Emit<'_, Obj>) {
        let py = py();
        for (s, (e, acc)) in std::mem::take(&mut w.open) {
            if let Some(acc) = acc {
                self.emit(py, &w.key, s, e, acc, emit);
            }
        }
        emit.discard();
    }

    fn late(&self) -> u64 {
        self.late
    }
}

/// Now, in ns since the Unix epoch (system time, as wake-ups are).
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A time a Python function gave (a `datetime`, or seconds since the epoch) in ns since the
/// epoch; None for None.
fn wake_ns(v: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    if v.is_none() {
        return Ok(None);
    }
    let secs: f64 = match v.extract::<f64>() {
        Ok(s) => s,
        Err(_) => v.call_method0("timestamp")?.extract()?,
    };
    if !secs.is_finite() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "notify_at() gave a time that is not finite",
        ));
    }
    Ok(Some((secs.max(0.0) * 1e9) as u64))
}

/// Bytewax's `StatefulLogic` per key: `builder(None)` makes a key's logic on its first record;
/// `on_item(record)`, `on_notify()` (when the time `notify_at()` gave comes) and `on_eof()`
/// each return `(outputs, discard)`: each output goes on as `(key, output)`, and `discard`
/// drops the key's logic.
pub(crate) struct Logic {
    pub(crate) state: KeyedState<Key, Option<Obj>>,
    pub(crate) builder: Arc<Obj>,
    pub(crate) name: Arc<str>,
    pub(crate) failures: Arc<Failures>,
}

impl Clone for Logic {
    fn clone(&self) -> Self {
        Logic {
            state: self.state.clone(),
            builder: self.builder.clone(),
            name: self.name.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl Logic {
    pub(crate) fn new_state(name: &str) -> KeyedState<Key, Option<Obj>> {
        KeyedState::new(name, |_: &Key| None)
    }

    /// Hands on what a logic method returned; whether it asked to discard.
    fn returned(
        &self,
        py: Python<'_>,
        key: &Key,
        what: &str,
        r: PyResult<Bound<'_, PyAny>>,
        record: Option<&Obj>,
        emit: &mut Emit<'_, Obj>,
    ) -> bool {
        let step = || format!("{} ({what}, key {})", self.name, key_repr(py, key));
        let r = r.and_then(|r| {
            let (outs, discard): (Bound<'_, PyAny>, bool) = r.extract().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "{what}() must return (outputs, discard): an iterable and a bool"
                ))
            })?;
            let k = key.to_py(py);
            for o in outs.try_iter()? {
                let t = PyTuple::new(py, [k.clone_ref(py), o?.unbind()])?;
                emit.emit(t.into_any().unbind());
            }
            Ok(discard)
        });
        match r {
            Ok(discard) => discard,
            Err(e) => {
                self.failures.fail(py, &step(), &e, record);
                false
            }
        }
    }
}

impl Stateful<Key, (Key, Obj)> for Logic {
    type State = Option<Obj>;
    type Out = Obj;
    const TIMERS: bool = true;

    fn state(&self) -> KeyedState<Key, Option<Obj>> {
        self.state.clone()
    }

    fn update(
        &mut self,
        logic: &mut Option<Obj>,
        (key, item): (Key, Obj),
        emit: &mut Emit<'_, Obj>,
    ) {
        let py = py();
        if logic.is_none() {
            match self.builder.bind(py).call1((py.None(),)) {
                Ok(l) => *logic = Some(l.unbind()),
                Err(e) => {
                    let step = format!("{} (the builder, key {})", self.name, key_repr(py, &key));
                    self.failures.fail(py, &step, &e, Some(&item));
                    emit.discard();
                    return;
                }
            }
        }
        let Some(l) = logic.as_ref() else { return };
        let r = l.bind(py).call_method1("on_item", (item.bind(py),));
        if self.returned(py, &key, "on_item", r, Some(&item), emit) {
            emit.discard();
        }
    }

    fn wake_at(&mut self, key: &Key, logic: &Option<Obj>) -> Option<u64> {
        let py = py();
        let l = logic.as_ref()?;
        match l
            .bind(py)
            .call_method0("notify_at")
            .and_then(|v| wake_ns(&v))
        {
            Ok(at) => at,
            Err(e) => {
                let step = format!("{} (notify_at, key {})", self.name, key_repr(py, key));
                self.failures.fail(py, &step, &e, None);
                None
            }
        }
    }

    fn notify(&mut self, key: &Key, logic: &mut Option<Obj>, _: u64, emit: &mut Emit<'_, Obj>) {
        let py = py();
        let Some(l) = logic.as_ref() else { return };
        let r = l.bind(py).call_method0("on_notify");
        if self.returned(py, key, "on_notify", r, None, emit) {
            emit.discard();
        }
    }

    fn finish(&mut self, key: &Key, logic: &mut Option<Obj>, emit: &mut Emit<'_, Obj>) {
        let py = py();
        if let Some(l) = logic.as_ref() {
            let r = l.bind(py).call_method0("on_eof");
            self.returned(py, key, "on_eof", r, None, emit);
        }
        emit.discard();
    }
}

/// A state that expires: a key with no record for `ttl` ns (system time) has its state
/// dropped (its next record starts from the factory's).
#[derive(Clone)]
pub(crate) struct Expiring<U> {
    pub(crate) inner: U,
    pub(crate) ttl: u64,
}

impl<U: Stateful<Key, (Key, Obj), State = Obj, Out = Obj>> Stateful<Key, (Key, Obj)>
    for Expiring<U>
{
    type State = Obj;
    type Out = Obj;
    const TIMERS: bool = true;
    fn state(&self) -> KeyedState<Key, Obj> {
        self.inner.state()
    }
    #[inline]
    fn update(&mut self, state: &mut Obj, item: (Key, Obj), emit: &mut Emit<'_, Obj>) {
        self.inner.update(state, item, emit)
    }
    fn finish(&mut self, key: &Key, state: &mut Obj, emit: &mut Emit<'_, Obj>) {
        self.inner.finish(key, state, emit)
    }
    fn wake_at(&mut self, _: &Key, _: &Obj) -> Option<u64> {
        Some(now_ns().saturating_add(self.ttl))
    }
    fn notify(&mut self, _: &Key, _: &mut Obj, _: u64, emit: &mut Emit<'_, Obj>) {
        emit.discard();
    }
}

/// `pickle.dumps` and `pickle.loads`, for the checkpoint codecs of the steps' own states.
pub(crate) struct Pickle {
    pub(crate) dumps: Obj,
    pub(crate) loads: Obj,
}

impl Pickle {
    pub(crate) fn new(py: Python<'_>) -> PyResult<Arc<Pickle>> {
        let m = py.import("pickle")?;
        Ok(Arc::new(Pickle {
            dumps: m.getattr("dumps")?.unbind(),
            loads: m.getattr("loads")?.unbind(),
        }))
    }

    fn dump(&self, py: Python<'_>, v: PyResult<Bound<'_, PyAny>>, b: &mut Vec<u8>) {
        let r = v
            .and_then(|v| self.dumps.bind(py).call1((v,)))
            .and_then(|d| {
                b.extend_from_slice(d.cast::<pyo3::types::PyBytes>()?.as_bytes());
                Ok(())
            });
        if let Err(e) = r {
            tracing::error!("a step's state cannot be pickled for a checkpoint: {e}");
        }
    }

    fn load<'py>(&self, py: Python<'py>, b: &[u8]) -> Option<Bound<'py, PyAny>> {
        self.loads
            .bind(py)
            .call1((pyo3::types::PyBytes::new(py, b),))
            .map_err(|e| tracing::error!("a checkpointed step state did not unpickle: {e}"))
            .ok()
    }
}

/// `state` in checkpoints: keys tagged, states pickled through `to_py` and back with
/// `from_py` (None: left out of the restore, and logged).
pub(crate) fn pickled_state<S: 'static>(
    state: KeyedState<Key, S>,
    pickle: &Arc<Pickle>,
    to_py: impl for<'py> Fn(Python<'py>, &S) -> PyResult<Bound<'py, PyAny>> + Send + Sync + 'static,
    from_py: impl Fn(&Bound<'_, PyAny>) -> PyResult<S> + Send + Sync + 'static,
) -> KeyedState<Key, S> {
    let (p1, p2) = (pickle.clone(), pickle.clone());
    state.checkpointed(
        |k: &Key, b: &mut Vec<u8>| k.tagged_bytes(b),
        |b: &[u8]| Key::from_tagged(b),
        move |s: &S, b: &mut Vec<u8>| {
            let py = py();
            p1.dump(py, to_py(py, s), b)
        },
        move |b: &[u8]| {
            let py = py();
            let v = p2.load(py, b)?;
            from_py(&v)
                .map_err(|e| tracing::error!("a checkpointed step state is not what it was: {e}"))
                .ok()
        },
    )
}

/// A key's windows in checkpoints, pickled as [`windows_to_py`] gives them.
pub(crate) fn windows_codec(
    state: KeyedState<Key, Windows>,
    pickle: &Arc<Pickle>,
) -> KeyedState<Key, Windows> {
    pickled_state(state, pickle, windows_to_py, windows_from_py)
}

/// A key's open windows as Python values: `(key, [(start, value or None), ...], at, seen)`.
pub(crate) fn windows_to_py<'py>(py: Python<'py>, w: &Windows) -> PyResult<Bound<'py, PyAny>> {
    let open: Vec<(i64, Obj)> = w
        .open
        .iter()
        .map(|(s, a)| {
            (
                *s,
                a.as_ref().map_or_else(|| py.None(), |a| a.clone_ref(py)),
            )
        })
        .collect();
    Ok((w.key.to_py(py), open, w.at, w.seen)
        .into_pyobject(py)?
        .into_any())
}

/// The open windows [`windows_to_py`] gave.
pub(crate) fn windows_from_py(v: &Bound<'_, PyAny>) -> PyResult<Windows> {
    let (key, open, at, seen): (Bound<'_, PyAny>, Vec<(i64, Obj)>, i64, bool) = v.extract()?;
    let py = v.py();
    Ok(Windows {
        key: Key::of(&key)?,
        open: open
            .into_iter()
            .map(|(s, a)| (s, (!a.is_none(py)).then_some(a)))
            .collect(),
        at,
        seen,
    })
}

/// A key's sessions as Python values: `(key, [(start, end, value or None), ...], at, seen)`.
pub(crate) fn sessions_codec(
    state: KeyedState<Key, Sessions>,
    pickle: &Arc<Pickle>,
) -> KeyedState<Key, Sessions> {
    pickled_state(state, pickle, sessions_to_py, sessions_from_py)
}

/// A key's open sessions as Python values: `(key, [(start, end, value or None), ...], at,
/// seen)`.
pub(crate) fn sessions_to_py<'py>(py: Python<'py>, w: &Sessions) -> PyResult<Bound<'py, PyAny>> {
    let open: Vec<(i64, i64, Obj)> = w
        .open
        .iter()
        .map(|(s, (e, a))| {
            (
                *s,
                *e,
                a.as_ref().map_or_else(|| py.None(), |a| a.clone_ref(py)),
            )
        })
        .collect();
    Ok((w.key.to_py(py), open, w.at, w.seen)
        .into_pyobject(py)?
        .into_any())
}

/// The open sessions [`sessions_to_py`] gave.
pub(crate) fn sessions_from_py(v: &Bound<'_, PyAny>) -> PyResult<Sessions> {
    type Saved<'py> = (Bound<'py, PyAny>, Vec<(i64, i64, Obj)>, i64, bool);
    let (key, open, at, seen): Saved<'_> = v.extract()?;
    let py = v.py();
    Ok(Sessions {
        key: Key::of(&key)?,
        open: open
            .into_iter()
            .map(|(s, e, a)| (s, (e, (!a.is_none(py)).then_some(a))))
            .collect(),
        at,
        seen,
    })
}

/// A final aggregation's value so far: `(count, value or None)`.
pub(crate) fn acc_codec(state: KeyedState<Key, Acc>, pickle: &Arc<Pickle>) -> KeyedState<Key, Acc> {
    pickled_state(
        state,
        pickle,
        |py, a: &Acc| {
            let v = a
                .value
                .as_ref()
                .map_or_else(|| py.None(), |v| v.clone_ref(py));
            Ok((a.n, v).into_pyobject(py)?.into_any())
        },
        |v| {
            let (n, value): (u64, Obj) = v.extract()?;
            let py = v.py();
            Ok(Acc {
                n,
                value: (!value.is_none(py)).then_some(value),
            })
        },
    )
}

/// A key's join: each side's records kept so far, as lists.
pub(crate) fn join_codec(
    state: KeyedState<Key, Sides>,
    pickle: &Arc<Pickle>,
) -> KeyedState<Key, Sides> {
    pickled_state(
        state,
        pickle,
        |py, s: &Sides| Ok(s.lists(py).into_pyobject(py)?.into_any()),
        |v| Ok(Sides(v.extract()?)),
    )
}

/// A key's `StatefulLogic`: its `snapshot()` (made again by `builder(snapshot)` on restore,
/// Bytewax's way), or, for a logic without `snapshot`, the object itself.
pub(crate) fn logic_codec(
    state: KeyedState<Key, Option<Obj>>,
    pickle: &Arc<Pickle>,
    builder: Arc<Obj>,
) -> KeyedState<Key, Option<Obj>> {
    pickled_state(
        state,
        pickle,
        |py, l: &Option<Obj>| {
            let Some(l) = l else {
                return Ok(("none", py.None()).into_pyobject(py)?.into_any());
            };
            let l = l.bind(py);
            if l.hasattr("snapshot")? {
                Ok(("snapshot", l.call_method0("snapshot")?)
                    .into_pyobject(py)?
                    .into_any())
            } else {
                Ok(("object", l.clone()).into_pyobject(py)?.into_any())
            }
        },
        move |v| {
            let (how, x): (String, Bound<'_, PyAny>) = v.extract()?;
            Ok(match how.as_str() {
                "snapshot" => Some(builder.bind(v.py()).call1((x,))?.unbind()),
                "object" => Some(x.unbind()),
                _ => None,
            })
        },
    )
}
