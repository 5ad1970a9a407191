"""Stream pipelines written in Python, run on canter's Rust pipeline engine.

    import canter.pipeline as cp

    flow = cp.Flow()
    words = flow.source(cp.tcp("127.0.0.1:7000", frame="lines", decode=cp.text))
    counts = flow.keyed_state(lambda: {"n": 0})

    def count(state, word):
        state["n"] += 1
        return f"{word} {state['n']}"

    (words.flat_map(str.split)
          .key_by(lambda w: w)
          .update(counts, count)
          .sink(cp.tcp_out("127.0.0.1:7001", encode=cp.text)))
    flow.run(workers=2)

Sources, framing, batching, routing by key, backpressure and metrics run in Rust; Python is
called only for your functions, by worker threads that hold the interpreter lock while they
work (no hand-over per record). Built-in decoders and encoders (`raw`, `text`, `json`,
`struct(fmt)`) run in Rust, or with CPython's C code for JSON.

A stream is used once: each step returns a new stream. A pipeline is a source, stateless steps
(`map`, `filter`, `flat_map`, `inspect`, and `flat_map_batch`, called once per batch of
records), at most one `key_by` followed by one stateful step (`update`, `with_state`,
`stateful_map`, `count_window`, `time_window`, `collect_window`, and the final aggregations
`count_final`, `fold_final`, `reduce_final`, `max_final`, `min_final`, which emit
`(key, value)` per key when the input ends), stateless steps again, and a sink. Pipelines given the same keyed state share it (Market Spread's quotes update what
its orders read).

An exception in a user function is logged with its traceback and the record counted as failed;
`errors=` chooses what happens next: `"skip"` (the default: the pipeline goes on), `"stop"`
(nothing more reaches a sink; `run` raises `PipelineError` naming the step, the exception and
the record), or `dead_letter(path)` (a JSON line per failed record). A record the decoder
refuses goes the same way (counted as rejected; its dead-letter line has its text, or
`record_base64`).
"""

import itertools
import json as _json
import operator
import os
import shutil
import signal
import sys
import tempfile
import threading

from . import _native

PipelineError = _native.PipelineError


