#!/usr/bin/env python3
"""Market Spread from files to a file, canter against Bytewax, one core each.

    cargo build --release -p canter-cli --example market_spread_files
    python3 bench/market_spread_files.py [--rounds 3] [--count 2000000]

The established engine a user would pick instead: Bytewax (PyPI, a Python API on a Rust
dataflow core; installed here into bench/build/bytewax-venv). Flink in local mode would need a
JVM and Maven on the machine; Bytewax is what a Python shop reaches for, and it runs the same
keyed, stateful job with no cluster. Both read the framed NBBO and order files written by
`canter send market-spread --write-dir` (1,000 symbols, 10% of orders rejected), key by symbol
through one shared state, and write framed 55-byte results; each run is pinned to CPU 0 and
checked against expected.bin record by record (sorted, timestamps aside). Reported: records/s
over the whole run (reading the files included) and CPU seconds (user+system). Markdown out.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CANTER = os.path.join(ROOT, "target", "release", "canter")
EXAMPLE = os.path.join(ROOT, "target", "release", "examples", "market_spread_files")
VENV = os.path.join(BENCH, "build", "bytewax-venv")


def frames(data):
    at, out = 0, []
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out


def results(path):
    return sorted(r[:47] + bytes(8) for r in frames(open(path, "rb").read()))


def timed(argv, env=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run(["taskset", "-c", "0"] + argv, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=2_000_000)
    args = ap.parse_args()
    data = os.path.join(BENCH, "build", f"market-spread-{args.count}")
    if not os.path.exists(os.path.join(data, "expected.bin")):
        os.makedirs(data, exist_ok=True)
        subprocess.run([CANTER, "send", "market-spread", "--write-dir", data, "--symbols", "1000",
                        "--reject-share", "0.1", "--count", str(args.count)], check=True)
    if not os.path.exists(os.path.join(VENV, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "-q", "bytewax==0.21.1"], check=True)
    expected = results(os.path.join(data, "expected.bin"))
    nbbo, orders = os.path.join(data, "nbbo.bin"), os.path.join(data, "orders.bin")
    out = os.path.join(data, "out.bin")
    runs = {"canter": [], "bytewax": []}
    for rnd in range(args.rounds):
        for name in (["canter", "bytewax"] if rnd % 2 == 0 else ["bytewax", "canter"]):
            if name == "canter":
                wall, cpu = timed([EXAMPLE, nbbo, orders, out, "1"])
            else:
                env = dict(os.environ, NBBO=nbbo, ORDERS=orders, OUT=out, PYTHONPATH=ROOT)
                wall, cpu = timed([os.path.join(VENV, "bin", "python"), "-m", "bytewax.run",
                                   "bench.market_spread_bytewax:flow"], env)
            got = results(out)
            assert got == expected, f"{name}: {len(got)} results, {len(expected)} expected, or they differ"
            runs[name].append((wall, cpu))
            print(f"round {rnd} {name}: {args.count / wall:,.0f} records/s, {cpu:.2f} CPU s", file=sys.stderr)
    print("| engine | records/s (median) | CPU s per million records | results checked |")
    print("|---|---:|---:|---:|")
    for name, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        print(f"| {name} | {args.count / wall:,.0f} | {cpu / args.count * 1e6:.3f} | {len(expected):,} x {len(rs)} |")


if __name__ == "__main__":
    main()
