//! Stream pipelines: source → stateless steps → `key_by` → a stateful step → sink, run on
//! thread-per-core workers.
//!
//! ```no_run
//! use canter_stream::pipeline::{KeyedState, Pipeline, RunOptions, Sink, Source, Topology};
//!
//! // Count the words of lines sent to port 7000, per word, and send "word count" lines on.
//! let counts = KeyedState::new("counts", |_word: &String| 0u64);
//! let words = Pipeline::new("words", Source::tcp_lines("127.0.0.1:7000".parse()?), |line: &[u8]| {
//!     std::str::from_utf8(line).map(str::to_owned)
//! })
//! .flat_map(|line: String| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
//! .key_by(|word: &String| word.clone())
//! .update(&counts, |n: &mut u64, word: String, out| {
//!     *n += 1;
//!     out.emit(format!("{word} {n}"));
//! })
//! .sink(Sink::tcp("127.0.0.1:7001".parse()?, |line: &String, buf: &mut Vec<u8>| {
//!     buf.extend_from_slice(line.as_bytes())
//! }));
//! let mut topology = Topology::new();
//! topology.add(words);
//! topology.start(RunOptions::default())?.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Fused steps.** `map`, `filter` and `flat_map` compose into one call chain per record,
//!   with no queue between steps; the chain runs on the worker that read the record.
//! - **Keyed state on one worker.** `key_by` picks the worker that owns each key (a hash of it);
//!   the stateful step runs there, with that key's state, created on the key's first sight.
//!   A record crosses threads only when its key lives on another worker, and then in a batch
//!   with the others of the same read (one allocation per batch, not per record).
//!   Pipelines given the same [`KeyedState`] share it.
//! - **Backpressure end to end.** A sink whose buffer is over its high-water mark, or a worker
//!   whose inbox from this one is full, stops this worker's sources from reading until it has
//!   drained; nothing is dropped and no queue grows without bound.
//! - **Bad input.** A record the decoder refuses is counted as rejected input and logged (at
//!   most once a second per pipeline and worker); a broken frame (over the maximum size)
//!   closes that source connection; the others keep running.
//! - **Metrics** ([`Metrics`]): counts per pipeline, step and worker, throughput over time and
//!   HDR latency histograms from source read to sink write, as Prometheus text and JSON.

pub mod checkpoint;
mod codecs;
mod join_window;
mod metrics;
mod run;
mod session;
pub(crate) mod state;
mod step;
mod time_window;

use std::fmt::Display;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use checkpoint::CheckpointOptions;
pub use codecs::{Checkpointable, Codecs};
pub use join_window::{JoinWindow, JoinWindows};
pub use metrics::{CheckpointTotals, Metrics, Percentiles, PipeSample, Sample, Totals};
pub use run::{Group, Running, Shutdown, Wire};
pub use session::{Session, SessionWindow};
pub use state::{
    Aggregate, CountWindow, Emit, Final, Join, JoinEmit, JoinInsert, KeyedState, Local, Open, Span,
    StateCodec, Stateful, TumblingWindow, Update,
};
pub use step::{Filter, FlatMap, Id, Map, Step, Then};
pub use time_window::{TimeWindow, TimeWindows};

use crate::frame::DEFAULT_MAX_FRAME;

/// How a byte stream is cut into records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// A 4-byte big-endian length, then that many bytes (at most `max`).
    LengthPrefixed {
        /// The largest record.
        max: usize,
    },
    /// Lines ended by `\n` (a `\r` before it dropped too), at most `max` bytes each.
    Lines {
        /// The longest line.
        max: usize,
    },
}

/// Where a pipeline's records come from.
#[derive(Clone)]
pub enum Source {
    /// A TCP listener: every worker accepts on the address (SO_REUSEPORT) and reads its
    /// connections.
    Tcp {
        /// Where to listen (port 0: any free port, see [`Running::source_addr`]).
        addr: SocketAddr,
        /// How records are cut.
        framing: Framing,
    },
    /// A file of framed records, read once by the first worker.
    File {
        /// The file.
        path: PathBuf,
        /// How records are cut.
        framing: Framing,
    },
    /// Records made in the process (for tests): `make(i, buf)` writes record `i` into `buf`
    /// for `i` in `0..count`; run by the first worker.
    Generate {
        /// How many records.
        count: u64,
        /// Writes one record.
        make: Arc<dyn Fn(u64, &mut Vec<u8>) + Send + Sync>,
    },
    /// The records other pipelines of the topology write to a [`Channel`] (made by
    /// [`Pipeline::from_channel`]).
    Channel {
        /// The channel.
        id: u64,
        /// The pipelines writing it (counted when the topology starts).
        writers: usize,
    },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Tcp { addr, framing } => write!(f, "Tcp({addr}, {framing:?})"),
            Source::File { path, framing } => write!(f, "File({}, {framing:?})", path.display()),
            Source::Generate { count, .. } => write!(f, "Generate({count})"),
            Source::Channel { id, writers } => write!(f, "Channel({id}, {writers} writers)"),
        }
    }
}

