#!/usr/bin/env python3
"""HTTP/3 side by side: canter against Caddy (quic-go) and hyperium's h3 on quinn, with canter's
own HTTP/2 over TLS on the same server as the reference, and quinn's own endpoint driving
canter's HTTP/3 engine (quinn+canter-h3: what canter-rt's QUIC driver would be on quinn).

    bench/build.sh && python3 bench/h3.py [--rounds 3] [--requests 200000]

Each server runs pinned to CPU 0 with one worker (canter --workers 1, Caddy GOMAXPROCS=1, the
h3 peer on a current-thread runtime); the load generator, `canter load --h3` (quinn with h3)
or `canter load -m` for HTTP/2, runs on CPU 1. Every round starts each server in turn (the order
rotating from round to round), warms it with a tenth of the requests, then measures a fixed
number of requests; the tables give medians over the rounds. Scenarios:

  c1-m100      GET /plaintext, 1 connection, 100 concurrent streams
  c50-m1       GET /plaintext, 50 connections, 1 stream each
  c1-m100-quic-go, c50-m1-quic-go
               the same two loads from quic-go's http3 client (bench/peers/quic-go-load,
               GOMAXPROCS=1): a client that is not ours, whose lead counts too
  handshakes   a new connection per request, no resumption (full handshakes), 50 clients:
               handshakes per second and CPU per handshake
  concurrent   1,000 handshakes started at once (a connection each); how many complete
  idle-memory  RSS growth per idle connection (300 connections, each after one request; an
               aioquic client from bench/build/py-aioquic), once per server; and canter's own
               TLS over TCP beside it (HTTP/1.1 keep-alive, bench/tls.py's idle client)

CPU per request is the server's utime+stime (whole process tree) over the measured requests
divided by them. The certificate is bench/tls.py's ECDSA P-256. Results go to
bench/results/h3-<time>.json and Markdown on standard output.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import summary  # noqa: E402
import tls  # noqa: E402  (the certificate, stop)

BENCH = run.BENCH
CANTER = run.CANTER_BIN
CADDY = os.path.join(run.BUILD, "caddy")
H3_QUINN = os.path.join(run.RUST_TARGET, "peer-h3-quinn")
# quinn's own endpoint and driver with canter's HTTP/3 engine (canter-h3): the endpoint A/B.
QUINN_CANTER_H3 = os.path.join(run.RUST_TARGET, "peer-quinn-canter-h3")
AIOQUIC = os.path.join(run.BUILD, "py-aioquic")
# quic-go's http3 as the load client (bench/peers/quic-go-load): a client that is not ours.
QUIC_GO_LOAD = os.path.join(run.BUILD, "quic-go-load")

CADDYFILE = """{
\tadmin off
\tauto_https off
\tpersist_config off
\tlog default {
\t\tlevel ERROR
\t}
\tservers {
\t\tprotocols h1 h2 h3
\t}
}
https://127.0.0.1:@PORT@ {
\ttls @CERT@ @KEY@
\theader Server caddy
\trespond /plaintext "Hello, World!" 200
}
"""


def servers(cert, key, builds=()):
    """name -> (argv(port, prefix), env, load flags); `builds`: other canter binaries to run as
    servers beside it, named canter@<path> (an A/B of two builds)."""
    def canter(port, _prefix, binary=CANTER):
        return [binary, "serve", "--addr", "127.0.0.1:0", "--tls-addr", f"127.0.0.1:{port}",
                "--tls-cert", cert, "--tls-key", key, "--h3", "--workers", "1"]

    def caddy(port, prefix):
        path = os.path.join(prefix, "Caddyfile")
        with open(path, "w") as f:
            f.write(CADDYFILE.replace("@PORT@", str(port)).replace("@CERT@", cert)
                    .replace("@KEY@", key))
        return [CADDY, "run", "--config", path, "--adapter", "caddyfile"]

    others = {f"canter@{b}": (lambda p, x, b=b: canter(p, x, b), {}, ["--h3"]) for b in builds}
    return {
        **others,
        "canter": (canter, {}, ["--h3"]),
        "canter-h2-tls": (canter, {}, []),
        "caddy": (caddy, {"GOMAXPROCS": "1", "HOME": "/tmp"}, ["--h3"]),
        "h3-quinn": (lambda port, _: [H3_QUINN, str(port), cert, key], {}, ["--h3"]),
        "quinn+canter-h3": (lambda port, _: [QUINN_CANTER_H3, str(port), cert, key], {},
                            ["--h3"]),
    }


SCENARIOS = {
    "c1-m100": dict(clients=1, streams=100),
    "c50-m1": dict(clients=50, streams=1),
    # The same loads from a client that is not ours: quic-go's http3 (bench/peers/quic-go-load).
    "c1-m100-quic-go": dict(clients=1, streams=100, client="quic-go"),
    "c50-m1-quic-go": dict(clients=50, streams=1, client="quic-go"),
    # A new connection per request, no resumption: full handshakes, 50 at a time.
    "handshakes": dict(clients=50, streams=1, new_connection=True),
}


def load(port, flags, sc, n):
    if sc.get("client") == "quic-go":
        return load_quic_go(port, sc, n)
    argv = ["taskset", "-c", "1", CANTER, "load", f"https://127.0.0.1:{port}/plaintext",
            "-n", str(n), "-c", str(sc["clients"]), "-k",
            "--json", "--no-progress", "--timeout", "20s"] + flags
    if sc.get("new_connection"):
        argv += ["--no-keepalive", "--tls-no-resume"]
    else:
        argv += ["-m", str(sc["streams"])]
    out = subprocess.run(argv, capture_output=True, text=True)
    try:
        r = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"canter load output not understood:\n{out.stdout}{out.stderr}")
    return dict(rps=r["rps"], succeeded=r["status"].get("200", 0),
                p50_us=r["latency_us"]["p50"], p99_us=r["latency_us"]["p99"])


def load_quic_go(port, sc, n):
    argv = ["taskset", "-c", "1", QUIC_GO_LOAD, "-n", str(n), "-c", str(sc["clients"]),
            "-m", str(sc["streams"]), f"https://127.0.0.1:{port}/plaintext"]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ,
                                                                     "GOMAXPROCS": "1"})
    try:
        r = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"quic-go-load output not understood:\n{out.stdout}{out.stderr}")
    return dict(rps=r["rps"], succeeded=r["succeeded"], p50_us=r["p50_us"], p99_us=r["p99_us"])


def wait_up(port, flags, timeout=15.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if load(port, flags, dict(clients=1, streams=1), 1)["succeeded"] == 1:
                return True
        except RuntimeError:
            pass
        time.sleep(0.2)
    return False


def start(name, spec, port):
    argv, env, flags = spec
    prefix = os.path.join(BENCH, "build", "h3-run", f"{name}-{port}")
    os.makedirs(prefix, exist_ok=True)
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv(port, prefix),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env}, start_new_session=True)
    if not wait_up(port, flags):
        tls.stop(proc)
        raise RuntimeError(f"{name} did not answer on port {port}")
    return proc


def measure(proc, port, flags, sc, n):
    load(port, flags, sc, max(n // 10, 1000))
    c0 = run.cpu_seconds(proc.pid)
    r = load(port, flags, sc, n)
    c1 = run.cpu_seconds(proc.pid)
    r["cpu_us_per_req"] = (c1 - c0) / max(r["succeeded"], 1) * 1e6
    return r


IDLE_CLIENT = r"""
import asyncio, ssl, sys
sys.path.insert(0, sys.argv[3])
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import HeadersReceived
from aioquic.quic.configuration import QuicConfiguration

