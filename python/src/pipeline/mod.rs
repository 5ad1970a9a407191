//! `canter.pipeline`'s engine side: a flow described in Python (`canter/pipeline.py`) becomes a
//! topology of the Rust pipeline engine. Sources, framing, batching, key routing,
//! backpressure and metrics are the engine's; Python runs only the user's functions, on the
//! worker threads, each of which holds the interpreter lock while it works and gives it up
//! only while its event loop waits (as the HTTP front end's workers do).

mod codec;
mod kafka;
mod key;
mod stateful;
mod steps;
mod wire;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use canter_stream::pipeline::{
    Built, Channel, CheckpointOptions, Emit, Framing, Group, Keyed, KeyedState, Pipeline,
    RunOptions, Running, Sink, Source, Stateful, Step, Topology, WorkerHooks,
};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use codec::{Decoder, Encoder};
use key::Key;
use stateful::{
    Agg, Decoded, Expiring, Final, FinalAgg, Insert, Join, JoinEmit, Logic, Mode, Pass, Pickle,
    SessionWindow, Span, Tag, Update, Window,
};
use steps::{
    step_name, Chain, Failures, KeyFn, KeyStep, KeyedAlready, Kind, Op, Out, Policy, Stopper, To,
};

/// A Python object held by the engine.
pub(crate) type Obj = Py<PyAny>;

/// The interpreter, on a pipeline worker's thread.
#[inline]
pub(crate) fn py() -> Python<'static> {
    debug_assert!(crate::holds_gil());
    // SAFETY: the engine calls the pipeline's steps, decoders, encoders and state factories
    // only on its workers' threads, each of which runs inside `Python::attach` (the hooks of
    // `start`) and holds the interpreter lock except while its event loop is parked, when no
    // step runs.
    unsafe { Python::assume_attached() }
}

thread_local! {
    /// When the input the stateful step is handling was read (ns since the Unix epoch).
    static READ_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Sets what `source_time_ns()` gives during a stateful step's call.
#[inline]
pub(crate) fn set_read_ns(ns: u64) {
    READ_NS.with(|c| c.set(ns));
}

/// When the record being handled by a stateful step (`update`, `with_state`, `stateful_map`,
/// a window's functions) was read from its source, in ns since the Unix epoch; 0 elsewhere.
#[pyfunction]
fn source_time_ns() -> u64 {
    READ_NS.with(std::cell::Cell::get)
}

/// A stateless step as `canter/pipeline.py` describes it: kind, function, and the name the
/// user gave it (if any).
type StepSpec<'py> = (String, Bound<'py, PyAny>, Option<String>);

/// One pipeline as `canter/pipeline.py` describes it.
struct Spec<'py> {
    name: String,
    source: Bound<'py, PyAny>,
    decode: Bound<'py, PyAny>,
    pre: Vec<StepSpec<'py>>,
    key: Option<Bound<'py, PyAny>>,
    stateful: Option<Bound<'py, PyAny>>,
    post: Vec<StepSpec<'py>>,
    sink: Bound<'py, PyAny>,
    /// The names the user gave `key_by` and the stateful step.
    key_name: Option<String>,
    stateful_name: Option<String>,
}

fn item<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, k: &str) -> PyResult<T> {
    d.get_item(k)?
        .ok_or_else(|| PyValueError::new_err(format!("pipeline spec without {k:?}")))?
        .extract()
        .map_err(Into::into)
}

use pyo3::conversion::FromPyObjectOwned;

fn addr(s: &str) -> PyResult<SocketAddr> {
    s.to_socket_addrs()
        .map_err(|e| PyOSError::new_err(format!("{s}: {e}")))?
        .next()
        .ok_or_else(|| PyOSError::new_err(format!("{s}: no address")))
}

fn framing(kind: &str, max: usize) -> PyResult<Framing> {
    match kind {
        "u32be" => Ok(Framing::LengthPrefixed { max }),
        "lines" => Ok(Framing::Lines { max }),
        other => Err(PyValueError::new_err(format!(
            "unknown framing {other:?} (u32be or lines)"
        ))),
    }
}

fn source(spec: &Bound<'_, PyAny>) -> PyResult<Source> {
    let kind: String = spec.get_item(0)?.extract()?;
    if kind == "iterable" {
        // Record i is the index of the list's item i (the decoder looks it up).
        let count: u64 = spec.get_item(1)?.extract()?;
        return Ok(Source::generate(count, |i, buf| {
            buf.extend_from_slice(&i.to_le_bytes())
        }));
    }
    let frame: String = spec.get_item(2)?.extract()?;
    let max: usize = spec.get_item(3)?.extract()?;
    let framing = framing(&frame, max)?;
    match kind.as_str() {
        "tcp" => Ok(Source::Tcp {
            addr: addr(&spec.get_item(1)?.extract::<String>()?)?,
            framing,
        }),
        "file" => Ok(Source::File {
            path: spec.get_item(1)?.extract::<String>()?.into(),
            framing,
        }),
        other => Err(PyValueError::new_err(format!("unknown source {other:?}"))),
    }
}

/// The sink and the last step before it (encoding, or appending to a list).
fn sink(
    py: Python<'_>,
    spec: &Bound<'_, PyAny>,
    failures: &Arc<Failures>,
) -> PyResult<(Sink<Vec<u8>>, Out)> {
    let kind: String = spec.get_item(0)?.extract()?;
    let copy = |v: &Vec<u8>, buf: &mut Vec<u8>| buf.extend_from_slice(v);
    let out = |to| Out {
        to,
        stopped: failures.stopped.clone(),
    };
    match kind.as_str() {
        "tcp" | "file" => {
            let enc = Encoder::from_spec(py, &spec.get_item(2)?)?;
            let target: String = spec.get_item(1)?.extract()?;
            let lines = spec
                .get_item(3)
                .ok()
                .and_then(|f| f.extract::<String>().ok())
                .is_some_and(|f| f == "lines");
            Ok(match (kind.as_str(), lines) {
                ("tcp", _) => (
                    Sink::tcp(addr(&target)?, copy),
                    out(To::Encode(enc, failures.clone())),
                ),
                (_, false) => (
                    Sink::file(target, copy),
                    out(To::Encode(enc, failures.clone())),
                ),
                (_, true) => (
                    Sink::file_lines(target, copy),
                    out(To::Line(enc, failures.clone())),
                ),
            })
        }
        "list" => {
            let list = spec.get_item(1)?.cast_into::<PyList>()?.unbind();
            Ok((Sink::discard(), out(To::Append(Arc::new(list)))))
        }
        "discard" => Ok((Sink::discard(), out(To::Discard))),
        "kafka" => Err(PyValueError::new_err(
            "kafka_out takes the results of Kafka sources (a flow is all Kafka or none)",
        )),
        other => Err(PyValueError::new_err(format!("unknown sink {other:?}"))),
    }
}

