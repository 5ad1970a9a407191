#!/usr/bin/env python3
"""Dataflow programs in canter.pipeline and in Bytewax 0.21, same input, same output: CPU per
record of each, in alternating rounds.

    python3 bench/dataflows.py [--rounds 3] [--scale 1.0] [--programs wordcount,average,...]

The programs, each reading files of text lines and writing text lines to its standard output
(compared line for line, sorted, between the two engines in every round):

- `wordcount`: the words of a text (Zipf-like over 5,000 words, ~25 MB at scale 1), counted
  per word at the end of input (`count_final`).
- `average`: `key,value` lines (1,000 keys, 1 M lines), a running average per key emitted for
  every line (`stateful_map`).
- `windows`: `key,time,value` lines in time order (500 keys, 1 M lines, ~10 per second per
  key), summed per key in 10-second tumbling windows of event time (Bytewax: `fold_window`
  aligned to the epoch, with an `EventClock` waiting 10 s: with no wait, its clock, which
  also moves on with the system's, dropped some 0.3% of the records as late and the outputs
  differed; with a day, every window stayed open to the end, at 0.24 ms a record; canter
  closes each key's windows as its records pass them).
- `join`: `id,quantity` orders and `id,price` fills (500,000 orders, one fill for every
  second one), joined by id (`join`, insert "last", emit "complete"): one line per filled
  order.

Each runs as its own process, one worker (Bytewax: `python -m bytewax.run`, one worker;
canter: `Flow.run(workers=1)`), and its CPU (user + system, from `wait4`) is divided by the
input lines. Beside it, the programs' own Python functions alone (parsing, splitting, the
fold and map functions), run in a plain loop over the same lines in the same interpreter: the
part of the CPU any engine calling these functions pays; what is left is the engine's.

The canter package is `CANTER_PY`'s (a Python with it installed, release build), or
bench/build/canter-venv's; Bytewax is bench/build/bytewax-venv's (`pip install
bytewax==0.21.1`). Data in bench/build/dataflows/. Results: Markdown on standard output.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import market_spread as ms  # noqa: E402  (the canter and Bytewax venvs)

DATA = os.path.join(BENCH, "build", "dataflows")

# The programs. Each `canter` and `bytewax` text is a module run with its input paths in
# `IN` (a list) and writing lines to standard output; `alone` is the functions in a plain loop
# (run by `bare()`), returning the lines it read.
PROGRAMS = {
    "wordcount": {
        "inputs": ["words.txt"],
        "canter": """
import canter.pipeline as cp
flow = cp.Flow()
(flow.source(cp.file(IN[0], frame="lines", decode=cp.text))
    .flat_map(str.split)
    .key_by(lambda w: w)
    .count_final()
    .map(lambda kv: f"{kv[0]} {kv[1]}")
    .sink(cp.stdout(encode=cp.text)))
flow.run()
""",
        "bytewax": """
import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.connectors.files import FileSource
from bytewax.connectors.stdio import StdOutSink
flow = Dataflow("wordcount")
lines = op.input("in", flow, FileSource(IN[0]))
words = op.flat_map("split", lines, str.split)
counts = op.count_final("count", words, lambda w: w)
op.output("out", op.map("fmt", counts, lambda kv: f"{kv[0]} {kv[1]}"), StdOutSink())
""",
        "alone": """
def run(IN):
    n = 0
    with open(IN[0]) as f:
        for line in f:
            n += 1
            for w in line.split():
                pass
    return n
""",
    },
    "average": {
        "inputs": ["values.txt"],
        "canter": """
import canter.pipeline as cp

def parse(line):
    k, v = line.split(",")
    return k, float(v)

def avg(state, r):
    n, s = state
    n += 1
    s += r[1]
    return (n, s), f"{r[0]} {s / n!r}"

flow = cp.Flow()
state = flow.keyed_state(lambda: (0, 0.0))
(flow.source(cp.file(IN[0], frame="lines", decode=cp.text))
    .map(parse)
    .key_by(lambda r: r[0])
    .stateful_map(state, avg)
    .sink(cp.stdout(encode=cp.text)))
flow.run()
""",
        "bytewax": """
import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.connectors.files import FileSource
from bytewax.connectors.stdio import StdOutSink

def parse(line):
    k, v = line.split(",")
    return k, float(v)

def avg(state, r):
    n, s = state or (0, 0.0)
    n += 1
    s += r[1]
    return (n, s), f"{r[0]} {s / n!r}"

flow = Dataflow("average")
rows = op.map("parse", op.input("in", flow, FileSource(IN[0])), parse)
keyed = op.key_on("key", rows, lambda r: r[0])
out = op.stateful_map("avg", keyed, avg)
op.output("out", op.map("fmt", out, lambda kv: kv[1]), StdOutSink())
""",
        "alone": """
