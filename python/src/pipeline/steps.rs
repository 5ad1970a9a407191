//! Python steps on the engine: the chain of `map`/`filter`/`flat_map`/`inspect` calls, keys
//! as Rust values, what becomes of a record at the end (encoded for a sink, appended to a
//! list), and what a failing user function does.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use canter_stream::pipeline::Step;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::codec::Encoder;
use super::key::Key;
use super::{py, Obj};

/// What happens to a record whose user function raised.
pub(crate) enum Policy {
    /// Logged and counted; the record is dropped and the pipeline goes on.
    Skip,
    /// Logged and counted; the pipeline stops (its `run` raises).
    Stop,
    /// Logged and counted; a JSON line naming the pipeline, step, error and record is
    /// appended to this file.
    DeadLetter(Mutex<std::fs::File>),
}

/// Stops the flow (set once it has started).
pub(crate) type Stopper = Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>;

/// `s` cut to at most `max` characters (a `…` where it was cut).
fn clipped(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// An exception as `Type: message`.
fn exception_text(py: Python<'_>, e: &PyErr) -> String {
    let name = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    format!("{name}: {}", e.value(py))
}

/// A record's bytes for a log line or a dead-letter file: its text if it is UTF-8, else
/// base64 (`true`).
fn bytes_text(b: &[u8]) -> (String, bool) {
    match std::str::from_utf8(b) {
        Ok(s) => (s.to_owned(), false),
        Err(_) => {
            use base64::Engine as _;
            (base64::engine::general_purpose::STANDARD.encode(b), true)
        }
    }
}

/// A pipeline's failures: counted, logged (every one's traceback for the first ten, then at
/// most one a second with the count held back), and handled by the policy.
pub(crate) struct Failures {
    pub(crate) pipeline: Arc<str>,
    pub(crate) count: AtomicU64,
    pub(crate) policy: Arc<Policy>,
    pub(crate) stop: Stopper,
    /// Whether the policy stopped the flow, and the first error's text.
    pub(crate) stopped: Arc<OnceLock<String>>,
    log: Mutex<(Option<Instant>, u64)>,
    /// Records the decoder refused.
    decode_failures: AtomicU64,
}

impl Failures {
    pub(crate) fn new(
        pipeline: &str,
        policy: Arc<Policy>,
        stop: Stopper,
        stopped: Arc<OnceLock<String>>,
    ) -> Self {
        Failures {
            pipeline: pipeline.into(),
            count: AtomicU64::new(0),
            policy,
            stop,
            stopped,
            log: Mutex::new((None, 0)),
            decode_failures: AtomicU64::new(0),
        }
    }

    /// Stops the flow for `why` (the first reason wins): sources stop reading, and nothing
    /// more reaches a sink.
    fn halt(&self, why: String) {
        if self.stopped.set(why).is_ok() {
            if let Some(stop) = self.stop.get() {
                stop();
            }
        }
    }

    /// A record the decoder refused (`why`): logged with a sample of its bytes (the first ten,
    /// then at most one a second), and handled by the policy: "stop" stops the flow, a
    /// dead-letter file gets a line with its bytes (text, or base64 where not UTF-8). The
    /// engine counts it as rejected input.
    pub(crate) fn decode_failed(&self, rec: &[u8], why: &str) {
        let n = self.decode_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let due = {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let due = n <= 10 || log.0.is_none_or(|t| now.duration_since(t).as_secs() >= 1);
            if due {
                log.0 = Some(now);
            }
            due
        };
        if due {
            let sample: String = rec
                .iter()
                .take(64)
                .flat_map(|b| std::ascii::escape_default(*b))
                .map(char::from)
                .collect();
            tracing::error!(pipeline = %self.pipeline, failed = n, bytes = rec.len(),
                "a record failed to decode ({why}); sample: b\"{sample}\"{}",
                if rec.len() > 64 { "…" } else { "" });
        }
        match &*self.policy {
            Policy::Skip => {}
            Policy::Stop => {
                // The whole record decides text or base64 (a cut could split a character).
                let (text, b64) = bytes_text(rec);
                self.halt(format!(
                    "pipeline {}: a record failed to decode ({why}): {}{:?}",
                    self.pipeline,
                    if b64 { "base64 " } else { "" },
                    clipped(&text, 200)
                ));
            }
            Policy::DeadLetter(file) => {
                let (text, b64) = bytes_text(rec);
                let mut line = serde_json::json!({
                    "pipeline": &*self.pipeline,
                    "step": "decode",
                    "error": why,
                });
                line[if b64 { "record_base64" } else { "record" }] = text.into();
                let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(err) = writeln!(f, "{line}") {
                    tracing::error!(pipeline = %self.pipeline, error = %err, "dead-letter file write failed");
                }
            }
        }
    }

    /// `step`'s function raised `e` on `record`.
    pub(crate) fn fail(&self, py: Python<'_>, step: &str, e: &PyErr, record: Option<&Obj>) {
        self.fail_many(
            py,
            step,
            e,
            record.map(std::slice::from_ref).unwrap_or(&[]),
            1,
        )
    }

    /// `records` (`n` of them: all given, or none for a record that is not kept) failed in
    /// one call of `step`: counted each, logged once, each to the dead-letter file.
    pub(crate) fn fail_many(&self, py: Python<'_>, step: &str, e: &PyErr, records: &[Obj], n: u64) {
        let n = self.count.fetch_add(n, Ordering::Relaxed) + n;
        let held = {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let due = log.0.is_none_or(|t| now.duration_since(t).as_secs() >= 1);
            if n <= 10 || due {
                log.0 = Some(now);
                Some(std::mem::take(&mut log.1))
            } else {
                log.1 += 1;
                None
            }
        };
        if let Some(held) = held {
            let tb = e
                .traceback(py)
                .and_then(|t| t.format().ok())
                .unwrap_or_default();
            tracing::error!(
                pipeline = %self.pipeline, step, failed = n, held,
                "exception in a pipeline function, the record is dropped\n{tb}{e}"
            );
        }
        match &*self.policy {
            Policy::Skip => {}
            Policy::Stop => {
                let record = records
                    .first()
                    .filter(|r| !r.is_none(py))
                    .map(|r| {
                        let repr = r.bind(py).repr().map(|r| r.to_string()).unwrap_or_default();
                        format!(" on record {}", clipped(&repr, 200))
                    })
                    .unwrap_or_default();
                self.halt(format!(
                    "pipeline {}: step {step} raised {}{record}",
                    self.pipeline,
                    exception_text(py, e)
                ));
            }
            Policy::DeadLetter(file) => {
                let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                let none = [py.None()];
                let records = if records.is_empty() {
                    &none[..]
                } else {
                    records
                };
                for r in records {
                    let record = if r.is_none(py) {
                        String::new()
                    } else {
                        r.bind(py).repr().map(|r| r.to_string()).unwrap_or_default()
                    };
                    let line = serde_json::json!({
                        "pipeline": &*self.pipeline,
                        "step": step,
                        "error": e.to_string(),
                        "record": record,
                    });
                    if let Err(err) = writeln!(f, "{line}") {
                        tracing::error!(pipeline = %self.pipeline, error = %err, "dead-letter file write failed");
                        break;
                    }
                }
            }
        }
    }
}

/// What a stateless step does with its function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Map,
    Filter,
    FlatMap,
    Inspect,
    /// The function takes a list of records (those of one read, at most [`BATCH`]) and gives
    /// an iterable of outputs.
    FlatMapBatch,
    /// The function gives the record's key: the record goes on as (key, record).
    Key,
}