fn chain(
    py: Python<'_>,
    ops: &[StepSpec<'_>],
    first: usize,
    failures: &Arc<Failures>,
) -> PyResult<Chain> {
    let ops = ops
        .iter()
        .enumerate()
        .map(|(i, (kind, f, named))| {
            let kind = Kind::parse(kind)?;
            let f = f.clone().unbind();
            Ok(Op {
                kind,
                // The name the user gave (Bytewax's step_id), or position, kind and function.
                name: match named {
                    Some(n) => n.clone(),
                    None => step_name(py, first + i, kind, &f),
                },
                f,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Chain::new(ops.into(), failures.clone()))
}

/// A `key_by` function and its step name (`3:key_by:name`).
fn key_fn(py: Python<'_>, key: &Bound<'_, PyAny>, at: usize) -> PyResult<(KeyFn, String)> {
    Ok(match key.extract::<(String, Bound<'_, PyAny>)>() {
        // ("item", i): operator.itemgetter(i), looked up in Rust.
        Ok((kind, i)) if kind == "item" => {
            let name = format!("{at}:key_by:itemgetter({})", i.repr()?);
            (
                KeyFn::Item(i.clone().unbind(), i.extract::<isize>().ok()),
                name,
            )
        }
        _ => {
            let name = step_name(py, at, Kind::Key, &key.clone().unbind());
            (KeyFn::Py(key.clone().unbind()), name)
        }
    })
}

/// The most windows one record goes into (size / slide of a sliding window).
const MAX_WINDOWS_PER_RECORD: f64 = 10_000.0;

/// The shared keyed states, by the id Python gave each.
type States = HashMap<u64, Shared>;

/// A keyed state of the flow, and how a key's state is made: `factory()`, or `missing` when
/// the factory raised (the record that needed it fails, and the next one of the key tries
/// again).
#[derive(Clone)]
struct Shared {
    state: KeyedState<Key, Obj>,
    factory: Arc<Obj>,
    missing: Arc<Obj>,
}

/// The flow's channels between its pipelines, by the id Python gave each.
type Channels = HashMap<u64, Channel<Obj>>;

/// The channel of `id`, made on first use.
fn channel(channels: &mut Channels, id: u64) -> Channel<Obj> {
    channels
        .entry(id)
        .or_insert_with(|| Channel::with_clone(|o: &Obj| o.clone_ref(py())))
        .clone()
}

/// Where a spec's outputs go.
fn end(
    py: Python<'_>,
    spec: &Bound<'_, PyAny>,
    failures: &Arc<Failures>,
    channels: &mut Channels,
) -> PyResult<End> {
    let kind: String = spec.get_item(0)?.extract()?;
    match kind.as_str() {
        "channel" => Ok(End::Objs(Sink::channel(&channel(
            channels,
            spec.get_item(1)?.extract()?,
        )))),
        "branch" => {
            let pred = Arc::new(spec.get_item(1)?.unbind());
            let yes = channel(channels, spec.get_item(2)?.extract()?);
            let no = channel(channels, spec.get_item(3)?.extract()?);
            let fails = failures.clone();
            // A predicate that raises fails the record (it goes to neither side).
            let side = move |o: &Obj| -> Option<bool> {
                let py = py_static();
                match pred
                    .bind(py)
                    .call1((o.bind(py),))
                    .and_then(|r| r.is_truthy())
                {
                    Ok(b) => Some(b),
                    Err(e) => {
                        fails.fail(py, "branch", &e, Some(o));
                        None
                    }
                }
            };
            Ok(End::Objs(Sink::branch(
                move |o: &Obj| side(o) == Some(true),
                &yes,
                &no,
            )))
        }
        _ => {
            let (sink, out) = sink(py, spec, failures)?;
            Ok(End::Bytes(sink, out))
        }
    }
}

/// A pipeline that keeps no state: its steps, on the worker that read each record.
fn local<D, E>(
    p: Pipeline<Obj, D, canter_stream::pipeline::Id<Obj>>,
    pre: Chain,
    post: Chain,
    end: End,
) -> Built
where
    E: std::fmt::Display,
    D: FnMut(&[u8]) -> Result<Obj, E> + Clone + Send + 'static,
{
    // No state to keep: its codec writes nothing (checkpoints need one for every state, each
    // of its own name).
    let pass = KeyedState::new(
        &format!("{} pass", p.name()),
        |_: &canter_stream::pipeline::Local| (),
    )
    .checkpointed(
        |_, _| {},
        |_| Some(canter_stream::pipeline::Local),
        |_, _| {},
        |_| Some(()),
    );
    let tail = p
        .step(pre)
        .local()
        .update(&pass, |_: &mut (), x: Obj, out: &mut Emit<'_, Obj>| {
            out.emit(x)
        })
        .step(post);
    match end {
        End::Bytes(sink, out) => tail.step(out).sink(sink),
        End::Objs(sink) => tail.sink(sink),
    }
}

#[allow(clippy::too_many_arguments)]
fn build(
    py: Python<'_>,
    s: Spec<'_>,
    states: &States,
    failures: Arc<Failures>,
    grouped: bool,
    channels: &mut Channels,
    pickle: &Arc<Pickle>,
) -> PyResult<Built> {
    let pre = chain(py, &s.pre, 1, &failures)?;
    let end = end(py, &s.sink, &failures, channels)?;
    let from: Option<u64> = match s.source.get_item(0)?.extract::<String>()?.as_str() {
        "channel" => Some(s.source.get_item(1)?.extract()?),
        _ => None,
    };
    let Some(key) = s.key else {
        if s.stateful.is_some() {
            return Err(PyValueError::new_err("a stateful step needs key_by first"));
        }
        let post = chain(py, &s.post, s.pre.len() + 1, &failures)?;
        if let Some(id) = from {
            let ch = channel(channels, id);
            return Ok(local(Pipeline::from_channel(&s.name, &ch), pre, post, end));
        }
        let src = source(&s.source)?;
        let dec = Decoder::from_spec(py, &s.decode)?;
        let mut cache = codec::Interner::default();
        let fails = failures.clone();
        let decode = move |rec: &[u8]| {
            dec.decode_cached(py_static(), rec, &mut cache)
                .map_err(|e| failed(&fails, rec, e.to_string()))
        };
        return Ok(local(Pipeline::new(&s.name, src, decode), pre, post, end));
    };
    let (f, name) = key_fn(py, &key, s.pre.len() + 1)?;
    let name = s.key_name.clone().unwrap_or(name);
    let post = chain(py, &s.post, s.pre.len() + 3, &failures)?;
    let stage = match s.stateful {
        Some(st) => stage(
            &st,
            &s.name,
            s.pre.len(),
            s.stateful_name.as_deref(),
            states,
            failures.clone(),
            pickle,
        )?,
        // key_by straight to the sink: records are routed by key, with no state.
        None => Stage::Pass(Pass::new(&format!("{} pass", s.name))),
    };
    if let Some(id) = from {
        let ch = channel(channels, id);
        let key_step = KeyStep {
            name,
            f: Arc::new(f),
            n: 0,
            failures: failures.clone(),
        };
        let keyed = Pipeline::from_channel(&s.name, &ch)
            .step(pre)
            .step(key_step)
            .key_by(|(k, _): &(Key, Obj)| k.clone())
            .wire(wire::PyWire::new(py)?);
        return Ok(stage.attach(ObjHead(keyed), post, end));
    }
    let src = source(&s.source)?;
    let dec = Decoder::from_spec(py, &s.decode)?;
    // In a group of processes, a record whose key can be read from its bytes (a `struct`
    // decoder, no step before `key_by`, an `itemgetter` key of a bytes or integer field)
    // crosses raw and is decoded by its owner: nothing is pickled, and the decoding is
    // shared out.
    let raw = match (&dec, &f) {
        (Decoder::Struct(format), KeyFn::Item(_, Some(i))) if grouped && s.pre.is_empty() => {
            format.key_field(*i).map(|k| (format.clone(), k))
        }
        _ => None,
    };
    if let Some((format, field)) = raw {
        let size = format.size();
        let fails = failures.clone();
        let decode = move |rec: &[u8]| {
            if rec.len() != size {
                let why = format!("record of {} bytes, the format takes {size}", rec.len());
                return Err(failed(&fails, rec, why));
            }
            let k = field.key(rec).map_err(|e| failed(&fails, rec, e))?;
            Ok((k, wire::Raw(rec.into())))
        };
        let keyed = Pipeline::new(&s.name, src, decode)
            .key_by(|(k, _): &(Key, wire::Raw)| k.clone())
            .wire(wire::RawWire);
        return Ok(stage.attach(RawHead(keyed, format, failures), post, end));
    }
    // In one process, the same key read from the record's bytes as it is decoded: no Python
    // item lookup and no key made of a Python value (fields whose key cannot fail only: a
    // u64 past i64 is a failed record of the key step, as when read from the value).
    let direct = match (&dec, &f) {
        (Decoder::Struct(format), KeyFn::Item(_, Some(i))) if s.pre.is_empty() => {
            format.key_field(*i).filter(|k| k.infallible())
        }
        _ => None,
    };
    if let Some(field) = direct {
        let mut cache = codec::Interner::default();
        let fails = failures.clone();
        let decode = move |rec: &[u8]| {
            let item = dec
                .decode_cached(py_static(), rec, &mut cache)
                .map_err(|e| failed(&fails, rec, e.to_string()))?;
            let key = field.key(rec).map_err(|e| failed(&fails, rec, e))?;
            Ok::<_, String>((key, item))
        };
        let keyed = Pipeline::new(&s.name, src, decode)
            .step(KeyedAlready::new(name))
            .key_by(|(k, _): &(Key, Obj)| k.clone())
            .wire(wire::PyWire::new(py)?);
        return Ok(stage.attach(ObjHead(keyed), post, end));
    }
    let mut cache = codec::Interner::default();
    let fails = failures.clone();
    let decode = move |rec: &[u8]| {
        dec.decode_cached(py_static(), rec, &mut cache)
            .map_err(|e| failed(&fails, rec, e.to_string()))
    };
    let key_step = KeyStep {
        name,
        f: Arc::new(f),
        n: 0,
        failures: failures.clone(),
    };
    let keyed = Pipeline::new(&s.name, src, decode)
        .step(pre)
        .step(key_step)
        .key_by(|(k, _): &(Key, Obj)| k.clone())
        .wire(wire::PyWire::new(py)?);
    Ok(stage.attach(ObjHead(keyed), post, end))
}

/// A record the decoder refused: through the flow's `errors=` policy, then back to the engine
/// (which counts it as rejected input).
fn failed(failures: &Failures, rec: &[u8], why: String) -> String {
    failures.decode_failed(rec, &why);
    why
}

/// A keyed pipeline's stateful step, as built from its spec.
enum Stage {
    Pass(Pass),
    Update(Update),
    Window(Window),
    Final(Final),
    Tag(Tag),
    Join(Join),
    Session(SessionWindow),
    Logic(Logic),
    Expiring(Expiring<Update>),
}

impl Stage {
    /// The pipeline: `head`, this step, the steps after it and the sink.
    fn attach<H: Attach>(self, head: H, post: Chain, end: End) -> Built {
        match self {
            Stage::Pass(u) => head.attach(u, post, end),
            Stage::Update(u) => head.attach(u, post, end),
            Stage::Window(u) => head.attach(u, post, end),
            Stage::Final(u) => head.attach(u, post, end),
            Stage::Tag(u) => head.attach(u, post, end),
            Stage::Join(u) => head.attach(u, post, end),
            Stage::Session(u) => head.attach(u, post, end),
            Stage::Logic(u) => head.attach(u, post, end),
            Stage::Expiring(u) => head.attach(u, post, end),
        }
    }
}

/// Where a pipeline's outputs go: encoded to a sink of bytes (or appended to a list), or as
/// Python objects into a channel to other pipelines of the flow.
enum End {
    Bytes(Sink<Vec<u8>>, Out),
    Objs(Sink<Obj>),
}

/// A keyed head, ready for its stateful step: records decoded into Python objects, or raw
/// records crossing a group (decoded by their owner).
trait Attach {
    fn attach<U>(self, step: U, post: Chain, end: End) -> Built
    where
        U: Stateful<Key, (Key, Obj), Out = Obj>;
}

struct ObjHead<H>(H);

impl<T, E, D, C, KF> Attach for ObjHead<Keyed<T, D, C, KF, Key>>
where
    T: 'static,
    E: std::fmt::Display,
    D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
    C: Step<T, Out = (Key, Obj)>,
    KF: FnMut(&(Key, Obj)) -> Key + Clone + Send + 'static,
{
    fn attach<U>(self, step: U, post: Chain, end: End) -> Built
    where
        U: Stateful<Key, (Key, Obj), Out = Obj>,
    {
        let tail = self.0.stateful(step).step(post);
        match end {
            End::Bytes(sink, out) => tail.step(out).sink(sink),
            End::Objs(sink) => tail.sink(sink),
        }
    }
}

struct RawHead<H>(H, codec::Format, Arc<Failures>);

impl<T, E, D, C, KF> Attach for RawHead<Keyed<T, D, C, KF, Key>>
where
    T: 'static,
    E: std::fmt::Display,
    D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
    C: Step<T, Out = (Key, wire::Raw)>,
    KF: FnMut(&(Key, wire::Raw)) -> Key + Clone + Send + 'static,
{
    fn attach<U>(self, step: U, post: Chain, end: End) -> Built
    where
        U: Stateful<Key, (Key, Obj), Out = Obj>,
    {
        let RawHead(keyed, format, failures) = self;
        let tail = keyed
            .stateful(Decoded {
                inner: step,
                format,
                cache: codec::Interner::default(),
                failures,
            })
            .step(post);
        match end {
            End::Bytes(sink, out) => tail.step(out).sink(sink),
            End::Objs(sink) => tail.sink(sink),
        }
    }
}

/// The stateful step of a spec: `update`, `stateful_map` or a window.
fn stage(
    st: &Bound<'_, PyAny>,
    pipe: &str,
    pre: usize,
    named: Option<&str>,
    states: &States,
    failures: Arc<Failures>,
    pickle: &Arc<Pickle>,
) -> PyResult<Stage> {
    let kind: String = st.get_item(0)?.extract()?;
    // The step's own state, by the pipeline's name (a checkpoint holds each state by its name).
    let state = format!("{pipe} {kind}");
    let name: Arc<str> = match named {
        Some(n) => n.into(),
        None => format!("{}:{kind}", pre + 2).into(),
    };
    match kind.as_str() {
        "update" | "stateful_map" => {
            let id: u64 = st.get_item(1)?.extract()?;
            let shared = states
                .get(&id)
                .ok_or_else(|| PyValueError::new_err("a state of another flow"))?
                .clone();
            // `with_state`: an update that only reads the state (any value will do).
            let read_only =
                st.get_item(3).ok().and_then(|v| v.extract::<bool>().ok()) == Some(true);
            let on_eof = st.get_item(4).ok().filter(|f| !f.is_none());
            // ("update", id, f, read_only, on_eof, ttl seconds or None)
            let ttl = match st.get_item(5).ok().filter(|t| !t.is_none()) {
                Some(t) => {
                    let t: f64 = t.extract()?;
                    if t.is_nan() || t <= 0.0 {
                        return Err(PyValueError::new_err(format!(
                            "{kind}(): ttl= is seconds, more than 0, not {t}"
                        )));
                    }
                    Some((t * 1e9).min(u64::MAX as f64) as u64)
                }
                None => None,
            };
            let step = Update {
                state: shared.state,
                factory: shared.factory,
                missing: shared.missing,
                f: Arc::new(st.get_item(2)?.unbind()),
                on_eof: on_eof.map(|f| Arc::new(f.unbind())),
                mode: match (kind.as_str(), read_only) {
                    ("update", false) => Mode::InPlace,
                    ("update", true) => Mode::Read,
                    _ => Mode::Replace,
                },
                name,
                failures,
            };
            Ok(match ttl {
                Some(ttl) => Stage::Expiring(Expiring { inner: step, ttl }),
                None => Stage::Update(step),
            })
        }
        "window" => {
            let by: String = st.get_item(1)?.extract()?;
            let (size, slide): (f64, f64) =
                (st.get_item(2)?.extract()?, st.get_item(3)?.extract()?);
            let time = st.get_item(4)?;
            // Each record goes into size / slide windows: bounded, so that no record (and no
            // event time a peer sends) costs more than that many folds.
            if size / slide > MAX_WINDOWS_PER_RECORD {
                return Err(PyValueError::new_err(format!(
                    "a window's size is at most {MAX_WINDOWS_PER_RECORD} times its slide"
                )));
            }
            let span = match by.as_str() {
                "count" => {
                    if size < 1.0 || slide < 1.0 || size.fract() != 0.0 || slide.fract() != 0.0 {
                        return Err(PyValueError::new_err(
                            "a count window's size and slide are whole numbers of at least 1",
                        ));
                    }
                    Span::Count {
                        size: size as u64,
                        slide: slide as u64,
                    }
                }
                "time" => {
                    // Any positive size: past the range of event times (±292 years in ns),
                    // one window holds them all.
                    let ns = |s: f64| (s * 1e9).round().min(i64::MAX as f64) as i64;
                    if !(size > 0.0 && slide > 0.0) {
                        return Err(PyValueError::new_err(format!(
                            "a time window's size and slide are positive seconds, not size \
                             {size} and slide {slide}"
                        )));
                    }
                    if ns(slide) < 1 {
                        return Err(PyValueError::new_err(format!(
                            "a time window's slide is at least 1 ns, not {slide} s"
                        )));
                    }
                    // How long (event time) a window waits for records that come out of order.
                    let wait: f64 = match st.get_item(9) {
                        Ok(w) if !w.is_none() => w.extract()?,
                        _ => 0.0,
                    };
                    if !(wait >= 0.0 && wait.is_finite()) {
                        return Err(PyValueError::new_err(format!(
                            "a time window's wait is zero or more seconds, not {wait}"
                        )));
                    }
                    Span::Time {
                        size: ns(size),
                        slide: ns(slide),
                        wait: ns(wait),
                    }
                }
                other => return Err(PyValueError::new_err(format!("unknown window {other:?}"))),
            };
            let agg = Agg::from_spec(st.get_item(5)?, st.get_item(6)?, st.get_item(7)?);
            let late_out = st
                .get_item(8)
                .ok()
                .filter(|f| !f.is_none())
                .map(|f| Arc::new(f.unbind()));
            // Count windows: whether one still short at the end of the input is emitted.
            let partial = match st.get_item(10) {
                Ok(p) if !p.is_none() => p.extract()?,
                _ => true,
            };
            let step = Window {
                state: stateful::windows_codec(Window::new_state(&state), pickle),
                span,
                time: (!time.is_none()).then(|| Arc::new(time.unbind())),
                agg: Arc::new(agg),
                name,
                failures,
                late: 0,
                late_out,
                partial,
                dropped: 0,
            };
            Ok(Stage::Window(step))
        }
        "final" => {
            let what: String = st.get_item(1)?.extract()?;
            let (a, b) = (st.get_item(2)?.unbind(), st.get_item(3)?.unbind());
            // The caller's token: `stage` runs on the thread that starts the flow, not on a
            // worker (where `py_static` may be called).
            let py = st.py();
            let by = |f: Obj| (!f.is_none(py)).then_some(f);
            let agg = match what.as_str() {
                "count" => FinalAgg::Count,
                "fold" => FinalAgg::Fold { init: a, fold: b },
                "reduce" => FinalAgg::Reduce(a),
                "max" => FinalAgg::Max(by(a)),
                "min" => FinalAgg::Min(by(a)),
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown final aggregation {other:?}"
                    )))
                }
            };
            let name: Arc<str> = match named {
                Some(n) => n.into(),
                None => format!("{}:{what}_final", pre + 2).into(),
            };
            Ok(Stage::Final(Final {
                state: stateful::acc_codec(Final::new_state(&state), pickle),
                agg: Arc::new(agg),
                name,
                failures,
            }))
        }
        "session" => {
            // ("session", gap, time, init, fold, reduce, merge, late, wait)
            let gap: f64 = st.get_item(1)?.extract()?;
            let wait: f64 = st.get_item(8)?.extract()?;
            for (what, v) in [("gap", gap), ("wait", wait)] {
                if v.is_nan() || v < 0.0 {
                    return Err(PyValueError::new_err(format!(
                        "session_window(): {what}= is seconds, 0 or more, not {v}"
                    )));
                }
            }
            let ns = |s: f64| (s * 1e9).round().min(i64::MAX as f64) as i64;
            let agg = Agg::from_spec(st.get_item(3)?, st.get_item(4)?, st.get_item(5)?);
            let opt = |i: usize| {
                st.get_item(i)
                    .ok()
                    .filter(|f| !f.is_none())
                    .map(|f| Arc::new(f.unbind()))
            };
            Ok(Stage::Session(SessionWindow {
                state: stateful::sessions_codec(SessionWindow::new_state(&state), pickle),
                gap: ns(gap),
                wait: ns(wait),
                time: Arc::new(st.get_item(2)?.unbind()),
                agg: Arc::new(agg),
                merge: opt(6),
                name,
                failures,
                late: 0,
                late_out: opt(7),
            }))
        }
        "logic" => {
            let builder = Arc::new(st.get_item(1)?.unbind());
            Ok(Stage::Logic(Logic {
                state: stateful::logic_codec(Logic::new_state(&state), pickle, builder.clone()),
                builder,
                name,
                failures,
            }))
        }
        "tag" => Ok(Stage::Tag(Tag {
            // No state to keep: its codec writes nothing but the key.
            state: KeyedState::new(&state, |_: &Key| ()).checkpointed(
                |k: &Key, b: &mut Vec<u8>| k.tagged_bytes(b),
                |b: &[u8]| Key::from_tagged(b),
                |_, _| {},
                |_| Some(()),
            ),
            side: st.get_item(1)?.extract()?,
        })),
        "join" => {
            let sides: usize = st.get_item(1)?.extract()?;
            let insert = match st.get_item(2)?.extract::<String>()?.as_str() {
                "first" => Insert::First,
                "last" => Insert::Last,
                "product" => Insert::Product,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "join(): insert= is 'first', 'last' or 'product', not {other:?}"
                    )))
                }
            };
            let when = match st.get_item(3)?.extract::<String>()?.as_str() {
                "complete" => JoinEmit::Complete,
                "final" => JoinEmit::Final,
                "running" => JoinEmit::Running,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "join(): emit= is 'complete', 'final' or 'running', not {other:?}"
                    )))
                }
            };
            Ok(Stage::Join(Join {
                state: stateful::join_codec(Join::new_state(&state, sides), pickle),
                sides,
                insert,
                when,
                name,
                failures,
            }))
        }
        other => Err(PyValueError::new_err(format!(
            "unknown stateful step {other:?}"
        ))),
    }
}

