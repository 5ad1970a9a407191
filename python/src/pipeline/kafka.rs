//! Flows on Kafka: input topics in (one per source pipeline, co-partitioned), one output topic
//! out, each key's Python state in its partition's task, kept in a compacted changelog
//! (pickled) and moved with the partition, as canter's Rust Kafka pipelines do
//! (`canter_stream::kafka`). A flow's graph (merge, branch, join, a stream read by several
//! steps, a key_by after a stateful step) runs inside the task: a pipeline's results for a
//! channel are queued and run through the channel's readers after the step that made them,
//! before the task's next record, so no state is borrowed twice and nothing crosses a thread.

use std::cell::RefCell;
use std::collections::VecDeque;

use std::sync::{Arc, Mutex};

use canter_stream::kafka::{Keyed, KeyedTask, Out, Refused};
use canter_stream::pipeline::{Emit, Stateful};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::codec::{Decoder, Encoder};
use super::key::Key;
use super::stateful::{
    key_repr, now_ns, sessions_from_py, sessions_to_py, windows_from_py, windows_to_py, Acc, Final,
    Join, JoinEmit, Logic, SessionWindow, Sessions, Sides, Window, Windows,
};
use super::steps::{Chain, Failures, KeyFn};
use super::{py, Obj};

/// A key's open windows (time, count or session) as the value a Kafka task's store holds:
/// pickled into the changelog as the Python values a checkpoint holds (`__reduce__`), and made
/// again from them.
#[pyclass(module = "canter._native", name = "_KafkaWindows")]
pub(crate) struct KafkaWindows {
    w: Held,
}

/// What [`KafkaWindows`] holds.
enum Held {
    Windows(Windows),
    Sessions(Sessions),
}

#[pymethods]
impl KafkaWindows {
    #[new]
    fn new(kind: &str, form: &Bound<'_, PyAny>) -> PyResult<Self> {
        let w = match kind {
            "sessions" => Held::Sessions(sessions_from_py(form)?),
            _ => Held::Windows(windows_from_py(form)?),
        };
        Ok(KafkaWindows { w })
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (&'static str, Bound<'py, PyAny>))> {
        let py = slf.py();
        let args = match &slf.borrow().w {
            Held::Windows(w) => ("windows", windows_to_py(py, w)?),
            Held::Sessions(w) => ("sessions", sessions_to_py(py, w)?),
        };
        Ok((slf.get_type().into_any(), args))
    }
}

/// A key's `stateful()` logic as the value a Kafka task's store holds: pickled into the
/// changelog as the logic's `snapshot()` (or the object itself, without one), and made again
/// by the builder from it (Bytewax's resume state) when the key is next needed.
#[pyclass(module = "canter._native", name = "_KafkaLogic")]
pub(crate) struct KafkaLogic {
    /// The key's logic, once built.
    logic: Option<Obj>,
    /// Read from the changelog, not built yet: ("snapshot", state) or ("object", logic).
    form: Option<(String, Obj)>,
}