class Terminated(SystemExit):
    """What `Flow.run` raises after SIGTERM stopped the flow: a `SystemExit` with code 143
    (128 + SIGTERM, what a process killed by it exits with), so that a program that does not
    catch it exits non-zero, as Bytewax's does, and prints no traceback."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)
#: When the record a stateful step is handling was read from its source (ns since the Unix
#: epoch): call it inside `update`, `with_state` or `stateful_map` functions.
source_time_ns = _native.source_time_ns
#: How many log lines the process dropped because its standard error could not be written
#: (closed, or a pipe whose reader left): logging never stops a flow.
log_lines_dropped = _native.log_lines_dropped

__all__ = [
    "Flow", "Stream", "KeyedStream", "State", "StatefulLogic", "PipelineError", "Terminated",
    "merge", "join",
    "join_window",
    "tcp", "file", "directory", "kafka", "iterable", "stdin", "tcp_out", "file_out", "stdout",
    "kafka_out",
    "collect", "discard", "dead_letter",
    "raw", "text", "json", "struct", "source_time_ns", "log_lines_dropped",
]

#: Records of up to 1 MiB by default, as in the Rust pipelines.
MAX_RECORD = 1 << 20


class _Codec:
    def __init__(self, spec, name):
        self.spec = spec
        self.name = name

    def __repr__(self):
        return f"canter.pipeline.{self.name}"


#: Records as `bytes`, unchanged.
raw = _Codec(("raw",), "raw")
#: Records as `str` (UTF-8; a record that is not UTF-8 is rejected input).
text = _Codec(("str",), "text")
#: Records as JSON values (`json.loads` / compact `json.dumps`).
json = _Codec(("json",), "json")


def struct(fmt):
    """Records as tuples of a `struct` format (`">B4sdd"`): unpacked and packed in Rust.
    Standard sizes, no alignment; codes `x ? b B c h H i I l L q Q n N f d s`."""
    return _Codec(("struct", fmt), f"struct({fmt!r})")


def _decoder(d):
    if d is None:
        return raw.spec
    if isinstance(d, _Codec):
        return d.spec
    if callable(d):
        return ("py", d)
    raise TypeError(f"decode= takes canter.pipeline.raw, text, json, struct(fmt) or a function, not {d!r}")


def _encoder(e):
    if e is None:
        return raw.spec
    if isinstance(e, _Codec):
        return e.spec
    if callable(e):
        return ("py", e)
    raise TypeError(f"encode= takes canter.pipeline.raw, text, json, struct(fmt) or a function, not {e!r}")


def _frame(frame):
    if frame not in ("u32be", "lines"):
        raise ValueError(f"frame={frame!r}: 'u32be' (a 4-byte big-endian length) or 'lines'")
    return frame


class _Source:
    def __init__(self, spec, decode):
        self.spec = spec
        self.decode = decode


def tcp(addr, frame="u32be", decode=None, max_record=MAX_RECORD):
    """A TCP listener at `addr` ("host:port"; port 0 for any free one, see `Flow.addrs`):
    every worker accepts connections on it; records framed by `frame`."""
    return _Source(("tcp", addr, _frame(frame), max_record), _decoder(decode))


def file(path, frame="u32be", decode=None, max_record=MAX_RECORD):
    """A file of framed records, read once (the flow ends when every file source has been
    read and delivered)."""
    return _Source(("file", os.fspath(path), _frame(frame), max_record), _decoder(decode))


class _Dir:
    def __init__(self, path, glob, frame, decode, max_record):
        self.path, self.glob = os.fspath(path), glob
        self.frame, self.decode, self.max_record = frame, decode, max_record


def directory(path, glob="*", frame="lines", decode=None, max_record=MAX_RECORD):
    """The files of directory `path` whose names match `glob` (sorted by name, listed when
    the flow is built), each read once as `file(...)` reads one, merged into one stream
    (Bytewax's `DirSource`). A directory without such a file is a FileNotFoundError. Each
    file is its own pipeline (`stats()`: one per file)."""
    return _Dir(path, glob, _frame(frame), decode, max_record)


def iterable(items):
    """The items of `items` (any iterable, read into a list at once), in order, as records:
    Python objects passed as they are, with no decoding (Bytewax's `TestingSource`; for tests
    and notebooks, with `collect(list)` at the end). Read by the first worker; the flow ends
    after the last item."""
    items = list(items)
    return _Source(("iterable", len(items)), ("items", items))


def stdin(decode=None, max_record=64 * 1024):
    """Lines of the standard input (a pipe, a file or a terminal), read by the first worker;
    the flow ends at the end of input. A pipe or a terminal is read by a thread of its own:
    while it waits for input, timers fire and a shutdown ends the flow. `decode=text` gives
    each line as a str."""
    return file("/dev/stdin", frame="lines", decode=decode, max_record=max_record)


def stdout(encode=None):
    """Each output as a line of the standard output (`encode=text` for str records, `json`
    for values): `file_out("/dev/stdout", frame="lines")`, written through the process's
    own descriptor 1, so that its lines and `print`'s share one file offset when the output
    is redirected to a file (`python flow.py > out.txt`), and all are written when `run`
    returns."""
    return file_out("/dev/stdout", encode=encode, frame="lines")


def _kafka_config(config):
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise TypeError("config= takes a dict of librdkafka settings")
    return dict(config)


def kafka_config(pairs=(), file=None):
    """Kafka settings from the command line's form: a properties `file` (``key=value`` or
    ``key: value`` lines, ``#`` and ``!`` comments), then ``KEY=VALUE`` `pairs` over it — what
    `canter pipeline --kafka-config-file/--kafka-config` take. Returns a dict for
    ``config=``."""
    out = {}
    if file is not None:
        with open(file, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line[0] in "#!":
                    continue
                cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
                if cut < 0:
                    raise ValueError(f"{file} line {n}: not key=value")
                out[line[:cut].strip()] = line[cut + 1:].strip()
    for p in pairs:
        k, eq, v = p.partition("=")
        if not eq:
            raise ValueError(f"{p!r} is not KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def kafka(topic, bootstrap, group="canter", decode=None, config=None, tail=True):
    """A Kafka topic's record values, read as a member of consumer group `group` from the
    brokers at `bootstrap` ("host:port,..."). A flow's sources are all Kafka topics or none;
    its topics are co-partitioned and partitioned by the key `key_by` gives (as Kafka Streams
    requires): each partition is a task owning the state of its keys, kept in a compacted
    changelog topic (`<group>-<state>-changelog`, states pickled) and moved with the
    partition when workers or processes join or leave. A Kafka flow's stateful steps:
    `update`, `with_state`, `stateful_map` (with `ttl=`: an expired key's state is a tombstone
    in the changelog), count, time and session windows, and `stateful()` logic (pickled as
    its `snapshot()`, built again from it by the builder; woken at its `notify_at()` within
    the fetch wait, 0.1 s; its `on_eof` runs only when the input ends, below), and `join`
    (each key's sides in the changelog). A Kafka flow is a graph as any flow is (merge,
    branch, join, a stream read by several steps, a key_by after a stateful step), run in
    each partition's task, with one keyed state (the pipelines' `update` steps share it, or
    one window, logic, final aggregation or join) and one output topic; a result keeps the
    key of the record it came from unless a later `key_by` sets another. A `key_by` after
    the stateful step keys the results only: no stateful step may follow it (its keys would
    not be divided by the input's partitions).

    `config` takes client settings by librdkafka's names, as confluent-kafka does:
    ``{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": ..., "sasl.password": ..., "ssl.ca.location": "ca.pem"}``, and
    ``linger.ms``, ``compression.type``, ``session.timeout.ms``, ``fetch.max.bytes``, … An
    unknown key is a ValueError naming it.

    `tail=False` (Bytewax's name) reads the topics to their ends, then ends the flow: each
    partition up to its end as the flow starts (the last stable offset under exactly-once),
    then final aggregations, open windows and `on_eof` hooks run as at the end of a file, and
    their results commit with the ends; a process ends once the group has committed every
    partition at its end. The state goes on from there: the next such run reads what came
    since. A flow's sources are all `tail=False` or none."""
    return _Source(("kafka", topic, bootstrap, group, _kafka_config(config), bool(tail)),
                   _decoder(decode))


def kafka_out(topic, encode=None, config=None):
    """Results to a Kafka topic, keyed (and partitioned) by their input's key. `config`, as
    for `kafka()`, must agree with the sources' where both set a key."""
    return ("kafka", topic, _encoder(encode), _kafka_config(config))


def tcp_out(addr, encode=None):
    """A TCP connection from each worker to `addr` ("host:port"), records framed with a 4-byte
    big-endian length (what `canter receive` reads); reconnects while the peer is down,
    holding records up to a high-water mark (then the sources wait)."""
    return ("tcp", addr, _encoder(encode))


def file_out(path, encode=None, frame="u32be"):
    """Records written to `path`, framed with a 4-byte big-endian length (what `file(...)`
    and `canter receive` read), or with `frame="lines"` as lines of text: each record, then a
    newline (a record holding a newline fails: it would read back as two). A run that resumes
    no checkpoint starts the file afresh (as Bytewax's `FileSink`: a second run does not
    double the output); one that resumes a checkpoint appends. Lines carry no sequence
    header, so a flow with checkpoints refuses them."""
    return ("file", os.fspath(path), _encoder(encode), _frame(frame))


def collect(into):
    """Appends each output to the list `into` (for tests and notebooks)."""
    if not isinstance(into, list):
        raise TypeError("collect() takes a list")
    return ("list", into)


def discard():
    """Drops every output (a pipeline that only updates state)."""
    return ("discard",)


def dead_letter(path):
    """`errors=dead_letter(path)`: each record a function raised on is appended to `path` as a
    JSON line (pipeline, step, error, repr of the record)."""
    return ("dead_letter", os.fspath(path))


def _key_spec(f):
    """`("item", i)` for `operator.itemgetter(i)` (one item), else the function."""
    if type(f) is operator.itemgetter:
        _, args = f.__reduce__()
        if len(args) == 1:
            return ("item", args[0])
    return f


_ids = itertools.count(1)


class State:
    """Keyed state: one Python object per key, made by `factory()` on the key's first
    record, on the worker that owns the key. Give it to `update`, `with_state` or
    `stateful_map` of several pipelines to share it."""

    def __init__(self, flow, factory, name):
        if not callable(factory):
            raise TypeError("keyed_state() takes a function that makes a key's starting state")
        self.flow = flow
        self.factory = factory
        self.name = name
        self.id = next(_ids)


class _Node:
    """A step of the flow's graph: a source, a step, `key_by`, a stateful step, a sink, or
    where streams meet or part (merge, branch, join)."""

    def __init__(self, flow, kind, parents, arg=None):
        self.flow = flow
        self.kind = kind
        self.parents = parents
        self.arg = arg
        self.children = []
        self.name = None
        self.step_name = None
        for p in parents:
            p.children.append(self)


class Stream:
    """Records flowing through a flow. Each step returns a new stream; a stream may take
    several next steps (each gets every record: fan-out). The stateless steps, `key_by`,
    `update`, `with_state`, `stateful_map` and `stateful` take `name=` (Bytewax's step_id):
    the step's name in metrics, logs, errors and dead-letter lines, instead of its position,
    kind and function (`2:map:parse`)."""

    def __init__(self, node):
        self._node = node

    @property
    def flow(self):
        return self._node.flow

    def _child(self, kind, arg=None, cls=None):
        if self._node.kind == "sink":
            raise ValueError(f"{kind}: this stream ended in a sink")
        return (cls or Stream)(_Node(self._node.flow, kind, [self._node], arg))

    def _step(self, kind, f, name=None):
        if not callable(f):
            raise TypeError(f"{kind}() takes a function, not {f!r}")
        return self._child("step", (kind, f, None if name is None else str(name)))

    def named(self, name):
        """Names the pipeline this stream is part of (in logs, metrics, `stats()` and
        `Flow.addrs`)."""
        self._node.name = str(name)
        return self

    def map(self, f, name=None):
        """Each record becomes `f(record)`."""
        return self._step("map", f, name)

    def filter(self, f, name=None):
        """Keeps the records `f` says yes to."""
        return self._step("filter", f, name)

    def flat_map(self, f, name=None):
        """Each record becomes every item of the iterable `f(record)`."""
        return self._step("flat_map", f, name)

    def inspect(self, f, name=None):
        """Calls `f(record)` and passes the record on unchanged (for debugging)."""
        return self._step("inspect", f, name)

    def flat_map_batch(self, f, name=None):
        """Calls `f(records)` once per batch: the list of the records one read of the source
        brought to this step (at most 1024), and passes on every item of the iterable it
        gives. One call for many records, for code that works on a batch at once (a
        vectorized library, one query for many records). If `f` raises, every record of the
        batch counts as failed. Not with checkpoints or on Kafka flows yet."""
        return self._step("flat_map_batch", f, name)

    def branch(self, pred):
        """Two streams: the records `pred(record)` says yes to, and the others (`pred` runs
        once per record; one that raises fails the record)."""
        if not callable(pred):
            raise TypeError(f"branch() takes a function, not {pred!r}")
        b = self._child("branch", pred)._node
        return Stream(_Node(self.flow, "side", [b], True)), Stream(_Node(self.flow, "side", [b], False))

    def merge(self, *others):
        """One stream of this stream's records and those of `others`, as they come."""
        return merge(self, *others)

    def key_by(self, f, name=None):
        """Routes each record to the worker owning its key `f(record)` (str, int, bytes, None
        or a tuple of them), where the stateful step runs with that key's state. With
        `operator.itemgetter(i)` the key is looked up in Rust, with no Python call."""
        if not callable(f):
            raise TypeError(f"key_by() takes a function, not {f!r}")
        out = self._child("key_by", _key_spec(f), KeyedStream)
        out._node.step_name = None if name is None else str(name)
        return out

    def sink(self, sink):
        """Ends the stream in `sink` (`tcp_out`, `file_out`, `stdout`, `collect`, `discard`)."""
        if not isinstance(sink, tuple):
            raise TypeError(f"sink() takes tcp_out(...), file_out(...), collect(list) or discard(), not {sink!r}")
        self._child("sink", sink)
        return self._node.flow


class StatefulLogic:
    """The methods a `stateful()` step's logic has (Bytewax's `StatefulLogic`); subclass it
    and override what you need. Each `on_*` returns `(outputs, discard)`."""

    def on_item(self, value):
        """A record of the key: what goes on, and whether to drop this logic."""
        return (), False

    def on_notify(self):
        """The time `notify_at()` gave has come."""
        return (), False

    def on_eof(self):
        """The input has ended."""
        return (), False

    def notify_at(self):
        """When `on_notify` should run next (a `datetime` or seconds since the epoch), or
        None."""
        return None


class _Late(tuple):
    """A late record as a window step hands it on: (key, record)."""
    __slots__ = ()


def _late(key, record):
    return _Late((key, record))


def _split_late(stream):
    """(windows, late records as (key, record)) of a window step that hands on its late
    records."""
    late, windows = stream.branch(lambda x: type(x) is _Late)
    return windows, late.map(tuple)


def merge(*streams):
    """One stream of the records of every stream in `streams`, as they come (Bytewax's
    `merge`)."""
    if not streams:
        raise ValueError("merge() takes one or more streams")
    for s in streams:
        if not isinstance(s, Stream):
            raise TypeError(f"merge() takes streams, not {s!r}")
        if s._node.kind == "sink":
            raise ValueError("merge(): a stream that ended in a sink")
    flow = streams[0].flow
    if any(s.flow is not flow for s in streams):
        raise ValueError("merge(): the streams belong to different flows")
    return Stream(_Node(flow, "merge", [s._node for s in streams]))


def join(*sides, insert="last", emit="complete"):
    """Joins keyed streams by key (Bytewax's `join`): emits `(key, (record of side 1, record
    of side 2, ...))`. `insert`: which records of a side are kept: "last" (the latest),
    "first", or "product" (all; the output is every combination). `emit`: "complete" (once
    every side has a record for the key; then the key's records are dropped), "final" (when
    the input ends, None for a side without a record), or "running" (on every record, None
    for the sides without one yet; nothing is dropped)."""
    if len(sides) < 2:
        raise ValueError("join() takes two or more keyed streams")
    for s in sides:
        if not isinstance(s, KeyedStream):
            raise TypeError(f"join() takes keyed streams (after key_by), not {s!r}")
    if insert not in ("first", "last", "product"):
        raise ValueError(f"join(): insert= is 'first', 'last' or 'product', not {insert!r}")
    if emit not in ("complete", "final", "running"):
        raise ValueError(f"join(): emit= is 'complete', 'final' or 'running', not {emit!r}")
    flow = sides[0].flow
    if any(s.flow is not flow for s in sides):
        raise ValueError("join(): the streams belong to different flows")
    return Stream(_Node(flow, "join", [s._node for s in sides], (insert, emit)))


def join_window(*sides, size, time, slide=None, product=False, wait=0.0):
    """Joins keyed streams by key within event-time windows (Bytewax's `join_window`): the
    records of each window of `size` seconds (a new one every `slide`, default `size`) are
    gathered per side, and when the window closes (as `time_window`'s do: a record of the key
    at or past its end plus `wait` seconds, or the end of the input: records of two streams
    come out of order between them, and `wait` is how far) it emits `(key, start, end, row)`: a row of
    each side's latest record in the window (None for a side with none), or with
    `product=True` one row for every combination of the sides' records. `time(record)` gives
    a record's time in seconds, whichever side it comes from. Late records (behind the key's
    watermark, as for `time_window`) are counted (`stats()["late"]`) and dropped."""
    if len(sides) < 2:
        raise ValueError("join_window() takes two or more keyed streams")
    for s in sides:
        if not isinstance(s, KeyedStream):
            raise TypeError(f"join_window() takes keyed streams (after key_by), not {s!r}")
    if not callable(time):
        raise TypeError("join_window(): time= takes a function giving a record's time")
    slide = size if slide is None else slide
    if slide > size:
        raise ValueError(f"join_window(): slide ({slide}) larger than size ({size}) would "
                         "skip records")
    flow = sides[0].flow
    if any(s.flow is not flow for s in sides):
        raise ValueError("join_window(): the streams belong to different flows")
    return Stream(_Node(flow, "join", [s._node for s in sides],
                        ("window", float(size), float(slide), time, bool(product),
                         _seconds(wait, "join_window", "wait"))))


def _seconds(v, what, arg):
    """A duration given as seconds or a timedelta, as float seconds."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hasattr(v, "total_seconds"):
        return float(v.total_seconds())
    raise TypeError(f"{what}(): {arg}= takes seconds or a timedelta, not {v!r}")


def _window_join(sides, time, product, wait):
    """The time window stage and the step after it that make a `join_window` of the tagged
    `(key, side, record)` items its pipeline reads."""
    def at(tagged):
        return time(tagged[2])

    def init():
        return [[] for _ in range(sides)]

    def fold(acc, tagged):
        _, side, record = tagged
        if product:
            acc[side].append(record)
        else:
            acc[side] = [record]
        return acc

    def rows(window):
        key, start, end, acc = window
        for row in itertools.product(*(vals or [None] for vals in acc)):
            yield (key, start, end, row)
    return (("window", "time", None, None, at, init, fold, None, None, wait),
            ("flat_map", rows, None))


class KeyedStream(Stream):
    """Records after `key_by`: next comes a stateful step, a join, or a sink (routed by key
    only)."""

    def join(self, *others, insert="last", emit="complete"):
        """`join(self, *others, ...)`."""
        return join(self, *others, insert=insert, emit=emit)

    def join_window(self, *others, size, time, slide=None, product=False, wait=0.0):
        """`join_window(self, *others, ...)`."""
        return join_window(self, *others, size=size, time=time, slide=slide, product=product,
                           wait=wait)

    def _stateful(self, what, spec, name=None):
        out = self._child("stateful", spec)
        out._node.step_name = None if name is None else str(name)
        return out

    def _state(self, state, f, what):
        if not isinstance(state, State):
            raise TypeError(f"{what}() takes a state from Flow.keyed_state()")
        if state.flow is not self.flow:
            raise ValueError(f"{what}(): the state belongs to another flow")
        if not callable(f):
            raise TypeError(f"{what}() takes a function (state, record)")

    @staticmethod
    def _on_eof(on_eof, what):
        if on_eof is not None and not callable(on_eof):
            raise TypeError(f"{what}(): on_eof= takes a function of a key's state")
        return on_eof

    @staticmethod
    def _ttl(ttl, what):
        return None if ttl is None else _seconds(ttl, what, "ttl")

    def update(self, state, f, *, on_eof=None, ttl=None, name=None):
        """`f(state, record)` with the record's key's state, which it may change in place;
        what it returns, unless None, goes on. A state that cannot change in place (an int, a
        str, a tuple, ...) is refused: a change to it would be lost (use `stateful_map`).
        A state factory that raises fails the record; the key's next record tries again.
        `on_eof(state)` is called for each key when this pipeline's input ends (a file read to
        its end, a shutdown); what it returns, unless None, goes on. `ttl` (seconds or a
        timedelta): a key with no record for that long has its state dropped (its next record
        starts from the factory's)."""
        self._state(state, f, "update")
        on_eof = self._on_eof(on_eof, "update")
        return self._stateful("update", ("update", state.id, f, False, on_eof,
                                         self._ttl(ttl, "update")), name)

    def with_state(self, state, f, *, name=None):
        """`f(state, record)`, as `update`, for steps that read the state (an order checked
        against its symbol's quote) rather than change it: on Kafka, changes it makes are not
        written to the changelog."""
        self._state(state, f, "with_state")
        return self._stateful("with_state", ("update", state.id, f, True, None, None), name)

    def stateful_map(self, state, f, *, on_eof=None, ttl=None, name=None):
        """`f(state, record)` returns `(new_state, output)`: the key's state becomes
        `new_state`; the output, unless None, goes on (for immutable states: numbers, tuples).
        `new_state` None drops the key's state (Bytewax's rule): its next record starts from
        the state factory's again. `on_eof(state)` and `ttl` as for `update`."""
        self._state(state, f, "stateful_map")
        on_eof = self._on_eof(on_eof, "stateful_map")
        return self._stateful("stateful_map", ("stateful_map", state.id, f, False, on_eof,
                                               self._ttl(ttl, "stateful_map")), name)

    def stateful(self, builder, *, name=None):
        """A keyed step with its own logic per key (Bytewax's `stateful`): `builder(None)`
        makes a key's logic on its first record, an object with the methods of
        `StatefulLogic`: `on_item(record)`, `on_notify()` (called once the time `notify_at()`
        gives has come, without a record: a timer), and `on_eof()` (the input ended) each
        return `(outputs, discard)`; each output goes on as `(key, output)`, and `discard`
        True drops the key's logic (its next record builds a new one). `notify_at()` is asked
        after each call: a `datetime`, seconds since the epoch, or None."""
        if not callable(builder):
            raise TypeError("stateful() takes a builder: a function of the resume state "
                            "(None) giving a key's logic")
        return self._stateful("stateful", ("logic", builder), name)

    def _final(self, what, a=None, b=None, name=None):
        return self._stateful(f"{what}_final", ("final", what, a, b), name)

    def count_final(self, name=None):
        """At the end of the input, `(key, n)` for each key: how many records it had."""
        return self._final("count", name=name)

    def fold_final(self, init, fold, name=None):
        """At the end of the input, `(key, value)` for each key: the value folded from
        `init()` by `value = fold(value, record)` over the key's records (Bytewax's
        `fold_final`). A `fold` that raises fails its record; the value stays as it was."""
        if not callable(init) or not callable(fold):
            raise TypeError("fold_final() takes init (a function making the starting value) and "
                            "fold(value, record)")
        return self._final("fold", init, fold, name)

    def reduce_final(self, f, name=None):
        """At the end of the input, `(key, value)` for each key: the key's records combined
        by `value = f(value, record)`, from its first record."""
        if not callable(f):
            raise TypeError("reduce_final() takes a function (value, record)")
        return self._final("reduce", f, name=name)

    def max_final(self, by=None, name=None):
        """At the end of the input, `(key, record)` for each key: its record with the largest
        `by(record)` (the record itself without `by`); the first of equals."""
        if by is not None and not callable(by):
            raise TypeError("max_final(): by= takes a function")
        return self._final("max", by, name=name)

    def min_final(self, by=None, name=None):
        """At the end of the input, `(key, record)` for each key: its record with the smallest
        `by(record)`; the first of equals."""
        if by is not None and not callable(by):
            raise TypeError("min_final(): by= takes a function")
        return self._final("min", by, name=name)

    @staticmethod
    def _agg(what, init, fold, reduce):
        if (fold is None) == (reduce is None):
            raise ValueError(f"{what}(): give fold= (with init=) or reduce=")
        if fold is not None and not callable(init):
            raise ValueError(f"{what}(): fold= needs init=, a function making the starting value")

    def _window(self, what, by, size, slide, time, init, fold, reduce, late=False, wait=0.0,
                name=None, partial=True):
        self._agg(what, init, fold, reduce)
        slide = size if slide is None else slide
        if slide > size:
            raise ValueError(f"{what}(): slide ({slide}) larger than size ({size}) would skip records")
        mark = _late if late else None
        out = self._stateful(what, ("window", by, float(size), float(slide), time, init, fold,
                                    reduce, mark, _seconds(wait, what, "wait"), bool(partial)),
                             name)
        return _split_late(out) if late else out

    def session_window(self, gap, *, time, init=None, fold=None, reduce=None, merge=None,
                       wait=0.0, late=False, name=None):
        """Session windows (Bytewax's `SessionWindower`): a key's records whose times are at
        most `gap` seconds apart are one session; it closes when the key's clock (the latest
        time of its records less `wait` seconds, Bytewax's `wait_for_system_duration`) is more
        than `gap` past its last record, or when the input ends, and is emitted as
        `(key, start, end, value)` (the times of its first and last record), the value folded
        from `init()` by `fold(acc, record)` or made by `reduce(acc, record)`. A record that
        arrives out of order and bridges two sessions merges them: `merge(a, b)` combines their
        values (`reduce` merges by itself). A record that can neither join a session nor open
        one still open is late: counted (`stats()["late"]`), and with `late=True` the step
        returns two streams, the windows and the late `(key, record)`s."""
        if not callable(time):
            raise TypeError("session_window(): time= takes a function giving a record's time")
        self._agg("session_window", init, fold, reduce)
        if merge is not None and not callable(merge):
            raise TypeError("session_window(): merge= takes a function (value, value)")
        out = self._stateful("session_window", ("session", float(gap), time, init, fold, reduce,
                                                merge, _late if late else None, float(wait)),
                             name)
        return _split_late(out) if late else out

    def count_window(self, size, *, slide=None, init=None, fold=None, reduce=None, partial=True,
                     name=None):
        """Windows of `size` records of a key, a new one every `slide` records (default:
        `size`, tumbling). Each full window is emitted as `(key, start, end, value)`, value
        folded from `init()` by `fold(acc, record)` or made by `reduce(acc, record)`; a window
        still short when the input ends is emitted with the end it reached, or with
        `partial=False` dropped and counted (`stats()[pipeline]["dropped_windows"]`)."""
        return self._window("count_window", "count", size, slide, None, init, fold, reduce,
                            name=name, partial=partial)

    def time_window(self, size, *, time, slide=None, init=None, fold=None, reduce=None,
                    late=False, wait=0.0, name=None):
        """Event-time windows of `size` seconds, a new one every `slide` seconds (default:
        `size`, tumbling); `time(record)` gives a record's time in seconds. A window closes
        when a record of its key at or past its end plus `wait` seconds arrives (records may
        come that much out of order; Bytewax's `wait_for_system_duration`), or when the input
        ends, and is emitted as `(key, start, end, value)`. A record behind its key's
        watermark (the latest time of the key's records less `wait`) is late, as in Bytewax,
        even where a window holding it is still open: counted (`stats()["late"]`) and
        dropped, or with `late=True` the step returns two streams: the windows, and the late
        records as `(key, record)`. (Bytewax's watermark also moves with the system clock
        while no record comes; canter's moves with event time only, so that a run gives the
        same output however fast it goes.)"""
        if not callable(time):
            raise TypeError("time_window(): time= takes a function giving a record's time")
        return self._window("time_window", "time", size, slide, time, init, fold, reduce, late,
                            wait, name)

    def collect_window(self, size, *, time=None, slide=None, by="time", name=None):
        """Windows whose value is the list of their records (Bytewax's `collect_window`):
        as `time_window` with `time=` (the records sorted by their time, those of equal times
        in the order they came), or as `count_window` with `by="count"` (in the order they
        came). Emitted as `(key, start, end, [records])`."""
        def append(acc, record):
            acc.append(record)
            return acc
        if by == "count":
            if time is not None:
                raise ValueError("collect_window(by='count') takes no time=")
            return self.count_window(size, slide=slide, init=list, fold=append, name=name)
        if by != "time":
            raise ValueError(f"collect_window(): by= is 'time' or 'count', not {by!r}")
        if not callable(time):
            raise TypeError("collect_window(): time= takes a function giving a record's time "
                            "(or by='count')")
        at = operator.itemgetter(0)

        def timed(acc, record):
            acc.append((time(record), record))
            return acc

        def ordered(w):
            return (w[0], w[1], w[2], [r for _, r in sorted(w[3], key=at)])
        return (self.time_window(size, time=time, slide=slide, init=list, fold=timed, name=name)
                .map(ordered))


class Flow:
    """A set of pipelines run together on the same workers."""

    def __init__(self):
        self._sources = []
        self._states = []
        self._handle = None

    def source(self, source):
        """A stream of `source`'s records (`tcp`, `file`, `kafka`, `iterable`, `stdin`), each a
        new pipeline."""
        if isinstance(source, _Dir):
            import glob as _glob
            files = sorted(p for p in _glob.glob(os.path.join(_glob.escape(source.path), source.glob))
                           if os.path.isfile(p))
            if not files:
                raise FileNotFoundError(f"directory {source.path}: no file matches {source.glob!r}")
            streams = [self.source(file(f, frame=source.frame, decode=source.decode,
                                        max_record=source.max_record)) for f in files]
            return streams[0] if len(streams) == 1 else merge(*streams)
        if not isinstance(source, _Source):
            raise TypeError("source() takes canter.pipeline.tcp(...), file(...), kafka(...), "
                            f"iterable(...), directory(...) or stdin(), not {source!r}")
        n = _Node(self, "source", [], source)
        n.name = f"p{len(self._sources) + 1}"
        self._sources.append(n)
        return Stream(n)

    def keyed_state(self, factory, name=None):
        """A keyed state whose keys start as `factory()`."""
        s = State(self, factory, name or f"state{len(self._states) + 1}")
        self._states.append(s)
        return s

    def _segments(self):
        """The flow's graph cut into the engine's pipelines: each a source (or a channel from
        other pipelines), steps, at most one key_by and stateful step, steps, and a sink (or a
        channel to other pipelines). A stream read by several steps, streams merged or joined,
        a branch, and a key_by after a stateful step are where one pipeline hands its records
        to the next, on the same worker."""
        ids = itertools.count(1)
        chan = {}

        def channel(node):
            if node not in chan:
                chan[node] = next(ids)
            return chan[node]

        segs, started = [], set()
        # (source spec, decode spec, name, first node, key_by node applied first or None, the
        # join side its records are tagged with when that first node is a join, or None)
        todo = [(n.arg.spec, n.arg.decode, n.name, n, None, None) for n in self._sources]
        count = {}

        def later(name, source, node, key=None, side=None):
            base = name.split(".")[0]
            count[base] = count.get(base, 1) + 1
            todo.append((source, None, f"{base}.{count[base]}", node, key, side))

        def once(node, name):
            # A merge or join starts one pipeline, however many streams lead to it.
            if node not in started:
                started.add(node)
                later(name, ("channel", channel(node)), node)

        while todo:
            source, decode, name, node, key, side = todo.pop(0)
            seg = {"name": name, "source": source, "decode": decode, "pre": [], "key": None,
                   "stateful": None, "post": [], "sink": None, "key_name": None,
                   "stateful_name": None}
            if key is not None:
                seg["key"] = key.arg
                seg["key_name"] = key.step_name
            # A line that starts at a key_by after a stateful step (or another key_by): its key
            # is a new one, which a Kafka flow's partitions are not divided by.
            seg["rekeyed"] = source[0] == "channel" and key is None and node.kind == "key_by"
            if side is not None:
                # One of several readers of a keyed stream is a join: this pipeline keys and
                # tags the records as the join's side `side`, as a key_by read by the join
                # alone does.
                seg["stateful"] = ("tag", side)
                seg["sink"] = ("channel", channel(node))
                once(node, name)
                segs.append(seg)
                continue
            cur = node
            while True:
                if cur.name is not None:
                    seg["name"] = cur.name
                k = cur.kind
                if k == "step":
                    (seg["pre"] if seg["key"] is None else seg["post"]).append(cur.arg)
                elif k == "key_by":
                    seg["key"] = cur.arg
                    seg["key_name"] = cur.step_name
                elif k == "stateful":
                    seg["stateful"] = cur.arg
                    seg["stateful_name"] = cur.step_name
                elif k == "join" and cur.arg[0] == "window":
                    _, size, slide, time, product, wait = cur.arg
                    seg["key"] = ("item", 0)
                    window, rows = _window_join(len(cur.parents), time, product, wait)
                    seg["stateful"] = window[:2] + (size, slide) + window[4:]
                    seg["post"].append(rows)
                elif k == "join":
                    seg["key"] = ("item", 0)
                    seg["stateful"] = ("join", len(cur.parents)) + cur.arg
                elif k == "sink":
                    seg["sink"] = cur.arg
                    break
                kids = cur.children
                if k == "branch":
                    if not all(side.children for side in kids):
                        raise ValueError(f"pipeline {seg['name']}: both streams of a branch need "
                                         "a next step (a sink at least)")
                    seg["sink"] = ("branch", cur.arg, channel(kids[0]), channel(kids[1]))
                    for side in kids:
                        for c in side.children:
                            later(name, ("channel", channel(side)), c)
                    break
                if not kids:
                    raise ValueError(f"pipeline {seg['name']}: a stream ends without a sink "
                                     "(end it with .sink(...), or .sink(discard()))")
                if k == "key_by" and len(kids) != 1:
                    # A keyed stream read by several steps: each applies the key again (and a
                    # join tags the records with the side this stream is of it).
                    seg["key"] = None
                    seg["sink"] = ("channel", channel(cur))
                    sides = {}
                    for c in kids:
                        side = None
                        if c.kind == "join":
                            # A stream joined with itself is two sides: the n-th time the join
                            # is a reader, it is for the n-th of them.
                            nth = sides.get(c, 0)
                            sides[c] = nth + 1
                            side = [i for i, p in enumerate(c.parents) if p is cur][nth]
                        later(name, ("channel", channel(cur)), c, cur, side)
                    break
                if len(kids) != 1:
                    seg["sink"] = ("channel", channel(cur))
                    for c in kids:
                        later(name, ("channel", channel(cur)), c)
                    break
                nxt = kids[0]
                if nxt.kind == "merge":
                    seg["sink"] = ("channel", channel(nxt))
                    once(nxt, name)
                    break
                if nxt.kind == "join":
                    if k != "key_by":
                        raise ValueError("join() takes keyed streams (after key_by)")
                    seg["stateful"] = ("tag", nxt.parents.index(cur))
                    seg["sink"] = ("channel", channel(nxt))
                    once(nxt, name)
                    break
                if nxt.kind == "key_by" and (seg["key"] is not None or seg["stateful"] is not None):
                    seg["sink"] = ("channel", channel(cur))
                    later(name, ("channel", channel(cur)), nxt)
                    break
                cur = nxt
            segs.append(seg)
        return segs

    def _spec(self):
        if not self._sources:
            raise ValueError("the flow has no pipeline (Flow.source)")
        out = self._segments()
        names = set()
        for p in out:
            if p["name"] in names:
                raise ValueError(f"two pipelines named {p['name']!r}")
            names.add(p["name"])
        states = {s.id: (s.name, s.factory) for s in self._states}
        return out, states

    def start(self, workers=1, errors="skip", metrics=None, exactly_once=False,
              commit_interval=None, instance_id=None, checkpoint_dir=None,
              checkpoint_interval=1.0, checkpoint_keep=3, _group=None):
        """Starts the flow on `workers` worker threads and returns at once (see `wait`,
        `shutdown`). `metrics="host:port"` serves /metrics (Prometheus), /metrics.json and
        the live page.

        TCP and file flows: `checkpoint_dir` turns checkpoints on (every `checkpoint_interval`
        seconds, the last `checkpoint_keep` kept): consistent snapshots of the keyed states
        (pickled) with the source positions they include, restored when a flow starts on the
        same directory; TCP and file sinks then carry a sequence header on each result
        (`canter receive --dedupe` drops the repeats after a restart). Windows, session
        windows, final aggregations and `stateful()` logic (its `snapshot()`, given back to
        its builder) are checkpointed too; with checkpoints on, a shutdown does not flush them
        (it is not the end of the input: they go on after a restart), while a file read to
        its end puts the end in a last checkpoint (final aggregations emitted and dropped), so
        a run started again on the directory emits nothing twice. Flows whose graph
        joins pipelines (merge, branch, join, a stream read by several steps, a key_by after
        a stateful step) checkpoint as one: every pipeline's state at the same point of the
        input.

        Kafka flows: `exactly_once` (results, changelog and offsets committed in one
        transaction per `commit_interval`, 0.1 s by default), `instance_id` (this process's
        name among the flow's processes, in its transactional ids)."""
        if self._handle is not None:
            raise RuntimeError("the flow is running already")
        if isinstance(errors, tuple):
            if errors[0] != "dead_letter":
                raise ValueError("errors= takes 'skip', 'stop' or dead_letter(path)")
        pipelines, states = self._spec()
        batched = [p["name"] for p in pipelines
                   if any(op[0] == "flat_map_batch" for op in p["pre"] + p["post"])]
        if batched and checkpoint_dir is not None:
            raise ValueError(f"pipeline {batched[0]}: flat_map_batch cannot be checkpointed yet "
                             "(a batch's results have no position of their own)")
        on_kafka = any(n.arg.spec[0] == "kafka" for n in self._sources)
        rekeyed = [p["name"] for p in pipelines if p["rekeyed"] and p["stateful"] is not None]
        if rekeyed and on_kafka:
            raise ValueError(f"pipeline {rekeyed[0]}: a stateful step after a key_by that "
                             "changes the key (one after a stateful step) needs its records "
                             "moved to their key's partition, which Kafka flows do not do yet: "
                             "only stateless steps may follow such a key_by on Kafka")
        if batched and any(p["source"][0] == "kafka" for p in pipelines):
            raise ValueError(f"pipeline {batched[0]}: flat_map_batch is not available on Kafka "
                             "flows yet")
        kafka = {"exactly_once": bool(exactly_once)}
        if commit_interval is not None:
            kafka["commit_interval"] = float(commit_interval)
        if instance_id is not None:
            kafka["instance_id"] = str(instance_id)
        checkpoint = None
        if checkpoint_dir is not None:
            checkpoint = (os.fspath(checkpoint_dir), float(checkpoint_interval), int(checkpoint_keep))
        self._handle = _native.start_flow(pipelines, states, int(workers), errors, metrics, kafka,
                                          checkpoint, _group)
        return self

    def addrs(self):
        """`{pipeline: (host, port)}` of the running flow's TCP sources."""
        return self._running().addrs()

    def wait(self, timeout=None):
        """Waits for the end (every file source read and delivered, or `shutdown`); False if
        `timeout` seconds passed first. Raises `PipelineError` if `errors="stop"` stopped it."""
        return self._running().wait(timeout)

    def shutdown(self):
        """Stops the flow: sources stop reading, what is in flight is delivered."""
        self._running().shutdown()

    def stats(self):
        """Counts per pipeline, by name: `source` (records read, or taken from the pipelines
        before it), `rejected` (input the decoder refused), `frame_errors` (broken frames),
        `failed` (a function raised, or a record failed to encode), `late` (records a window
        refused as too late), `dropped_windows` (count windows dropped short at the end, with
        `partial=False`), `sink` (records handed to the sink, or to the pipelines after it);
        and `checkpoints` (`completed`, `failed`, `restored_epoch`). A flow's graph runs as
        several pipelines where it merges, branches, joins, fans out or keys again: the first
        of each source is named as the source's stream (`p1`, or `.named()`), the later ones
        `p1.2`, `p1.3`, ... unless a stream of theirs is `.named()`. Kafka flows: see
        `start`."""
        return self._running().stats()

    def prometheus(self):
        """The flow's metrics as Prometheus text."""
        return self._running().prometheus()

    def _running(self):
        if self._handle is None:
            raise RuntimeError("the flow is not started (Flow.start or Flow.run)")
        return self._handle

    def run(self, workers=1, errors="skip", metrics=None, processes=1, **settings):
        """Runs the flow until it ends and returns `stats()`. Raises `PipelineError` if
        `errors="stop"` stopped it. Checkpoint and Kafka settings as for `start`.

        A stop by a signal is not the end of the input, and never passes for a finished run:
        SIGTERM and SIGINT (Ctrl-C) stop the sources, deliver what is in flight, and emit no
        final aggregations, `emit="final"` joins, open windows or `on_eof` results (they would
        be values of part of the input; with `checkpoint_dir=` they stay in the checkpoint and
        go on after a restart); then `run` raises: `Terminated` (a `SystemExit` of code 143)
        after SIGTERM, `KeyboardInterrupt` after SIGINT. `Flow.shutdown()` called by the
        program is its own end of the input: it emits them.

        `processes=N`: N processes, forked here, each with `workers` worker threads, so that the
        interpreter lock of one never serializes the others; returns their stats summed, and
        raises as one process would (`PipelineError` if any stopped on an error,
        `KeyboardInterrupt` if interrupted, `RuntimeError` naming a process that failed
        otherwise). Kafka flows: all are members of the flow's consumer group,
        the topics' partitions (and their state) are shared among them, and a process that dies
        has its partitions taken over by the rest. TCP and file flows: each key belongs to one
        worker of all the processes, and records cross to their key's process in batches
        (pickled: records must be picklable); the processes' TCP sources share their ports
        (each needs a fixed one), a file source is read by the first process, and sinks are
        per process (`tcp_out`, `file_out`, `discard`; not `collect`, whose list would be a
        child's). With `checkpoint_dir=`, the processes checkpoint as one: the first process
        takes each checkpoint of every worker of the group into the one directory, and a
        run started again with as many processes restores it (each key in its process)."""
        if processes > 1:
            return self._run_processes(processes, workers, errors, metrics, settings)
        # What the program printed before comes first on a shared standard output.
        sys.stdout.flush()
        previous = None
        stopped_by = []

        def on_sigterm(*_):
            stopped_by.append(signal.SIGTERM)
            if self._handle is not None:
                self._handle.interrupt()

        # Before the start: a SIGTERM from the first record on stops the flow as one.
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            self.start(workers=workers, errors=errors, metrics=metrics, **settings)
        except BaseException:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            raise
        if stopped_by:
            self._handle.interrupt()
        try:
            while True:
                try:
                    if self.wait(0.2):
                        break
                except KeyboardInterrupt:
                    stopped_by.append(signal.SIGINT)
                    self._running().interrupt()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if signal.SIGINT in stopped_by:
            raise KeyboardInterrupt
        if stopped_by:
            raise Terminated()
        return self.stats()

    def _run_processes(self, processes, workers, errors, metrics, settings):
        if metrics is not None:
            raise ValueError("processes= with metrics=: give each process its own port "
                             "(run them as separate `python -m canter pipeline` processes)")
        kafka = all(n.arg.spec[0] == "kafka" for n in self._sources)
        group_dir = None
        if kafka:
            base = settings.pop("instance_id", None) or f"{os.getpid():x}"
        else:
            self._check_group(settings)
            group_dir = tempfile.mkdtemp(prefix="canter-flow-")
            if settings.get("checkpoint_dir") is None:
                # The processes append to the file sinks; a run that resumes nothing starts
                # them afresh here, once, as one process would.
                for p in self._segments():
                    if p["sink"][0] == "file":
                        _truncate(p["sink"][1])
        # Each child leaves its outcome (stats, or the exception that ended it) in a file here.
        outcomes = tempfile.mkdtemp(prefix="canter-outcomes-")
        children = []
        for i in range(processes):
            pid = os.fork()
            if pid == 0:
                status, outcome = 0, None
                try:
                    print(f"process {i + 1} of {processes} (pid {os.getpid()}) joins the group",
                          file=sys.stderr, flush=True)
                except OSError:
                    pass  # No standard error to say it on: the flow goes on all the same.
                try:
                    if kafka:
                        stats = self.run(workers=workers, errors=errors,
                                         instance_id=f"{base}-{i}", **settings)
                    else:
                        stats = self.run(workers=workers, errors=errors,
                                         _group=(i, processes, group_dir), **settings)
                    outcome = {"stats": stats}
                except PipelineError as e:
                    outcome, status = {"raised": "PipelineError", "message": str(e)}, 1
                except KeyboardInterrupt:
                    outcome, status = {"raised": "KeyboardInterrupt"}, 1
                except Terminated:
                    outcome, status = {"raised": "Terminated"}, 1
                except BaseException as e:  # noqa: BLE001  (a child reports, never returns)
                    import traceback
                    traceback.print_exc()
                    outcome = {"raised": type(e).__name__, "message": str(e)}
                    status = 1
                finally:
                    try:
                        with open(os.path.join(outcomes, f"{i}.json"), "w") as f:
                            _json.dump(outcome, f)
                    finally:
                        os._exit(status)
            children.append(pid)

        def forward(sig, _frame):
            for pid in children:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, forward)
        try:
            statuses = []
            for pid in children:
                while True:
                    try:
                        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                        break
                    except InterruptedError:
                        continue
            ended = []
            for i, status in enumerate(statuses):
                try:
                    with open(os.path.join(outcomes, f"{i}.json")) as f:
                        ended.append(_json.load(f))
                except (OSError, ValueError):
                    ended.append(None)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if group_dir is not None:
                shutil.rmtree(group_dir, ignore_errors=True)
            shutil.rmtree(outcomes, ignore_errors=True)
        return _merged(processes, statuses, ended)

    def _check_group(self, settings):
        """What a TCP or file flow in several processes cannot do, refused before forking."""
        if any(n.arg.spec[0] == "kafka" for n in self._sources):
            raise ValueError("a flow's sources are all Kafka topics, or none of them")
        for p in self._segments():
            if p["sink"][0] == "list":
                raise ValueError(f"pipeline {p['name']}: collect() fills a list in one process; "
                                 "with processes= use tcp_out, file_out or discard")
            if p["source"][0] != "tcp":
                continue
            host, _, port = p["source"][1].rpartition(":")
            if port in ("", "0"):
                raise ValueError(f"pipeline {p['name']}: with processes= a TCP source needs a fixed "
                                 f"port (the processes share it), not {p['source'][1]!r}")
            # The processes share the port (SO_REUSEPORT): anything listening there already
            # would take some of the connections.
            import socket
            host = host.strip("[]") or "0.0.0.0"
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, int(port)))
                except OSError as e:
                    raise OSError(e.errno, f"pipeline {p['name']}: {p['source'][1]} is taken: "
                                           f"{e.strerror}") from None


