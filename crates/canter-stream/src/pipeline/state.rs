//! Keyed state, stateful steps and windows.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::checkpoint::{Entries, Reader};
use super::codecs::{put_u64, Checkpointable, Codecs};

/// A fast hasher for keys (the FxHash mix, then a folded multiply): keys come from the
/// application, not from a peer choosing them to collide, and a symbol's 4 bytes hash in two
/// multiplies. The final fold matters: a multiply alone carries input bits only upwards, so
/// keys differing in their last bytes (symbols `   A`, `   B`...) would share the low bits
/// the table indexes by, and pile up in a few buckets.
#[derive(Default, Clone, Copy)]
pub(crate) struct Fx(u64);

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(n as u64);
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        let x = (self.0 as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x as u64) ^ ((x >> 64) as u64)
    }
}

impl Fx {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type FxBuild = BuildHasherDefault<Fx>;

/// The worker that owns `key`, of `workers`.
#[inline]
pub(crate) fn owner<K: Hash>(key: &K, workers: usize) -> usize {
    if workers <= 1 {
        return 0;
    }
    let mut h = Fx::default();
    key.hash(&mut h);
    // The high bits of the multiply are the well-mixed ones.
    ((h.finish() >> 32) % workers as u64) as usize
}

/// The key of a pipeline without one ([`Pipeline::local`](super::Pipeline::local)): its
/// stateful step runs on the worker that read the item, with one state per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Local;

/// Whether keys of type `K` stay on the worker that read them (a constant per type: the
/// check compiles away).
#[inline(always)]
pub(crate) fn is_local<K: 'static>() -> bool {
    std::any::TypeId::of::<K>() == std::any::TypeId::of::<Local>()
}

static NEXT_STATE: AtomicU64 = AtomicU64::new(1);

/// State kept per key, created on a key's first sight and touched only by the worker that owns
/// the key. Several pipelines given the same `KeyedState` (a clone) share it: Market Spread's
/// quotes pipeline writes what its orders pipeline reads.
pub struct KeyedState<K, S> {
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
    pub(crate) init: Arc<dyn Fn(&K) -> S + Send + Sync>,
    pub(crate) codec: Option<Arc<StateCodec<K, S>>>,
}

/// How a keyed state's keys and values are written into checkpoints and read back.
pub struct StateCodec<K, S> {
    encode_key: Box<dyn Fn(&K, &mut Vec<u8>) + Send + Sync>,
    decode_key: Box<dyn Fn(&[u8]) -> Option<K> + Send + Sync>,
    encode_state: Box<dyn Fn(&S, &mut Vec<u8>) + Send + Sync>,
    decode_state: Box<dyn Fn(&[u8]) -> Option<S> + Send + Sync>,
}

impl<K, S> Clone for KeyedState<K, S> {
    fn clone(&self) -> Self {
        KeyedState {
            id: self.id,
            name: self.name.clone(),
            init: self.init.clone(),
            codec: self.codec.clone(),
        }
    }
}