#[pymethods]
impl KafkaLogic {
    #[new]
    fn new(how: String, x: Obj) -> Self {
        KafkaLogic {
            logic: None,
            form: Some((how, x)),
        }
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (String, Bound<'py, PyAny>))> {
        let py = slf.py();
        let me = slf.borrow();
        let args = match (&me.logic, &me.form) {
            (Some(l), _) => {
                let l = l.bind(py);
                if l.hasattr("snapshot")? {
                    ("snapshot".to_owned(), l.call_method0("snapshot")?)
                } else {
                    ("object".to_owned(), l.clone())
                }
            }
            (None, Some((how, x))) => (how.clone(), x.bind(py).clone()),
            (None, None) => ("none".to_owned(), py.None().into_bound(py)),
        };
        Ok((slf.get_type().into_any(), args))
    }
}

impl KafkaLogic {
    /// Builds the logic from what the changelog held, if that is what the key has.
    fn build(&mut self, py: Python<'_>, builder: &Obj) -> PyResult<()> {
        if let Some((how, x)) = self.form.take() {
            self.logic = match how.as_str() {
                "snapshot" => Some(builder.bind(py).call1((x,))?.unbind()),
                "object" => Some(x),
                _ => None,
            };
        }
        Ok(())
    }
}

/// A key's final aggregation so far (its count, and its value) as the value a Kafka task's
/// store holds, pickled into the changelog as `(count, value)`.
#[pyclass(module = "canter._native", name = "_KafkaFinal")]
pub(crate) struct KafkaFinal {
    acc: Acc,
}

#[pymethods]
impl KafkaFinal {
    #[new]
    fn new(n: u64, value: Option<Obj>) -> Self {
        KafkaFinal {
            acc: Acc { n, value },
        }
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (u64, Option<Obj>))> {
        let py = slf.py();
        let me = slf.borrow();
        let value = me.acc.value.as_ref().map(|v| v.clone_ref(py));
        Ok((slf.get_type().into_any(), (me.acc.n, value)))
    }
}

/// A key's join (the records each side holds) as the value a Kafka task's store holds,
/// pickled into the changelog as the sides' lists.
#[pyclass(module = "canter._native", name = "_KafkaJoin")]
pub(crate) struct KafkaJoin {
    sides: Sides,
}

#[pymethods]
impl KafkaJoin {
    #[new]
    fn new(sides: Vec<Vec<Obj>>) -> Self {
        KafkaJoin {
            sides: Sides(sides),
        }
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Vec<Vec<Obj>>,))> {
        let sides = slf.borrow().sides.lists(slf.py());
        Ok((slf.get_type().into_any(), (sides,)))
    }
}

/// What wakes a Kafka flow's keys: a `stateful()` logic's `notify_at()` (pipeline `.0`), or a
/// state's expiry after `ttl` ns without a record.
pub(crate) enum Timer {
    Logic(usize),
    Ttl(u64),
}

/// What a pipeline's stateful step is on Kafka.
pub(crate) enum KStep {
    /// `f(state, record)`, the state saved to the changelog; output unless None.
    Update(Obj),
    /// `f(state, record)` reading the state (not saved); output unless None.
    Read(Obj),
    /// `f(state, record) -> (new_state, output)`.
    Map(Obj),
    /// Count or time windows, their open windows per key in the store (as [`KafkaWindows`]).
    Window(Mutex<Window>),
    /// Session windows, kept the same way.
    Session(Mutex<SessionWindow>),
    /// A `stateful()` logic per key (as [`KafkaLogic`]), woken at its `notify_at()`.
    Logic(Mutex<Logic>),
    /// A final aggregation per key (as [`KafkaFinal`]), emitted at the end of a bounded read.
    Final(Mutex<Final>),
    /// One side of a join: `(key, side, record)` to the join's channel; no state.
    Tag(usize),
    /// A join of keyed streams, each key's sides in the store (as [`KafkaJoin`]).
    Join(Mutex<Join>),
}

/// Where a pipeline's results go.
pub(crate) enum Route {
    /// The output topic, through its encoder.
    Topic(Encoder),
    /// Nowhere (`discard()`).
    Discard,
    /// The pipelines that read a channel (a merge, a join, a stream read by several steps, a
    /// key_by after a stateful step), by their index in [`PyTask::pipes`].
    Channel(Vec<usize>),
    /// A branch: its predicate, then the readers of its true stream and of its false one.
    Branch(Obj, Vec<usize>, Vec<usize>),
}

/// One pipeline of a Kafka flow.
pub(crate) struct KPipe {
    pub(crate) decode: Decoder,
    pub(crate) pre: Chain,
    pub(crate) key: Option<KeyFn>,
    pub(crate) step: Option<(KStep, Obj)>,
    pub(crate) post: Chain,
    /// Where the results go.
    pub(crate) route: Route,
    pub(crate) failures: Arc<Failures>,
    /// `on_eof(state)` of an `update` or `stateful_map`, at the end of a bounded read.
    pub(crate) on_eof: Option<Obj>,
    /// The `key_by` step's and the stateful step's names in failures (as the file engine
    /// names them: `3:key_by:f`, `4:update`, or the step's `name=`).
    pub(crate) names: (Arc<str>, Arc<str>),
}

