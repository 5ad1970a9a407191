#!/usr/bin/env python3
"""Pipelines written in Python (canter.pipeline): where the CPU per record goes.

    python3 bench/python_pipelines.py [--rounds 3] [--duration 8]

1. The engine's overhead around a Python call: a flow reading framed records over TCP
   (53-byte Market Spread orders, `canter send --repeat` at full speed) and writing them to a
   TCP sink (`canter receive`), with no step and with one trivial `map(lambda r: r)`, one
   worker thread on CPU 0, the tools on CPU 1. CPU per record from /proc. The call's own cost
   is measured apart (timeit of the same lambda on a bytes object, in the same interpreter);
   what the map adds beyond it is the engine's overhead per call. And the same flow with
   `flat_map_batch(lambda rs: rs)`: one call per batch of a read's records instead of one per
   record.
2. Market Spread in Python (python/examples/market_spread.py at its peak, as
   `bench/market_spread.py --servers canter-py` runs it) and, in the same round, its Python
   functions alone: `on_nbbo` and `check_order` in a plain Python loop over records decoded
   beforehand, each with its symbol's state found beforehand (the loop's own cost, measured
   empty, taken out): the interpreter running the user's code, which any engine calling these
   functions pays. The rest of the CPU per record is canter's: decoding into Python objects,
   keys, state lookup, routing, framing, sinks.

The machine's speed drifts from minute to minute (the same loop measured 139 and 228 ns/record
ten minutes apart), so every figure is taken in each round and the table shows medians.

The Python is bench/build/canter-venv's (`pip install ./python`, release build), or CANTER_PY.
Results: Markdown on standard output and in BENCHMARKS.md (--no-summary: not recorded).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import market_spread as ms  # noqa: E402  (data, ports, CPU accounting, the canter venv)

FLOW = """
import sys
import canter.pipeline as cp
flow = cp.Flow()
s = flow.source(cp.tcp({src!r})).named("in")
{step}
s.sink(cp.tcp_out({out!r}))
flow.start()
print("ready", flush=True)
while not flow.wait(0.2):
    pass
"""


STEPS = {"no step": "", "map(lambda r: r)": "s = s.map(lambda r: r)",
         "flat_map_batch(lambda rs: rs)": "s = s.flat_map_batch(lambda rs: rs)"}


def flow_run(python, step, duration):
    """CPU ns per record of the pass-through flow with `step` (one of STEPS)."""
    subprocess.run(["pkill", "-f", "canter receive"], stderr=subprocess.DEVNULL)
    rx = subprocess.Popen(["taskset", "-c", "1", ms.CANTER, "receive", "--listen", ms.RECV,
                           "--duration", f"{duration + 8}s", "--json", "--interval", "0s"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    code = FLOW.format(src=ms.NBBO, out=ms.RECV, step=STEPS[step])
    srv = subprocess.Popen(["taskset", "-c", "0", python, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, cwd=tempfile.gettempdir())
    assert srv.stdout.readline().strip() == "ready", "the flow did not start"
    send = subprocess.Popen(["taskset", "-c", "1", ms.CANTER, "send", "--to", ms.NBBO, "--file",
                             os.path.join(ms.DATA, "orders.bin"), "--repeat", "--duration",
                             str(duration), "--batch", "1024", "--json"], stdout=subprocess.PIPE)
    time.sleep(0.5)
    c0, t0 = ms.cpu_seconds(srv.pid), time.time()
    sent = json.loads(send.communicate()[0])
    c1, t1 = ms.cpu_seconds(srv.pid), time.time()
    got = json.loads(rx.communicate()[0])
    srv.terminate()
    srv.wait(30)
    # The first half second's records are outside the CPU window: count the rate inside it.
    records = sent["rate"] * (t1 - t0)
    assert got["records"] == sent["records"], f"{got['records']} of {sent['records']} arrived"
    return (c1 - c0) / records * 1e9, sent["rate"]


CALL = """
import timeit
f = lambda r: r
b = bytes(53)
n = 2_000_000
loop = min(timeit.repeat("for _ in r: pass", setup=f"r = range({n})", number=1, repeat=5))
call = min(timeit.repeat("for _ in r: f(b)", setup=f"r = range({n})", number=1, repeat=5,
                         globals={"f": f, "b": b}))
print((call - loop) / n * 1e9)
"""

FLOOR = """
import struct, sys, time
sys.path.insert(0, {examples!r})
from market_spread import on_nbbo, check_order
def frames(path, limit):
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data) and len(out) < limit:
        n = int.from_bytes(data[at:at + 4], "big")
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out
N = 200_000
q = struct.Struct(">B4s21xdd")
o = struct.Struct(">BBI6s4sdd21x")
quotes = [q.unpack(r) for r in frames({nbbo!r}, N)]
orders = [o.unpack(r) for r in frames({orders!r}, N)]
states = {{}}
work = []
for qt, od in zip(quotes, orders):
    work.append((on_nbbo, states.setdefault(qt[1], [True, 0.0, 0.0]), qt))
    work.append((check_order, states.setdefault(od[4], [True, 0.0, 0.0]), od))