/// `py()` for closures that outlive the `Python` token they were made with.
#[inline]
fn py_static() -> Python<'static> {
    py()
}

/// What runs a flow: the pipeline engine's workers (TCP and file sources), or a Kafka job.
enum Engine {
    Pipes {
        running: Option<Running>,
        metrics: Arc<canter_stream::pipeline::Metrics>,
    },
    Kafka {
        running: Option<canter_stream::kafka::KafkaRunning>,
        stats: Arc<canter_stream::kafka::Stats>,
    },
}

impl Engine {
    /// Takes the ended run's result once every worker has ended; None while running.
    fn ended(&mut self) -> Option<Result<(), String>> {
        match self {
            Engine::Pipes { running, .. } => match running {
                Some(r) if !r.is_finished() => None,
                Some(_) => running.take().map(|r| r.wait().map_err(|e| e.to_string())),
                None => Some(Ok(())),
            },
            Engine::Kafka { running, .. } => match running {
                Some(r) if !r.is_finished() => None,
                Some(_) => running.take().map(|r| r.wait().map_err(|e| e.to_string())),
                None => Some(Ok(())),
            },
        }
    }
}

/// A running flow (`canter.pipeline.Flow.start`).
#[pyclass(module = "canter._native")]
pub(crate) struct FlowHandle {
    engine: Mutex<Engine>,
    stop: Arc<dyn Fn() + Send + Sync>,
    /// Stops it, not as the end of its input (see `interrupt`).
    interrupt: Arc<dyn Fn() + Send + Sync>,
    addrs: Vec<(String, Option<SocketAddr>)>,
    failures: Vec<Arc<Failures>>,
    stopped: Arc<OnceLock<String>>,
    result: Mutex<Option<Result<(), String>>>,
    metrics_server: Mutex<Option<canter_rt::ShutdownHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl FlowHandle {
    /// Where each pipeline's TCP source listens: `{name: (host, port)}`.
    fn addrs(&self) -> HashMap<String, (String, u16)> {
        self.addrs
            .iter()
            .filter_map(|(n, a)| a.map(|a| (n.clone(), (a.ip().to_string(), a.port()))))
            .collect()
    }

    /// Waits up to `timeout` seconds (forever if None) for the flow to end, with the lock
    /// released; True once it has ended.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let done = py.detach(|| loop {
            if let Some(out) = lock(&self.engine).ended() {
                let mut result = lock(&self.result);
                if result.is_none() {
                    *result = Some(out);
                }
                if let Some(h) = lock(&self.metrics_server).take() {
                    h.shutdown();
                }
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        });
        if !done {
            return Ok(false);
        }
        if let Some(why) = self.stopped.get() {
            return Err(PipelineError::new_err(why.clone()));
        }
        match &*lock(&self.result) {
            Some(Err(e)) => Err(PyRuntimeError::new_err(e.clone())),
            _ => Ok(true),
        }
    }

    /// Stops the flow: sources stop reading, what is in flight is delivered (Kafka: the
    /// workers commit what they processed and leave the group).
    fn shutdown(&self) {
        (self.stop)();
    }

    /// Stops the flow as `shutdown` does, but not as the end of its input: final
    /// aggregations, `emit="final"` joins, open windows and `on_eof` hooks emit nothing (a
    /// stop by a signal). Kafka flows: as `shutdown`.
    fn interrupt(&self) {
        (self.interrupt)();
    }

    /// Counts per pipeline: `{name: {"source": n, "rejected": n, "failed": n, "sink": n,
    /// "late": n, "dropped_windows": n}}` and `"checkpoints": {"completed": n, "failed": n,
    /// "restored_epoch": n}`;
    /// a Kafka flow's pipelines have only "failed", and the job's counters are under "kafka"
    /// (`records_in`, `records_out`, `refused`, `commits`, ...).
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let out = PyDict::new(py);
        let engine = lock(&self.engine);
        for f in &self.failures {
            let d = PyDict::new(py);
            if let Engine::Pipes { metrics, .. } = &*engine {
                if let Some(t) = metrics.totals(&f.pipeline) {
                    d.set_item("source", t.source_records)?;
                    d.set_item("rejected", t.rejected_input)?;
                    d.set_item("frame_errors", t.frame_errors)?;
                    d.set_item("sink", t.sink_records)?;
                    d.set_item("late", t.late_records)?;
                    d.set_item("dropped_windows", t.dropped_windows)?;
                }
            }
            d.set_item("failed", f.count.load(Ordering::Relaxed))?;
            out.set_item(&*f.pipeline, d)?;
        }
        if let Engine::Pipes { metrics, .. } = &*engine {
            let c = metrics.checkpoints();
            let d = PyDict::new(py);
            d.set_item("completed", c.completed)?;
            d.set_item("failed", c.failed)?;
            d.set_item("restored_epoch", c.restored_epoch)?;
            out.set_item("checkpoints", d)?;
        }
        if let Engine::Kafka { stats, .. } = &*engine {
            let json: serde_json::Value =
                serde_json::from_str(&stats.json()).unwrap_or(serde_json::Value::Null);
            let d = PyDict::new(py);
            if let serde_json::Value::Object(m) = json {
                for (k, v) in m {
                    d.set_item(k, v.as_u64().unwrap_or(0))?;
                }
            }
            out.set_item("kafka", d)?;
        }
        Ok(out.unbind())
    }

    /// The metrics as Prometheus text.
    fn prometheus(&self) -> String {
        match &*lock(&self.engine) {
            Engine::Pipes { metrics, .. } => prometheus(metrics, &self.failures),
            Engine::Kafka { stats, .. } => stats.prometheus() + &failed_text(&self.failures),
        }
    }

    /// The metrics as JSON.
    fn metrics_json(&self) -> String {
        match &*lock(&self.engine) {
            Engine::Pipes { metrics, .. } => metrics.json(),
            Engine::Kafka { stats, .. } => stats.json(),
        }
    }
}