impl Source {
    /// A TCP listener of length-prefixed records of up to 1 MiB.
    pub fn tcp(addr: SocketAddr) -> Source {
        Source::Tcp {
            addr,
            framing: Framing::LengthPrefixed {
                max: DEFAULT_MAX_FRAME,
            },
        }
    }

    /// A TCP listener of lines of up to 64 KiB.
    pub fn tcp_lines(addr: SocketAddr) -> Source {
        Source::Tcp {
            addr,
            framing: Framing::Lines { max: 64 * 1024 },
        }
    }

    /// A file of length-prefixed records of up to 1 MiB.
    pub fn file(path: impl Into<PathBuf>) -> Source {
        Source::File {
            path: path.into(),
            framing: Framing::LengthPrefixed {
                max: DEFAULT_MAX_FRAME,
            },
        }
    }

    /// A file of lines of up to 64 KiB (the last one need not end with a newline).
    pub fn file_lines(path: impl Into<PathBuf>) -> Source {
        Source::File {
            path: path.into(),
            framing: Framing::Lines { max: 64 * 1024 },
        }
    }

    /// `count` records made by `make`.
    pub fn generate(
        count: u64,
        make: impl Fn(u64, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Source {
        Source::Generate {
            count,
            make: Arc::new(make),
        }
    }

    /// Whether the source ends by itself (a channel ends when its writers have).
    fn finite(&self) -> bool {
        !matches!(self, Source::Tcp { .. })
    }
}

static NEXT_CHANNEL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An in-process channel between the pipelines of a topology: the pipelines whose sink is
/// [`Sink::channel`] (or a side of [`Sink::branch`]) write it, and the pipelines made by
/// [`Pipeline::from_channel`] read it, on the same worker, with no queue and no encoding
/// between them. Several writers merge into one stream; several readers each get every record
/// (a clone for all but the last). A reader ends when every writer has ended.
pub struct Channel<T> {
    pub(crate) id: u64,
    pub(crate) clone: fn(&T) -> T,
}

impl<T> Clone for Channel<T> {
    fn clone(&self) -> Self {
        Channel {
            id: self.id,
            clone: self.clone,
        }
    }
}

impl<T> std::fmt::Debug for Channel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channel({})", self.id)
    }
}

impl<T: Clone + 'static> Channel<T> {
    /// A new channel.
    pub fn new() -> Self {
        Channel {
            id: NEXT_CHANNEL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            clone: T::clone,
        }
    }
}

impl<T: 'static> Channel<T> {
    /// A new channel of records that are not `Clone`, copied by `clone` for all readers but
    /// the last (a front end's handles to its own objects, say).
    pub fn with_clone(clone: fn(&T) -> T) -> Self {
        Channel {
            id: NEXT_CHANNEL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            clone,
        }
    }
}

impl<T: Clone + 'static> Default for Channel<T> {
    fn default() -> Self {
        Channel::new()
    }
}

/// A shared list the [`Sink::collect`] sink appends to (for tests).
pub struct Collector<O>(Arc<Mutex<Vec<O>>>);

impl<O> Clone for Collector<O> {
    fn clone(&self) -> Self {
        Collector(self.0.clone())
    }
}

impl<O> Default for Collector<O> {
    fn default() -> Self {
        Collector(Arc::new(Mutex::new(Vec::new())))
    }
}

impl<O> std::fmt::Debug for Collector<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Collector({})", self.len())
    }
}

impl<O> Collector<O> {
    /// An empty collector.
    pub fn new() -> Self {
        Collector::default()
    }