/// The task every worker runs: input `i` goes through pipeline `inputs[i]`, and on through the
/// pipelines that read its channels.
pub(crate) struct PyTask {
    pub(crate) pipes: Vec<KPipe>,
    /// The pipeline of each input topic.
    pub(crate) inputs: Vec<usize>,
    pub(crate) dumps: Obj,
    pub(crate) loads: Obj,
    /// What the keys' wake-ups do, if anything wakes them.
    pub(crate) timer: Option<Timer>,
}

thread_local! {
    /// A result's key and value, reused from one result to the next.
    static SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const {
        RefCell::new((Vec::new(), Vec::new()))
    };
    /// Records sent to channels and not yet run through their readers: (reader, record, the
    /// key of the record it came from, which results keep when the reader sets none).
    static PENDING: RefCell<VecDeque<(usize, Obj, Option<Key>)>> = const {
        RefCell::new(VecDeque::new())
    };
}

/// `k`'s state in the store as a `T` (made by `made` on the key's first record); a state of
/// another kind (a changelog of another flow) is a TypeError naming `what` it should be.
fn held_as<'py, T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>>(
    py: Python<'py>,
    state: &mut Keyed<Key, Obj>,
    k: &Key,
    made: impl FnOnce() -> T,
    what: &str,
) -> PyResult<Bound<'py, T>> {
    let held = state
        .update(k.clone(), || {
            Py::new(py, made())
                .map(|f| f.into_any())
                .unwrap_or_else(|_| py.None())
        })
        .clone_ref(py)
        .into_bound(py);
    held.cast_into::<T>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "the key's state is not {what} (a changelog of another flow?)"
        ))
    })
}

/// Queues `v` for each of `readers`.
fn send(py: Python<'_>, readers: &[usize], key: Option<&Key>, v: Obj) {
    PENDING.with(|q| {
        let mut q = q.borrow_mut();
        if let Some((last, rest)) = readers.split_last() {
            for &r in rest {
                q.push_back((r, v.clone_ref(py), key.cloned()));
            }
            q.push_back((*last, v, key.cloned()));
        }
    });
}