class C(QuicConnectionProtocol):
    def __init__(s, *a, **k):
        super().__init__(*a, **k); s.h3 = H3Connection(s._quic)
        s.got = asyncio.get_running_loop().create_future()
    def quic_event_received(s, e):
        for ev in s.h3.handle_event(e):
            if isinstance(ev, HeadersReceived) and not s.got.done(): s.got.set_result(1)

async def one(port, stack):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                            idle_timeout=120)
    c = await stack.enter_async_context(connect("127.0.0.1", port, configuration=cfg,
                                                create_protocol=C))
    sid = c._quic.get_next_available_stream_id()
    c.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                            (b":authority", b"localhost"), (b":path", b"/plaintext")], True)
    c.transmit(); await c.got

async def main():
    import contextlib
    port, n = int(sys.argv[1]), int(sys.argv[2])
    async with contextlib.AsyncExitStack() as stack:
        for i in range(0, n, 50):
            await asyncio.gather(*(one(port, stack) for _ in range(min(50, n - i))))
        print("held", flush=True)
        await asyncio.sleep(3)

asyncio.run(main())
"""


def idle_memory(name, spec, port, n):
    proc = start(name, spec, port)
    try:
        time.sleep(0.5)
        before = run.rss_kib(proc.pid)
        client = subprocess.Popen([sys.executable, "-c", IDLE_CLIENT, str(port), str(n), AIOQUIC],
                                  stdout=subprocess.PIPE, text=True)
        line = client.stdout.readline()
        if line.strip() != "held":
            raise RuntimeError(f"idle client failed for {name}")
        time.sleep(1.0)
        after = run.rss_kib(proc.pid)
        client.wait()
    finally:
        tls.stop(proc)
    return (after - before) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--handshakes", type=int, default=5000,
                    help="measured handshakes per round (a tenth more to warm up)")
    ap.add_argument("--concurrent", type=int, default=1000,
                    help="handshakes started at once, each of which must complete")
    ap.add_argument("--only", default="", help="comma-separated server names")
    ap.add_argument("--scenarios", default="", help="comma-separated scenario names")
    ap.add_argument("--build", action="append", default=[],
                    help="another canter binary to serve HTTP/3 beside target/release/canter "
                         "(repeatable; an A/B, with --only and --no-summary)")
    ap.add_argument("--clients", action="store_true",
                    help="only c1-m100 and c50-m1 from both clients (ours and quic-go's), no "
                         "handshake or memory runs: BENCHMARKS.md's 'HTTP/3 under a client that "
                         "is not ours' table")
    ap.add_argument("--no-summary", action="store_true",
                    help="an experiment: do not make this run BENCHMARKS.md's table")
    args = ap.parse_args()
    cert, key = tls.make_cert("ecdsa")
    specs = servers(cert, key, args.build)
    missing = [p for p in (CANTER, CADDY, H3_QUINN, QUINN_CANTER_H3, QUIC_GO_LOAD)
               if not os.path.exists(p)]
    if missing:
        sys.exit(f"missing {missing}: run bench/build.sh")
    names = [n for n in specs
             if not args.only or n in args.only.split(",") or n.startswith("canter@")]
    port = 19443
    cells = {}
    if args.clients:
        args.scenarios = "c1-m100,c1-m100-quic-go,c50-m1,c50-m1-quic-go"
    chosen = {k: v for k, v in SCENARIOS.items()
              if not args.scenarios or k in args.scenarios.split(",")}
    for k in list(SCENARIOS):
        if k not in chosen:
            del SCENARIOS[k]
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for sc_name, sc in SCENARIOS.items():
            for name in order:
                if sc.get("new_connection") and name == "canter-h2-tls":
                    continue  # TLS over TCP has its own handshake table (bench/tls.py)
                if sc.get("client") and name == "canter-h2-tls":
                    continue  # an HTTP/3 client only
                port += 1
                proc = start(name, specs[name], port)
                try:
                    n = args.handshakes if sc.get("new_connection") else args.requests
                    r = measure(proc, port, specs[name][2], sc, n)
                finally:
                    tls.stop(proc)
                cells.setdefault((sc_name, name), []).append(r)
                print(f"round {rnd + 1} {sc_name:8} {name:14} {r['rps']:>10.0f} req/s "
                      f"{r['cpu_us_per_req']:7.2f} us CPU/req", file=sys.stderr)
    concurrent = {}
    for name in names:
        if name == "canter-h2-tls" or args.build or args.clients:
            continue
        port += 1
        proc = start(name, specs[name], port)
        try:
            sc = dict(clients=args.concurrent, streams=1, new_connection=True)
            concurrent[name] = load(port, specs[name][2], sc, args.concurrent)["succeeded"]
        finally:
            tls.stop(proc)
        print(f"{name}: {concurrent[name]} of {args.concurrent} concurrent handshakes completed",
              file=sys.stderr)
    idle = {}
    for name in names:
        if args.build or args.clients:
            continue
        port += 1
        try:
            if name == "canter-h2-tls":
                idle["canter, TLS over TCP"] = tls.idle_memory(
                    lambda: start(name, specs[name], port), port, args.idle, "https")
            else:
                idle[name] = idle_memory(name, specs[name], port, args.idle)
        except RuntimeError as e:
            print(e, file=sys.stderr)
    results = dict(machine=run.machine_info(), rounds=args.rounds, requests=args.requests,
                   cells={f"{s}/{n}": v for (s, n), v in cells.items()}, idle_kib=idle,
                   concurrent=concurrent, concurrent_started=args.concurrent)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    path = os.path.join(BENCH, "results", time.strftime("h3-%Y%m%d-%H%M%S.json"))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    command = "python3 bench/h3.py " + " ".join(sys.argv[1:])
    note = ("Medians of the rounds; server on CPU 0 with one worker, `canter load --h3` (quinn "
            "with h3) or `canter load -m` (HTTP/2 over TLS) on CPU 1. CPU/req: the server's "
            "utime+stime over the measured requests. Under a client that is not ours "
            "(quic-go's) the server does more work a request, and the leads are smaller: see "
            "the next section.")
    if args.clients:
        note = ("Medians of the rounds; server on CPU 0 with one worker; the client on CPU 1: "
                "`canter load --h3` (quinn with h3, ours) or quic-go's http3 "
                "(bench/peers/quic-go-load, GOMAXPROCS=1). CPU/req: the server's utime+stime "
                "over the measured requests. A lead over a peer counts where it holds under "
                "both clients.")
        with summary.capture("http3-clients", command.strip(), note):
            print(markdown(cells, idle, names, concurrent, args.concurrent))
            print(by_client(cells, names))
    else:
        with summary.capture("http3", command.strip(), note):
            print(markdown(cells, idle, names, concurrent, args.concurrent))
    print(f"\n(results: {os.path.relpath(path, run.ROOT)})")


def markdown(cells, idle, names, concurrent=None, started=0):
    out = []
    for sc in SCENARIOS:
        if (sc, "canter") not in cells:
            continue
        base = statistics.median(r["cpu_us_per_req"] for r in cells[(sc, "canter")])
        sc_def = SCENARIOS[sc]
        if sc_def.get("new_connection"):
            out.append(f"\n#### {sc}: {sc_def['clients']} clients, a new connection (a full "
                       "handshake) per request; CPU/req is CPU per handshake\n")
        else:
            client = ("quic-go's http3 (bench/peers/quic-go-load)" if sc_def.get("client")
                      else "`canter load --h3`")
            out.append(f"\n#### {sc}: {sc_def['clients']} connection(s), {sc_def['streams']} "
                       f"stream(s) each, GET /plaintext; client {client}\n")
        out.append("| server | req/s | CPU/req (µs) | vs canter | p50 (µs) | p99 (µs) |")
        out.append("|---|--:|--:|--:|--:|--:|")
        for name in names:
            if (sc, name) not in cells:
                continue
            rs = cells[(sc, name)]
            cpu = statistics.median(r["cpu_us_per_req"] for r in rs)
            out.append(f"| {name} | {statistics.median(r['rps'] for r in rs):,.0f} | {cpu:.2f} | "
                       f"{cpu / base:.2f}× | {statistics.median(r['p50_us'] for r in rs):,.0f} | "
                       f"{statistics.median(r['p99_us'] for r in rs):,.0f} |")
    if concurrent:
        out.append(f"\n#### {started:,} handshakes at once (a connection each, no resumption)\n")
        out.append("| server | completed |")
        out.append("|---|--:|")
        for name, done in concurrent.items():
            out.append(f"| {name} | {done:,} of {started:,} |")
    if idle:
        out.append("\n#### idle-memory: RSS growth per idle connection (KiB), HTTP/3 and, for "
                   "reference, canter's TLS over TCP (an HTTP/1.1 keep-alive connection)\n")
        out.append("| server | KiB |")
        out.append("|---|--:|")
        for name, kib in idle.items():
            out.append(f"| {name} | {kib:.1f} |")
    return "\n".join(out)


def by_client(cells, names):
    """Each server's CPU per request under quic-go's client over that under ours, and its
    ratio to canter under each client."""
    out = ["\n#### CPU per request by client: quic-go's over ours, and each server against "
           "canter under the same client\n",
           "| server | load | ours (µs) | quic-go (µs) | quic-go / ours | vs canter, ours | "
           "vs canter, quic-go |",
           "|---|---|--:|--:|--:|--:|--:|"]

    def cpu(sc, name):
        rs = cells.get((sc, name))
        return statistics.median(r["cpu_us_per_req"] for r in rs) if rs else None

    for sc in ("c1-m100", "c50-m1"):
        for name in names:
            ours, theirs = cpu(sc, name), cpu(f"{sc}-quic-go", name)
            base_ours, base_theirs = cpu(sc, "canter"), cpu(f"{sc}-quic-go", "canter")
            if None in (ours, theirs, base_ours, base_theirs):
                continue
            out.append(f"| {name} | {sc} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}× | "
                       f"{ours / base_ours:.2f}× | {theirs / base_theirs:.2f}× |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