fn prometheus(metrics: &canter_stream::pipeline::Metrics, failures: &[Arc<Failures>]) -> String {
    metrics.prometheus() + &failed_text(failures)
}

/// `canter_pipeline_failed_total` per pipeline.
fn failed_text(failures: &[Arc<Failures>]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    s.push_str("# HELP canter_pipeline_failed_total Records dropped because a Python function raised.\n# TYPE canter_pipeline_failed_total counter\n");
    for f in failures {
        let _ = writeln!(
            s,
            "canter_pipeline_failed_total{{pipeline=\"{}\"}} {}",
            f.pipeline,
            f.count.load(Ordering::Relaxed)
        );
    }
    s
}

pyo3::create_exception!(
    canter,
    PipelineError,
    pyo3::exceptions::PyException,
    "A flow stopped by an exception in a user function (`errors=\"stop\"`)."
);

/// `state` in checkpoints: keys tagged (`Key::tagged_bytes`), states pickled.
fn pickled(py: Python<'_>, state: KeyedState<Key, Obj>) -> PyResult<KeyedState<Key, Obj>> {
    let pickle = py.import("pickle")?;
    let (dumps, loads) = (
        Arc::new(pickle.getattr("dumps")?.unbind()),
        Arc::new(pickle.getattr("loads")?.unbind()),
    );
    Ok(state.checkpointed(
        |k: &Key, b: &mut Vec<u8>| k.tagged_bytes(b),
        |b: &[u8]| Key::from_tagged(b),
        move |s: &Obj, b: &mut Vec<u8>| {
            let py = py_static();
            match dumps.bind(py).call1((s.bind(py),)) {
                Ok(v) => match v.cast::<pyo3::types::PyBytes>() {
                    Ok(v) => b.extend_from_slice(v.as_bytes()),
                    Err(e) => tracing::error!("pickle.dumps gave no bytes: {e}"),
                },
                Err(e) => tracing::error!("a keyed state cannot be pickled for a checkpoint: {e}"),
            }
        },
        move |b: &[u8]| {
            let py = py_static();
            loads
                .bind(py)
                .call1((pyo3::types::PyBytes::new(py, b),))
                .map(Bound::unbind)
                .map_err(|e| tracing::error!("a checkpointed state did not unpickle: {e}"))
                .ok()
        },
    ))
}