impl PyTask {
    fn emit(&self, py: Python<'_>, p: &KPipe, key: Option<&Key>, v: Obj, out: &mut Out<'_>) {
        // Once errors="stop" has stopped the flow, nothing more goes out.
        if p.failures.stopped.get().is_some() {
            return;
        }
        let enc = match &p.route {
            Route::Topic(enc) => enc,
            Route::Discard => return,
            Route::Channel(readers) => return send(py, readers, key, v),
            Route::Branch(pred, yes, no) => {
                // A predicate that raises fails the record (it goes to neither side).
                match pred
                    .bind(py)
                    .call1((v.bind(py),))
                    .and_then(|r| r.is_truthy())
                {
                    Ok(true) => send(py, yes, key, v),
                    Ok(false) => send(py, no, key, v),
                    Err(e) => p.failures.fail(py, "branch", &e, Some(&v)),
                }
                return;
            }
        };
        SCRATCH.with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else {
                return;
            };
            let (kb, buf) = &mut *s;
            kb.clear();
            buf.clear();
            if let Some(k) = key {
                k.natural_bytes(kb);
            }
            match enc.encode(py, v.bind(py), buf) {
                Ok(()) => out.emit(kb, buf),
                Err(e) => p.failures.fail(py, "encode", &e, Some(&v)),
            }
        })
    }

    /// Runs one record, after the steps before `key_by`, through the rest of pipeline `p`;
    /// `inherited` is the key results carry when `p` sets none (its input's, from a channel).
    fn keyed(
        &self,
        py: Python<'_>,
        p: &KPipe,
        x: Obj,
        inherited: Option<&Key>,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let Some(kf) = &p.key else {
            return self.post(py, p, inherited, x, out);
        };
        let k = match kf.key(py, x.bind(py)) {
            Ok(k) => k,
            Err(e) => return p.failures.fail(py, &p.names.0, &e, Some(&x)),
        };
        let Some((step, factory)) = &p.step else {
            return self.post(py, p, Some(&k), x, out);
        };
        if matches!(step, KStep::Window(_) | KStep::Session(_)) {
            return self.window(py, p, step, k, x, state, out);
        }
        if let KStep::Logic(m) = step {
            return self.logic(py, p, m, Some(x), k, state, out);
        }
        if let KStep::Final(m) = step {
            return self.fold_final(py, p, m, k, x, state);
        }
        if let KStep::Tag(side) = step {
            return match (k.to_py(py), *side, x).into_pyobject(py) {
                Ok(t) => self.post(py, p, Some(&k), t.into_any().unbind(), out),
                Err(e) => p.failures.fail(py, &p.names.1, &e, None),
            };
        }
        if let KStep::Join(m) = step {
            return self.join(py, p, m, k, x, state, out);
        }
        if let Some(Timer::Ttl(ttl)) = self.timer {
            // The key's state expires `ttl` after its latest record (as in the file engine,
            // whatever the record did).
            self.expire_later(&k, ttl, state);
        }
        // A key's first record makes its state; if the factory raises, that record fails
        // (the key named) and the key's next record tries again.
        let fresh = if state.get(&k).is_none() {
            match factory.bind(py).call0() {
                Ok(s) => Some(s.unbind()),
                Err(e) => {
                    let key = k
                        .to_py(py)
                        .bind(py)
                        .repr()
                        .map(|r| r.to_string())
                        .unwrap_or_default();
                    let step = format!("{} (the state factory, for key {key})", p.names.1);
                    return p.failures.fail(py, &step, &e, Some(&x));
                }
            }
        } else {
            None
        };
        let made = || fresh.unwrap_or_else(|| py.None());
        let result = match step {
            KStep::Update(f) => {
                let st = state.update(k.clone(), made);
                f.bind(py).call1((st.bind(py), x.bind(py)))
            }
            KStep::Read(f) => match state.get(&k) {
                Some(st) => f.bind(py).call1((st.bind(py), x.bind(py))),
                None => f.bind(py).call1((made(), x.bind(py))),
            },
            KStep::Map(f) => {
                let st = state.update(k.clone(), made);
                let r = f.bind(py).call1((st.bind(py), x.bind(py))).and_then(|r| {
                    let (s, o): (Obj, Obj) = r.extract()?;
                    Ok((s, o.into_bound(py)))
                });
                match r {
                    // None as the new state drops the key's (a tombstone in the changelog);
                    // its next record starts from the factory's.
                    Ok((s, o)) if s.is_none(py) => {
                        state.remove(&k);
                        Ok(o)
                    }
                    Ok((s, o)) => {
                        *st = s;
                        Ok(o)
                    }
                    Err(e) => Err(e),
                }
            }
            // Run by `window`, `logic`, `fold_final` and `join` above.
            KStep::Window(_)
            | KStep::Session(_)
            | KStep::Logic(_)
            | KStep::Final(_)
            | KStep::Tag(_)
            | KStep::Join(_) => return,
        };
        match result {
            Ok(o) if o.is_none() => {}
            Ok(o) => self.post(py, p, Some(&k), o.unbind(), out),
            Err(e) => p.failures.fail(py, &p.names.1, &e, Some(&x)),
        }
    }

    /// The steps after the stateful one, then the output topic.
    /// Runs a record through a window step: the key's windows from the store (made on its
    /// first record), the closed ones emitted.
    #[allow(clippy::too_many_arguments)]
    fn window(
        &self,
        py: Python<'_>,
        p: &KPipe,
        step: &KStep,
        k: Key,
        x: Obj,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let held = state.update(k.clone(), || {
            let w = match step {
                KStep::Session(_) => Held::Sessions(Sessions::new(&k)),
                _ => Held::Windows(Windows::new(&k)),
            };
            Py::new(py, KafkaWindows { w })
                .map(|w| w.into_any())
                .unwrap_or_else(|_| py.None())
        });
        let held = held.clone_ref(py);
        let Ok(cell) = held.bind(py).cast::<KafkaWindows>() else {
            let e = pyo3::exceptions::PyTypeError::new_err(
                "the key's state is not a window's (a changelog of another flow?)",
            );
            return p.failures.fail(py, &p.names.1, &e, Some(&x));
        };
        let Ok(mut held) = cell.try_borrow_mut() else {
            return;
        };
        let (key, read_ns) = (Some(&k), out.read_time_ns());
        let mut emit_one = |o: Obj| self.post(py, p, key, o, out);
        let mut emit = Emit::new(&mut emit_one, read_ns);
        match (step, &mut held.w) {
            (KStep::Window(m), Held::Windows(w)) => {
                if let Ok(mut s) = m.lock() {
                    s.update(w, (k.clone(), x), &mut emit);
                }
            }
            (KStep::Session(m), Held::Sessions(w)) => {
                if let Ok(mut s) = m.lock() {
                    s.update(w, (k.clone(), x), &mut emit);
                }
            }
            _ => {
                let e = pyo3::exceptions::PyTypeError::new_err(
                    "the key's windows are of another kind (a changelog of another flow?)",
                );
                p.failures.fail(py, &p.names.1, &e, Some(&x));
            }
        }
    }

    /// Runs a side's `(key, side, record)` through its key's join (made on the key's first
    /// record); a join that emits a complete row drops the key's sides.
    #[allow(clippy::too_many_arguments)]
    fn join(
        &self,
        py: Python<'_>,
        p: &KPipe,
        step: &Mutex<Join>,
        k: Key,
        x: Obj,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let Ok(mut j) = step.lock() else { return };
        let sides = j.sides;
        let made = || KafkaJoin {
            sides: Sides::empty(sides),
        };
        let cell = match held_as(py, state, &k, made, "a join's") {
            Ok(cell) => cell,
            Err(e) => return p.failures.fail(py, &p.names.1, &e, Some(&x)),
        };
        let Ok(mut held) = cell.try_borrow_mut() else {
            return;
        };
        let discard = {
            let mut emit_one = |o: Obj| self.post(py, p, Some(&k), o, out);
            let mut emit = Emit::new(&mut emit_one, 0);
            j.update(&mut held.sides, (k.clone(), x), &mut emit);
            emit.discarded()
        };
        if discard {
            drop(held);
            state.remove(&k);
        }
    }

    /// Runs the records queued for channels through their readers, and what those send on,
    /// until none is left (a flow's graph has no cycle).
    fn drain(&self, py: Python<'_>, state: &mut Keyed<Key, Obj>, out: &mut Out<'_>) {
        loop {
            let Some((r, x, key)) = PENDING.with(|q| q.borrow_mut().pop_front()) else {
                return;
            };
            let Some(p) = self.pipes.get(r) else { continue };
            if p.failures.stopped.get().is_some() {
                PENDING.with(|q| q.borrow_mut().clear());
                return;
            }
            self.enter(py, p, x, key.as_ref(), state, out);
        }
    }

    /// Runs a record through every step of pipeline `p`.
    fn enter(
        &self,
        py: Python<'_>,
        p: &KPipe,
        x: Obj,
        inherited: Option<&Key>,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        if p.pre.is_empty() {
            self.keyed(py, p, x, inherited, state, out);
        } else {
            p.pre
                .run_all(py, x, &mut |x| self.keyed(py, p, x, inherited, state, out));
        }
    }

    /// Adds a record to its key's final aggregation (made on the key's first record).
    fn fold_final(
        &self,
        py: Python<'_>,
        p: &KPipe,
        step: &Mutex<Final>,
        k: Key,
        x: Obj,
        state: &mut Keyed<Key, Obj>,
    ) {
        let made = || KafkaFinal {
            acc: Acc { n: 0, value: None },
        };
        let cell = match held_as(py, state, &k, made, "a final aggregation's") {
            Ok(cell) => cell,
            Err(e) => return p.failures.fail(py, &p.names.1, &e, Some(&x)),
        };
        let (Ok(mut held), Ok(mut f)) = (cell.try_borrow_mut(), step.lock()) else {
            return;
        };
        let mut none = |_: Obj| {};
        let mut emit = Emit::new(&mut none, 0);
        f.update(&mut held.acc, (k, x), &mut emit);
    }

    /// The end of a bounded read for key `k` of pipeline `p`: its final aggregation, open
    /// windows or logic's `on_eof` emitted and the key's state dropped; an `update`'s
    /// `on_eof(state)` emitted (the state kept).
    fn end_key(
        &self,
        py: Python<'_>,
        p: &KPipe,
        k: &Key,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let Some((step, _)) = &p.step else { return };
        let Some(held) = state.get(k).map(|h| h.clone_ref(py)) else {
            return;
        };
        let discard = {
            let mut emit_one = |o: Obj| self.post(py, p, Some(k), o, out);
            let mut emit = Emit::new(&mut emit_one, 0);
            match step {
                KStep::Final(m) => {
                    if let (Ok(cell), Ok(mut f)) = (held.bind(py).cast::<KafkaFinal>(), m.lock()) {
                        if let Ok(mut h) = cell.try_borrow_mut() {
                            f.finish(k, &mut h.acc, &mut emit);
                        }
                    }
                }
                KStep::Window(m) => {
                    if let (Ok(cell), Ok(mut w)) = (held.bind(py).cast::<KafkaWindows>(), m.lock())
                    {
                        if let Ok(mut h) = cell.try_borrow_mut() {
                            if let Held::Windows(open) = &mut h.w {
                                w.finish(k, open, &mut emit);
                            }
                        }
                    }
                }
                KStep::Session(m) => {
                    if let (Ok(cell), Ok(mut w)) = (held.bind(py).cast::<KafkaWindows>(), m.lock())
                    {
                        if let Ok(mut h) = cell.try_borrow_mut() {
                            if let Held::Sessions(open) = &mut h.w {
                                w.finish(k, open, &mut emit);
                            }
                        }
                    }
                }
                KStep::Logic(m) => {
                    if let (Ok(cell), Ok(mut lg)) = (held.bind(py).cast::<KafkaLogic>(), m.lock()) {
                        if let Ok(mut h) = cell.try_borrow_mut() {
                            match h.build(py, &lg.builder) {
                                Ok(()) => lg.finish(k, &mut h.logic, &mut emit),
                                Err(e) => {
                                    let what = format!(
                                        "{} (the builder, from the changelog, key {})",
                                        p.names.1,
                                        key_repr(py, k)
                                    );
                                    p.failures.fail(py, &what, &e, None);
                                }
                            }
                        }
                    }
                }
                // emit="final" emits what the sides hold and drops them; the other modes keep
                // them for the next run of the group, as an `update`'s state is kept.
                KStep::Join(m) => {
                    if let (Ok(cell), Ok(mut j)) = (held.bind(py).cast::<KafkaJoin>(), m.lock()) {
                        if let (Ok(mut h), JoinEmit::Final) = (cell.try_borrow_mut(), j.when) {
                            j.finish(k, &mut h.sides, &mut emit);
                        }
                    }
                }
                KStep::Tag(_) => {}
                KStep::Update(_) | KStep::Read(_) | KStep::Map(_) => {
                    if let Some(f) = &p.on_eof {
                        match f.bind(py).call1((held.bind(py),)) {
                            Ok(o) if o.is_none() => {}
                            Ok(o) => emit.emit(o.unbind()),
                            Err(e) => {
                                let what =
                                    format!("{} (on_eof, key {})", p.names.1, key_repr(py, k));
                                p.failures.fail(py, &what, &e, None);
                            }
                        }
                    }
                }
            }
            emit.discarded()
        };
        if discard {
            state.remove(k);
        }
    }

    /// Sets `k`'s expiry `ttl` from now (if it has state).
    fn expire_later(&self, k: &Key, ttl: u64, state: &mut Keyed<Key, Obj>) {
        state.wake_at(k, Some(now_ns().saturating_add(ttl)));
    }

    /// Runs a key's `stateful()` logic: `on_item(x)`, or `on_notify()` without a record. The
    /// logic is built on the key's first record (or from its changelog snapshot); its outputs
    /// go on as `(key, output)`; a discard (or a builder that failed) drops the key's state,
    /// and otherwise its `notify_at()` sets the key's wake-up.
    #[allow(clippy::too_many_arguments)]
    fn logic(
        &self,
        py: Python<'_>,
        p: &KPipe,
        step: &Mutex<Logic>,
        x: Option<Obj>,
        k: Key,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let fresh = || {
            Py::new(
                py,
                KafkaLogic {
                    logic: None,
                    form: None,
                },
            )
            .map(|l| l.into_any())
            .unwrap_or_else(|_| py.None())
        };
        let held = match &x {
            Some(_) => state.update(k.clone(), fresh).clone_ref(py),
            // A wake-up: only a key that still has its logic (and it is written again: the
            // notify may change it).
            None => match state.get(&k) {
                Some(_) => state.update(k.clone(), fresh).clone_ref(py),
                None => return,
            },
        };
        let Ok(cell) = held.bind(py).cast::<KafkaLogic>() else {
            let e = pyo3::exceptions::PyTypeError::new_err(
                "the key's state is not a stateful() logic's (a changelog of another flow?)",
            );
            return p.failures.fail(py, &p.names.1, &e, x.as_ref());
        };
        let (Ok(mut held), Ok(mut lg)) = (cell.try_borrow_mut(), step.lock()) else {
            return;
        };
        if let Err(e) = held.build(py, &lg.builder) {
            let what = format!(
                "{} (the builder, from the changelog, key {})",
                p.names.1,
                key_repr(py, &k)
            );
            p.failures.fail(py, &what, &e, x.as_ref());
            state.remove(&k);
            return;
        }
        let read_ns = out.read_time_ns();
        let discard = {
            let mut emit_one = |o: Obj| self.post(py, p, Some(&k), o, out);
            let mut emit = Emit::new(&mut emit_one, read_ns);
            match x {
                Some(x) => lg.update(&mut held.logic, (k.clone(), x), &mut emit),
                None => lg.notify(&k, &mut held.logic, now_ns(), &mut emit),
            }
            emit.discarded()
        };
        if discard || held.logic.is_none() {
            drop(held);
            state.remove(&k);
            return;
        }
        let at = lg.wake_at(&k, &held.logic);
        state.wake_at(&k, at);
    }

    fn post(&self, py: Python<'_>, p: &KPipe, k: Option<&Key>, o: Obj, out: &mut Out<'_>) {
        if p.post.is_empty() {
            return self.emit(py, p, k, o, out);
        }
        p.post.run_all(py, o, &mut |o| self.emit(py, p, k, o, out));
    }
}