impl<K, S> std::fmt::Debug for KeyedState<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedState")
            .field("name", &self.name)
            .field("checkpointed", &self.codec.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: 'static, S: 'static> KeyedState<K, S> {
    /// The state checkpointed with a built-in step's `codecs`: keys by their codec, each state
    /// by `encode` and `decode` (a state whose bytes `decode` leaves some of is refused).
    pub(crate) fn with_codecs<V: 'static>(
        self,
        codecs: Codecs<K, V>,
        encode: impl Fn(&Codecs<K, V>, &S, &mut Vec<u8>) + Send + Sync + 'static,
        decode: impl Fn(&Codecs<K, V>, &mut Reader<'_>) -> Option<S> + Send + Sync + 'static,
    ) -> Self {
        let (ek, dk, c) = (
            codecs.encode_key.clone(),
            codecs.decode_key.clone(),
            codecs.clone(),
        );
        self.checkpointed(
            move |k, b| ek(k, b),
            move |b| dk(b),
            move |st, b| encode(&codecs, st, b),
            move |b| {
                let mut r = Reader(b);
                decode(&c, &mut r).filter(|_| r.0.is_empty())
            },
        )
    }
}

impl<K, S> KeyedState<K, S> {
    /// State named `name` (for logs, and in checkpoints), each key's starting as `init` makes
    /// it.
    pub fn new(name: &str, init: impl Fn(&K) -> S + Send + Sync + 'static) -> Self {
        KeyedState {
            id: NEXT_STATE.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            init: Arc::new(init),
            codec: None,
        }
    }

    /// Makes the state part of checkpoints (see [`super::checkpoint`]): each key and its state
    /// are written with `encode_key`/`encode_state` and read back with the decoders (a key or
    /// state they refuse is left out of the restore and counted in a log line). A topology
    /// that checkpoints refuses to start with a state that has no codec.
    pub fn checkpointed(
        mut self,
        encode_key: impl Fn(&K, &mut Vec<u8>) + Send + Sync + 'static,
        decode_key: impl Fn(&[u8]) -> Option<K> + Send + Sync + 'static,
        encode_state: impl Fn(&S, &mut Vec<u8>) + Send + Sync + 'static,
        decode_state: impl Fn(&[u8]) -> Option<S> + Send + Sync + 'static,
    ) -> Self {
        self.codec = Some(Arc::new(StateCodec {
            encode_key: Box::new(encode_key),
            decode_key: Box::new(decode_key),
            encode_state: Box::new(encode_state),
            decode_state: Box::new(decode_state),
        }));
        self
    }
}

/// One worker's part of a keyed state. With checkpoints on, the keys touched since the last
/// checkpoint are listed (a flag per key and one push on its first touch), so that the next
/// checkpoint copies only those.
pub(crate) struct Store<K, S> {
    pub(crate) map: HashMap<K, (S, bool), FxBuild>,
    init: Arc<dyn Fn(&K) -> S + Send + Sync>,
    codec: Option<Arc<StateCodec<K, S>>>,
    name: Arc<str>,
    /// Whether touched keys are listed (checkpoints are on and the state has a codec).
    track: bool,
    changed: Vec<K>,
}

impl<K: Hash + Eq + Clone, S> Store<K, S> {
    pub(crate) fn new(state: &KeyedState<K, S>) -> Self {
        Store {
            map: HashMap::default(),
            init: state.init.clone(),
            codec: state.codec.clone(),
            name: state.name.clone(),
            track: false,
            changed: Vec::new(),
        }
    }

    /// The key's state, made on its first sight.
    #[cfg(test)]
    pub(crate) fn get(&mut self, key: K) -> &mut S {
        &mut self.slot(key).into_mut().0
    }

    /// The key's entry, its state made on its first sight: for a step that may drop the state
    /// afterwards (`remove_entry`; the key is marked changed already, so the next checkpoint
    /// records it as gone). Always inlined: it is the tail's lookup per record, and a front
    /// end with many pipeline types (the Python one) otherwise got it as a call of its own,
    /// some 20 instructions a record more (callgrind).
    #[inline(always)]
    pub(crate) fn slot(
        &mut self,
        key: K,
    ) -> std::collections::hash_map::OccupiedEntry<'_, K, (S, bool)> {
        use std::collections::hash_map::Entry;
        match self.map.entry(key) {
            Entry::Occupied(mut e) => {
                if self.track && !e.get().1 {
                    self.changed.push(e.key().clone());
                    e.get_mut().1 = true;
                }
                e
            }
            Entry::Vacant(e) => {
                let s = (self.init)(e.key());
                if self.track {
                    self.changed.push(e.key().clone());
                }
                e.insert_entry((s, self.track))
            }
        }
    }
}

/// A worker's part of a keyed state as checkpoints see it, whatever its types.
pub(crate) trait Snap {
    /// The state's name (its section in checkpoint files).
    fn name(&self) -> &str;
    /// Lists touched keys from now on.
    fn track(&mut self);
    /// The keys touched since the last call, with their states; clears the list.
    fn delta(&mut self) -> Entries;
    /// Applies a checkpoint's entries for the keys this worker owns (of `workers`); returns
    /// (keys applied, entries that did not decode).
    fn restore(&mut self, entries: &Entries, me: usize, workers: usize) -> (u64, u64);
}