/// The most records a batch step's function is called with at once.
pub(crate) const BATCH: usize = 1024;

impl Kind {
    pub(crate) fn parse(s: &str) -> PyResult<Kind> {
        Ok(match s {
            "map" => Kind::Map,
            "filter" => Kind::Filter,
            "flat_map" => Kind::FlatMap,
            "inspect" => Kind::Inspect,
            "flat_map_batch" => Kind::FlatMapBatch,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown step {other:?}"
                )))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Map => "map",
            Kind::Filter => "filter",
            Kind::FlatMap => "flat_map",
            Kind::Inspect => "inspect",
            Kind::FlatMapBatch => "flat_map_batch",
            Kind::Key => "key_by",
        }
    }
}

pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) f: Obj,
    /// The step's name in logs and metrics (`3:map:decode`).
    pub(crate) name: String,
}

/// A run of stateless Python steps, one engine [`Step`]: each record goes through every
/// function in turn, with no queue between them.
pub(crate) struct Chain {
    pub(crate) ops: Arc<[Op]>,
    pub(crate) counts: Vec<u64>,
    pub(crate) failures: Arc<Failures>,
    /// The records each batch step holds until the end of the read (empty for the others).
    pub(crate) pending: Vec<Vec<Obj>>,
}

impl Clone for Chain {
    fn clone(&self) -> Self {
        Chain::new(self.ops.clone(), self.failures.clone())
    }
}

