#!/usr/bin/env python3
"""Application-layer overhead: server CPU time per request of the router (100 routes, ordinary
handlers, `Json<T>`) and of the router inside three disabled layers, against a bare service
function, on /plaintext and /json. Target (issue: application layer): <= 5% over bare.

Usage: python3 bench/overhead.py [--rounds 5] [--duration 5] [--conns 50] [--markdown]

Server on CPU 0 (one worker), `canter load` on CPU 1; the modes are interleaved round by
round and the median of the rounds is reported. Waits for a quiet machine first.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (shared helpers: CPU accounting, load runs, quiet wait)

EXAMPLE = os.path.join(run.ROOT, "target", "release", "examples", "app_overhead")
MODES = ["bare", "router", "layered"]
PATHS = ["/plaintext", "/json"]


def build():
    subprocess.run(["cargo", "build", "--release", "-p", "canter", "--bin", "canter",
                    "--example", "app_overhead"], cwd=run.ROOT, check=True)


def start(mode, port):
    argv = ["taskset", "-c", run.SERVER_CPU, EXAMPLE, mode, f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            st, _, _, _ = run.http_get(port, "/plaintext", timeout=1.0)
            if st == 200:
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{mode}: server did not start")


def measure(mode, path, port, args):
    proc = start(mode, port)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        run.run_load("canter", url, args.conns, 1.0)  # warm-up
        c0 = run.cpu_seconds(proc.pid)
        r = run.run_load("canter", url, args.conns, args.duration)
        c1 = run.cpu_seconds(proc.pid)
        if r["non2xx"] or any(r["errors"].values()):
            raise RuntimeError(f"{mode} {path}: errors {r['errors']} non-2xx {r['non2xx']}")
        return {"rps": r["rps"], "cpu_us": (c1 - c0) / r["requests"] * 1e6}
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--port", type=int, default=31500)
    ap.add_argument("--quiet-wait", type=float, default=30.0)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    if not args.no_build:
        build()
    waited, busy = run.wait_quiet(args.quiet_wait)
    run.log(f"quiet wait {waited:.1f}s (busy {busy:.2f})")
    results = {(m, p): [] for m in MODES for p in PATHS}
    port = args.port
    for rnd in range(args.rounds):
        for path in PATHS:
            for mode in MODES:
                port = port + 1 if port < args.port + 200 else args.port
                r = measure(mode, path, port, args)
                results[(mode, path)].append(r)
                run.log(f"round {rnd + 1} {path:<10} {mode:<8} {r['cpu_us']:.3f} us/req "
                        f"{r['rps']:,.0f} req/s")
    med = {k: (run.median([r["cpu_us"] for r in v]), run.median([r["rps"] for r in v]))
           for k, v in results.items()}
    spread = {k: (min(r["cpu_us"] for r in v), max(r["cpu_us"] for r in v))
              for k, v in results.items()}
    lines = ["| endpoint | mode | CPU/request (median) | min–max | req/s | vs bare |",
             "|---|---|---|---|---|---|"]
    for path in PATHS:
        base = med[("bare", path)][0]
        for mode in MODES:
            cpu, rps = med[(mode, path)]
            lo, hi = spread[(mode, path)]
            lines.append(f"| {path} | {mode} | {cpu:.3f} µs | {lo:.3f}–{hi:.3f} | {rps:,.0f} | "
                         f"{cpu / base:.3f}× |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