/// The hooks that make each worker thread hold the interpreter lock while it works.
fn gil_hooks() -> WorkerHooks {
    WorkerHooks {
        run: Arc::new(|_me, run| {
            Python::attach(|_py| {
                crate::set_holds_gil(true);
                let r = run();
                crate::set_holds_gil(false);
                r
            })
        }),
        park: crate::park_hooks(),
    }
}

fn specs<'py>(pipelines: &Bound<'py, PyList>) -> PyResult<Vec<Spec<'py>>> {
    pipelines
        .iter()
        .map(|p| {
            let d = p.cast_into::<PyDict>()?;
            let d = &d;
            Ok(Spec {
                name: item(d, "name")?,
                source: item(d, "source")?,
                decode: item(d, "decode")?,
                pre: item(d, "pre")?,
                key: item(d, "key")?,
                stateful: item(d, "stateful")?,
                post: item(d, "post")?,
                sink: item(d, "sink")?,
                key_name: d.get_item("key_name")?.and_then(|n| n.extract().ok()),
                stateful_name: d.get_item("stateful_name")?.and_then(|n| n.extract().ok()),
            })
        })
        .collect()
}

/// Starts a flow described by `canter/pipeline.py` on `workers` worker threads; returns its
/// handle at once. A flow whose sources are Kafka topics runs as a Kafka job (`kafka`: its
/// settings).
#[pyfunction]
#[pyo3(signature = (pipelines, states, workers, errors, metrics=None, kafka=None, checkpoint=None, group=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_flow(
    py: Python<'_>,
    pipelines: &Bound<'_, PyList>,
    states: &Bound<'_, PyDict>,
    workers: usize,
    errors: &Bound<'_, PyAny>,
    metrics: Option<String>,
    kafka: Option<&Bound<'_, PyDict>>,
    checkpoint: Option<(String, f64, usize)>,
    group: Option<(usize, usize, String)>,
) -> PyResult<FlowHandle> {
    crate::init_logging();
    let policy = Arc::new(if let Ok(s) = errors.extract::<String>() {
        match s.as_str() {
            "skip" => Policy::Skip,
            "stop" => Policy::Stop,
            other => {
                return Err(PyValueError::new_err(format!(
                    "errors={other:?}: \"skip\", \"stop\" or canter.pipeline.dead_letter(path)"
                )))
            }
        }
    } else {
        let path: String = errors.get_item(1)?.extract()?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| PyOSError::new_err(format!("dead-letter file {path}: {e}")))?;
        Policy::DeadLetter(Mutex::new(f))
    });
    let specs = specs(pipelines)?;
    let stop: Stopper = Arc::new(OnceLock::new());
    let stopped: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let failures: Vec<Arc<Failures>> = specs
        .iter()
        .map(|s| {
            Arc::new(Failures::new(
                &s.name,
                policy.clone(),
                stop.clone(),
                stopped.clone(),
            ))
        })
        .collect();
    let source_is = |s: &Spec<'_>, kind: &str| {
        s.source
            .get_item(0)
            .and_then(|k| k.extract::<String>())
            .is_ok_and(|k| k == kind)
    };
    let kafka_sources = specs.iter().filter(|s| source_is(s, "kafka")).count();
    // Channels (a graph's inner pipelines) are read from the flow's other pipelines.
    let channels = specs.iter().filter(|s| source_is(s, "channel")).count();
    if kafka_sources > 0 {
        if kafka_sources + channels != specs.len() {
            return Err(PyValueError::new_err(
                "a flow's sources are all Kafka topics, or none of them",
            ));
        }
        return start_kafka(
            py, specs, states, workers, failures, stop, stopped, metrics, kafka,
        );
    }
    let checkpoint = match checkpoint {
        Some((dir, interval, keep)) => {
            let interval = Duration::try_from_secs_f64(interval)
                .map_err(|_| PyValueError::new_err("checkpoint_interval: a number of seconds"))?;
            Some(CheckpointOptions::new(dir).interval(interval).keep(keep))
        }
        None => None,
    };
    let mut shared = States::new();
    for (id, v) in states.iter() {
        let id: u64 = id.extract()?;
        let name: String = v.get_item(0)?.extract()?;
        let factory = Arc::new(v.get_item(1)?.unbind());
        // A fresh object no user value is: the state of a key whose factory raised.
        let missing = Arc::new(py.eval(c"object()", None, None)?.unbind());
        let state = {
            let (factory, missing) = (factory.clone(), missing.clone());
            KeyedState::new(&name, move |_: &Key| {
                let py = py_static();
                factory.bind(py).call0().map_or_else(
                    |e| {
                        // The record that needed it fails with this error (the step takes it
                        // on this thread, next).
                        stateful::factory_failed(e);
                        missing.clone_ref(py)
                    },
                    Bound::unbind,
                )
            })
        };
        let state = match &checkpoint {
            Some(_) => pickled(py, state)?,
            None => state,
        };
        shared.insert(
            id,
            Shared {
                state,
                factory,
                missing,
            },
        );
    }
    let mut topology = Topology::new();
    let mut channels = Channels::new();
    let pickle = Pickle::new(py)?;
    for (spec, f) in specs.into_iter().zip(&failures) {
        topology.add(build(
            py,
            spec,
            &shared,
            f.clone(),
            group.is_some(),
            &mut channels,
            &pickle,
        )?);
    }
    let mut opts = RunOptions::default().workers(workers).hooks(gil_hooks());
    if let Some(c) = checkpoint {
        opts = opts.checkpoint(c);
    }
    if let Some((process, processes, dir)) = group {
        opts = opts.group(Group::new(process, processes, dir));
    }
    let running = py.detach(|| topology.start(opts)).map_err(PyErr::from)?;
    let shutdown = running.shutdown_handle();
    let interrupt: Arc<dyn Fn() + Send + Sync> = {
        let shutdown = shutdown.clone();
        Arc::new(move || shutdown.interrupt())
    };
    let stop_fn: Arc<dyn Fn() + Send + Sync> = Arc::new(move || shutdown.shutdown());
    let s2 = stop_fn.clone();
    let _ = stop.set(Box::new(move || s2()));
    let metrics_arc = running.metrics();
    let addrs = failures
        .iter()
        .map(|f| (f.pipeline.to_string(), running.source_addr(&f.pipeline)))
        .collect();
    let metrics_server = match metrics {
        Some(a) => {
            let (m1, m2, f) = (metrics_arc.clone(), metrics_arc.clone(), failures.clone());
            Some(serve_metrics(
                addr(&a)?,
                move || prometheus(&m1, &f),
                move || m2.json(),
            )?)
        }
        None => None,
    };
    Ok(FlowHandle {
        engine: Mutex::new(Engine::Pipes {
            running: Some(running),
            metrics: metrics_arc,
        }),
        stop: stop_fn,
        interrupt,
        addrs,
        failures,
        stopped,
        result: Mutex::new(None),
        metrics_server: Mutex::new(metrics_server),
    })
}