def _truncate(path):
    """Empties `path` if it is a regular file (not the standard output, a pipe or a device)."""
    if path in ("/dev/stdout", "/dev/stderr"):
        return
    if os.path.isfile(path):
        os.truncate(path, 0)


def _merged(processes, statuses, ended):
    """The outcome of a run in several processes: their stats summed, or what one raised
    (an error first, then an interruption by SIGINT, then any other failure, then a stop by
    SIGTERM)."""
    for i, o in enumerate(ended):
        if o is not None and o.get("raised") == "PipelineError":
            raise PipelineError(f"process {i + 1} of {processes}: {o['message']}")
    if any(o is not None and o.get("raised") == "KeyboardInterrupt" for o in ended):
        raise KeyboardInterrupt
    terminated = False
    for i, (status, o) in enumerate(zip(statuses, ended)):
        if o is not None and o.get("raised") == "Terminated":
            terminated = True
        elif status != 0 or o is None or "stats" not in o:
            why = f"signal {-status}" if status < 0 else f"status {status}"
            what = f": {o['raised']}: {o.get('message', '')}" if o and "raised" in o else ""
            raise RuntimeError(f"process {i + 1} of {processes} ended with {why}{what}")
    if terminated:
        raise Terminated()
    total = {}
    for o in ended:
        for name, counts in o["stats"].items():
            into = total.setdefault(name, {})
            for k, v in counts.items():
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    into.setdefault(k, v)
                elif name == "checkpoints":
                    # The group's checkpoints are the same in every process: not summed.
                    into[k] = max(into.get(k, 0), v)
                else:
                    into[k] = into.get(k, 0) + v
    return total