impl Chain {
    pub(crate) fn new(ops: Arc<[Op]>, failures: Arc<Failures>) -> Chain {
        Chain {
            counts: vec![0; ops.len()],
            pending: ops.iter().map(|_| Vec::new()).collect(),
            ops,
            failures,
        }
    }

    /// Calls batch step `i`'s function with the records it holds; runs what it gives through
    /// the steps after it.
    fn run_batch(
        py: Python<'_>,
        ops: &[Op],
        counts: &mut [u64],
        pending: &mut [Vec<Obj>],
        failures: &Failures,
        i: usize,
        emit: &mut dyn FnMut(Obj),
    ) {
        let Some(held) = pending.get_mut(i) else {
            return;
        };
        if held.is_empty() {
            return;
        }
        let batch = std::mem::replace(held, Vec::with_capacity(held.len()));
        let op = &ops[i];
        let n = batch.len() as u64;
        let list = match pyo3::types::PyList::new(py, &batch) {
            Ok(l) => l,
            Err(e) => return failures.fail_many(py, &op.name, &e, &batch, n),
        };
        let made = op.f.bind(py).call1((list,));
        Chain::run_each(
            py,
            ops,
            counts,
            pending,
            failures,
            i,
            made,
            emit,
            &mut |e| failures.fail_many(py, &op.name, e, &batch, n),
        );
    }

    /// Runs each item of `made` (what step `i`'s function gave, an iterable) through the steps
    /// after it; a failure, of the call or of the iteration, goes to `fail` and ends it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn run_each(
        py: Python<'_>,
        ops: &[Op],
        counts: &mut [u64],
        pending: &mut [Vec<Obj>],
        failures: &Failures,
        i: usize,
        made: PyResult<Bound<'_, PyAny>>,
        emit: &mut dyn FnMut(Obj),
        fail: &mut dyn FnMut(&PyErr),
    ) {
        match made.and_then(|v| v.try_iter()) {
            Ok(iter) => {
                for v in iter {
                    match v {
                        Ok(v) => {
                            Chain::run(py, ops, counts, pending, failures, i + 1, v.unbind(), emit)
                        }
                        Err(e) => {
                            fail(&e);
                            break;
                        }
                    }
                }
            }
            Err(e) => fail(&e),
        }
    }

    /// Runs `item` through the steps from `i` on.
    #[allow(clippy::too_many_arguments)]
    fn run(
        py: Python<'_>,
        ops: &[Op],
        counts: &mut [u64],
        pending: &mut [Vec<Obj>],
        failures: &Failures,
        i: usize,
        item: Obj,
        emit: &mut dyn FnMut(Obj),
    ) {
        let Some(op) = ops.get(i) else {
            emit(item);
            return;
        };
        if let Some(c) = counts.get_mut(i) {
            *c += 1;
        }
        let f = op.f.bind(py);
        match op.kind {
            Kind::Map => match f.call1((item.bind(py),)) {
                Ok(v) => Chain::run(py, ops, counts, pending, failures, i + 1, v.unbind(), emit),
                Err(e) => failures.fail(py, &op.name, &e, Some(&item)),
            },
            Kind::Filter => match f.call1((item.bind(py),)).and_then(|v| v.is_truthy()) {
                Ok(true) => Chain::run(py, ops, counts, pending, failures, i + 1, item, emit),
                Ok(false) => {}
                Err(e) => failures.fail(py, &op.name, &e, Some(&item)),
            },
            Kind::Inspect => match f.call1((item.bind(py),)) {
                Ok(_) => Chain::run(py, ops, counts, pending, failures, i + 1, item, emit),
                Err(e) => failures.fail(py, &op.name, &e, Some(&item)),
            },
            Kind::FlatMap => {
                let made = f.call1((item.bind(py),));
                Chain::run_each(
                    py,
                    ops,
                    counts,
                    pending,
                    failures,
                    i,
                    made,
                    emit,
                    &mut |e| failures.fail(py, &op.name, e, Some(&item)),
                );
            }
            Kind::FlatMapBatch => {
                if let Some(held) = pending.get_mut(i) {
                    held.push(item);
                    if held.len() >= BATCH {
                        Chain::run_batch(py, ops, counts, pending, failures, i, emit);
                    }
                }
            }
            Kind::Key => unreachable!("a key step is a KeyStep"),
        }
    }

    /// Calls every batch step with what it holds, first to last (what one gives may fill a
    /// later one's batch).
    fn flush_all(
        py: Python<'_>,
        ops: &[Op],
        counts: &mut [u64],
        pending: &mut [Vec<Obj>],
        failures: &Failures,
        emit: &mut dyn FnMut(Obj),
    ) {
        for i in 0..ops.len() {
            if ops[i].kind == Kind::FlatMapBatch {
                Chain::run_batch(py, ops, counts, pending, failures, i, emit);
            }
        }
    }
}

