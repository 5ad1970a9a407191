#!/usr/bin/env python3
"""Pipelines written in Python across processes: what `processes=N` buys on a CPython with
the interpreter lock, and what a record crossing processes costs.

    python3 bench/python_processes.py [--rounds 3] [--records 2000000]

A file of framed 16-byte records (an 8-byte symbol `k<i % 1000>` and a number) is read by a
flow that decodes each with the built-in `struct` decoder and keys it by its symbol (both in
Rust), then runs a keyed `update` doing about a microsecond of Python per record (a state's
count and a short float loop), into `discard()`. Each variant is
`python -m canter pipeline` under `taskset -c 0,1`:

- 1 process, 1 worker: the floor;
- 1 process, 2 worker threads: the threads take turns holding the interpreter lock;
- 2 processes, 1 worker each: the first reads and decodes the file, and the records of the
  other's keys (about half) cross to it, pickled in batches over a Unix socket;
- 2 separate single-process flows at once, on CPU 0 and CPU 1, each reading half of the
  records: the same work in parallel with nothing crossing, the bound for the line above.

(A file source, because this machine has two CPUs: a TCP source would need its sender on one
of them. With TCP sources every process reads and decodes its own connections.)

Figures: records/s (from the run's wall time, less the same command's time on an empty file:
start-up and imports) and CPU per record (user + system of every process, less the empty
run's). Medians over the rounds, each round running every variant in turn.

The Python is bench/build/canter-venv's (`pip install ./python`, release build), or CANTER_PY.
Results: Markdown on standard output and in BENCHMARKS.md (--no-summary: not recorded).
"""
import argparse
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import market_spread as ms  # noqa: E402  (the canter venv)

FLOW = """
import operator

import canter.pipeline as cp

flow = cp.Flow()
state = flow.keyed_state(lambda: {{"n": 0, "x": 1.0}})


def work(s, rec):
    s["n"] += 1
    x = s["x"]
    for _ in range(12):
        x = x * 1.000001 + 1e-9
    s["x"] = x


(flow.source(cp.file({path!r}, decode=cp.struct(">8sQ"))).named("in")
    .key_by(operator.itemgetter(0))
    .update(state, work)
    .sink(cp.discard()))
"""

VARIANTS = [("1 process, 1 worker", 1, 1), ("1 process, 2 threads", 1, 2),
            ("2 processes, 1 worker each", 2, 1),
            ("2 separate flows, half the file each (no crossing)", 0, 1)]


def write_records(path, n):
    with open(path, "wb") as f:
        chunk = []
        for i in range(n):
            r = struct.pack(">8sQ", b"k%d" % (i % 1000), i)
            chunk.append(struct.pack(">I", len(r)) + r)
            if len(chunk) == 65536:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))


def run_once(python, workdir, module, processes, workers):
    """Wall seconds and CPU seconds (all processes) of one run to its end. `processes=0`: two
    separate single-process flows at once, on CPU 0 and CPU 1, each reading its half of the
    records (`<module>_half`): the same work in parallel with nothing crossing."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    if processes == 0:
        runs = [subprocess.Popen(["taskset", "-c", str(cpu), python, "-m", "canter", "pipeline",
                                  f"{module}_half:flow"], cwd=workdir,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for cpu in (0, 1)]
        if any(r.wait() != 0 for r in runs):
            raise RuntimeError("a flow failed")
    else:
        subprocess.run(["taskset", "-c", "0,1", python, "-m", "canter", "pipeline",
                        f"{module}:flow", "--processes", str(processes), "--workers",
                        str(workers)], cwd=workdir, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    python = ms.canter_python()
    work = tempfile.mkdtemp(prefix="canter-bench-procs-")
    full, half = os.path.join(work, "in.bin"), os.path.join(work, "half.bin")
    empty = os.path.join(work, "empty.bin")
    write_records(full, args.records)
    write_records(half, args.records // 2)
    write_records(empty, 0)
    for name, path in (("full", full), ("full_half", half), ("empty", empty),
                       ("empty_half", empty)):
        with open(os.path.join(work, f"{name}.py"), "w") as f:
            f.write(FLOW.format(path=path))
    results = {v[0]: {"rate": [], "cpu": []} for v in VARIANTS}
    for r in range(args.rounds):
        for label, processes, workers in VARIANTS:
            w0, c0 = run_once(python, work, "empty", processes, workers)
            w, c = run_once(python, work, "full", processes, workers)
            rate = args.records / max(w - w0, 1e-9)
            cpu_ns = (c - c0) * 1e9 / args.records
            results[label]["rate"].append(rate)
            results[label]["cpu"].append(cpu_ns)
            print(f"round {r} {label}: {rate:,.0f} records/s, {cpu_ns:,.0f} ns CPU/record "
                  f"(run {w:.2f} s, empty {w0:.2f} s)", file=sys.stderr, flush=True)
    base = statistics.median(results[VARIANTS[0][0]]["rate"])
    lines = ["| variant | records/s | × 1 process | CPU ns/record (all processes) |",
             "|---|---:|---:|---:|"]
    for label, _, _ in VARIANTS:
        rate = statistics.median(results[label]["rate"])
        cpu = statistics.median(results[label]["cpu"])
        lines.append(f"| {label} | {rate:,.0f} | {rate / base:.2f}× | {cpu:,.0f} |")
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's section)
    command = "python3 bench/python_processes.py " + " ".join(
        a for a in sys.argv[1:] if a != "--no-summary")
    note = (f"{args.rounds} rounds of {args.records:,} records, medians; every process's CPU "
            "on CPUs 0 and 1 (`taskset -c 0,1`).")
    with summary.capture("python-pipelines-processes", command.strip(), note):
        print("\n".join(lines))

if __name__ == "__main__":
    main()