impl KeyedTask for PyTask {
    type Key = Key;
    type State = Obj;

    fn process(
        &self,
        input: usize,
        _key: Option<&[u8]>,
        value: &[u8],
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) -> Result<(), Refused> {
        let py = py();
        let Some(p) = self.inputs.get(input).and_then(|&i| self.pipes.get(i)) else {
            return Err(Refused(format!("no pipeline for input {input}")));
        };
        let rec = p.decode.decode(py, value).map_err(|e| {
            // Through the flow's errors= (stop, dead letter, skip), then counted as refused.
            let why = e.to_string();
            p.failures.decode_failed(value, &why);
            Refused(why)
        })?;
        super::set_read_ns(out.read_time_ns());
        self.enter(py, p, rec, None, state, out);
        self.drain(py, state, out);
        super::set_read_ns(0);
        Ok(())
    }

    fn halted(&self) -> bool {
        self.pipes
            .first()
            .is_some_and(|p| p.failures.stopped.get().is_some())
    }

    fn wake(&self, key: &Key, state: &mut Keyed<Key, Obj>, out: &mut Out<'_>) {
        let py = py();
        match self.timer {
            // Expired: a tombstone in the changelog; its next record starts from the factory.
            Some(Timer::Ttl(_)) => {
                state.remove(key);
            }
            Some(Timer::Logic(i)) => {
                let Some(p) = self.pipes.get(i) else { return };
                if let Some((KStep::Logic(m), _)) = &p.step {
                    self.logic(py, p, m, None, key.clone(), state, out);
                }
            }
            None => {}
        }
        self.drain(py, state, out);
    }