impl<K: Hash + Eq + Clone, S> Snap for Store<K, S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn track(&mut self) {
        self.track = self.codec.is_some();
    }

    fn delta(&mut self) -> Entries {
        let mut out = Entries::default();
        let Some(codec) = self.codec.clone() else {
            return out;
        };
        for k in self.changed.drain(..) {
            match self.map.get_mut(&k) {
                Some((s, mark)) => {
                    if *mark {
                        *mark = false;
                        let s: &S = s;
                        out.push(
                            |b| (codec.encode_key)(&k, b),
                            Some(&|b: &mut Vec<u8>| (codec.encode_state)(s, b)),
                        );
                    }
                }
                // Dropped since (a step discarded it): gone from the checkpoint too.
                None => out.push(|b| (codec.encode_key)(&k, b), None),
            }
        }
        out
    }

    fn restore(&mut self, entries: &Entries, me: usize, workers: usize) -> (u64, u64) {
        let Some(codec) = self.codec.clone() else {
            return (0, 0);
        };
        let (mut applied, mut bad) = (0, 0);
        for (kb, sb) in entries.iter() {
            let Some(k) = (codec.decode_key)(kb) else {
                bad += 1;
                continue;
            };
            if owner(&k, workers) != me {
                continue;
            }
            match sb {
                None => {
                    self.map.remove(&k);
                }
                Some(sb) => match (codec.decode_state)(sb) {
                    Some(s) => {
                        self.map.insert(k, (s, false));
                    }
                    None => {
                        bad += 1;
                        continue;
                    }
                },
            }
            applied += 1;
        }
        (applied, bad)
    }
}

/// Where a stateful step sends what it makes, and when its input was read.
pub struct Emit<'a, O> {
    f: &'a mut dyn FnMut(O),
    read_ns: u64,
    discard: bool,
}

impl<'a, O> Emit<'a, O> {
    /// An `Emit` handing each item to `f`, for input read at `read_ns` (ns since the Unix
    /// epoch): to run a [`Stateful`] step where no pipeline's tail does, such as a Kafka task
    /// that keeps the step's state in its changelog.
    pub fn new(f: &'a mut dyn FnMut(O), read_ns: u64) -> Self {
        Emit {
            f,
            read_ns,
            discard: false,
        }
    }

    /// Drops the key's state once this call returns: its next item starts from a new state
    /// (made as on the key's first sight). A checkpoint or changelog then holds no state for
    /// the key.
    #[inline]
    pub fn discard(&mut self) {
        self.discard = true;
    }

    /// Whether [`Emit::discard`] was called.
    #[inline]
    pub fn discarded(&self) -> bool {
        self.discard
    }

    /// Sends `item` on, to the steps after this one and the sink.
    #[inline]
    pub fn emit(&mut self, item: O) {
        (self.f)(item)
    }

    /// When the input being handled was read from its source, in ns since the Unix epoch (0
    /// while windows are flushed at the end of the input).
    pub fn source_time_ns(&self) -> u64 {
        self.read_ns
    }
}

/// A stateful step: runs on the worker owning each item's key, with that key's state.
pub trait Stateful<K, T>: Clone + Send + 'static {
    /// The state per key.
    type State: 'static;
    /// What it emits.
    type Out: 'static;
    /// The keyed state it works on.
    fn state(&self) -> KeyedState<K, Self::State>;
    /// Handles one item.
    fn update(&mut self, state: &mut Self::State, item: T, emit: &mut Emit<'_, Self::Out>);
    /// The input has ended: emit what is still held for `key` (open windows, final
    /// aggregations); [`Emit::discard`] drops the key's state.
    fn finish(&mut self, key: &K, state: &mut Self::State, emit: &mut Emit<'_, Self::Out>) {
        let _ = (key, state, emit);
    }
    /// Items refused as too late (event-time windows).
    fn late(&self) -> u64 {
        0
    }
    /// Windows dropped short at the end of the input (count windows that keep only full
    /// ones).
    fn dropped(&self) -> u64 {
        0
    }
    /// Whether the step asks for wake-ups ([`Stateful::wake_at`]): a step that does not is
    /// never asked, at no cost.
    const TIMERS: bool = false;
    /// When [`Stateful::notify`] should next run for `key` (ns of system time since the Unix
    /// epoch), or None; asked after each of the key's items and wake-ups (with
    /// [`Stateful::TIMERS`]).
    fn wake_at(&mut self, key: &K, state: &Self::State) -> Option<u64> {
        let _ = (key, state);
        None
    }
    /// The time `wake_at` gave for `key` has come (`now_ns`); [`Emit::discard`] drops the
    /// key's state.
    fn notify(
        &mut self,
        key: &K,
        state: &mut Self::State,
        now_ns: u64,
        emit: &mut Emit<'_, Self::Out>,
    ) {
        let _ = (key, state, now_ns, emit);
    }
}

/// The keys of a tail that asked for a wake-up, by time.
pub(crate) struct Timers<K> {
    due: std::collections::BTreeMap<(u64, u64), K>,
    at: HashMap<K, (u64, u64), FxBuild>,
    seq: u64,
}

