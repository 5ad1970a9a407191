#!/usr/bin/env python3
"""WebSocket side by side: canter against Bun's built-in server (uWebSockets), axum
(tokio-tungstenite), fastwebsockets, Go (gorilla/websocket) and Node's `ws`.

    bench/build.sh && python3 bench/ws.py [--rounds 3] [--duration 5s] [--idle 1000]

Each server runs pinned to CPU 0 on one thread (one canter worker, a current-thread tokio
runtime, GOMAXPROCS=1, Node's and Bun's single JavaScript thread); the load generator,
`canter load ws://` (the same client for every server), runs on CPU 1. Every server answers
`/ws/echo` by sending each message back. Scenarios:

  echo-32B-c100      100 connections, 32-byte text messages, one in flight per connection
  echo-32B-c100-p16  the same, 16 in flight per connection
  deflate-4KiB-c16   16 connections, 4 KiB JSON-like text, permessage-deflate offered
  broadcast-64B-c1000  1,000 connections in the room of `/ws/broadcast`; one of them publishes
                     100 messages of 64 bytes a second, each delivered to all 1,000 (the server
                     sends every message it receives to every member; fastwebsockets has no
                     room here and is left out)
  idle-memory        RSS growth per idle WebSocket connection (after the upgrade; no deflate)

CPU per message is the server's utime+stime (the whole process tree) over the measured run
divided by the messages echoed (delivered, for the broadcast), also given as its two parts:
user (the server's own code) and kernel (system calls and the TCP stack on its behalf; on
loopback that includes delivering to the client's socket); wire bytes per message is what
the server sent per message (the client's bytes read). Every round starts each server in
turn (the order rotating), and the tables give medians over the rounds. Results go to bench/results/ws-<time>.json.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import tls  # noqa: E402  (stop)

BENCH = run.BENCH
CANTER = run.CANTER_BIN
NODE_DIR = os.path.join(BENCH, "peers", "node-ws")
BUN = os.path.join(NODE_DIR, "node_modules", "bun", "bin", "bun.exe")


def servers():
    """name -> (the file that must exist, argv(port), extra environment)."""
    return {
        "canter": (CANTER, lambda p: [CANTER, "serve", "--addr", f"127.0.0.1:{p}",
                                      "--workers", "1"], {}),
        # Another build of canter (CANTER_BASE=path), to measure a change before and after.
        "canter-base": (os.environ.get("CANTER_BASE", "/nonexistent"),
                        lambda p: [os.environ["CANTER_BASE"], "serve", "--addr",
                                   f"127.0.0.1:{p}", "--workers", "1"], {}),
        "bun": (BUN, lambda p: [BUN, os.path.join(NODE_DIR, "bun.js"), str(p)], {}),
        "fastwebsockets": (os.path.join(run.RUST_TARGET, "peer-ws-fast"),
                           lambda p: [os.path.join(run.RUST_TARGET, "peer-ws-fast"), str(p)], {}),
        "axum (tungstenite)": (os.path.join(run.RUST_TARGET, "peer-ws-axum"),
                               lambda p: [os.path.join(run.RUST_TARGET, "peer-ws-axum"), str(p)],
                               {}),
        "go (gorilla)": (os.path.join(run.BUILD, "go-ws"),
                         lambda p: [os.path.join(run.BUILD, "go-ws"), str(p)],
                         {"GOMAXPROCS": "1"}),
        "node ws": (os.path.join(NODE_DIR, "node_modules", "ws", "package.json"),
                    lambda p: ["node", os.path.join(NODE_DIR, "ws.js"), str(p)], {}),
    }


SCENARIOS = {
    "echo-32B-c100": dict(conns=100, size=32, pipeline=1, deflate=False),
    "echo-32B-c100-p16": dict(conns=100, size=32, pipeline=16, deflate=False),
    "deflate-4KiB-c16": dict(conns=16, size=4096, pipeline=1, deflate=True),
    "broadcast-64B-c1000": dict(conns=1000, size=64, pipeline=1, deflate=False, broadcast=100),
}

# The servers with a broadcast room at /ws/broadcast.
ROOMS = {"canter", "canter-base", "bun", "axum (tungstenite)", "go (gorilla)", "node ws"}

UPGRADE = (b"GET /ws/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")


def up(port, timeout=15.0):
    """Waits until the server answers an upgrade with 101."""
    until = time.time() + timeout
    while time.time() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(UPGRADE)
                if s.recv(64).startswith(b"HTTP/1.1 101"):
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def start(name, spec, port):
    argv, env = spec[1](port), spec[2]
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    if not up(port):
        tls.stop(proc)
        raise RuntimeError(f"{name} did not come up on port {port}")
    return proc


def load(port, sc, duration):
    path = "/ws/broadcast" if sc.get("broadcast") else "/ws/echo"
    argv = ["taskset", "-c", "1", CANTER, "load", f"ws://127.0.0.1:{port}{path}",
            "-c", str(sc["conns"]), "-d", duration, "--warmup", "1s", "--pipeline",
            str(sc["pipeline"]), "--ws-size", str(sc["size"]), "--json", "--no-progress"]
    if sc["deflate"]:
        argv.append("--ws-deflate")
    if sc.get("broadcast"):
        argv += ["--ws-broadcast", "--rate", str(sc["broadcast"])]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def measure(proc, port, sc, duration):
    (u0, s0), t0 = run.cpu_user_system(proc.pid), time.time()
    rep = load(port, sc, duration)
    (u1, s1), t1 = run.cpu_user_system(proc.pid), time.time()
    c0, c1 = u0 + s0, u1 + s1
    # The warm-up second is in the CPU time too: scale it to the measured part by wall time.
    measured = rep["duration_s"] / max(t1 - t0, 1e-9)
    msgs = max(rep["requests"], 1)
    errors = sum(rep["errors"].values())
    want = sc["broadcast"] * sc["conns"] if sc.get("broadcast") else None
    return dict(rps=rep["rps"], messages=rep["requests"], errors=errors,
                delivered_pct=(100.0 * rep["rps"] / want) if want else 100.0,
                cpu_us_per_msg=(c1 - c0) * measured / msgs * 1e6,
                user_us_per_msg=(u1 - u0) * measured / msgs * 1e6,
                kernel_us_per_msg=(s1 - s0) * measured / msgs * 1e6,
                wire_bytes_per_msg=rep["bytes_read"] / msgs,
                p50_us=rep["latency_us"]["p50"], p99_us=rep["latency_us"]["p99"])


def idle_memory(name, spec, port, n):
    proc = start(name, spec, port)
    socks = []
    try:
        time.sleep(0.5)
        before = run.rss_kib(proc.pid)
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(UPGRADE)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError(f"{name} closed an upgrade")
                head += chunk
            assert head.startswith(b"HTTP/1.1 101"), head[:64]
            socks.append(s)
        time.sleep(1.0)
        after = run.rss_kib(proc.pid)
    finally:
        for s in socks:
            s.close()
        tls.stop(proc)
    return (after - before) / n


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def markdown(results):
    runs = results["runs"]
    names = list(dict.fromkeys(r["server"] for r in runs))
    lines = [f"### WebSocket echo, server on CPU 0, `canter load ws://` on CPU 1 "
             f"(median of {results['rounds']} rounds)", ""]
    for sc in SCENARIOS:
        lines += [f"#### {sc}", "",
                  "| server | messages/s | delivered | CPU µs/message | × canter's CPU "
                  "| of it user | of it kernel | wire B/message | p50 | p99 | errors |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        cells = {}
        for name in names:
            rs = [r for r in runs if r["server"] == name and r["scenario"] == sc]
            if rs:
                cells[name] = {k: median([r[k] for r in rs]) for k in rs[0]
                               if isinstance(rs[0][k], (int, float))}
        base = cells.get("canter", {}).get("cpu_us_per_msg")
        for name, c in cells.items():
            ratio = f"{c['cpu_us_per_msg'] / base:.2f}" if base else "–"
            lines.append(f"| {name} | {c['rps']:,.0f} | {c['delivered_pct']:.1f}% | "
                         f"{c['cpu_us_per_msg']:.2f} | {ratio} | "
                         f"{c.get('user_us_per_msg', 0):.2f} | "
                         f"{c.get('kernel_us_per_msg', 0):.2f} | "
                         f"{c['wire_bytes_per_msg']:.0f} | {c['p50_us']:.0f} µs | "
                         f"{c['p99_us']:.0f} µs | {c['errors']:.0f} |")
        lines.append("")
    idle = [r for r in runs if r["scenario"] == "idle-memory"]
    if idle:
        lines += [f"#### idle-memory ({results['idle']} connections after the upgrade)", "",
                  "| server | KiB per idle connection |", "|---|---:|"]
        for r in idle:
            lines.append(f"| {r['server']} | {r['kib_per_conn']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--servers", default=",".join(n for n in servers() if n != "canter-base"))
    ap.add_argument("--base-port", type=int, default=24000)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="the scenarios to run (comma-separated; all by default)")
    args = ap.parse_args()
    run.raise_nofile()
    all_servers = servers()
    names = []
    for n in args.servers.split(","):
        if os.path.exists(all_servers[n][0]):
            names.append(n)
        else:
            print(f"skipping {n}: {all_servers[n][0]} not built (bench/build.sh)", file=sys.stderr)
    results = {"rounds": args.rounds, "duration": args.duration, "idle": args.idle,
               "runs": [], "machine": run.machine_info()}
    port = args.base_port
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            port += 1
            proc = start(name, all_servers[name], port)
            try:
                for sc_name, sc in SCENARIOS.items():
                    if sc_name not in args.scenarios.split(","):
                        continue
                    if sc.get("broadcast") and name not in ROOMS:
                        continue
                    r = measure(proc, port, sc, args.duration)
                    results["runs"].append(dict(server=name, scenario=sc_name, round=rnd, **r))
                    print(f"{sc_name} {name}: {r['rps']:.0f} msg/s, "
                          f"{r['cpu_us_per_msg']:.2f} µs/msg", file=sys.stderr)
            finally:
                tls.stop(proc)
    if args.idle:
        for name in names:
            port += 1
            kib = idle_memory(name, all_servers[name], port, args.idle)
            results["runs"].append(dict(server=name, scenario="idle-memory", round=0,
                                        kib_per_conn=kib))
            print(f"idle {name}: {kib:.1f} KiB/conn", file=sys.stderr)
    os.makedirs(run.RESULTS, exist_ok=True)
    path = os.path.join(run.RESULTS, time.strftime("ws-%Y%m%d-%H%M%S.json"))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(markdown(results))
    print(f"\n(results: {os.path.relpath(path, run.ROOT)})")


if __name__ == "__main__":
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("websocket", " ".join(["python3", "bench/ws.py"] + sys.argv[1:])):
        main()
