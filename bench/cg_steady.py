#!/usr/bin/env python3
"""User-space instructions per HTTP/1.1 request in the steady state, counted by callgrind.

Callgrind counts instructions, not time, so the figure does not move with the CPU or with the
machine's load: two servers, or two builds of one, compare exactly. Unlike `cg_pipeline.sh`
(one connection, start-up included) this leaves start-up and warm-up out: the server runs
under callgrind, gets WARMUP requests, has its counters zeroed (`callgrind_control -z`), gets
REQUESTS more, and the dump taken then (`callgrind_control -d`) is divided by REQUESTS.

    bench/cg_steady.py [--conns 50] [--depth 1] [--requests 20000] [--sim] -- SERVER ARGS...

The server must listen on 127.0.0.1:PORT (`--port`, default 31051; `{port}` in its arguments
is replaced by it). `--conns` connections each keep `--depth` requests in flight (depth 1: one
at a time, as wrk without pipelining; 16: as wrk's pipelined script). `--sim` adds callgrind's
cache and branch simulation: first-level data and instruction misses, last-level misses and
mispredicted branches per request (simulated for a generic cache: a model, not this CPU's
counters, which this machine's `perf` cannot read). Prints one line of JSON.

Examples (release builds; bench/build.sh builds the peers):
    bench/cg_steady.py -- target/release/canter serve --addr 127.0.0.1:{port} --workers 1
    bench/cg_steady.py --depth 16 -- bench/target/release/peer-may-minihttp {port}

`--client "ARGS"` drives the server with `canter load ARGS -n N` instead of the built-in
HTTP/1.1 client (`{port}` replaced as above), for the protocols that client does not speak:
HTTP/2 (`-m`), TLS (`https://... -k`), WebSocket (`ws://.../ws/echo`). The warm-up and the
measured run are a `canter load` each, so each opens its connections anew; with few
connections and many requests their set-up (a TLS handshake) is a small, equal share of an
A/B. A run is refused unless every request succeeded.
    bench/cg_steady.py --client "https://127.0.0.1:{port}/plaintext -k -c 1 -m 10" -- \
        target/release/canter serve --addr 127.0.0.1:0 --tls-addr 127.0.0.1:{port} \
        --tls-cert C --tls-key K --workers 1

`--table` runs the suite's table instead (BENCHMARKS.md, "instructions per request"): canter,
may-minihttp, actix-web and the C ceiling, each one connection one request at a time, 50
connections one request each, and 50 connections 16 pipelined, with the simulation on.
"""
import argparse
import glob
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conns", type=int, default=50)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--requests", type=int, default=20000, help="measured requests")
    p.add_argument("--warmup", type=int, default=5000)
    p.add_argument("--path", default="/plaintext")
    p.add_argument("--port", type=int, default=31051)
    p.add_argument("--sim", action="store_true", help="cache and branch simulation")
    p.add_argument("--label", default="")
    p.add_argument("--table", action="store_true", help="the suite's table (see above)")
    p.add_argument("--client", default="", help="canter load's arguments (see above)")
    p.add_argument("server", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.server[:1] == ["--"]:
        a.server = a.server[1:]
    if not a.server and not a.table:
        p.error("no server command")
    return a


class CanterLoad:
    """`canter load` with the given arguments, one run per call."""

    def __init__(self, port, args):
        import shlex
        self.argv = [os.path.join(ROOT, "target", "release", "canter"), "load"] + [
            x.replace("{port}", str(port)) for x in shlex.split(args)]

    def run(self, total):
        out = subprocess.run(self.argv + ["-n", str(total), "--json", "--no-progress",
                                          "--timeout", "120s"],
                             capture_output=True, text=True)
        try:
            r = json.loads(out.stdout)
        except json.JSONDecodeError:
            sys.exit(f"canter load output not understood:\n{out.stdout}{out.stderr}")
        # A WebSocket run counts echoed messages as requests (its status is the 101).
        ok = r["requests"] if r.get("protocol") == "websocket" else r["status"].get("200", 0)
        done = ok if not any(r["errors"].values()) else 0
        if done != total:
            sys.exit(f"canter load did {done} of {total}: {out.stdout[:2000]}")
        return done


class Load:
    """`conns` keep-alive connections, each with `depth` requests in flight."""

    def __init__(self, port, conns, depth, path):
        self.req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        self.depth = depth
        self.sel = selectors.DefaultSelector()
        self.socks = []
        for _ in range(conns):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, {"buf": b"", "inflight": 0})
            self.socks.append(s)

    def run(self, total):
        """Sends and answers `total` requests; returns when every answer is in."""
        sent = done = 0
        for s in self.socks:
            state = self.sel.get_key(s).data
            n = min(self.depth, total - sent)
            if n > 0:
                s.sendall(self.req * n)
                state["inflight"] += n
                sent += n
        while done < total:
            events = self.sel.select(timeout=120)
            if not events:
                sys.exit(f"no answer for 120 s ({done} of {total} answered)")
            for key, _ in events:
                s, state = key.fileobj, key.data
                data = s.recv(1 << 16)
                if not data:
                    sys.exit("the server closed a connection")
                state["buf"] += data
                got = self.take(state)
                done += got
                state["inflight"] -= got
                # Refill once the whole batch is answered (as a pipelining client does).
                if state["inflight"] == 0 and sent < total:
                    n = min(self.depth, total - sent)
                    s.sendall(self.req * n)
                    state["inflight"] += n
                    sent += n
        return done

    @staticmethod
    def take(state):
        buf, got = state["buf"], 0
        while (i := buf.find(b"\r\n\r\n")) >= 0:
            head = buf[:i].lower()
            j = head.find(b"content-length:")
            if j < 0:
                sys.exit(f"answer without Content-Length: {head[:200]!r}")
            n = int(head[j + 15:].split(b"\r\n")[0])
            if len(buf) < i + 4 + n:
                break
            if not head.startswith(b"http/1.1 200"):
                sys.exit(f"unexpected answer: {head[:80]!r}")
            buf = buf[i + 4 + n:]
            got += 1
        state["buf"] = buf
        return got


