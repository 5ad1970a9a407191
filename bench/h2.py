#!/usr/bin/env python3
"""HTTP/2 side by side: canter against hyper, Go net/http, h2o and nginx, over h2c (prior
knowledge) and h2 over TLS (ALPN), with canter's own HTTP/1.1 as a reference.

    bench/build.sh && python3 bench/h2.py [--rounds 3] [--requests 400000] [--only h2c|tls]
        [--client canter|h2load]

Each server runs pinned to CPU 0 with one worker (thread, process or GOMAXPROCS=1); the load
generator runs on CPU 1: `canter load -m` (the default), or h2load as a cross-check. Every round starts each server in turn (the order rotating from round to round),
warms it with a tenth of the requests and then measures a fixed number of requests; the tables
give medians over the rounds. Scenarios:

  c1-m100        GET /plaintext, 1 connection, 100 concurrent streams
  c16-m100       GET /plaintext, 16 connections, 100 streams each
  large-c4-m10   GET 1 MiB (canter: /bytes/1048576), 4 connections, 10 streams each; against
                 canter's HTTP/1.1 with 40 connections (h2load --h1, or canter load without -m)
  idle-memory    RSS growth per idle HTTP/2 connection (1,000 connections, each after one
                 request)

CPU per request is the server's utime+stime (whole process tree) over the measured requests
divided by them. Results go to bench/results/h2-<time>.json, plots to bench/plots/h2-*.svg and
Markdown on standard output. Python 3 standard library only; h2load from Debian's
nghttp2-client (also used to check that a server is up).
"""
import argparse
import json
import os
import re
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import tls  # noqa: E402  (certificates, nginx TLS config, start/stop)

BENCH = run.BENCH
CANTER = run.CANTER_BIN
HYPER = os.path.join(run.RUST_TARGET, "peer-hyper")
GO = os.path.join(run.BUILD, "go-nethttp")
NGINX = run._which("nginx") or "/usr/sbin/nginx"
H2O = run._which("h2o") or "/usr/bin/h2o"


def nginx_h2(port, prefix, cert=None, key=None):
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    name = "nginx-h2c.conf.in" if cert is None else "nginx-tls.conf.in"
    with open(os.path.join(BENCH, "peers", "nginx", name)) as f:
        conf = f.read()
    conf = (conf.replace("@PORT@", str(port)).replace("@PREFIX@", prefix)
            .replace("@NOFILE@", str(nofile)))
    if cert is not None:
        # HTTP/2 on the TLS listener (nginx 1.22 syntax).
        conf = (conf.replace("@CERT@", cert).replace("@KEY@", key)
                .replace(" ssl backlog=4096;", " ssl http2 backlog=4096;"))
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    return [NGINX, "-p", prefix, "-c", os.path.join(prefix, "nginx.conf")]


def h2o_h2c(port, prefix):
    run._h2o_prepare(port, prefix)
    return [H2O, "-c", os.path.join(prefix, "h2o.conf")]


def servers(cert, key):
    """name -> (binary, argv(port, prefix), scheme, env, large path or None)."""
    return {
        "h2c": {
            "canter": (CANTER, lambda p, _: [CANTER, "serve", "--addr", f"127.0.0.1:{p}",
                                             "--workers", "1"], "http", {}, "/bytes/1048576"),
            "hyper": (HYPER, lambda p, _: [HYPER, str(p)], "http", {}, None),
            "go-nethttp": (GO, lambda p, _: [GO, str(p)], "http", {"GOMAXPROCS": "1"}, None),
            "h2o": (H2O, h2o_h2c, "http", {}, None),
            "nginx": (NGINX, lambda p, prefix: nginx_h2(p, prefix), "http", {}, None),
        },
        "tls": {
            "canter": (CANTER, lambda p, _: [CANTER, "serve", "--addr", "127.0.0.1:0", "--workers",
                                             "1", "--tls-addr", f"127.0.0.1:{p}", "--tls-cert",
                                             cert, "--tls-key", key], "https", {}, None),
            "hyper-rustls": (HYPER, lambda p, _: [HYPER, str(p), cert, key], "https",
                             {"PEER_ALPN": "h2,http/1.1"}, None),
            "go-nethttp": (GO, lambda p, _: [GO, str(p), cert, key], "https",
                           {"GOMAXPROCS": "1"}, None),
            "nginx": (NGINX, lambda p, prefix: nginx_h2(p, prefix, cert, key), "https", {}, None),
        },
    }