/// A flow of Kafka pipelines: one input topic each (co-partitioned), one output topic, one
/// keyed state, run as a `canter_stream::kafka` job.
#[allow(clippy::too_many_arguments)]
fn start_kafka(
    py: Python<'_>,
    specs: Vec<Spec<'_>>,
    states: &Bound<'_, PyDict>,
    workers: usize,
    failures: Vec<Arc<Failures>>,
    stop: Stopper,
    stopped: Arc<OnceLock<String>>,
    metrics: Option<String>,
    settings: Option<&Bound<'_, PyDict>>,
) -> PyResult<FlowHandle> {
    let bad = |why: String| PyValueError::new_err(why);
    let (mut bootstrap, mut group) = (None::<String>, None::<String>);
    // librdkafka-named settings of every source and the sink, merged: one key, one value.
    let mut config: std::collections::BTreeMap<String, String> = Default::default();
    let mut merge = |d: Option<Bound<'_, PyAny>>| -> PyResult<()> {
        let Some(d) = d else { return Ok(()) };
        let d = d.cast_into::<PyDict>()?;
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            let v = match v.extract::<bool>() {
                Ok(b) if v.is_instance_of::<pyo3::types::PyBool>() => b.to_string(),
                _ => v.str()?.to_string(),
            };
            if let Some(old) = config.get(&k) {
                if *old != v {
                    return Err(PyValueError::new_err(format!(
                        "Kafka setting {k} differs between the flow's sources and sink"
                    )));
                }
            }
            config.insert(k, v);
        }
        Ok(())
    };
    let mut inputs = Vec::new();
    let mut output: Option<String> = None;
    let mut state_id: Option<u64> = None;
    // A window's (or a stateful() logic's) pipeline keeps its own state in the flow's one
    // store.
    let mut windowed = false;
    let mut timer: Option<kafka::Timer> = None;
    let mut tails: Option<bool> = None;
    let pickle = Arc::new(Pickle::new(py)?);
    let mut pipes = Vec::new();
    // The pipelines that read each channel (by their index, which is the spec's), and the
    // pipeline of each input topic.
    let mut readers: std::collections::HashMap<u64, Vec<usize>> = Default::default();
    for (i, s) in specs.iter().enumerate() {
        if s.source.get_item(0)?.extract::<String>()? == "channel" {
            readers
                .entry(s.source.get_item(1)?.extract()?)
                .or_default()
                .push(i);
        }
    }
    let readers_of = |id: u64| readers.get(&id).cloned().unwrap_or_default();
    let mut input_pipes = Vec::new();
    // Whether the topics are read to their ends: known before the first channel's pipeline is
    // built (Flow._segments cuts every source's pipeline first).
    let mut bounded = false;
    for (i, (s, failures)) in specs.into_iter().zip(&failures).enumerate() {
        let from_channel = s.source.get_item(0)?.extract::<String>()? == "channel";
        // A channel's records come decoded.
        let decode = match from_channel {
            true => Decoder::Raw,
            false => Decoder::from_spec(py, &s.decode)?,
        };
        if !from_channel {
            input_pipes.push(i);
            let topic: String = s.source.get_item(1)?.extract()?;
            let (b, g): (String, String) = (
                s.source.get_item(2)?.extract()?,
                s.source.get_item(3)?.extract()?,
            );
            if bootstrap.get_or_insert_with(|| b.clone()) != &b
                || group.get_or_insert_with(|| g.clone()) != &g
            {
                return Err(bad(
                    "a Kafka flow's sources share one bootstrap and one group".into(),
                ));
            }
            inputs.push(topic);
            merge(s.source.get_item(4).ok())?;
            // tail=False: the topics are read to their ends, then the flow ends.
            let tail: bool = match s.source.get_item(5) {
                Ok(t) if !t.is_none() => t.extract()?,
                _ => true,
            };
            if *tails.get_or_insert(tail) != tail {
                return Err(bad(
                    "a Kafka flow's sources are all read to their ends (tail=False) or none".into(),
                ));
            }
            bounded = !tail;
        }
        let sink_kind: String = s.sink.get_item(0)?.extract()?;
        let route = match sink_kind.as_str() {
            "channel" => kafka::Route::Channel(readers_of(s.sink.get_item(1)?.extract()?)),
            "branch" => kafka::Route::Branch(
                s.sink.get_item(1)?.unbind(),
                readers_of(s.sink.get_item(2)?.extract()?),
                readers_of(s.sink.get_item(3)?.extract()?),
            ),
            "kafka" => {
                let t: String = s.sink.get_item(1)?.extract()?;
                if output.get_or_insert_with(|| t.clone()) != &t {
                    return Err(bad(format!(
                        "pipeline {}: a Kafka flow writes one output topic ({} and {t} given)",
                        s.name,
                        output.as_deref().unwrap_or_default()
                    )));
                }
                merge(s.sink.get_item(3).ok())?;
                kafka::Route::Topic(Encoder::from_spec(py, &s.sink.get_item(2)?)?)
            }
            "discard" => kafka::Route::Discard,
            other => {
                return Err(bad(format!(
                    "pipeline {}: a Kafka flow's sinks are kafka_out or discard, not {other}",
                    s.name
                )))
            }
        };
        let (key, key_name) = match &s.key {
            Some(k) => {
                let (f, name) = key_fn(py, k, s.pre.len() + 1)?;
                (Some(f), name)
            }
            None => (None, String::new()),
        };
        let mut pipe_on_eof: Option<Obj> = None;
        // The stateful step's name, as the file engine gives it.
        let step_name: String = match (&s.stateful_name, &s.stateful) {
            (Some(n), _) => n.clone(),
            (None, Some(st)) => {
                let kind: String = st.get_item(0)?.extract()?;
                match kind.as_str() {
                    "final" => {
                        let what: String = st.get_item(1)?.extract()?;
                        format!("{}:{what}_final", s.pre.len() + 2)
                    }
                    _ => format!("{}:{kind}", s.pre.len() + 2),
                }
            }
            (None, None) => String::new(),
        };
        let names: (Arc<str>, Arc<str>) = (key_name.into(), step_name.into());
        let step = match &s.stateful {
            None => None,
            // One side of a join: no state of its own.
            Some(st) if st.get_item(0)?.extract::<String>()? == "tag" => {
                Some((kafka::KStep::Tag(st.get_item(1)?.extract()?), py.None()))
            }
            Some(st) => {
                let kind: String = st.get_item(0)?.extract()?;
                if kind == "join" && !bounded && st.get_item(3)?.extract::<String>()? == "final" {
                    return Err(bad(format!(
                        "pipeline {}: a join with emit=\"final\" needs an input that ends: read \
                         the topics to their ends with kafka(..., tail=False)",
                        s.name
                    )));
                }
                if matches!(
                    kind.as_str(),
                    "window" | "session" | "logic" | "final" | "join"
                ) {
                    // Steps with a state of their own (windows' open windows, a stateful()
                    // logic, a final aggregation): it is the key's state in the store (and the
                    // changelog); a logic's notify_at() wakes it between records; the end of a
                    // bounded read flushes them.
                    if kind == "final" && !bounded {
                        return Err(bad(format!(
                            "pipeline {}: final aggregations need an input that ends: read the \
                             topics to their ends with kafka(..., tail=False)",
                            s.name
                        )));
                    }
                    if state_id.is_some() || windowed {
                        return Err(bad(format!(
                            "pipeline {}: a Kafka flow's pipelines share one keyed state, so a \
                             {kind} step's pipeline is the flow's only stateful one",
                            s.name
                        )));
                    }
                    windowed = true;
                    let step = match stage(
                        st,
                        &s.name,
                        s.pre.len(),
                        s.stateful_name.as_deref(),
                        &States::new(),
                        failures.clone(),
                        &pickle,
                    )? {
                        Stage::Window(w) => kafka::KStep::Window(std::sync::Mutex::new(w)),
                        Stage::Session(w) => kafka::KStep::Session(std::sync::Mutex::new(w)),
                        Stage::Final(f) => kafka::KStep::Final(std::sync::Mutex::new(f)),
                        Stage::Join(j) => kafka::KStep::Join(std::sync::Mutex::new(j)),
                        Stage::Logic(lg) => {
                            timer = Some(kafka::Timer::Logic(pipes.len()));
                            kafka::KStep::Logic(std::sync::Mutex::new(lg))
                        }
                        _ => return Err(bad(format!("{kind}: not a step with its own state"))),
                    };
                    pipes.push(kafka::KPipe {
                        decode,
                        pre: chain(py, &s.pre, 1, failures)?,
                        key,
                        step: Some((step, py.None())),
                        post: chain(py, &s.post, s.pre.len() + 3, failures)?,
                        route,
                        failures: failures.clone(),
                        on_eof: None,
                        names: names.clone(),
                    });
                    continue;
                }
                if let Some(t) = st.get_item(5).ok().filter(|t| !t.is_none()) {
                    // The key's state expires `ttl` after its latest record: a wake-up.
                    let t: f64 = t.extract()?;
                    if t.is_nan() || t <= 0.0 {
                        return Err(bad(format!(
                            "{kind}(): ttl= is seconds, more than 0, not {t}"
                        )));
                    }
                    let ttl = (t * 1e9).min(u64::MAX as f64) as u64;
                    match timer {
                        Some(kafka::Timer::Ttl(other)) if other != ttl => {
                            return Err(bad(format!(
                                "pipeline {}: the pipelines sharing a Kafka flow's keyed state \
                                 take one ttl= ({} s and {t} s given)",
                                s.name,
                                other as f64 / 1e9
                            )));
                        }
                        _ => timer = Some(kafka::Timer::Ttl(ttl)),
                    }
                }
                let on_eof = st.get_item(4).ok().filter(|f| !f.is_none());
                if on_eof.is_some() && !bounded {
                    return Err(bad(format!(
                        "pipeline {}: on_eof needs an input that ends: read the topics to their \
                         ends with kafka(..., tail=False)",
                        s.name
                    )));
                }
                pipe_on_eof = on_eof.map(Bound::unbind);
                let id: u64 = st.get_item(1)?.extract()?;
                if windowed || *state_id.get_or_insert(id) != id {
                    return Err(bad("a Kafka flow's pipelines share one keyed state".into()));
                }
                let f = st.get_item(2)?.unbind();
                let read_only =
                    st.get_item(3).ok().and_then(|v| v.extract::<bool>().ok()) == Some(true);
                let factory = states
                    .get_item(id)?
                    .ok_or_else(|| bad("a state of another flow".into()))?
                    .get_item(1)?
                    .unbind();
                Some((
                    match (kind.as_str(), read_only) {
                        ("stateful_map", _) => kafka::KStep::Map(f),
                        (_, true) => kafka::KStep::Read(f),
                        _ => kafka::KStep::Update(f),
                    },
                    factory,
                ))
            }
        };
        pipes.push(kafka::KPipe {
            decode,
            pre: chain(py, &s.pre, 1, failures)?,
            key,
            step,
            post: chain(py, &s.post, s.pre.len() + 3, failures)?,
            route,
            failures: failures.clone(),
            on_eof: pipe_on_eof,
            names,
        });
    }
    let (Some(bootstrap), Some(group)) = (bootstrap, group) else {
        return Err(bad("no pipeline".into()));
    };
    let output = output.ok_or_else(|| bad("a Kafka flow needs a kafka_out sink".into()))?;
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let mut job = canter_stream::kafka::KafkaJob::new(&bootstrap, &group, &inputs, &output);
    job.workers = workers.max(1);
    job.hooks = Some(gil_hooks());
    job.bounded = tails == Some(false);
    let setting = |e: canter_stream::kafka::KafkaError| {
        let text = e.to_string();
        bad(text.trim_start_matches("kafka: settings: ").to_owned())
    };
    let mut client = canter_stream::kafka::ClientSettings::new();
    for (k, v) in &config {
        client.set(k, v).map_err(setting)?;
    }
    job.configure(&client).map_err(setting)?;
    if let Some(k) = settings {
        if let Some(v) = k.get_item("exactly_once")? {
            job.exactly_once = v.extract()?;
        }
        if let Some(v) = k.get_item("commit_interval")? {
            job.commit_interval = Duration::from_secs_f64(v.extract()?);
        }
        if let Some(v) = k.get_item("state_name")? {
            job.state_name = v.extract()?;
        }
        if let Some(v) = k.get_item("instance_id")? {
            job.instance_id = v.extract()?;
        }
        if let Some(v) = k.get_item("session_timeout")? {
            job.session_timeout = Some(Duration::from_secs_f64(v.extract()?));
        }
    }
    let task = kafka::PyTask {
        pipes,
        inputs: input_pipes,
        dumps: pickle.dumps.clone_ref(py),
        loads: pickle.loads.clone_ref(py),
        timer,
    };
    // While start waits for topics that do not exist yet, Ctrl-C ends the wait.
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = interrupted.clone();
    job.interrupted = Some(canter_stream::kafka::Interrupt(Arc::new(move || {
        let hit = Python::attach(|py| py.check_signals().is_err());
        if hit {
            seen.store(true, Ordering::SeqCst);
        }
        hit
    })));
    let running = py
        .detach(|| canter_stream::kafka::start(job, task))
        .map_err(|e| match interrupted.load(Ordering::SeqCst) {
            true => pyo3::exceptions::PyKeyboardInterrupt::new_err(format!("Kafka: {e}")),
            false => PyOSError::new_err(format!("Kafka: {e}")),
        })?;
    let flag = running.stopper();
    let stats = running.stats();
    let stop_fn: Arc<dyn Fn() + Send + Sync> = Arc::new(move || flag.store(true, Ordering::SeqCst));
    let s2 = stop_fn.clone();
    let _ = stop.set(Box::new(move || s2()));
    let metrics_server = match metrics {
        Some(a) => {
            let (s1, s2, f) = (stats.clone(), stats.clone(), failures.clone());
            Some(serve_metrics(
                addr(&a)?,
                move || s1.prometheus() + &failed_text(&f),
                move || s2.json(),
            )?)
        }
        None => None,
    };
    Ok(FlowHandle {
        engine: Mutex::new(Engine::Kafka {
            running: Some(running),
            stats,
        }),
        interrupt: stop_fn.clone(),
        stop: stop_fn,
        addrs: Vec::new(),
        failures,
        stopped,
        result: Mutex::new(None),
        metrics_server: Mutex::new(metrics_server),
    })
}