impl<K> Default for Timers<K> {
    fn default() -> Self {
        Timers {
            due: Default::default(),
            at: HashMap::default(),
            seq: 0,
        }
    }
}

impl<K: Hash + Eq + Clone> Timers<K> {
    /// Sets (or clears) `key`'s wake-up; true if it is now the earliest.
    pub(crate) fn set(&mut self, key: &K, at: Option<u64>) -> bool {
        if let Some(old) = self.at.remove(key) {
            self.due.remove(&old);
        }
        let Some(at) = at else { return false };
        self.seq += 1;
        let slot = (at, self.seq);
        self.due.insert(slot, key.clone());
        self.at.insert(key.clone(), slot);
        self.due.first_key_value().is_some_and(|(s, _)| *s == slot)
    }

    /// The earliest wake-up.
    pub(crate) fn next(&self) -> Option<u64> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// Takes the keys due at `now`.
    pub(crate) fn take_due(&mut self, now: u64) -> Vec<K> {
        let mut out = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let k = entry.remove();
            self.at.remove(&k);
            out.push(k);
        }
        out
    }
}

/// A stateful step from a closure over a shared [`KeyedState`].
pub struct Update<K, S, F, O> {
    state: KeyedState<K, S>,
    f: F,
    _o: PhantomData<fn() -> O>,
}

impl<K, S, F: Clone, O> Clone for Update<K, S, F, O> {
    fn clone(&self) -> Self {
        Update {
            state: self.state.clone(),
            f: self.f.clone(),
            _o: PhantomData,
        }
    }
}

impl<K, S, F, O> Update<K, S, F, O> {
    pub(crate) fn new(state: &KeyedState<K, S>, f: F) -> Self {
        Update {
            state: state.clone(),
            f,
            _o: PhantomData,
        }
    }
}