def wait_up(scheme, port, timeout=10.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        r = subprocess.run(["h2load", "-n", "1", f"{scheme}://127.0.0.1:{port}/plaintext"],
                           capture_output=True, text=True)
        if "1 succeeded" in r.stdout:
            return True
        time.sleep(0.1)
    return False


def start(name, spec, port):
    binary, argv, scheme = spec[0], spec[1], spec[2]
    env = spec[3]
    prefix = os.path.join(BENCH, "build", "h2-run", f"{name}-{port}")
    os.makedirs(prefix, exist_ok=True)
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv(port, prefix),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env}, start_new_session=True)
    if not wait_up(scheme, port):
        tls.stop(proc)
        raise RuntimeError(f"{name} did not answer HTTP/2 on port {port}")
    return proc


def h2load(url, clients, streams, n, h1=False):
    argv = ["taskset", "-c", "1", "h2load", "-n", str(n), "-c", str(clients), "-m", str(streams),
            url]
    if h1:
        argv.insert(4, "--h1")
    t0 = time.time()
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    wall = time.time() - t0
    m = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s, ([\d.]+)([KMG]?B)/s", out)
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if not m or not done:
        raise RuntimeError(f"h2load output not understood:\n{out}")
    unit = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(5)]
    return dict(rps=float(m.group(3)), bytes_per_s=float(m.group(4)) * unit,
                succeeded=int(done.group(2)), wall=wall)


def canter_load(url, clients, streams, n, h1=False):
    argv = ["taskset", "-c", "1", CANTER, "load", "-n", str(n), "-c", str(clients),
            "--json", "--no-progress", "-k", "--timeout", "20s", url]
    if not h1:
        argv[5:5] = ["-m", str(streams)]
    t0 = time.time()
    out = subprocess.run(argv, capture_output=True, text=True)
    wall = time.time() - t0
    try:
        r = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"canter load output not understood:\n{out.stdout}{out.stderr}")
    secs = max(r["duration_s"], 1e-9)
    return dict(rps=r["rps"], bytes_per_s=r["bytes_read"] / secs,
                succeeded=r["status"].get("200", 0), wall=wall,
                p50_us=r["latency_us"]["p50"], p99_us=r["latency_us"]["p99"])


CLIENTS = {"canter": canter_load, "h2load": h2load}
CLIENT = canter_load

SCENARIOS = {
    "c1-m100": dict(clients=1, streams=100),
    "c16-m100": dict(clients=16, streams=100),
}