def run(IN):
    def parse(line):
        k, v = line.split(",")
        return k, float(v)

    def avg(state, r):
        n, s = state
        n += 1
        s += r[1]
        return (n, s), f"{r[0]} {s / n!r}"
    states, n = {}, 0
    with open(IN[0]) as f:
        for line in f:
            n += 1
            r = parse(line.rstrip("\\n"))
            states[r[0]], _ = avg(states.get(r[0], (0, 0.0)), r)
    return n
""",
    },
    "windows": {
        "inputs": ["events.txt"],
        "canter": """
import canter.pipeline as cp

def parse(line):
    k, t, v = line.split(",")
    return k, float(t), int(v)

flow = cp.Flow()
(flow.source(cp.file(IN[0], frame="lines", decode=cp.text))
    .map(parse)
    .key_by(lambda r: r[0])
    .time_window(10, time=lambda r: r[1], init=int, fold=lambda a, r: a + r[2])
    .map(lambda w: f"{w[0]} {int(w[1])} {w[3]}")
    .sink(cp.stdout(encode=cp.text)))
flow.run()
""",
        "bytewax": """
from datetime import datetime, timedelta, timezone
import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.dataflow import Dataflow
from bytewax.connectors.files import FileSource
from bytewax.connectors.stdio import StdOutSink
from bytewax.operators.windowing import EventClock, TumblingWindower

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

def parse(line):
    k, t, v = line.split(",")
    return k, datetime.fromtimestamp(float(t), tz=timezone.utc), int(v)

flow = Dataflow("windows")
rows = op.map("parse", op.input("in", flow, FileSource(IN[0])), parse)
keyed = op.key_on("key", rows, lambda r: r[0])
# Waits 10 s of event time. (With no wait, Bytewax's clock, which also moves on with the
# system's, counted some 0.3% of these time-sorted records as late; with a day, every window
# stayed open to the end and each record cost 0.24 ms.)
clock = EventClock(lambda r: r[1], wait_for_system_duration=timedelta(seconds=10))
windower = TumblingWindower(length=timedelta(seconds=10), align_to=EPOCH)
out = win.fold_window("sum", keyed, clock, windower, int, lambda a, r: a + r[2],
                      lambda a, b: a + b)
op.output("out", op.map("fmt", out.down, lambda kv: f"{kv[0]} {kv[1][0] * 10} {kv[1][1]}"),
          StdOutSink())
""",
        "alone": """
def run(IN):
    def parse(line):
        k, t, v = line.split(",")
        return k, float(t), int(v)
    fold = lambda a, r: a + r[2]  # noqa: E731
    n, acc = 0, {}
    with open(IN[0]) as f:
        for line in f:
            n += 1
            r = parse(line.rstrip("\\n"))
            acc[r[0]] = fold(acc.get(r[0], 0), r)
    return n
""",
    },
    "join": {
        "inputs": ["orders.txt", "fills.txt"],
        "canter": """
import canter.pipeline as cp

def parse(line):
    a, b = line.split(",")
    return a, int(b)

flow = cp.Flow()
orders = flow.source(cp.file(IN[0], frame="lines", decode=cp.text)).map(parse)
fills = flow.source(cp.file(IN[1], frame="lines", decode=cp.text)).map(parse)
(cp.join(orders.key_by(lambda r: r[0]), fills.key_by(lambda r: r[0]))
    .map(lambda kv: f"{kv[0]} {kv[1][0][1]} {kv[1][1][1]}")
    .sink(cp.stdout(encode=cp.text)))
flow.run()
""",
        "bytewax": """
import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.connectors.files import FileSource
from bytewax.connectors.stdio import StdOutSink

def parse(line):
    a, b = line.split(",")
    return a, int(b)

flow = Dataflow("join")
orders = op.map("po", op.input("orders", flow, FileSource(IN[0])), parse)
fills = op.map("pf", op.input("fills", flow, FileSource(IN[1])), parse)
joined = op.join("join", op.key_on("ko", orders, lambda r: r[0]),
                 op.key_on("kf", fills, lambda r: r[0]))
op.output("out", op.map("fmt", joined, lambda kv: f"{kv[0]} {kv[1][0][1]} {kv[1][1][1]}"),
          StdOutSink())
""",
        "alone": """
def run(IN):
    def parse(line):
        a, b = line.split(",")
        return a, int(b)
    n, seen = 0, {}
    for i, path in enumerate(IN):
        with open(path) as f:
            for line in f:
                n += 1
                r = parse(line.rstrip("\\n"))
                seen.setdefault(r[0], [None, None])[i] = r
    for k, (o, fl) in seen.items():
        if o is not None and fl is not None:
            f"{k} {o[1]} {fl[1]}"
    return n