    /// Records collected so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes what was collected.
    pub fn take(&self) -> Vec<O> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<O>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Encodes a record for a framed sink (the sink adds the length prefix).
pub type Encoder<O> = Arc<dyn Fn(&O, &mut Vec<u8>) + Send + Sync>;

/// Where a pipeline's records go.
pub enum Sink<O> {
    /// A TCP connection from each worker to `addr`, records length-prefixed; reconnects with
    /// backoff (50 ms doubling to 2 s) while it is down, holding records up to its high-water
    /// mark meanwhile (then the sources wait).
    Tcp {
        /// The receiver.
        addr: SocketAddr,
        /// The record encoder.
        encode: Encoder<O>,
    },
    /// Records appended, length-prefixed (or as lines), to a file (one writer per worker,
    /// whole batches per write).
    File {
        /// The file (created if missing).
        path: PathBuf,
        /// The record encoder.
        encode: Encoder<O>,
        /// Each record followed by a newline instead of after a length (a text file; no
        /// sequence headers, so not with checkpoints).
        lines: bool,
    },
    /// An in-memory list (for tests).
    Collect(Collector<O>),
    /// Nothing (a pipeline that only updates state).
    Discard,
    /// The pipelines reading `to` (see [`Channel`]).
    Channel(Channel<O>),
    /// Each record to the readers of `yes` if `pred` holds for it, else to those of `no`.
    Branch {
        /// Which side a record goes to.
        pred: Arc<dyn Fn(&O) -> bool + Send + Sync>,
        /// Where the records `pred` holds for go.
        yes: Channel<O>,
        /// Where the others go.
        no: Channel<O>,
    },
}

impl<O> Sink<O> {
    /// A framed TCP client connection to `addr`.
    pub fn tcp(
        addr: SocketAddr,
        encode: impl Fn(&O, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        Sink::Tcp {
            addr,
            encode: Arc::new(encode),
        }
    }

    /// A file of framed records. A run that resumes no checkpoint starts the file afresh
    /// (one of a [`RunOptions::group`] appends: whoever starts the group starts it afresh);
    /// a resumed one appends. `/dev/stdout` is the process's standard output itself.
    pub fn file(
        path: impl Into<PathBuf>,
        encode: impl Fn(&O, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        Sink::File {
            path: path.into(),
            encode: Arc::new(encode),
            lines: false,
        }
    }

    /// A file of lines: each record as `encode` writes it, then a newline (`encode` must not
    /// write one of its own: the line would read back as two). Not with checkpoints (a line
    /// has no room for the sequence header). Opened as [`Sink::file`]'s.
    pub fn file_lines(
        path: impl Into<PathBuf>,
        encode: impl Fn(&O, &mut Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        Sink::File {
            path: path.into(),
            encode: Arc::new(encode),
            lines: true,
        }
    }

    /// Collects into `c`.
    pub fn collect(c: &Collector<O>) -> Self {
        Sink::Collect(c.clone())
    }

    /// Drops every record.
    pub fn discard() -> Self {
        Sink::Discard
    }

    /// Hands each record to the pipelines reading `to`.
    pub fn channel(to: &Channel<O>) -> Self {
        Sink::Channel(to.clone())
    }

    /// Hands each record to the readers of `yes` if `pred` holds for it, else to those of
    /// `no` (`pred` runs once per record).
    pub fn branch(
        pred: impl Fn(&O) -> bool + Send + Sync + 'static,
        yes: &Channel<O>,
        no: &Channel<O>,
    ) -> Self {
        Sink::Branch {
            pred: Arc::new(pred),
            yes: yes.clone(),
            no: no.clone(),
        }
    }

    /// The channels this sink writes.
    pub(crate) fn channels(&self) -> Vec<u64> {
        match self {
            Sink::Channel(c) => vec![c.id],
            Sink::Branch { yes, no, .. } => vec![yes.id, no.id],
            _ => Vec::new(),
        }
    }
}

impl<O> Clone for Sink<O> {
    fn clone(&self) -> Self {
        match self {
            Sink::Tcp { addr, encode } => Sink::Tcp {
                addr: *addr,
                encode: encode.clone(),
            },
            Sink::File {
                path,
                encode,
                lines,
            } => Sink::File {
                path: path.clone(),
                encode: encode.clone(),
                lines: *lines,
            },
            Sink::Collect(c) => Sink::Collect(c.clone()),
            Sink::Discard => Sink::Discard,
            Sink::Channel(c) => Sink::Channel(c.clone()),
            Sink::Branch { pred, yes, no } => Sink::Branch {
                pred: pred.clone(),
                yes: yes.clone(),
                no: no.clone(),
            },
        }
    }
}

/// A pipeline's source, decoder and stateless steps, before `key_by`.
pub struct Pipeline<T, D, C> {
    name: String,
    source: Source,
    decode: D,
    chain: C,
    _t: PhantomData<fn() -> T>,
}

impl<T, E, D> Pipeline<T, D, Id<T>>
where
    T: 'static,
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
{
    /// A pipeline named `name` (in metrics and logs) reading `source`, each record decoded by
    /// `decode` (a record it refuses is counted as rejected input and logged).
    pub fn new(name: &str, source: Source, decode: D) -> Self {
        Pipeline {
            name: name.to_owned(),
            source,
            decode,
            chain: Id::new(),
            _t: PhantomData,
        }
    }
}

/// The decoder of a pipeline reading a channel: never called (its records are not bytes).
pub type NoDecode<T> = fn(&[u8]) -> Result<T, &'static str>;

impl<T: 'static> Pipeline<T, NoDecode<T>, Id<T>> {
    /// A pipeline named `name` reading the records written to `channel` by other pipelines
    /// of the topology (on each worker, what that worker's writers wrote).
    pub fn from_channel(name: &str, channel: &Channel<T>) -> Self {
        fn never<T>(_: &[u8]) -> Result<T, &'static str> {
            Err("a channel's records are not bytes")
        }
        Pipeline {
            name: name.to_owned(),
            source: Source::Channel {
                id: channel.id,
                writers: 0,
            },
            decode: never::<T>,
            chain: Id::new(),
            _t: PhantomData,
        }
    }
}

impl<T: 'static, D, C: Step<T>> Pipeline<T, D, C> {
    /// The pipeline's name (in metrics, logs and checkpoints).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn then<C2>(self, chain: C2) -> Pipeline<T, D, C2> {
        Pipeline {
            name: self.name,
            source: self.source,
            decode: self.decode,
            chain,
            _t: PhantomData,
        }
    }