def measure(proc, url, sc, n, h1=False):
    CLIENT(url, sc["clients"], sc["streams"], max(n // 10, 1000), h1)
    c0 = run.cpu_seconds(proc.pid)
    r = CLIENT(url, sc["clients"], sc["streams"], n, h1)
    c1 = run.cpu_seconds(proc.pid)
    r["cpu_us_per_req"] = (c1 - c0) / max(r["succeeded"], 1) * 1e6
    return r


def idle_memory(name, spec, port, n):
    # One request per connection: preface, empty SETTINGS, HEADERS for GET /plaintext
    # (:method GET, :scheme http, :path without indexing, :authority x), then stay open.
    block = bytes([0x82, 0x86, 0x04, 0x0a]) + b"/plaintext" + bytes([0x01, 0x01]) + b"x"
    req = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
           + len(block).to_bytes(3, "big") + bytes([1, 5, 0, 0, 0, 1]) + block)
    return tls.idle_memory(lambda: start(name, spec, port), port, n, "http", req)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--only", choices=["h2c", "tls"])
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--base-port", type=int, default=23000)
    ap.add_argument("--client", choices=sorted(CLIENTS), default="canter")
    args = ap.parse_args()
    global CLIENT
    CLIENT = CLIENTS[args.client]
    run.raise_nofile()
    cert, key = tls.make_cert("ecdsa")
    all_servers = servers(cert, key)
    results = {"rounds": args.rounds, "requests": args.requests, "client": args.client,
               "runs": []}
    port = args.base_port
    for kind, group in all_servers.items():
        if args.only and kind != args.only:
            continue
        names = [n for n, spec in group.items() if os.path.exists(spec[0])]
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                spec = group[name]
                port += 1
                proc = start(name, spec, port)
                try:
                    for sc_name, sc in SCENARIOS.items():
                        url = f"{spec[2]}://127.0.0.1:{port}/plaintext"
                        r = measure(proc, url, sc, args.requests)
                        results["runs"].append(dict(kind=kind, server=name, scenario=sc_name,
                                                    round=rnd, **r))
                        print(f"{kind} {sc_name} {name}: {r['rps']:.0f} req/s, "
                              f"{r['cpu_us_per_req']:.2f} µs/req", file=sys.stderr)
                    if spec[4] is not None:
                        sc = dict(clients=4, streams=10)
                        url = f"{spec[2]}://127.0.0.1:{port}{spec[4]}"
                        r = measure(proc, url, sc, 4000)
                        results["runs"].append(dict(kind=kind, server=name, scenario="large-c4-m10",
                                                    round=rnd, **r))
                        r = measure(proc, url, dict(clients=40, streams=1), 4000, h1=True)
                        results["runs"].append(dict(kind=kind, server=name + " (HTTP/1.1, 40 conns)",
                                                    scenario="large-c4-m10", round=rnd, **r))
                finally:
                    tls.stop(proc)
    if args.idle and args.only != "tls":
        for name, spec in all_servers["h2c"].items():
            if not os.path.exists(spec[0]):
                continue
            port += 1
            kib = idle_memory(name, spec, port, args.idle)
            results["runs"].append(dict(kind="h2c", server=name, scenario="idle-memory",
                                        round=0, kib_per_conn=kib))
            print(f"idle {name}: {kib:.1f} KiB/conn", file=sys.stderr)
    os.makedirs(run.RESULTS, exist_ok=True)
    path = os.path.join(run.RESULTS, time.strftime("h2-%Y%m%d-%H%M%S.json"))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(markdown(results))
    print(f"\n(results: {os.path.relpath(path, run.ROOT)}; plots: {', '.join(plots(results))})")


COLORS = {"canter": "#d62728", "hyper": "#1f77b4", "hyper-rustls": "#1f77b4",
          "go-nethttp": "#2ca02c", "h2o": "#9467bd", "nginx": "#8c564b"}


def plots(results):
    """bench/plots/h2-cpu-per-request.svg and h2-throughput.svg: medians per scenario."""
    cells = {}
    for r in results["runs"]:
        if r["scenario"] in SCENARIOS:
            cells.setdefault((r["kind"], r["scenario"]), {}).setdefault(r["server"], []).append(r)
    med = statistics.median
    cpu, rps = [], []
    for (kind, sc), by_server in sorted(cells.items()):
        title = f"{kind} {sc}"
        cpu.append((title, sorted(((n, med(r["cpu_us_per_req"] for r in rs), COLORS.get(n, "#888"))
                                   for n, rs in by_server.items()), key=lambda t: t[1])))
        rps.append((title, sorted(((n, med(r["rps"] for r in rs), COLORS.get(n, "#888"))
                                   for n, rs in by_server.items()), key=lambda t: -t[1])))
    written = []
    os.makedirs(run.PLOTS, exist_ok=True)
    for name, svg in (
            ("h2-cpu-per-request.svg", run.svg_bar_panels(
                "HTTP/2: server CPU time per request (median, us)", cpu, " us",
                lower_is_better=True) if cpu else None),
            ("h2-throughput.svg", run.svg_bar_panels(
                "HTTP/2: requests per second (median)", rps, "") if rps else None)):
        if svg:
            with open(os.path.join(run.PLOTS, name), "w") as f:
                f.write(svg)
            written.append(os.path.join("bench", "plots", name))
    return written


def markdown(results):
    out = []
    cells = {}
    for r in results["runs"]:
        cells.setdefault((r["kind"], r["scenario"], r["server"]), []).append(r)
    for kind in ("h2c", "tls"):
        for sc in list(SCENARIOS) + ["large-c4-m10", "idle-memory"]:
            rows = [(s, rs) for (k, c, s), rs in cells.items() if k == kind and c == sc]
            if not rows:
                continue
            out.append(f"\n**{kind} {sc}**\n")
            if sc == "idle-memory":
                out.append("| server | KiB per idle connection |\n|---|---:|")
                for s, rs in rows:
                    out.append(f"| {s} | {rs[0]['kib_per_conn']:.1f} |")
                continue
            out.append("| server | req/s | MB/s | CPU µs/req |\n|---|---:|---:|---:|")
            for s, rs in sorted(rows, key=lambda x: statistics.median(r["cpu_us_per_req"] for r in x[1])):
                rps = statistics.median(r["rps"] for r in rs)
                mbs = statistics.median(r["bytes_per_s"] for r in rs) / 1e6
                cpu = statistics.median(r["cpu_us_per_req"] for r in rs)
                out.append(f"| {s} | {rps:,.0f} | {mbs:,.1f} | {cpu:.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("http2", " ".join(["python3", "bench/h2.py"] + sys.argv[1:])):
        main()