/// Serves `/metrics` (Prometheus), `/metrics.json` and the live page at `/` from a thread of
/// its own.
fn serve_metrics(
    at: SocketAddr,
    text: impl Fn() -> String + Clone + Send + Sync + 'static,
    json: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> PyResult<canter_rt::ShutdownHandle> {
    use canter_rt::http::{header::CONTENT_TYPE, HeaderValue, StatusCode};
    let config = canter_rt::Config::builder()
        .addr(at)
        .workers(1)
        .build()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let server = canter_rt::Server::bind(config)
        .map_err(|e| PyOSError::new_err(format!("metrics listener {at}: {e}")))?;
    tracing::info!("pipeline metrics on http://{}/", server.local_addr());
    let handle = server.shutdown_handle();
    let reply = |kind: &'static str, body: String| {
        canter_rt::Response::new(StatusCode::OK)
            .with_header(CONTENT_TYPE, HeaderValue::from_static(kind))
            .with_body(body)
    };
    std::thread::Builder::new()
        .name("canter-metrics-http".into())
        .spawn(move || {
            let r = server.serve(move |_worker| {
                let (text, json) = (text.clone(), json.clone());
                canter::Router::new()
                    .route(
                        "/metrics",
                        canter::get(move || reply("text/plain; version=0.0.4", text())),
                    )
                    .route(
                        "/metrics.json",
                        canter::get(move || reply("application/json", json())),
                    )
                    .route(
                        "/",
                        canter::get(move || {
                            reply(
                                "text/html; charset=utf-8",
                                canter_stream::pipeline::METRICS_PAGE.to_owned(),
                            )
                        }),
                    )
            });
            if let Err(e) = r {
                tracing::error!(error = %e, "the metrics server stopped");
            }
        })
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    Ok(handle)
}

/// Registers the pipeline functions and types in `_native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(start_flow, m)?)?;
    m.add_function(wrap_pyfunction!(source_time_ns, m)?)?;
    m.add_class::<FlowHandle>()?;
    m.add_class::<kafka::KafkaWindows>()?;
    m.add_class::<kafka::KafkaLogic>()?;
    m.add_class::<kafka::KafkaFinal>()?;
    m.add_class::<kafka::KafkaJoin>()?;
    m.add("PipelineError", m.py().get_type::<PipelineError>())?;
    Ok(())
}
