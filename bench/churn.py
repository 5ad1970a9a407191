#!/usr/bin/env python3
"""Connection churn: a new connection for every request (`Connection: close`), canter against
nginx, at 1, 50 and 1,000 concurrent clients.

    bench/build.sh && python3 bench/churn.py [--rounds 5] [--duration 5s] [--clients 1,50,1000]
    python3 bench/churn.py --ab        # ab -c 1000 (apache2-utils) as the load generator instead
    python3 bench/churn.py --servers canter,nginx,nginx-deferred   # + nginx `listen ... deferred`

Each server is pinned to CPU 0 with one worker (nginx: master + one worker, CPU summed); the
load generator (`canter load --no-keepalive`, or `ab` without -k) runs on CPU 1. Every round
starts each server in turn (the order rotating), warms it for 1 s and measures for --duration.
The table gives medians over the rounds of server CPU per connection (utime+stime of the process
tree divided by the responses) and connections per second. Results go to
bench/results/churn-<time>.json. Python 3 standard library.
"""
import argparse
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
from tls import stop  # noqa: E402  (a server's process group, stopped)

ROOT = run.ROOT
BENCH = run.BENCH
CANTER = run.CANTER_BIN
WORK = os.path.join(BENCH, "build", "churn")


def nginx_argv(port, prefix, deferred=False):
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open(os.path.join(BENCH, "peers", "nginx", "nginx.conf.in")) as f:
        conf = f.read()
    conf = conf.replace("@PORT@", str(port)).replace("@PREFIX@", prefix).replace("@NOFILE@", str(nofile))
    if deferred:
        # `listen ... deferred`: TCP_DEFER_ACCEPT, as canter sets on its HTTP listeners.
        conf = conf.replace("backlog=4096;", "backlog=4096 deferred;")
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    return [shutil.which("nginx") or "/usr/sbin/nginx", "-p", prefix, "-c",
            os.path.join(prefix, "nginx.conf")]


BASE = None

SERVERS = {
    "canter": lambda p, _: [CANTER, "serve", "--addr", f"127.0.0.1:{p}", "--workers", "1"],
    "nginx": nginx_argv,
    "nginx-deferred": lambda p, prefix: nginx_argv(p, prefix, deferred=True),
    # Another build of canter (--base BIN), for before/after comparisons in the same run.
    "canter-base": lambda p, _: [BASE, "serve", "--addr", f"127.0.0.1:{p}", "--workers", "1"],
}


def answers(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
        s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ok = s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()
        return ok
    except OSError:
        return False


def start(name, port):
    prefix = os.path.join(WORK, "run", f"{name}-{port}")
    os.makedirs(prefix, exist_ok=True)
    proc = subprocess.Popen(["taskset", "-c", "0"] + SERVERS[name](port, prefix),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < 10:
        if answers(port):
            return proc
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"{name} did not answer on {port}")


def load_canter(port, clients, duration):
    argv = ["taskset", "-c", "1", CANTER, "load", f"http://127.0.0.1:{port}/plaintext",
            "-c", str(clients), "-t", "1", "-d", duration, "--no-keepalive", "--json",
            "--no-progress"]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    errors = sum(v for v in out["errors"].values() if isinstance(v, int))
    return out["requests"], errors


def load_ab(port, clients, duration):
    secs = max(1, int(float(duration.rstrip("s"))))
    argv = ["taskset", "-c", "1", "ab", "-q", "-r", "-c", str(clients), "-t", str(secs), "-n", "10000000",
            f"http://127.0.0.1:{port}/plaintext"]
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    done = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))
    return done, failed


def main():
    global CANTER, BASE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--clients", default="1,50,1000")
    ap.add_argument("--servers", default="canter,nginx")
    ap.add_argument("--canter", default=CANTER, help="the canter binary to serve with")
    ap.add_argument("--base", help="another canter binary, served as canter-base")
    ap.add_argument("--ab", action="store_true", help="ab (apache2-utils) as the load generator")
    ap.add_argument("--quiet-wait", type=float, default=5.0)
    ap.add_argument("--port-base", type=int, default=24400)
    args = ap.parse_args()
    CANTER = args.canter
    BASE = args.base
    if args.ab and not shutil.which("ab"):
        subprocess.run(["apt-get", "install", "-y", "-q", "apache2-utils"], check=True,
                       stdout=subprocess.DEVNULL)
    run.raise_nofile()
    os.sched_setaffinity(0, {1})
    names = [n for n in args.servers.split(",") if n]
    load = load_ab if args.ab else load_canter
    results = {"rounds": args.rounds, "duration": args.duration, "generator": "ab" if args.ab else "canter load",
               "cells": {}}
    port = args.port_base
    for clients in [int(c) for c in args.clients.split(",")]:
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                port += 1
                run.wait_quiet(args.quiet_wait)
                proc = start(name, port)
                try:
                    load(port, clients, "1s")
                    c0 = run.cpu_seconds(proc.pid)
                    t0 = time.time()
                    n, errors = load(port, clients, args.duration)
                    elapsed = time.time() - t0
                    c1 = run.cpu_seconds(proc.pid)
                finally:
                    stop(proc)
                cell = {"cps": n / elapsed, "cpu_us": (c1 - c0) / max(n, 1) * 1e6, "requests": n,
                        "errors": errors}
                results["cells"].setdefault(str(clients), {}).setdefault(name, []).append(cell)
                print(f"c{clients:<5} round {r + 1} {name:8} {cell['cps']:>9,.0f} conn/s "
                      f"{cell['cpu_us']:7.2f} us CPU/conn errors {errors}", flush=True)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    path = os.path.join(BENCH, "results", time.strftime("churn-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {os.path.relpath(path, ROOT)}\n")
    med = statistics.median
    print("| clients | " + " | ".join(f"{n} µs/conn" for n in names) + " | canter ÷ nginx | per-round ratios |")
    print("|---:|" + "---:|" * len(names) + "---:|---|")
    for clients, by in results["cells"].items():
        cpus = {n: med(c["cpu_us"] for c in by[n]) for n in names}
        ratios = ([a["cpu_us"] / b["cpu_us"] for a, b in zip(by["canter"], by["nginx"])]
                  if "canter" in by and "nginx" in by else [])
        ratio = f"{med(ratios):.2f}" if ratios else "-"
        print(f"| {clients} | " + " | ".join(f"{cpus[n]:.2f}" for n in names)
              + f" | {ratio} | {', '.join(f'{x:.2f}' for x in ratios)} |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("churn", " ".join(["python3", "bench/churn.py"] + sys.argv[1:])):
        main()
