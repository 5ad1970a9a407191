#!/usr/bin/env python3
"""Application-layer overhead: server CPU time per request of the router (100 routes, ordinary
handlers, `Json<T>`, `Path<u64>`) and of the router inside three disabled layers, against a
bare service function, on /plaintext, /json and a route with a parameter. Target (issue: application layer): <= 5% over bare.

Usage: python3 bench/overhead.py [--rounds 5] [--duration 5] [--conns 50]
       python3 bench/overhead.py --callgrind [--requests 8000]

Server on CPU 0 (one worker), `canter load` on CPU 1; the modes are interleaved round by
round and the median of the rounds is reported. Waits for a quiet machine first.

CPU time per request varies by several percent from one server start to the next, as much as
the difference measured, so `--callgrind` counts user-space instructions per request instead
(valgrind; deterministic): each mode serves N and 2N keep-alive requests from one connection
and the difference is divided by N, which cancels start-up and shutdown.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (shared helpers: CPU accounting, load runs, quiet wait)

EXAMPLE = os.path.join(run.ROOT, "target", "release", "examples", "app_overhead")
MODES = ["bare", "router", "layered"]
PATHS = ["/plaintext", "/json", "/api/v1/resource7/42"]


def build():
    subprocess.run(["cargo", "build", "--release", "-p", "canter-cli", "-p", "canter",
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


def instructions(mode, path, n, port):
    """Instructions executed by the server (valgrind --tool=callgrind) for n requests."""
    out = os.path.join(run.BUILD, "run", f"overhead-{mode}-{path.strip('/').replace('/', '_')}-{n}.callgrind")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", EXAMPLE, mode,
            f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"{mode}: server did not start under valgrind")
                time.sleep(0.1)
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        buf = b""
        for _ in range(n):
            s.sendall(req)
            while True:
                i = buf.find(b"\r\n\r\n")
                if i >= 0:
                    head = buf[:i].lower()
                    cl = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(buf) >= i + 4 + cl:
                        if not head.startswith(b"http/1.1 200"):
                            raise RuntimeError(f"{mode} {path}: {head[:40]!r}")
                        buf = buf[i + 4 + cl:]
                        break
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError(f"{mode}: connection closed")
                buf += chunk
        s.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    with open(out) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def callgrind_table(args):
    lines = ["| endpoint | mode | instructions/request | vs bare |", "|---|---|---|---|"]
    for path in PATHS:
        base = None
        for mode in MODES:
            n = args.requests
            a = instructions(mode, path, n, args.port)
            b = instructions(mode, path, 2 * n, args.port + 1)
            per = (b - a) / n
            base = base or per
            run.log(f"{path:<10} {mode:<8} {per:,.0f} instructions/request")
            lines.append(f"| {path} | {mode} | {per:,.0f} | {per / base:.3f}× |")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--port", type=int, default=31500)
    ap.add_argument("--quiet-wait", type=float, default=30.0)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions per request under valgrind instead of CPU time")
    ap.add_argument("--requests", type=int, default=8000, help="N for --callgrind")
    args = ap.parse_args()
    if not args.no_build:
        build()
    if args.callgrind:
        callgrind_table(args)
        return
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