def main(argv=None):
    """`python -m canter pipeline module:flow [--workers N] [--errors skip|stop]
    [--metrics host:port]`: imports the module, takes its `Flow` and runs it."""
    import argparse
    import importlib
    import logging
    import sys

    ap = argparse.ArgumentParser(prog="python -m canter pipeline",
                                 description="Runs a canter.pipeline Flow.")
    ap.add_argument("target", help="module:attribute of the Flow (module:flow)")
    ap.add_argument("--workers", type=int, default=1, help="worker threads (per process)")
    ap.add_argument("--processes", type=int, default=1,
                    help="processes, each with --workers threads (keys spread over them all)")
    ap.add_argument("--errors", choices=["skip", "stop"], default="skip")
    ap.add_argument("--dead-letter", metavar="PATH", help="failed records to this file")
    ap.add_argument("--metrics", metavar="HOST:PORT")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    mod, _, attr = args.target.partition(":")
    sys.path.insert(0, os.getcwd())
    flow = getattr(importlib.import_module(mod), attr or "flow")
    if not isinstance(flow, Flow):
        ap.error(f"{args.target} is not a canter.pipeline.Flow")
    errors = dead_letter(args.dead_letter) if args.dead_letter else args.errors
    try:
        if args.processes > 1:
            stats = flow.run(workers=args.workers, errors=errors, processes=args.processes)
        else:
            stats = flow.run(workers=args.workers, errors=errors, metrics=args.metrics)
    except PipelineError as e:
        print(f"pipeline stopped: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pipeline interrupted (SIGINT): stopped after delivering what was in flight",
              file=sys.stderr)
        return 130
    except Terminated:
        print("pipeline terminated (SIGTERM): stopped after delivering what was in flight, "
              "with no final results", file=sys.stderr)
        return 143
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    for name, s in stats.items():
        print(f"{name}: {s}", file=sys.stderr)
    return 0
