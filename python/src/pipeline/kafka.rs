//! Flows on Kafka: input topics in (one per pipeline, co-partitioned), one output topic out,
//! each key's Python state in its partition's task, kept in a compacted changelog (pickled) and
//! moved with the partition, as canter's Rust Kafka pipelines do (`canter_stream::kafka`).

use std::sync::{Arc, Mutex};

use canter_stream::kafka::{Keyed, KeyedTask, Out, Refused};
use canter_stream::pipeline::{Emit, Stateful};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::codec::{Decoder, Encoder};
use super::key::Key;
use super::stateful::{
    sessions_from_py, sessions_to_py, windows_from_py, windows_to_py, SessionWindow, Sessions,
    Window, Windows,
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
}

/// One pipeline of a Kafka flow.
pub(crate) struct KPipe {
    pub(crate) decode: Decoder,
    pub(crate) pre: Chain,
    pub(crate) key: Option<KeyFn>,
    pub(crate) step: Option<(KStep, Obj)>,
    pub(crate) post: Chain,
    /// The output topic's encoder, or None: the results are dropped.
    pub(crate) encode: Option<Encoder>,
    pub(crate) failures: Arc<Failures>,
}

/// The task every worker runs: input `i` goes through pipeline `i`.
pub(crate) struct PyTask {
    pub(crate) pipes: Vec<KPipe>,
    pub(crate) dumps: Obj,
    pub(crate) loads: Obj,
}

thread_local! {
    /// A result's key and value, reused from one result to the next.
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

impl PyTask {
    fn emit(&self, py: Python<'_>, p: &KPipe, key: Option<&Key>, v: Obj, out: &mut Out<'_>) {
        let Some(enc) = &p.encode else { return };
        // Once errors="stop" has stopped the flow, nothing more goes out.
        if p.failures.stopped.get().is_some() {
            return;
        }
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

    /// Runs one record, after the steps before `key_by`, through the rest of pipeline `p`.
    fn keyed(
        &self,
        py: Python<'_>,
        p: &KPipe,
        x: Obj,
        state: &mut Keyed<Key, Obj>,
        out: &mut Out<'_>,
    ) {
        let Some(kf) = &p.key else {
            return self.post(py, p, None, x, out);
        };
        let k = match kf.key(py, x.bind(py)) {
            Ok(k) => k,
            Err(e) => return p.failures.fail(py, "key_by", &e, Some(&x)),
        };
        let Some((step, factory)) = &p.step else {
            return self.post(py, p, Some(&k), x, out);
        };
        if matches!(step, KStep::Window(_) | KStep::Session(_)) {
            return self.window(py, p, step, k, x, state, out);
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
                    let step = format!("keyed_state (the state factory, for key {key})");
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
            // Run by `window` above.
            KStep::Window(_) | KStep::Session(_) => return,
        };
        match result {
            Ok(o) if o.is_none() => {}
            Ok(o) => self.post(py, p, Some(&k), o.unbind(), out),
            Err(e) => p.failures.fail(py, "stateful", &e, Some(&x)),
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
            return p.failures.fail(py, "window", &e, Some(&x));
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
                p.failures.fail(py, "window", &e, Some(&x));
            }
        }
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
        let Some(p) = self.pipes.get(input) else {
            return Err(Refused(format!("no pipeline for input {input}")));
        };
        let rec = p.decode.decode(py, value).map_err(|e| {
            // Through the flow's errors= (stop, dead letter, skip), then counted as refused.
            let why = e.to_string();
            p.failures.decode_failed(value, &why);
            Refused(why)
        })?;
        super::set_read_ns(out.read_time_ns());
        if p.pre.is_empty() {
            self.keyed(py, p, rec, state, out);
        } else {
            p.pre
                .run_all(py, rec, &mut |x| self.keyed(py, p, x, state, out));
        }
        super::set_read_ns(0);
        Ok(())
    }

    fn halted(&self) -> bool {
        self.pipes
            .first()
            .is_some_and(|p| p.failures.stopped.get().is_some())
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
