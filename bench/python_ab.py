#!/usr/bin/env python3
"""Two builds of the Python package on the same fixed work, alternating: CPU per record of
Market Spread in Python (python/examples/market_spread.py, one worker on CPU 0) over the whole
bench data set (bench/build/market-spread: 5 M quotes and 5 M orders, sent at once by two
`canter send --batch 1024` on CPU 1, results to `canter receive` on CPU 1).

    python3 bench/python_ab.py --pairs 16 new=bench/build/canter-venv/bin/python base=/path/to/python

Each build is given as NAME=PYTHON (an interpreter that imports that build of `canter`, e.g.
a wrapper setting PYTHONPATH). The CPU is the flow process's utime+stime from /proc, from when it
listens until its CPU stops moving after the last record was sent. The machine's speed drifts
by a third from minute to minute, so runs alternate and the output gives each build's median
and the ratio of each pair (first build over second) with its median. Nothing is recorded:
the output is the result.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import run  # noqa: E402

DATA = os.path.join(run.BUILD, "market-spread")
RECORDS = 10_000_000
PORTS = (7601, 7602, 7600)  # quotes, orders, results


def once(python):
    """CPU ns per record of one run with `python`."""
    nbbo, orders, out = (f"127.0.0.1:{p}" for p in PORTS)
    rx = subprocess.Popen(["taskset", "-c", "1", run.CANTER_BIN, "receive", "--listen", out,
                           "--duration", "600s", "--json"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    flow = subprocess.Popen(["taskset", "-c", "0", python,
                             os.path.join(ROOT, "python", "examples", "market_spread.py"),
                             "--nbbo", nbbo, "--orders", orders, "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if not flow.stdout.readline().startswith("listening"):
            raise RuntimeError(f"{python}: the flow did not start")
        c0 = run.cpu_seconds(flow.pid)
        senders = [subprocess.Popen(["taskset", "-c", "1", run.CANTER_BIN, "send", "--to", to,
                                     "--batch", "1024", "--file", os.path.join(DATA, name)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for to, name in ((nbbo, "nbbo.bin"), (orders, "orders.bin"))]
        for s in senders:
            if s.wait(timeout=600) != 0:
                raise RuntimeError("canter send failed")
        last = run.cpu_seconds(flow.pid)
        while True:
            time.sleep(0.3)
            now = run.cpu_seconds(flow.pid)
            if now - last < 0.02:
                break
            last = now
        return (now - c0) / RECORDS * 1e9
    finally:
        for p in (flow, rx):
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("builds", nargs=2, metavar="NAME=PYTHON")
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.builds)
    for name in ("nbbo.bin", "orders.bin"):
        if not os.path.exists(os.path.join(DATA, name)):
            sys.exit(f"{DATA}/{name} is missing: run bench/build.sh")
    got = {name: [] for name in builds}
    for i in range(args.pairs):
        for name, python in builds.items():
            got[name].append(once(python))
            print(f"pair {i + 1} {name}: {got[name][-1]:.0f} ns/record", file=sys.stderr)
    a, b = builds
    ratios = [x / y for x, y in zip(got[a], got[b])]
    for name, xs in got.items():
        print(f"{name}: median {statistics.median(xs):.0f} ns/record "
              f"({min(xs):.0f} to {max(xs):.0f})")
    print(f"{a} / {b}: median of the pairs' ratios {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f} to {max(ratios):.3f})")


if __name__ == "__main__":
    main()