""",
    },
}


def make_data(scale):
    """The inputs, made once per scale (a fixed seed)."""
    d = os.path.join(DATA, f"scale-{scale:g}")
    if os.path.exists(os.path.join(d, "done")):
        return d
    os.makedirs(d, exist_ok=True)
    rng = random.Random(42)
    vocab = [f"w{i}" for i in range(5000)]
    weights = [1 / (i + 1) for i in range(5000)]
    with open(os.path.join(d, "words.txt"), "w") as f:
        for _ in range(int(400_000 * scale)):
            f.write(" ".join(rng.choices(vocab, weights, k=8)) + "\n")
    with open(os.path.join(d, "values.txt"), "w") as f:
        for _ in range(int(1_000_000 * scale)):
            f.write(f"k{rng.randrange(1000)},{rng.randrange(100000) / 100}\n")
    with open(os.path.join(d, "events.txt"), "w") as f:
        t = 1_700_000_000.0
        for _ in range(int(1_000_000 * scale)):
            t += 0.0002
            f.write(f"k{rng.randrange(500)},{t:.4f},{rng.randrange(100)}\n")
    n = int(500_000 * scale)
    ids = list(range(n))
    rng.shuffle(ids)
    with open(os.path.join(d, "orders.txt"), "w") as f:
        for i in ids:
            f.write(f"o{i},{i % 100 + 1}\n")
    rng.shuffle(ids)
    with open(os.path.join(d, "fills.txt"), "w") as f:
        for i in ids:
            if i % 2 == 0:
                f.write(f"o{i},{1000 + i}\n")
    open(os.path.join(d, "done"), "w").close()
    return d


def lines(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += sum(1 for _ in f)
    return n


def run_program(python, engine, program, paths, out_path):
    """Runs one program to its end: its CPU seconds and wall seconds."""
    src = f"IN = {paths!r}\n" + PROGRAMS[program][engine]
    with tempfile.TemporaryDirectory() as tmp:
        mod = os.path.join(tmp, "prog.py")
        with open(mod, "w") as f:
            f.write(src)
        if engine == "bytewax":
            cmd = [python, "-m", "bytewax.run", "prog:flow"]
        else:
            cmd = [python, mod]
        t0 = time.monotonic()
        with open(out_path, "w") as out:
            p = subprocess.Popen(["taskset", "-c", "0", *cmd], stdout=out,
                                 stderr=subprocess.PIPE, cwd=tmp)
            _, status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace")
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{engine} {program} failed:\n{err[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def bare(python, program, paths):
    """The program's functions alone, in a plain loop: CPU seconds."""
    code = PROGRAMS[program]["alone"] + f"""
import resource
r0 = resource.getrusage(resource.RUSAGE_SELF)
run({paths!r})
r1 = resource.getrusage(resource.RUSAGE_SELF)
print((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
"""
    out = subprocess.run(["taskset", "-c", "0", python, "-c", code], capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip())


def sorted_lines(path):
    with open(path) as f:
        return sorted(f.read().splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    args = ap.parse_args()
    d = make_data(args.scale)
    pythons = {"canter": ms.canter_python(), "bytewax": ms.bytewax_python()}
    rows = {}
    for program in args.programs.split(","):
        paths = [os.path.join(d, p) for p in PROGRAMS[program]["inputs"]]
        n = lines(paths)
        cpu = {"canter": [], "bytewax": []}
        alone = []
        for r in range(args.rounds):
            outs = {}
            order = ["canter", "bytewax"] if r % 2 == 0 else ["bytewax", "canter"]
            for engine in order:
                out = os.path.join(d, f"{program}.{engine}.out")
                c, _ = run_program(pythons[engine], engine, program, paths, out)
                cpu[engine].append(c / n * 1e9)
                outs[engine] = sorted_lines(out)
            if outs["canter"] != outs["bytewax"]:
                a, b = outs["canter"], outs["bytewax"]
                diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                raise SystemExit(f"{program}: outputs differ ({len(a)} vs {len(b)} lines; "
                                 f"first at {diff}: {a[diff:diff + 1]} vs {b[diff:diff + 1]})")
            alone.append(bare(pythons["canter"], program, paths) / n * 1e9)
            print(f"{program} round {r + 1}: canter {cpu['canter'][-1]:.0f} ns/record, bytewax "
                  f"{cpu['bytewax'][-1]:.0f}, functions alone {alone[-1]:.0f}; outputs equal "
                  f"({len(outs['canter'])} lines)", file=sys.stderr, flush=True)
        rows[program] = (n, statistics.median(cpu["canter"]), statistics.median(cpu["bytewax"]),
                         statistics.median(alone))
    print("| program | input lines | canter CPU ns/line | Bytewax 0.21 CPU ns/line | canter ÷ "
          "Bytewax | functions alone ns/line | canter's engine ns/line | Bytewax's engine "
          "ns/line |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for program, (n, c, b, a) in rows.items():
        print(f"| {program} | {n:,} | {c:,.0f} | {b:,.0f} | {c / b:.2f}× | {a:,.0f} | "
              f"{max(c - a, 0):,.0f} | {max(b - a, 0):,.0f} |")


if __name__ == "__main__":
    main()
