#!/usr/bin/env python3
"""BENCHMARKS.md: one current table per area against the peers, rebuilt from bench/summary/.

Every benchmark script of the suite records the table of its last run here
(`summary.record(area, command, table)`, or `with summary.capture(area, command): print(...)`),
which rewrites `bench/summary/<area>.md` and then BENCHMARKS.md from all areas (not with
`--no-summary`: an experiment's table belongs in the notebook). The experiments
behind the numbers, tried, kept and dropped, are the notebook in bench/notebook/.

    python3 bench/summary.py        # rebuild BENCHMARKS.md from bench/summary/*.md
"""

import contextlib
import datetime
import io
import os
import platform
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
AREAS_DIR = os.path.join(BENCH, "summary")
OUT = os.path.join(ROOT, "BENCHMARKS.md")

# (area, heading, the script that records it): the order of BENCHMARKS.md.
AREAS = [
    ("http1", "HTTP/1.1", "bench/run.py"),
    ("http1-instructions", "HTTP/1.1: instructions per request", "bench/cg_steady.py --table"),
    ("http2", "HTTP/2", "bench/h2.py"),
    ("http3", "HTTP/3", "bench/h3.py"),
    ("http3-clients", "HTTP/3 under a client that is not ours (quic-go)",
     "bench/h3.py --clients"),
    ("tls", "TLS", "bench/tls.py"),
    ("churn", "A new connection per request", "bench/churn.py"),
    ("static", "Static files under compression", "bench/static_compress.py"),
    ("websocket", "WebSocket", "bench/ws.py"),
    ("techempower", "TechEmpower's database tests (PostgreSQL)", "bench/techempower.py"),
    ("market-spread", "Stream pipelines: Market Spread", "bench/market_spread.py"),
    ("kafka", "Stream pipelines on Kafka: Market Spread", "bench/kafka.py"),
    ("kafka-secure", "Kafka where users run it: SASL_SSL, the classic group protocol",
     "bench/kafka_secure.py"),
    ("kafka-chaos", "Exactly once on Kafka under faults", "bench/kafka_chaos.py"),
    ("checkpoints", "Checkpoints of TCP pipelines", "bench/market_spread.py"),
    ("checkpoints-recovery", "Checkpoints of TCP pipelines: recovery by state size",
     "bench/checkpoint_recovery.py"),
    ("tcp-chaos", "TCP pipelines under faults", "bench/tcp_chaos.py"),
    ("python-pipelines", "Pipelines in Python: Market Spread", "bench/market_spread.py"),
    ("python-pipelines-cost", "Pipelines in Python: where the time goes",
     "bench/python_pipelines.py"),
    ("dataflows", "Dataflows in Python against Bytewax 0.21", "bench/dataflows.py"),
    ("python-pipelines-kafka", "Pipelines in Python on Kafka: Market Spread", "bench/kafka.py"),
    ("python-pipelines-processes", "Pipelines in Python across processes",
     "bench/python_processes.py"),
    ("python", "The Python front end", "bench/python.py"),
]


def _git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def record(area, command, table, note=""):
    """Makes `table` (markdown) the current one of `area`, run with `command`; rebuilds."""
    if area not in {a for a, _, _ in AREAS}:
        raise ValueError(f"unknown area {area}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    cpu = _cpu_model()
    on = f" on {cpu}" if cpu else ""
    lines = [f"Run {when} at `{_git_commit()}`{on}:", "", "```", command, "```", ""]
    if note:
        lines += [note, ""]
    lines += [table.strip(), ""]
    os.makedirs(AREAS_DIR, exist_ok=True)
    with open(os.path.join(AREAS_DIR, f"{area}.md"), "w") as f:
        f.write("\n".join(lines))
    build()


@contextlib.contextmanager
def capture(area, command, note=""):
    """Prints as usual, and records the markdown table lines printed inside as `area`'s; not
    with `--no-summary` on the command line (an experiment, such as two builds of canter against
    each other, that is not the area's current table), which is taken off it here."""
    if "--no-summary" in sys.argv:
        sys.argv.remove("--no-summary")
        yield
        return
    buf = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s):
            buf.write(s)
            return sys.__stdout__.write(s)

        def flush(self):
            sys.__stdout__.flush()

    with contextlib.redirect_stdout(Tee()):
        yield
    kept = [line for line in buf.getvalue().splitlines()
            if line.startswith(("|", "#")) or not line.strip()]
    table = "\n".join(kept)
    while "\n\n\n" in table:
        table = table.replace("\n\n\n", "\n\n")
    if "|" in table:
        record(area, command, table.strip(), note)


def _cpu_model():
    """The CPU's model name (`lscpu`), or "" if it cannot be read."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return ""
    for line in lscpu.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "Model name":
            return v.strip()
    return ""


def _machine():
    facts = []
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "L3 cache"):
                facts.append(f"{k.strip()}: `{v.strip()}`")
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            facts.append(f"memory: `{f.readline().split(':')[1].strip()}`")
    except OSError:
        pass
    facts.append(f"kernel: `{platform.release()}`")
    return facts


def build():
    """Writes BENCHMARKS.md from the recorded areas."""
    L = ["# Benchmarks", "",
         "<!-- Generated by bench/summary.py from bench/summary/*.md; do not edit by hand. -->", "",
         "canter against the servers and engines it is compared with, one current table per "
         "area. Each table says when it was run, at which commit and with which command; "
         "`bench/build.sh` builds the peers. The method (CPU pinning, interleaved rounds, CPU per "
         "request from `/proc`) is in [bench/README.md](bench/README.md); every experiment "
         "behind these numbers, kept or dropped, is in the notebook, "
         "[bench/notebook/](bench/notebook/README.md).", "",
         "## Machine", "",
         "Where this file was last rebuilt. Tables run since 2026-12-06 name their own CPU; "
         "older ones do not (the rebuild before then was on an AMD EPYC of the same size).", ""]
    L += [f"- {fact}" for fact in _machine()]
    L += ["- the server under test on CPU 0, the load generator on CPU 1 (`taskset`)", ""]
    for area, heading, script in AREAS:
        path = os.path.join(AREAS_DIR, f"{area}.md")
        L += [f"## {heading}", ""]
        if os.path.exists(path):
            with open(path) as f:
                L.append(f.read().rstrip())
        else:
            L.append(f"_not run yet: `python3 {script}`_")
        L.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    build()
    print(f"wrote {OUT}")