noop = lambda s, r: None
def run(items):
    t = time.perf_counter_ns()
    for f, s, r in items:
        f(s, r)
    return time.perf_counter_ns() - t
empty = [(noop, s, r) for _, s, r in work]
user = min(run(work) for _ in range(5))
base = min(run(empty) for _ in range(5))
def bare(items):
    t = time.perf_counter_ns()
    for f, s, r in items:
        pass
    return time.perf_counter_ns() - t
bare_ns = min(bare(work) for _ in range(5))
print(user / len(work), (user - bare_ns) / len(work), (base - bare_ns) / len(work))
"""


def floor(python):
    """(user code ns/record, an empty function in its place, with the loop)."""
    out = subprocess.run(
        ["taskset", "-c", "0", python, "-c",
         FLOOR.format(examples=os.path.join(ROOT, "python", "examples"),
                      nbbo=os.path.join(ms.DATA, "nbbo.bin"),
                      orders=os.path.join(ms.DATA, "orders.bin"))],
        capture_output=True, text=True, check=True).stdout.split()
    with_loop, user, empty_call = (float(x) for x in out)
    return user, empty_call, with_loop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    ms.generate()
    prefix = ms.reject_prefix()
    python = ms.canter_python()
    opts = argparse.Namespace(duration=args.duration, fixed_batch=None, batch=1024,
                              rt_receiver=False, read_budget=None)
    keys = list(STEPS) + ["call", "market spread", "user code", "empty call"]
    rows = {k: [] for k in keys}
    for rnd in range(args.rounds):
        for name in STEPS:
            ns, rate = flow_run(python, name, args.duration)
            rows[name].append(ns)
            print(f"round {rnd} {name}: {ns:.0f} ns/record at {rate:,.0f} records/s", flush=True)
        rows["call"].append(float(subprocess.run(
            ["taskset", "-c", "0", python, "-c", CALL], capture_output=True, text=True,
            check=True).stdout))
        r = ms.one("canter-py", 0, prefix, opts)
        assert r["lost"] == 0, r
        rows["market spread"].append(r["cpu_ns_per_record"])
        user, empty, _ = floor(python)
        rows["user code"].append(user)
        rows["empty call"].append(empty)
        print(f"round {rnd}: call {rows['call'][-1]:.0f} ns; Market Spread "
              f"{r['cpu_ns_per_record']:.0f} ns/record, its Python functions alone {user:.0f} ns",
              flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    per_round = lambda k: ", ".join(f"{x:.0f}" for x in rows[k])  # noqa: E731
    added = med["map(lambda r: r)"] - med["no step"]
    lines = [
        f"One worker thread on CPU 0, `canter send`/`canter receive` on CPU 1; medians of "
        f"{args.rounds} rounds (each round's figures in brackets).", "",
        "| what | CPU ns/record |", "|---|---:|",
        f"| pass-through flow over TCP, no step (53-byte records) | {med['no step']:.0f} ({per_round('no step')}) |",
        f"| the same with `map(lambda r: r)` | {med['map(lambda r: r)']:.0f} ({per_round('map(lambda r: r)')}) |",
        f"| the call itself (timeit of the lambda on a bytes object, loop taken out) | {med['call']:.0f} ({per_round('call')}) |",
        f"| **the map beyond its call: the engine's overhead per call** (target: at most 200) | **{added - med['call']:.0f}** |",
        f"| the same with `flat_map_batch(lambda rs: rs)` instead (one call per batch of a read's records) | {med['flat_map_batch(lambda rs: rs)']:.0f} ({per_round('flat_map_batch(lambda rs: rs)')}) |",
        f"| Market Spread in Python (canter-py), at its peak | {med['market spread']:.0f} ({per_round('market spread')}) |",
        f"| its Python functions alone: the interpreter running the user's code | {med['user code']:.0f} ({per_round('user code')}) |",
        f"| (an empty function called in their place) | {med['empty call']:.0f} |",
        f"| **the rest: canter's part** (decoding into Python objects, keys, state lookup, routing, framing, sink) | **{med['market spread'] - med['user code']:.0f}** |",
    ]
    table = "\n".join(lines)
    print(table)
    if not args.no_summary:
        import summary  # noqa: E402
        summary.record("python-pipelines-cost",
                       " ".join(["python3", "bench/python_pipelines.py"] + sys.argv[1:]), table)


if __name__ == "__main__":
    main()