impl<K, S, T, F, O> Stateful<K, T> for Update<K, S, F, O>
where
    K: 'static,
    S: 'static,
    O: 'static,
    F: FnMut(&mut S, T, &mut Emit<'_, O>) + Clone + Send + 'static,
{
    type State = S;
    type Out = O;
    fn state(&self) -> KeyedState<K, S> {
        self.state.clone()
    }
    #[inline]
    fn update(&mut self, state: &mut S, item: T, emit: &mut Emit<'_, O>) {
        (self.f)(state, item, emit)
    }
}

/// Where a window starts and ends: item positions in its key's stream for count windows
/// (`start..end`), event times in ns for tumbling windows (`[start, end)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First position or time in the window.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// An aggregation per window: a starting value, how each item updates it, and the output made
/// of it when the window closes.
pub struct Aggregate<K, T, A, O> {
    pub(crate) init: Arc<dyn Fn() -> A + Send + Sync>,
    pub(crate) update: Arc<dyn Fn(&mut A, T) + Send + Sync>,
    pub(crate) output: Arc<dyn Fn(&K, A, Span) -> O + Send + Sync>,
}

impl<K, T, A, O> Clone for Aggregate<K, T, A, O> {
    fn clone(&self) -> Self {
        Aggregate {
            init: self.init.clone(),
            update: self.update.clone(),
            output: self.output.clone(),
        }
    }
}

impl<K, T, A, O> Aggregate<K, T, A, O> {
    /// The aggregation of `init`, `update` and `output`.
    pub fn new(
        init: impl Fn() -> A + Send + Sync + 'static,
        update: impl Fn(&mut A, T) + Send + Sync + 'static,
        output: impl Fn(&K, A, Span) -> O + Send + Sync + 'static,
    ) -> Self {
        Aggregate {
            init: Arc::new(init),
            update: Arc::new(update),
            output: Arc::new(output),
        }
    }
}

/// One key's open window.
pub struct Open<K, A> {
    key: K,
    acc: Option<A>,
    /// Count windows: items so far in the key's stream. Tumbling: the open window's start.
    at: u64,
}

impl<K: 'static, A: 'static> Open<K, A> {
    /// A state of open windows with codecs: the key, the position or start, then the value
    /// (if there is one yet).
    fn with_codecs(
        state: KeyedState<K, Open<K, A>>,
        codecs: Codecs<K, A>,
    ) -> KeyedState<K, Open<K, A>> {
        state.with_codecs(
            codecs,
            |c, o: &Open<K, A>, b| {
                c.put_key(&o.key, b);
                put_u64(b, o.at);
                c.put_option(&o.acc, b);
            },
            |c, b| {
                Some(Open {
                    key: c.take_key(b)?,
                    at: b.u64().ok()?,
                    acc: c.take_option(b)?,
                })
            },
        )
    }
}

/// A count window: every `size` items of a key make one output. A window still short when the
/// input ends is emitted with the end it reached (its [`Span`] shorter than `size`), or, when
/// only full windows are kept, dropped and counted ([`Stateful::dropped`]).
pub struct CountWindow<K, T, A, O> {
    state: KeyedState<K, Open<K, A>>,
    size: u64,
    agg: Aggregate<K, T, A, O>,
    partial: bool,
    dropped: u64,
}

impl<K, T, A, O> Clone for CountWindow<K, T, A, O> {
    fn clone(&self) -> Self {
        CountWindow {
            state: self.state.clone(),
            size: self.size,
            agg: self.agg.clone(),
            partial: self.partial,
            dropped: 0,
        }
    }
}

impl<K: Clone + Send + Sync + 'static, T, A: 'static, O> CountWindow<K, T, A, O> {
    pub(crate) fn new(name: &str, size: u64, partial: bool, agg: Aggregate<K, T, A, O>) -> Self {
        CountWindow {
            state: KeyedState::new(name, |k: &K| Open {
                key: k.clone(),
                acc: None,
                at: 0,
            }),
            size: size.max(1),
            agg,
            partial,
            dropped: 0,
        }
    }
}

impl<K: 'static, T, A: 'static, O> Checkpointable<K> for CountWindow<K, T, A, O> {
    type Value = A;
    fn with_codecs(mut self, codecs: Codecs<K, A>) -> Self {
        self.state = Open::with_codecs(self.state, codecs);
        self
    }
}

impl<K, T, A, O> Stateful<K, T> for CountWindow<K, T, A, O>
where
    K: Send + 'static,
    T: 'static,
    A: Send + 'static,
    O: Send + 'static,
{
    type State = Open<K, A>;
    type Out = O;
    fn state(&self) -> KeyedState<K, Open<K, A>> {
        self.state.clone()
    }
    fn update(&mut self, st: &mut Open<K, A>, item: T, emit: &mut Emit<'_, O>) {
        let acc = st.acc.get_or_insert_with(|| (self.agg.init)());
        (self.agg.update)(acc, item);
        st.at += 1;
        if st.at.is_multiple_of(self.size) {
            if let Some(acc) = st.acc.take() {
                let span = Span {
                    start: st.at - self.size,
                    end: st.at,
                };
                emit.emit((self.agg.output)(&st.key, acc, span));
            }
        }
    }
    fn finish(&mut self, _: &K, st: &mut Open<K, A>, emit: &mut Emit<'_, O>) {
        if let Some(acc) = st.acc.take() {
            if self.partial {
                let span = Span {
                    start: st.at - st.at % self.size,
                    end: st.at,
                };
                emit.emit((self.agg.output)(&st.key, acc, span));
            } else {
                self.dropped += 1;
            }
        }
        emit.discard();
    }
    fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// An event-time tumbling window: items are grouped per key by the window of `size` their
/// event time falls in; a window closes when an item of the same key from a later window
/// arrives, or when the input ends. An item older than the key's open window is late: counted
/// and dropped.
pub struct TumblingWindow<K, T, A, O> {
    state: KeyedState<K, Open<K, A>>,
    size: u64,
    time: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
    agg: Aggregate<K, T, A, O>,
    late: u64,
}

impl<K, T, A, O> Clone for TumblingWindow<K, T, A, O> {
    fn clone(&self) -> Self {
        TumblingWindow {
            state: self.state.clone(),
            size: self.size,
            time: self.time.clone(),
            agg: self.agg.clone(),
            late: 0,
        }
    }
}

impl<K: Clone + Send + Sync + 'static, T, A: 'static, O> TumblingWindow<K, T, A, O> {
    pub(crate) fn new(
        name: &str,
        size: Duration,
        time: impl Fn(&T) -> u64 + Send + Sync + 'static,
        agg: Aggregate<K, T, A, O>,
    ) -> Self {
        TumblingWindow {
            state: KeyedState::new(name, |k: &K| Open {
                key: k.clone(),
                acc: None,
                at: 0,
            }),
            size: (size.as_nanos() as u64).max(1),
            time: Arc::new(time),
            agg,
            late: 0,
        }
    }
}

impl<K: 'static, T, A: 'static, O> Checkpointable<K> for TumblingWindow<K, T, A, O> {
    type Value = A;
    fn with_codecs(mut self, codecs: Codecs<K, A>) -> Self {
        self.state = Open::with_codecs(self.state, codecs);
        self
    }
}

impl<K, T, A, O> Stateful<K, T> for TumblingWindow<K, T, A, O>
where
    K: Send + 'static,
    T: 'static,
    A: Send + 'static,
    O: Send + 'static,
{
    type State = Open<K, A>;
    type Out = O;
    fn state(&self) -> KeyedState<K, Open<K, A>> {
        self.state.clone()
    }
    fn update(&mut self, st: &mut Open<K, A>, item: T, emit: &mut Emit<'_, O>) {
        let t = (self.time)(&item);
        let start = t - t % self.size;
        if st.acc.is_some() {
            if start < st.at {
                self.late += 1;
                return;
            }
            if start > st.at {
                self.close(st, emit);
            }
        }
        if st.acc.is_none() {
            st.at = start;
        }
        let acc = st.acc.get_or_insert_with(|| (self.agg.init)());
        (self.agg.update)(acc, item);
    }
    fn finish(&mut self, _: &K, st: &mut Open<K, A>, emit: &mut Emit<'_, O>) {
        self.close(st, emit);
    }
    fn late(&self) -> u64 {
        self.late
    }
}

impl<K, T, A, O> TumblingWindow<K, T, A, O> {
    fn close(&self, st: &mut Open<K, A>, emit: &mut Emit<'_, O>) {
        if let Some(acc) = st.acc.take() {
            let span = Span {
                start: st.at,
                end: st.at + self.size,
            };
            emit.emit((self.agg.output)(&st.key, acc, span));
        }
    }
}

/// A final aggregation: each key's items are folded as they come, and one `(key, value)` per
/// key goes out when the input ends (Bytewax's `fold_final` and its kin); the key's state is
/// dropped then. Built by [`Keyed::fold_final`](super::Keyed::fold_final),
/// [`count_final`](super::Keyed::count_final), [`reduce_final`](super::Keyed::reduce_final),
/// [`max_final`](super::Keyed::max_final) and [`min_final`](super::Keyed::min_final).
pub struct Final<K, T, A> {
    state: KeyedState<K, Option<A>>,
    fold: Arc<dyn Fn(&mut Option<A>, T) + Send + Sync>,
}

impl<K, T, A> Clone for Final<K, T, A> {
    fn clone(&self) -> Self {
        Final {
            state: self.state.clone(),
            fold: self.fold.clone(),
        }
    }
}

impl<K, T, A> Final<K, T, A> {
    /// `fold(acc, item)` for each item of a key, `acc` None before its first.
    pub(crate) fn new(
        name: &str,
        fold: impl Fn(&mut Option<A>, T) + Send + Sync + 'static,
    ) -> Self {
        Final {
            state: KeyedState::new(name, |_: &K| None),
            fold: Arc::new(fold),
        }
    }
}

impl<K: 'static, T, A: 'static> Checkpointable<K> for Final<K, T, A> {
    type Value = A;
    /// The value folded so far, if any.
    fn with_codecs(mut self, codecs: Codecs<K, A>) -> Self {
        self.state = self.state.with_codecs(
            codecs,
            |c, acc: &Option<A>, b| c.put_option(acc, b),
            |c, b| c.take_option(b),
        );
        self
    }
}

impl<K, T, A> Stateful<K, T> for Final<K, T, A>
where
    K: Clone + Send + 'static,
    T: 'static,
    A: Send + 'static,
{
    type State = Option<A>;
    type Out = (K, A);
    fn state(&self) -> KeyedState<K, Option<A>> {
        self.state.clone()
    }
    #[inline]
    fn update(&mut self, acc: &mut Option<A>, item: T, _: &mut Emit<'_, (K, A)>) {
        (self.fold)(acc, item)
    }
    fn finish(&mut self, key: &K, acc: &mut Option<A>, emit: &mut Emit<'_, (K, A)>) {
        if let Some(acc) = acc.take() {
            emit.emit((key.clone(), acc));
        }
        emit.discard();
    }
}

/// Which records of a side a [`Join`] keeps (Bytewax's `insert_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinInsert {
    /// The side's first record.
    First,
    /// The side's latest record.
    Last,
    /// Every record of the side: the rows are every combination.
    Product,
}

/// When a [`Join`] emits (Bytewax's `emit_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinEmit {
    /// Once every side has a record for the key; then the key's records are dropped.
    Complete,
    /// When the input ends, whatever the sides hold (None for a side without a record).
    Final,
    /// On every record, None for the sides without one yet; nothing is dropped.
    Running,
}