    /// Changes each item.
    pub fn map<O: 'static, F>(self, f: F) -> Pipeline<T, D, Map<C, F, O>>
    where
        F: FnMut(C::Out) -> O + Clone + Send + 'static,
    {
        let chain = Map::new(self.chain.clone(), f);
        self.then(chain)
    }

    /// Keeps the items `f` says yes to.
    pub fn filter<F>(self, f: F) -> Pipeline<T, D, Filter<C, F>>
    where
        F: FnMut(&C::Out) -> bool + Clone + Send + 'static,
    {
        let chain = Filter::new(self.chain.clone(), f);
        self.then(chain)
    }

    /// Makes any number of items of each.
    pub fn flat_map<It, F>(self, f: F) -> Pipeline<T, D, FlatMap<C, F, It>>
    where
        F: FnMut(C::Out) -> It + Clone + Send + 'static,
        It: IntoIterator + 'static,
    {
        let chain = FlatMap::new(self.chain.clone(), f);
        self.then(chain)
    }

    /// Adds the steps of `next`, a [`Step`] of its own (a front end's chain, say).
    pub fn step<N: Step<C::Out>>(self, next: N) -> Pipeline<T, D, Then<C, N>> {
        let chain = Then::new(self.chain.clone(), next);
        self.then(chain)
    }

    /// Ends a pipeline of stateless steps in `sink`: each item goes on from the worker that
    /// read it, with no key and no state.
    pub fn sink<E>(self, sink: Sink<C::Out>) -> Built
    where
        E: Display,
        D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
        C::Out: Send + 'static,
    {
        // Each state has a name of its own in a checkpoint.
        let none = KeyedState::new(&format!("{} (no state)", self.name), |_: &Local| ())
            .checkpointed(|_, _| {}, |_| Some(Local), |_, _| {}, |_| Some(()));
        self.local()
            .update(
                &none,
                |_: &mut (), x: C::Out, out: &mut Emit<'_, C::Out>| out.emit(x),
            )
            .sink(sink)
    }

    /// No key: the stateful step runs on the worker that read each item, with one state per
    /// worker (under the key [`Local`]); nothing crosses workers.
    #[allow(clippy::type_complexity)]
    pub fn local(self) -> Keyed<T, D, C, fn(&C::Out) -> Local, Local> {
        fn local<X>(_: &X) -> Local {
            Local
        }
        Keyed {
            head: self,
            key: local::<C::Out>,
            wire: None,
            _k: PhantomData,
        }
    }

    /// Routes each item to the worker owning its key, where the stateful step runs.
    pub fn key_by<K, KF>(self, key: KF) -> Keyed<T, D, C, KF, K>
    where
        KF: FnMut(&C::Out) -> K + Clone + Send + 'static,
        K: std::hash::Hash + Eq + Send + 'static,
    {
        Keyed {
            head: self,
            key,
            wire: None,
            _k: PhantomData,
        }
    }
}

/// A pipeline after `key_by`: next comes its stateful step.
pub struct Keyed<T, D, C: Step<T>, KF, K> {
    head: Pipeline<T, D, C>,
    key: KF,
    wire: Option<Arc<dyn Wire<K, C::Out>>>,
    _k: PhantomData<fn() -> K>,
}