def totals(path):
    """The event totals of one callgrind dump, by event name."""
    events = summary = None
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                summary = [int(x) for x in line.split()[1:]]
    if not events or summary is None:
        sys.exit(f"no totals in {path}")
    return dict(zip(events, summary))


def measure(a):
    """One server, one load: the row of per-request figures."""
    out = tempfile.mkdtemp(prefix="cg-steady-")
    cmd = [x.replace("{port}", str(a.port)) for x in a.server]
    vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out.%p", "--dump-instr=no"]
    if a.sim:
        vg += ["--cache-sim=yes", "--branch-sim=yes"]
    log = open(os.path.join(out, "server.log"), "w")
    server = subprocess.Popen(vg + cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", a.port)).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"server did not start; its log: {out}/server.log")
                time.sleep(0.2)
        load = (CanterLoad(a.port, a.client) if a.client
                else Load(a.port, a.conns, a.depth, a.path))
        load.run(a.warmup)
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        load.run(a.requests)
        before = set(glob.glob(f"{out}/cg.out.{server.pid}*"))
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        dumps = sorted(set(glob.glob(f"{out}/cg.out.{server.pid}*")) - before)
        if not dumps:
            sys.exit("callgrind wrote no dump")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    t = {}
    for d in dumps:  # one file, or one a thread with --separate-threads
        for k, v in totals(d).items():
            t[k] = t.get(k, 0) + v
    per = {k: round(v / a.requests, 1) for k, v in t.items()}
    row = {"server": a.label or os.path.basename(cmd[0]), "conns": a.conns, "depth": a.depth,
           "requests": a.requests, "instructions": per.get("Ir"), "profile": dumps[0]}
    if a.client:
        del row["conns"], row["depth"]
        row["client"] = a.client
    if a.sim:
        row.update({
            "l1_misses": round(per.get("I1mr", 0) + per.get("D1mr", 0) + per.get("D1mw", 0), 2),
            "ll_misses": round(per.get("ILmr", 0) + per.get("DLmr", 0) + per.get("DLmw", 0), 2),
            "branch_misses": round(per.get("Bcm", 0) + per.get("Bim", 0), 2),
            "branches": round(per.get("Bc", 0) + per.get("Bi", 0), 1),
        })
    return row


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "bench", "target", "release")
TABLE_SERVERS = [
    ("canter", [os.path.join(ROOT, "target", "release", "canter"), "serve",
                "--addr", "127.0.0.1:{port}", "--workers", "1"]),
    ("may-minihttp", [os.path.join(PEERS, "peer-may-minihttp"), "{port}"]),
    ("actix-web", [os.path.join(PEERS, "peer-actix"), "{port}"]),
    ("ceiling (C)", [os.path.join(ROOT, "bench", "build", "ceiling"), "{port}"]),
]
# (name, connections, depth, measured requests)
TABLE_LOADS = [("1 conn, one at a time", 1, 1, 10000), ("50 conns, one at a time", 50, 1, 10000),
               ("50 conns, 16 pipelined", 50, 16, 64000)]


def table(a):
    rows = {}
    for name, cmd in TABLE_SERVERS:
        if not os.path.exists(cmd[0]):
            sys.exit(f"{cmd[0]} is missing: bench/build.sh builds it")
        for load, conns, depth, requests in TABLE_LOADS:
            b = argparse.Namespace(**vars(a))
            b.server, b.conns, b.depth, b.requests, b.label, b.sim = cmd, conns, depth, requests, name, True
            b.warmup = max(a.warmup, requests // 4)
            rows[(name, load)] = r = measure(b)
            print(json.dumps(r), file=sys.stderr)
    import summary  # bench/summary.py
    lines = ["| load | server | instructions | vs may-minihttp | branches | branch misses "
             "| L1 misses | LL misses |", "|---|---|--:|--:|--:|--:|--:|--:|"]
    for load, *_ in TABLE_LOADS:
        base = rows[("may-minihttp", load)]["instructions"]
        for name, _ in TABLE_SERVERS:
            r = rows[(name, load)]
            lines.append(f"| {load} | {name} | {r['instructions']:,.0f} | "
                         f"{r['instructions'] / base:.2f}x | {r['branches']:,.0f} | "
                         f"{r['branch_misses']:.1f} | {r['l1_misses']:.1f} | {r['ll_misses']:.2f} |")
    text = "\n".join(lines)
    print(text)
    note = ("User-space instructions per `GET /plaintext` in the steady state, counted by "
            "callgrind (start-up and warm-up left out: counters zeroed after the warm-up, dumped "
            "after the measured requests), one worker each; the kernel's instructions are not "
            "counted. Branch and cache misses are callgrind's simulation (a generic two-level "
            "cache of the host's sizes and a simple predictor): a model, not this CPU's "
            "counters, which `perf` cannot read on this machine. Under callgrind a server runs "
            "some 50 times slower than the client, so with 50 connections every wake-up finds "
            "many ready: that row is batched harder than a real run; the one-connection row "
            "pays one wake-up per request and is exactly repeatable.")
    summary.record("http1-instructions", "python3 bench/cg_steady.py --table", text, note)


def main():
    a = parse_args()
    if a.table:
        table(a)
    else:
        print(json.dumps(measure(a)))


if __name__ == "__main__":
    main()