/// A join by key of several sides: its items are `(side, record)`, and it emits
/// `(key, row)`, a row holding one record (or None) per side. Built by
/// [`Keyed::join`](super::Keyed::join).
pub struct Join<K, V> {
    state: KeyedState<K, Vec<Vec<V>>>,
    insert: JoinInsert,
    emit: JoinEmit,
}

impl<K, V> Clone for Join<K, V> {
    fn clone(&self) -> Self {
        Join {
            state: self.state.clone(),
            insert: self.insert,
            emit: self.emit,
        }
    }
}

impl<K, V> Join<K, V> {
    pub(crate) fn new(name: &str, sides: usize, insert: JoinInsert, emit: JoinEmit) -> Self {
        Join {
            state: KeyedState::new(name, move |_: &K| (0..sides).map(|_| Vec::new()).collect()),
            insert,
            emit,
        }
    }
}

impl<K: 'static, V: 'static> Checkpointable<K> for Join<K, V> {
    type Value = V;
    /// Each side's records kept so far.
    fn with_codecs(mut self, codecs: Codecs<K, V>) -> Self {
        self.state = self.state.with_codecs(
            codecs,
            |c, sides: &Vec<Vec<V>>, b| c.put_sides(sides, b),
            |c, b| c.take_sides(b),
        );
        self
    }
}