impl<T, D, C, KF, K> Keyed<T, D, C, KF, K>
where
    T: 'static,
    C: Step<T>,
    C::Out: Send,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// How the items and keys cross processes when the topology runs in a [`Group`]
    /// ([`RunOptions::group`]): a keyed pipeline without one refuses to start in a group.
    pub fn wire(mut self, wire: impl Wire<K, C::Out>) -> Self {
        self.wire = Some(Arc::new(wire));
        self
    }

    /// The stateful step: `f(state, item, emit)` with the item's key's state from `state`.
    pub fn update<S: 'static, O: 'static, F>(
        self,
        state: &KeyedState<K, S>,
        f: F,
    ) -> Tail<T, D, C, KF, K, Update<K, S, F, O>, Id<O>>
    where
        F: FnMut(&mut S, C::Out, &mut Emit<'_, O>) + Clone + Send + 'static,
    {
        self.stateful(Update::new(state, f))
    }

    /// The stateful step of Bytewax's `stateful_map`: `f(state, item)` gets the key's state
    /// (taken out of the store) and returns `(new state, output)`; the output goes on, and a
    /// new state of `None` drops the key's state (its next item starts from the state's
    /// `init` again).
    #[allow(clippy::type_complexity)]
    pub fn stateful_map<S, O, F>(
        self,
        state: &KeyedState<K, S>,
        mut f: F,
    ) -> Tail<
        T,
        D,
        C,
        KF,
        K,
        Update<K, S, impl FnMut(&mut S, C::Out, &mut Emit<'_, O>) + Clone + Send + 'static, O>,
        Id<O>,
    >
    where
        S: Default + 'static,
        O: 'static,
        F: FnMut(S, C::Out) -> (Option<S>, O) + Clone + Send + 'static,
    {
        self.update(state, move |s: &mut S, item, out: &mut Emit<'_, O>| {
            let (next, o) = f(std::mem::take(s), item);
            match next {
                Some(n) => *s = n,
                None => out.discard(),
            }
            out.emit(o)
        })
    }

    /// Count windows: every `size` items of a key are aggregated into one output; a key's
    /// window still short when the input ends is emitted then, its [`Span`] ending where the
    /// key's items did.
    pub fn count_window<A, O>(
        self,
        size: u64,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, CountWindow<K, C::Out, A, O>, Id<O>>
    where
        A: Send + 'static,
        O: Send + 'static,
    {
        self.count_windows(size, true, agg)
    }

    /// Count windows that keep only full ones: as [`Keyed::count_window`], but a window
    /// still short when the input ends is dropped, and counted
    /// ([`Totals::dropped_windows`]).
    pub fn count_window_full<A, O>(
        self,
        size: u64,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, CountWindow<K, C::Out, A, O>, Id<O>>
    where
        A: Send + 'static,
        O: Send + 'static,
    {
        self.count_windows(size, false, agg)
    }

    fn count_windows<A, O>(
        self,
        size: u64,
        partial: bool,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, CountWindow<K, C::Out, A, O>, Id<O>>
    where
        A: Send + 'static,
        O: Send + 'static,
    {
        let name = format!("{} count_window", self.head.name);
        self.stateful(CountWindow::new(&name, size, partial, agg))
    }

    /// Event-time tumbling windows of `size`, each item's time (ns) given by `time`.
    pub fn tumbling_window<A, O>(
        self,
        size: Duration,
        time: impl Fn(&C::Out) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, TumblingWindow<K, C::Out, A, O>, Id<O>>
    where
        A: Send + 'static,
        O: Send + 'static,
    {
        let name = format!("{} tumbling_window", self.head.name);
        self.stateful(TumblingWindow::new(&name, size, time, agg))
    }

    /// Event-time session windows: a key's items no more than `gap` apart (by `time`, ns)
    /// make one session, aggregated into one output when the session closes (see
    /// [`SessionWindow`]).
    pub fn session_window<A, O>(
        self,
        gap: Duration,
        time: impl Fn(&C::Out) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, SessionWindow<K, C::Out, A, O>, Id<O>>
    where
        A: Send + 'static,
        O: Send + 'static,
    {
        let name = format!("{} session_window", self.head.name);
        self.stateful(SessionWindow::new(&name, gap, time, agg))
    }

    /// Tumbling windows of `size` on event time whose output is the window's items, sorted by
    /// their time (Bytewax's `collect_window`): `(key, span, items)`.
    #[allow(clippy::type_complexity)]
    pub fn collect_window(
        self,
        size: Duration,
        time: impl Fn(&C::Out) -> u64 + Send + Sync + 'static,
    ) -> Tail<
        T,
        D,
        C,
        KF,
        K,
        TumblingWindow<K, C::Out, Vec<(u64, C::Out)>, (K, Span, Vec<C::Out>)>,
        Id<(K, Span, Vec<C::Out>)>,
    >
    where
        C::Out: Send + 'static,
    {
        let time = Arc::new(time);
        let at = time.clone();
        self.tumbling_window(
            size,
            move |x: &C::Out| time(x),
            Aggregate::new(
                Vec::new,
                move |v: &mut Vec<(u64, C::Out)>, x| v.push((at(&x), x)),
                |k: &K, mut v: Vec<(u64, C::Out)>, span| {
                    // Stable: items of one time keep their order of arrival.
                    v.sort_by_key(|(t, _)| *t);
                    (k.clone(), span, v.into_iter().map(|(_, x)| x).collect())
                },
            ),
        )
    }

    /// Event-time windows of `size`, a new one every `slide` (tumbling when equal), each item's
    /// time (ns) given by `time`, closing once the key's latest time less `wait` has passed
    /// their end (items may come that much out of order) or at the end of the input (see
    /// [`TimeWindow`]; Python's `time_window`). `slide` is at least 1 ns and at most `size`.
    pub fn time_window<A, O>(
        self,
        size: Duration,
        slide: Duration,
        wait: Duration,
        time: impl Fn(&C::Out) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, C::Out, A, O>,
    ) -> Tail<T, D, C, KF, K, TimeWindow<K, C::Out, A, O>, Id<O>>
    where
        C::Out: Clone,
        A: Send + 'static,
        O: Send + 'static,
    {
        let name = format!("{} time_window", self.head.name);
        self.stateful(TimeWindow::new(&name, size, slide, wait, time, agg))
    }

    /// At the end of the input, `(key, value)` for each key, the value folded from `init()`
    /// by `fold(acc, item)` over the key's items (Bytewax's `fold_final`).
    #[allow(clippy::type_complexity)]
    pub fn fold_final<A, I, F>(
        self,
        init: I,
        fold: F,
    ) -> Tail<T, D, C, KF, K, Final<K, C::Out, A>, Id<(K, A)>>
    where
        A: Send + 'static,
        I: Fn() -> A + Send + Sync + 'static,
        F: Fn(&mut A, C::Out) + Send + Sync + 'static,
    {
        let name = format!("{} fold_final", self.head.name);
        self.stateful(Final::new(&name, move |acc, item| {
            fold(acc.get_or_insert_with(&init), item)
        }))
    }

    /// At the end of the input, `(key, n)`: how many items each key had.
    #[allow(clippy::type_complexity)]
    pub fn count_final(self) -> Tail<T, D, C, KF, K, Final<K, C::Out, u64>, Id<(K, u64)>> {
        let name = format!("{} count_final", self.head.name);
        self.stateful(Final::new(&name, |n: &mut Option<u64>, _| {
            *n.get_or_insert(0) += 1
        }))
    }

    /// At the end of the input, `(key, item)`, the item made of the key's items by
    /// `f(acc, item)`, from its first (Bytewax's `reduce_final`).
    #[allow(clippy::type_complexity)]
    pub fn reduce_final<F>(
        self,
        f: F,
    ) -> Tail<T, D, C, KF, K, Final<K, C::Out, C::Out>, Id<(K, C::Out)>>
    where
        F: Fn(C::Out, C::Out) -> C::Out + Send + Sync + 'static,
    {
        let name = format!("{} reduce_final", self.head.name);
        self.stateful(Final::new(&name, move |acc: &mut Option<C::Out>, item| {
            *acc = Some(match acc.take() {
                None => item,
                Some(a) => f(a, item),
            })
        }))
    }

    /// At the end of the input, `(key, item)`: the key's item with the largest `by(item)`
    /// (the first of equals).
    #[allow(clippy::type_complexity)]
    pub fn max_final<B: PartialOrd, F>(
        self,
        by: F,
    ) -> Tail<T, D, C, KF, K, Final<K, C::Out, C::Out>, Id<(K, C::Out)>>
    where
        F: Fn(&C::Out) -> B + Send + Sync + 'static,
    {
        self.reduce_final(move |a, b| if by(&b) > by(&a) { b } else { a })
    }

    /// At the end of the input, `(key, item)`: the key's item with the smallest `by(item)`
    /// (the first of equals).
    #[allow(clippy::type_complexity)]
    pub fn min_final<B: PartialOrd, F>(
        self,
        by: F,
    ) -> Tail<T, D, C, KF, K, Final<K, C::Out, C::Out>, Id<(K, C::Out)>>
    where
        F: Fn(&C::Out) -> B + Send + Sync + 'static,
    {
        self.reduce_final(move |a, b| if by(&b) < by(&a) { b } else { a })
    }

    /// Joins the sides merged into this stream by key (Bytewax's `join`): each item is
    /// `(key, side, record)` for side `0..sides` (the key given again, so that the row can
    /// name it), and the output is `(key, row)`, a row holding a record (or None) per side,
    /// as `insert` keeps them and when `emit` says. The sides come through a [`Channel`]
    /// that each side's pipeline writes (see the README's join).
    #[allow(clippy::type_complexity)]
    pub fn join<V>(
        self,
        sides: usize,
        insert: JoinInsert,
        emit: JoinEmit,
    ) -> Tail<T, D, C, KF, K, Join<K, V>, Id<(K, Vec<Option<V>>)>>
    where
        C: Step<T, Out = (K, usize, V)>,
        V: Clone + Send + 'static,
    {
        let name = format!("{} join", self.head.name);
        self.stateful(Join::new(&name, sides, insert, emit))
    }

    /// Joins the sides merged into this stream by key within tumbling windows of event time
    /// (Bytewax's `join_window`): items `(key, side, record)` as for [`Keyed::join`], each
    /// record's time (ns) given by `time`; when a window of `size` closes (once the key's
    /// latest time less `wait` has passed its end, or at the end of the input) the output is
    /// `(key, span, row)`, one row of each side's latest record in the window, or with
    /// `product` every combination (see [`JoinWindow`]).
    #[allow(clippy::type_complexity)]
    pub fn join_window<V>(
        self,
        sides: usize,
        size: Duration,
        wait: Duration,
        product: bool,
        time: impl Fn(&V) -> u64 + Send + Sync + 'static,
    ) -> Tail<T, D, C, KF, K, JoinWindow<K, V>, Id<(K, Span, Vec<Option<V>>)>>
    where
        C: Step<T, Out = (K, usize, V)>,
        V: Clone + Send + 'static,
    {
        let name = format!("{} join_window", self.head.name);
        self.stateful(JoinWindow::new(&name, sides, size, wait, product, time))
    }

    /// Any [`Stateful`] step.
    pub fn stateful<U: Stateful<K, C::Out>>(self, step: U) -> Tail<T, D, C, KF, K, U, Id<U::Out>> {
        Tail {
            keyed: self,
            step,
            post: Id::new(),
        }
    }
}

impl<T, D, C, KF, K, U, P> Tail<T, D, C, KF, K, U, P>
where
    C: Step<T>,
    U: Checkpointable<K>,
{
    /// Makes a built-in step's state part of checkpoints (see [`KeyedState::checkpointed`]):
    /// keys and the values the step keeps (a final aggregation's or a window's value, a join's
    /// records) are written and read back by these functions, so a restarted topology goes on
    /// from what the checkpoint held: windows open then are finished, a final aggregation is
    /// emitted once, at the end.
    pub fn checkpointed(
        mut self,
        encode_key: impl Fn(&K, &mut Vec<u8>) + Send + Sync + 'static,
        decode_key: impl Fn(&[u8]) -> Option<K> + Send + Sync + 'static,
        encode_value: impl Fn(&U::Value, &mut Vec<u8>) + Send + Sync + 'static,
        decode_value: impl Fn(&[u8]) -> Option<U::Value> + Send + Sync + 'static,
    ) -> Self {
        let codecs = Codecs::new(encode_key, decode_key, encode_value, decode_value);
        self.step = self.step.with_codecs(codecs);
        self
    }
}

/// A pipeline after its stateful step: stateless steps may follow, then the sink.
pub struct Tail<T, D, C: Step<T>, KF, K, U, P> {
    keyed: Keyed<T, D, C, KF, K>,
    step: U,
    post: P,
}

impl<T, D, C, KF, K, U, P> Tail<T, D, C, KF, K, U, P>
where
    C: Step<T>,
    U: Stateful<K, C::Out>,
    P: Step<U::Out>,
{
    fn then<P2>(self, post: P2) -> Tail<T, D, C, KF, K, U, P2> {
        Tail {
            keyed: self.keyed,
            step: self.step,
            post,
        }
    }

    /// Changes each output.
    pub fn map<O: 'static, F>(self, f: F) -> Tail<T, D, C, KF, K, U, Map<P, F, O>>
    where
        F: FnMut(P::Out) -> O + Clone + Send + 'static,
    {
        let post = Map::new(self.post.clone(), f);
        self.then(post)
    }

    /// Keeps the outputs `f` says yes to.
    pub fn filter<F>(self, f: F) -> Tail<T, D, C, KF, K, U, Filter<P, F>>
    where
        F: FnMut(&P::Out) -> bool + Clone + Send + 'static,
    {
        let post = Filter::new(self.post.clone(), f);
        self.then(post)
    }

    /// Makes any number of outputs of each.
    pub fn flat_map<It, F>(self, f: F) -> Tail<T, D, C, KF, K, U, FlatMap<P, F, It>>
    where
        F: FnMut(P::Out) -> It + Clone + Send + 'static,
        It: IntoIterator + 'static,
    {
        let post = FlatMap::new(self.post.clone(), f);
        self.then(post)
    }

    /// Adds the steps of `next`, a [`Step`] of its own.
    pub fn step<N: Step<P::Out>>(self, next: N) -> Tail<T, D, C, KF, K, U, Then<P, N>> {
        let post = Then::new(self.post.clone(), next);
        self.then(post)
    }
}

impl<T, E, D, C, KF, K, U, P> Tail<T, D, C, KF, K, U, P>
where
    T: 'static,
    E: Display,
    D: FnMut(&[u8]) -> Result<T, E> + Clone + Send + 'static,
    C: Step<T>,
    C::Out: Send,
    KF: FnMut(&C::Out) -> K + Clone + Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    U: Stateful<K, C::Out>,
    P: Step<U::Out>,
    P::Out: Send + 'static,
{
    /// Ends the pipeline in `sink`: ready for [`Topology::add`].
    pub fn sink(self, sink: Sink<P::Out>) -> Built {
        Built(Box::new(run::Def {
            name: self.keyed.head.name,
            source: self.keyed.head.source,
            decode: self.keyed.head.decode,
            chain: self.keyed.head.chain,
            key: self.keyed.key,
            wire: self.keyed.wire,
            step: self.step,
            post: self.post,
            sink,
            _t: PhantomData,
        }))
    }
}

/// A complete pipeline, to add to a [`Topology`].
pub struct Built(Box<dyn run::PipelineDef>);

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pipeline({})", self.0.name())
    }
}

/// How a topology runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// Worker threads (at most 64).
    pub workers: usize,
    /// Pin worker `i` to CPU `i`.
    pub pin: bool,
    /// Bytes a sink holds per worker before the sources wait.
    pub sink_high_water: usize,
    /// Records in flight from the other workers to one worker, per pipeline, before their
    /// sources wait.
    pub inbox_capacity: usize,
    /// Bytes read per source connection before it yields to the worker's others.
    pub read_budget: usize,
    /// Source connections each worker keeps open (each may hold a frame's worth of input);
    /// more are closed at once, with a log line.
    pub max_source_connections: usize,
    /// On shutdown, longest a sink may take to deliver what it holds.
    pub drain_timeout: Duration,
    /// Longest a TCP sink's peer may take nothing while records wait for it; then the sink
    /// connects again (what the closed connection's kernel buffers held is lost, what the
    /// sink's buffer holds is sent on the new one).
    pub sink_write_timeout: Duration,
    /// Checkpoints (off by default): consistent snapshots of the keyed state with the source
    /// positions they include, restored at start (see [`checkpoint`]). Every keyed state
    /// must have a codec ([`KeyedState::checkpointed`]); TCP and file sinks then carry a
    /// sequence header on each result.
    pub checkpoint: Option<CheckpointOptions>,
    /// Called on each worker's thread: around its whole run, before it waits for events and
    /// when it wakes (a front end holding an interpreter lock while the worker works).
    pub hooks: Option<WorkerHooks>,
    /// The processes this topology's workers are spread over ([`Group`]); none by default.
    pub group: Option<Group>,
}

/// Callbacks on each worker's thread ([`RunOptions::hooks`]).
#[derive(Clone)]
pub struct WorkerHooks {
    /// Runs the worker: called on the worker's thread with its index and the worker's whole
    /// run (event loop made, run to its end and dropped), which it must call once; a front end
    /// wraps it in its own context (an interpreter lock held all along, say).
    pub run: Arc<
        dyn Fn(usize, &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()> + Send + Sync,
    >,
    /// Before the worker waits for events, and after it wakes.
    pub park: canter_rt::ParkHooks,
}

/// Spawns worker `me`'s thread, named `name`: `main` runs on an event loop of `config` (whose
/// park hooks the caller set from `hooks`), inside `hooks.run` when there are hooks.
pub(crate) fn spawn_hooked<F, Fut>(
    me: usize,
    config: &canter_rt::Config,
    name: String,
    hooks: Option<WorkerHooks>,
    main: F,
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<()>>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + 'static,
{
    let config = config.clone();
    std::thread::Builder::new().name(name).spawn(move || {
        let mut main = Some(main);
        let mut run = || match main.take() {
            Some(main) => canter_rt::run_here(me, &config, main),
            None => Ok(()),
        };
        match &hooks {
            Some(h) => (h.run)(me, &mut run),
            None => run(),
        }
    })
}

impl std::fmt::Debug for WorkerHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHooks").finish_non_exhaustive()
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            workers: 1,
            pin: false,
            sink_high_water: 1 << 20,
            inbox_capacity: 64 * 1024,
            read_budget: 1024 * 1024,
            max_source_connections: 1024,
            drain_timeout: Duration::from_secs(5),
            sink_write_timeout: Duration::from_secs(30),
            checkpoint: None,
            hooks: None,
            group: None,
        }
    }
}

impl RunOptions {
    /// Spreads the workers over a [`Group`] of processes, each running this topology: keys
    /// are owned across the group, and the keyed pipelines' records cross processes through
    /// their [`Wire`] ([`Keyed::wire`]).
    pub fn group(mut self, group: Group) -> Self {
        self.group = Some(group);
        self
    }

    /// `workers` worker threads.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.clamp(1, 64);
        self
    }

    /// Pins the workers to CPUs.
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// Sets the sink's high-water mark in bytes.
    pub fn sink_high_water(mut self, bytes: usize) -> Self {
        self.sink_high_water = bytes.max(1);
        self
    }

    /// Sets the most source connections per worker.
    pub fn max_source_connections(mut self, n: usize) -> Self {
        self.max_source_connections = n.max(1);
        self
    }

    /// Sets the inbox capacity in records.
    pub fn inbox_capacity(mut self, records: usize) -> Self {
        self.inbox_capacity = records.max(1);
        self
    }

    /// Sets the bytes read per source connection before it yields to the worker's others.
    pub fn read_budget(mut self, bytes: usize) -> Self {
        self.read_budget = bytes.max(1);
        self
    }

    /// Turns checkpoints on.
    pub fn checkpoint(mut self, checkpoint: CheckpointOptions) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Sets the callbacks on the workers' threads.
    pub fn hooks(mut self, hooks: WorkerHooks) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// Sets how long a TCP sink's peer may take nothing before the sink connects again.
    pub fn sink_write_timeout(mut self, timeout: Duration) -> Self {
        self.sink_write_timeout = timeout;
        self
    }
}

/// The pipelines of an application, run together on the same workers (sharing keyed state
/// where they were given the same [`KeyedState`]).
#[derive(Default, Debug)]
pub struct Topology {
    pipelines: Vec<Built>,
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Topology::default()
    }

    /// Adds a pipeline.
    pub fn add(&mut self, pipeline: Built) -> &mut Self {
        self.pipelines.push(pipeline);
        self
    }

    /// Binds the sources and starts the workers. Returns at once; [`Running::wait`] waits for
    /// the end (finite sources all read and delivered, or a shutdown).
    pub fn start(self, options: RunOptions) -> std::io::Result<Running> {
        run::start(self.pipelines.into_iter().map(|b| b.0).collect(), options)
    }
}

/// The live metrics page: charts of throughput and latency percentiles over time per pipeline,
/// and the totals, drawn from `metrics.json` (relative to the page) every second. Self-contained
/// (no scripts or styles from elsewhere).
pub const METRICS_PAGE: &str = include_str!("metrics.html");