    fn end(&self, state: &mut Keyed<Key, Obj>, out: &mut Out<'_>) {
        let py = py();
        let keys: Vec<Key> = state.keys().cloned().collect();
        super::set_read_ns(0);
        for p in self.pipes.iter().filter(|p| p.step.is_some()) {
            for k in &keys {
                self.end_key(py, p, k, state, out);
                self.drain(py, state, out);
            }
        }
    }

    fn restored(&self, state: &mut Keyed<Key, Obj>) {
        let py = py();
        let keys: Vec<Key> = state.keys().cloned().collect();
        match self.timer {
            // Restored states expire `ttl` from now (their last record's time is not kept).
            Some(Timer::Ttl(ttl)) => {
                for k in &keys {
                    self.expire_later(k, ttl, state);
                }
            }
            // Each key's logic is built again from its snapshot, and asked when to wake.
            Some(Timer::Logic(i)) => {
                let Some(p) = self.pipes.get(i) else { return };
                let Some((KStep::Logic(m), _)) = &p.step else {
                    return;
                };
                let Ok(mut lg) = m.lock() else { return };
                for k in keys {
                    let Some(held) = state.get(&k).map(|h| h.clone_ref(py)) else {
                        continue;
                    };
                    let Ok(cell) = held.bind(py).cast::<KafkaLogic>() else {
                        continue;
                    };
                    let Ok(mut held) = cell.try_borrow_mut() else {
                        continue;
                    };
                    match held.build(py, &lg.builder) {
                        Ok(()) => {
                            let at = lg.wake_at(&k, &held.logic);
                            state.wake_at(&k, at);
                        }
                        Err(e) => {
                            let what = format!(
                                "{} (the builder, from the changelog, key {})",
                                p.names.1,
                                key_repr(py, &k)
                            );
                            p.failures.fail(py, &what, &e, None);
                        }
                    }
                }
            }
            None => {}
        }
    }

    fn encode_key(&self, key: &Key, buf: &mut Vec<u8>) {
        key.tagged_bytes(buf);
    }

    fn decode_key(&self, bytes: &[u8]) -> Option<Key> {
        Key::from_tagged(bytes)
    }

    fn encode_state(&self, state: &Obj, buf: &mut Vec<u8>) {
        let py = py();
        match self.dumps.bind(py).call1((state.bind(py),)) {
            Ok(b) => match b.cast::<PyBytes>() {
                Ok(b) => buf.extend_from_slice(b.as_bytes()),
                Err(e) => tracing::error!("pickle.dumps gave no bytes: {e}"),
            },
            Err(e) => {
                let n = self.pipes.first().map(|p| &p.failures);
                if let Some(f) = n {
                    f.fail(py, "state pickle", &e, Some(state));
                }
            }
        }
    }

    fn decode_state(&self, bytes: &[u8]) -> Option<Obj> {
        let py = py();
        self.loads
            .bind(py)
            .call1((PyBytes::new(py, bytes),))
            .map(Bound::unbind)
            .map_err(|e| tracing::error!("a changelog state did not unpickle: {e}"))
            .ok()
    }
}