/// Every combination of the sides' records (a record, or None for an empty side, from each),
/// the last side varying fastest.
pub(crate) fn join_rows<V: Clone>(sides: &[Vec<V>], mut row_out: impl FnMut(Vec<Option<V>>)) {
    let mut at = vec![0usize; sides.len()];
    loop {
        let row = sides
            .iter()
            .zip(&at)
            .map(|(s, i)| s.get(*i).cloned())
            .collect();
        row_out(row);
        let mut i = sides.len();
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            at[i] += 1;
            if at[i] < sides[i].len() {
                break;
            }
            at[i] = 0;
        }
    }
}

impl<K, V> Stateful<K, (K, usize, V)> for Join<K, V>
where
    K: Clone + Send + 'static,
    V: Clone + Send + 'static,
{
    type State = Vec<Vec<V>>;
    type Out = (K, Vec<Option<V>>);
    fn state(&self) -> KeyedState<K, Vec<Vec<V>>> {
        self.state.clone()
    }
    fn update(
        &mut self,
        sides: &mut Vec<Vec<V>>,
        (key, side, item): (K, usize, V),
        emit: &mut Emit<'_, Self::Out>,
    ) {
        let Some(slot) = sides.get_mut(side) else {
            return;
        };
        match self.insert {
            JoinInsert::First if !slot.is_empty() => {}
            JoinInsert::First | JoinInsert::Product => slot.push(item),
            JoinInsert::Last => *slot = vec![item],
        }
        match self.emit {
            JoinEmit::Complete if sides.iter().all(|s| !s.is_empty()) => {
                join_rows(sides, |row| emit.emit((key.clone(), row)));
                emit.discard();
            }
            JoinEmit::Running => join_rows(sides, |row| emit.emit((key.clone(), row))),
            _ => {}
        }
    }
    fn finish(&mut self, key: &K, sides: &mut Vec<Vec<V>>, emit: &mut Emit<'_, Self::Out>) {
        if self.emit == JoinEmit::Final && sides.iter().any(|s| !s.is_empty()) {
            join_rows(sides, |row| emit.emit((key.clone(), row)));
        }
        emit.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<S: Stateful<u32, (u32, u64)>>(
        step: &mut S,
        items: &[(u32, u64)],
        finish: bool,
    ) -> Vec<S::Out> {
        let state = step.state();
        let mut store = Store::new(&state);
        let mut out = Vec::new();
        for &item in items {
            let st = store.get(item.0);
            step.update(st, item, &mut Emit::new(&mut |o| out.push(o), 0));
        }
        if finish {
            let mut keys: Vec<u32> = store.map.keys().copied().collect();
            keys.sort_unstable();
            for k in keys {
                let st = store.get(k);
                step.finish(&k, st, &mut Emit::new(&mut |o| out.push(o), 0));
            }
        }
        out
    }

    fn sum() -> Aggregate<u32, (u32, u64), u64, (u32, u64, Span)> {
        Aggregate::new(
            || 0u64,
            |a: &mut u64, (_, v): (u32, u64)| *a += v,
            |k: &u32, a, span| (*k, a, span),
        )
    }

    #[test]
    fn count_windows_close_every_n_items_per_key() {
        let mut w = CountWindow::new("w", 2, true, sum());
        let out = run(
            &mut w,
            &[(1, 1), (2, 10), (1, 2), (1, 4), (2, 20), (1, 8)],
            true,
        );
        assert_eq!(
            out,
            [
                (1, 3, Span { start: 0, end: 2 }),
                (2, 30, Span { start: 0, end: 2 }),
                (1, 12, Span { start: 2, end: 4 }),
            ]
        );
    }

    #[test]
    fn tumbling_windows_close_on_a_later_window_or_at_the_end_and_drop_late_items() {
        // Event time is the item's value in seconds.
        let mut w = TumblingWindow::new(
            "w",
            Duration::from_secs(10),
            |&(_, v): &(u32, u64)| v * 1_000_000_000,
            sum(),
        );
        let s = |a: u64, b: u64| Span {
            start: a * 1_000_000_000,
            end: b * 1_000_000_000,
        };
        let out = run(
            &mut w,
            &[(1, 1), (1, 9), (2, 5), (1, 12), (1, 3), (1, 35), (2, 6)],
            true,
        );
        assert_eq!(
            out,
            [
                (1, 10, s(0, 10)),
                (1, 12, s(10, 20)),
                (1, 35, s(30, 40)),
                (2, 11, s(0, 10))
            ]
        );
        assert_eq!(w.late(), 1, "(1, 3) came after the window 10..20 opened");
    }

    #[test]
    fn keys_spread_over_workers_and_stay_put() {
        let mut seen = [0usize; 4];
        for k in 0u32..4_000 {
            let w = owner(&k, 4);
            assert_eq!(w, owner(&k, 4));
            seen[w] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        assert_eq!(owner(&7u32, 1), 0);
    }

    /// Symbol `i` as Market Spread writes them: letters in base 26, right-aligned (`   A`,
    /// `   B`, ..., `  BA`).
    fn symbol(mut i: usize) -> [u8; 4] {
        let mut s = [b' '; 4];
        let mut at = 4;
        loop {
            at -= 1;
            s[at] = b'A' + (i % 26) as u8;
            i /= 26;
            if i == 0 || at == 0 {
                return s;
            }
        }
    }

    #[test]
    fn symbols_differing_in_their_last_bytes_spread_over_the_low_bits() {
        // Hash tables index by the low bits: 1,000 symbols must not share a few of them.
        let mut buckets = std::collections::HashSet::new();
        for i in 0..1_000 {
            let mut h = Fx::default();
            std::hash::Hash::hash(&symbol(i), &mut h);
            buckets.insert(h.finish() & 1023);
        }
        assert!(
            buckets.len() > 550,
            "{} of 1024 buckets used",
            buckets.len()
        );
    }

    #[test]
    fn a_discarded_key_is_gone_from_the_next_checkpoint_and_from_a_restore() {
        let state = KeyedState::new("s", |_: &u32| 0u64).checkpointed(
            |k, b| b.extend_from_slice(&k.to_be_bytes()),
            |b| Some(u32::from_be_bytes(b.try_into().ok()?)),
            |s, b| b.extend_from_slice(&s.to_be_bytes()),
            |b| Some(u64::from_be_bytes(b.try_into().ok()?)),
        );
        let mut store = Store::new(&state);
        store.track();
        for k in [1u32, 2, 3] {
            *store.get(k) += 10 + k as u64;
        }
        let first = store.delta();
        // After the checkpoint: key 2 discarded, key 1 changed.
        store.slot(2).remove_entry();
        *store.get(1) += 1;
        let decoded = |e: &Entries| -> Vec<(u32, Option<u64>)> {
            let mut v: Vec<_> = e
                .iter()
                .map(|(k, s)| {
                    let k = u32::from_be_bytes(k.try_into().expect("4 bytes"));
                    (
                        k,
                        s.map(|s| u64::from_be_bytes(s.try_into().expect("8 bytes"))),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let second = store.delta();
        assert_eq!(decoded(&second), [(1, Some(12)), (2, None)]);
        // A restore of both checkpoints in order has keys 1 and 3, not 2.
        let mut back = Store::new(&state);
        back.restore(&first, 0, 1);
        back.restore(&second, 0, 1);
        let mut keys: Vec<_> = back.map.iter().map(|(k, (s, _))| (*k, *s)).collect();
        keys.sort();
        assert_eq!(keys, [(1, 12), (3, 13)]);
    }
}