impl Chain {
    /// Whether the chain has no step.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Runs `item` through every step, uncounted (a Kafka task's chain, shared by workers;
    /// Kafka flows refuse batch steps).
    pub(crate) fn run_all(&self, py: Python<'_>, item: Obj, emit: &mut dyn FnMut(Obj)) {
        Chain::run(
            py,
            &self.ops,
            &mut [],
            &mut [],
            &self.failures,
            0,
            item,
            emit,
        )
    }
}

impl Step<Obj> for Chain {
    type Out = Obj;
    #[inline]
    fn push<E: FnMut(Obj)>(&mut self, item: Obj, emit: &mut E) {
        if self.ops.is_empty() {
            return emit(item);
        }
        let Chain {
            ops,
            counts,
            failures,
            pending,
        } = self;
        Chain::run(py(), ops, counts, pending, failures, 0, item, emit)
    }
    #[inline]
    fn flush<E: FnMut(Obj)>(&mut self, emit: &mut E) {
        if self.pending.iter().all(Vec::is_empty) {
            return;
        }
        let Chain {
            ops,
            counts,
            failures,
            pending,
        } = self;
        Chain::flush_all(py(), ops, counts, pending, failures, emit)
    }
    fn counts(&self, out: &mut Vec<u64>) {
        out.extend_from_slice(&self.counts);
    }
    fn names(&self, out: &mut Vec<String>) {
        out.extend(self.ops.iter().map(|o| o.name.clone()));
    }
}

/// How `key_by` finds a record's key.
pub(crate) enum KeyFn {
    /// A Python function.
    Py(Obj),
    /// `operator.itemgetter(i)`: `record[i]`, looked up in Rust (a tuple's item read in
    /// place).
    Item(Obj, Option<isize>),
}

/// `key_by`: the record goes on with its key, or is dropped (and counted) when the function
/// raises or gives what cannot be a key.
pub(crate) struct KeyStep {
    pub(crate) f: Arc<KeyFn>,
    pub(crate) n: u64,
    pub(crate) name: String,
    pub(crate) failures: Arc<Failures>,
}

impl Clone for KeyStep {
    fn clone(&self) -> Self {
        KeyStep {
            f: self.f.clone(),
            n: 0,
            name: self.name.clone(),
            failures: self.failures.clone(),
        }
    }
}

