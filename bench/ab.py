#!/usr/bin/env python3
"""Interleaved A/B runs of canter builds and peers, with the server's user and system time.

    python3 bench/ab.py --build before=/path/to/old/canter --build after=target/release/canter \
        --peer may-minihttp --rounds 5 --duration 4s --pipeline 16 --conns 256

Each round starts every server in turn (pinned to CPU 0, one worker), warms it for 1 s with
`canter load` on CPU 1, then measures for --duration. The order rotates from round to round
(A B C, B C A, C A B, ...): on this machine the place in a round can matter as much as the
change measured. Prints per round and the medians of requests/s and of user, system and total
CPU time per request (from /proc/PID/stat), and for two or more builds, how many rounds each
build used less user time than the first.
Python 3 standard library only; peers come from bench/build.sh.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
LOAD = os.path.join(ROOT, "target", "release", "canter")
PEERS = {
    "ceiling": lambda port: [os.path.join(BENCH, "build", "ceiling"), str(port)],
    "ceiling-uring": lambda port: [os.path.join(BENCH, "build", "ceiling-uring"), str(port)],
    "may-minihttp": lambda port: [os.path.join(BENCH, "target", "release", "peer-may-minihttp"), str(port)],
    "hyper": lambda port: [os.path.join(BENCH, "target", "release", "peer-hyper"), str(port)],
}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def load(port, args, duration):
    argv = ["taskset", "-c", "1", LOAD, "load", f"http://127.0.0.1:{port}{args.path}", "-c",
            str(args.conns), "-t", "1", "-d", duration, "--pipeline", str(args.pipeline),
            "--json", "--no-progress"]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=BIN",
                    help="a canter binary to run as `BIN serve` (repeatable)")
    ap.add_argument("--peer", action="append", default=[], choices=sorted(PEERS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="4s")
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--conns", type=int, default=256)
    ap.add_argument("--path", default="/plaintext")
    ap.add_argument("--port-base", type=int, default=31400)
    args = ap.parse_args()
    servers = {}
    for spec in args.build:
        name, _, binary = spec.partition("=")
        servers[name] = (lambda b: lambda port: [b, "serve", "--addr", f"127.0.0.1:{port}",
                                                 "--workers", "1"])(binary)
    for peer in args.peer:
        servers[peer] = PEERS[peer]
    if not servers:
        ap.error("give at least one --build or --peer")
    results = {name: [] for name in servers}
    port = args.port_base
    names = list(servers)
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            argv = servers[name]
            port += 1
            srv = subprocess.Popen(["taskset", "-c", "0"] + argv(port),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.6)
                load(port, args, "1s")
                u0, s0 = cpu_times(srv.pid)
                out = load(port, args, args.duration)
                u1, s1 = cpu_times(srv.pid)
            finally:
                srv.terminate()
                srv.wait()
            n = out["requests"]
            row = ((u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6, out["rps"])
            results[name].append(row)
            print(f"round {r + 1} {name:14} {row[2]:>12,.0f} req/s  user {row[0]:.3f}  "
                  f"system {row[1]:.3f}  total {row[0] + row[1]:.3f} us/request", flush=True)
    print("medians:")
    for name, rows in results.items():
        med = lambda f: statistics.median(f(x) for x in rows)
        print(f"  {name:14} {med(lambda x: x[2]):>12,.0f} req/s  user {med(lambda x: x[0]):.3f}  "
              f"system {med(lambda x: x[1]):.3f}  total {med(lambda x: x[0] + x[1]):.3f} us/request")
    builds = [spec.partition("=")[0] for spec in args.build]
    for name in builds[1:]:
        fewer = sum(b[0] < a[0] for a, b in zip(results[builds[0]], results[name]))
        print(f"{name} used less user time than {builds[0]} in {fewer} of {args.rounds} rounds")


if __name__ == "__main__":
    main()