impl KeyFn {
    /// The key of `item`.
    #[inline]
    pub(crate) fn key(&self, py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<Key> {
        match self {
            KeyFn::Py(f) => Key::of(&f.bind(py).call1((item,))?),
            KeyFn::Item(i, at) => {
                if let (Some(at), Ok(t)) = (at, item.cast_exact::<PyTuple>()) {
                    if (0..t.len() as isize).contains(at) {
                        // SAFETY: `at` is within the tuple; the item is borrowed while the
                        // tuple (held by `item`) lives.
                        let v = unsafe { t.get_borrowed_item_unchecked(*at as usize) };
                        return Key::of(&v);
                    }
                }
                Key::of(&item.get_item(i.bind(py))?)
            }
        }
    }
}

impl Step<Obj> for KeyStep {
    type Out = (Key, Obj);
    #[inline]
    fn push<E: FnMut((Key, Obj))>(&mut self, item: Obj, emit: &mut E) {
        let py = py();
        self.n += 1;
        match self.f.key(py, item.bind(py)) {
            Ok(k) => emit((k, item)),
            Err(e) => self.failures.fail(py, &self.name, &e, Some(&item)),
        }
    }
    fn counts(&self, out: &mut Vec<u64>) {
        out.push(self.n);
    }
    fn names(&self, out: &mut Vec<String>) {
        out.push(self.name.clone());
    }
}

/// `key_by` when the decoder made the key already (read from the record's bytes): counted
/// and named as the key step is, for the metrics.
#[derive(Clone)]
pub(crate) struct KeyedAlready {
    n: u64,
    name: String,
}

impl KeyedAlready {
    pub(crate) fn new(name: String) -> KeyedAlready {
        KeyedAlready { n: 0, name }
    }
}

impl Step<(Key, Obj)> for KeyedAlready {
    type Out = (Key, Obj);
    #[inline]
    fn push<E: FnMut((Key, Obj))>(&mut self, item: (Key, Obj), emit: &mut E) {
        self.n += 1;
        emit(item)
    }
    fn counts(&self, out: &mut Vec<u64>) {
        out.push(self.n);
    }
    fn names(&self, out: &mut Vec<String>) {
        out.push(self.name.clone());
    }
}

/// The end of a pipeline: records encoded for a framed sink, or appended to a Python list.
/// Once `errors="stop"` has stopped the flow, nothing more reaches the sink: records read
/// before the failure was known and still on their way are dropped here.
pub(crate) struct Out {
    pub(crate) to: To,
    pub(crate) stopped: Arc<OnceLock<String>>,
}

/// Where [`Out`] puts a record.
pub(crate) enum To {
    Encode(Encoder, Arc<Failures>),
    /// Encoded as a line: a record holding a newline fails (it would read back as two).
    Line(Encoder, Arc<Failures>),
    Append(Arc<Py<PyList>>),
    /// Counted as delivered, and dropped.
    Discard,
}

impl Clone for Out {
    fn clone(&self) -> Self {
        let to = match &self.to {
            To::Encode(e, f) => To::Encode(e.clone(), f.clone()),
            To::Line(e, f) => To::Line(e.clone(), f.clone()),
            To::Append(l) => To::Append(l.clone()),
            To::Discard => To::Discard,
        };
        Out {
            to,
            stopped: self.stopped.clone(),
        }
    }
}

impl Step<Obj> for Out {
    type Out = Vec<u8>;
    #[inline]
    fn push<E: FnMut(Vec<u8>)>(&mut self, item: Obj, emit: &mut E) {
        if self.stopped.get().is_some() {
            return;
        }
        let py = py();
        match &mut self.to {
            To::Encode(enc, failures) => {
                let mut buf = Vec::new();
                match enc.encode(py, item.bind(py), &mut buf) {
                    Ok(()) => emit(buf),
                    Err(e) => failures.fail(py, "encode", &e, Some(&item)),
                }
            }
            To::Line(enc, failures) => {
                let mut buf = Vec::new();
                match enc.encode(py, item.bind(py), &mut buf) {
                    Ok(()) if !buf.contains(&b'\n') => emit(buf),
                    Ok(()) => {
                        let e = pyo3::exceptions::PyValueError::new_err(
                            "the record holds a newline, and the sink writes lines (it would \
                             read back as two): give file_out frame='u32be', or an encoder \
                             that escapes newlines",
                        );
                        failures.fail(py, "encode", &e, Some(&item))
                    }
                    Err(e) => failures.fail(py, "encode", &e, Some(&item)),
                }
            }
            To::Append(list) => match list.bind(py).append(item) {
                // Nothing to write: the empty record only counts as delivered.
                Ok(()) => emit(Vec::new()),
                Err(e) => e.print(py),
            },
            To::Discard => emit(Vec::new()),
        }
    }
    fn counts(&self, _: &mut Vec<u64>) {}
    fn names(&self, _: &mut Vec<String>) {}
}

/// A step's name: its position, kind and function (`2:map:decode`).
pub(crate) fn step_name(py: Python<'_>, at: usize, kind: Kind, f: &Obj) -> String {
    let mut s = format!("{at}:{}", kind.name());
    if let Ok(n) = f.bind(py).getattr("__name__") {
        let _ = write!(s, ":{n}");
    }
    s
}
