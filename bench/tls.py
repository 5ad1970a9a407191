#!/usr/bin/env python3
"""HTTPS side by side: canter (rustls, ring) against nginx (OpenSSL), Go net/http (crypto/tls),
hyper with tokio-rustls, and canter without TLS as the reference.

    bench/build.sh && python3 bench/tls.py [--rounds 5] [--duration 5s] [--key ecdsa|rsa]

Each server runs pinned to CPU 0 with one worker; `canter load` runs on CPU 1. Every round
starts each server in turn (the order rotating from round to round), warms it for 1 s and
measures for --duration; the tables give medians over the rounds. Scenarios:

  plaintext-50        keep-alive, 50 connections, GET /plaintext
  pipeline-16x256     16 pipelined requests per write, 256 connections
  conns-1000          1,000 keep-alive connections
  handshake-full      a new connection per request (`Connection: close`), no resumption:
                      full handshakes/s, 50 clients
  handshake-resumed   the same with session resumption (TLS 1.3 tickets), 4 clients (a rustls
                      client keeps only a few tickets per server: at 50 clients about 5%
                      of the handshakes were full)
  idle-memory         RSS growth per idle TLS keep-alive connection (2,000 connections, each
                      after one request), once per server

CPU per request is the server's utime+stime (whole process tree: nginx's master and worker)
divided by the responses. The certificate is the same for every server: ECDSA P-256 by default,
RSA 2048 with --key rsa, made with openssl into bench/build/tls/. Results go to
bench/results/tls-<time>.json and a Markdown table on standard output.
Python 3 standard library only.
"""
import argparse
import asyncio
import json
import os
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the suite's helpers: process-tree CPU and RSS, quiet wait)

ROOT = run.ROOT
BENCH = run.BENCH
CANTER = run.CANTER_BIN
TLS_DIR = os.path.join(BENCH, "build", "tls")


def make_cert(kind):
    os.makedirs(TLS_DIR, exist_ok=True)
    cert, key = os.path.join(TLS_DIR, f"{kind}.pem"), os.path.join(TLS_DIR, f"{kind}.key")
    if not os.path.exists(cert):
        algo = (["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if kind == "ecdsa"
                else ["-newkey", "rsa:2048"])
        subprocess.run(["openssl", "req", "-x509", "-nodes", "-days", "30", *algo, "-keyout", key,
                        "-out", cert, "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True)
        # PKCS#8 for every server (Go and rustls read both; keep one file for all).
        subprocess.run(["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", key, "-out", key + ".p8"],
                       check=True)
        os.replace(key + ".p8", key)
    return cert, key


def nginx_prepare(port, prefix, cert, key):
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open(os.path.join(BENCH, "peers", "nginx", "nginx-tls.conf.in")) as f:
        conf = f.read()
    conf = (conf.replace("@PORT@", str(port)).replace("@PREFIX@", prefix)
            .replace("@NOFILE@", str(nofile)).replace("@CERT@", cert).replace("@KEY@", key))
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    return ["nginx", "-p", prefix, "-c", os.path.join(prefix, "nginx.conf")]


def servers(cert, key):
    """name -> (binary that must exist, argv(port, prefix), scheme, env)."""
    return {
        "canter": (CANTER, lambda p, _: [CANTER, "serve", "--addr", "127.0.0.1:0", "--workers", "1",
                                         "--tls-addr", f"127.0.0.1:{p}", "--tls-cert", cert,
                                         "--tls-key", key], "https", {}),
        "nginx": (shutil.which("nginx") or run._which("nginx") or "/usr/sbin/nginx",
                  lambda p, prefix: nginx_prepare(p, prefix, cert, key), "https", {}),
        "go-nethttp": (os.path.join(BENCH, "build", "go-nethttp"),
                       lambda p, _: [os.path.join(BENCH, "build", "go-nethttp"), str(p), cert, key],
                       "https", {"GOMAXPROCS": "1"}),
        "hyper-rustls": (os.path.join(BENCH, "target", "release", "peer-hyper"),
                         lambda p, _: [os.path.join(BENCH, "target", "release", "peer-hyper"), str(p),
                                       cert, key], "https", {}),
        "canter-plain": (CANTER, lambda p, _: [CANTER, "serve", "--addr", f"127.0.0.1:{p}",
                                               "--workers", "1"], "http", {}),
    }


SCENARIOS = {
    "plaintext-50": dict(conns=50, pipeline=1),
    "pipeline-16x256": dict(conns=256, pipeline=16),
    "conns-1000": dict(conns=1000, pipeline=1),
    "handshake-full": dict(conns=50, pipeline=1, close=True, no_resume=True),
    # Few clients: a rustls client keeps a handful of single-use TLS 1.3 tickets per server, so
    # with 50 at once about 5% of the handshakes were full ones.
    "handshake-resumed": dict(conns=4, pipeline=1, close=True),
}


def load(scheme, port, sc, duration):
    argv = ["taskset", "-c", "1", CANTER, "load", f"{scheme}://127.0.0.1:{port}/plaintext",
            "-c", str(sc["conns"]), "-t", "1", "-d", duration, "--pipeline", str(sc["pipeline"]),
            "--json", "--no-progress"]
    if scheme == "https":
        argv.append("-k")
    if sc.get("close"):
        argv += ["-H", "Connection: close"]
    if sc.get("no_resume"):
        argv.append("--tls-no-resume")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def wait_up(scheme, port, timeout=10.0):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            import socket
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            if scheme == "https":
                s = ctx.wrap_socket(s, server_hostname="localhost")
            s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
            if s.recv(100).startswith(b"HTTP/1.1 200"):
                s.close()
                return True
        except OSError:
            time.sleep(0.05)
    return False


def start(name, spec, port):
    binary, argv, scheme, env = spec
    prefix = os.path.join(BENCH, "build", "tls-run", f"{name}-{port}")
    os.makedirs(prefix, exist_ok=True)
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv(port, prefix),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env}, start_new_session=True)
    if not wait_up(scheme, port):
        stop(proc)
        raise RuntimeError(f"{name} did not answer on port {port}")
    return proc


def stop(proc):
    try:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


GET_PLAINTEXT = b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n"


async def hold_idle(port, n, scheme, request=GET_PLAINTEXT):
    """Opens `n` connections (100 at a time), sends `request` on each and waits for its
    `Hello, World!`; returns the writers, connections still open."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sem = asyncio.Semaphore(100)

    async def one():
        async with sem:
            r, w = await asyncio.open_connection("127.0.0.1", port,
                                                 ssl=ctx if scheme == "https" else None)
            w.write(request)
            await w.drain()
            await r.readuntil(b"Hello, World!")
            return w

    return await asyncio.gather(*[one() for _ in range(n)])


def idle_memory(start_server, port, n, scheme, request=GET_PLAINTEXT):
    """RSS growth per idle connection, in KiB: `start_server()` starts the server on `port`,
    then `n` connections each make one request and stay open."""
    proc = start_server()
    try:
        time.sleep(0.5)
        before = run.rss_kib(proc.pid)
        loop = asyncio.new_event_loop()
        writers = loop.run_until_complete(hold_idle(port, n, scheme, request))
        time.sleep(1.0)
        after = run.rss_kib(proc.pid)
        for w in writers:
            w.close()
        loop.close()
    finally:
        stop(proc)
    return (after - before) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="canter,nginx,go-nethttp,hyper-rustls,canter-plain")
    ap.add_argument("--scenarios", default=",".join(list(SCENARIOS) + ["idle-memory"]))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--key", choices=["ecdsa", "rsa"], default="ecdsa")
    ap.add_argument("--idle-conns", type=int, default=2000)
    ap.add_argument("--quiet-wait", type=float, default=5.0)
    ap.add_argument("--plot", nargs="+", metavar="JSON",
                    help="measure nothing: draw bench/plots/tls-*.svg from these results files "
                         "(a later file's cells replace an earlier one's)")
    ap.add_argument("--port-base", type=int, default=22400,
                    help="first port; stay below the ephemeral range (32768 on Linux)")
    args = ap.parse_args()
    if args.plot:
        merged = [json.load(open(p)) for p in args.plot]
        for name in write_plots(merged):
            print(f"wrote bench/plots/{name}")
        return
    run.raise_nofile()
    os.sched_setaffinity(0, {1})
    cert, key = make_cert(args.key)
    defs = servers(cert, key)
    names = [n for n in args.servers.split(",") if n]
    missing = [n for n in names if not os.path.exists(defs[n][0])]
    for n in missing:
        print(f"skipping {n}: {defs[n][0]} not built (bench/build.sh)", file=sys.stderr)
    names = [n for n in names if n not in missing]
    scenarios = [s for s in args.scenarios.split(",") if s]
    results = {"key": args.key, "rounds": args.rounds, "duration": args.duration, "cells": {}}
    port = args.port_base
    for scn in scenarios:
        if scn == "idle-memory":
            for name in names:
                port += 1
                kib = idle_memory(lambda: start(name, defs[name], port), port, args.idle_conns,
                                  defs[name][2])
                results["cells"].setdefault(scn, {})[name] = [{"kib_per_conn": kib}]
                print(f"{scn:18} {name:13} {kib:8.2f} KiB per idle connection", flush=True)
            continue
        sc = SCENARIOS[scn]
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                if sc.get("close") and defs[name][2] != "https":
                    continue  # handshakes: TLS servers only
                port += 1
                run.wait_quiet(args.quiet_wait)
                proc = start(name, defs[name], port)
                try:
                    load(defs[name][2], port, sc, "1s")
                    c0 = run.cpu_seconds(proc.pid)
                    out = load(defs[name][2], port, sc, args.duration)
                    c1 = run.cpu_seconds(proc.pid)
                finally:
                    stop(proc)
                n = out["requests"]
                errors = sum(v for k, v in out["errors"].items() if isinstance(v, int))
                cell = {"rps": out["rps"], "cpu_us": (c1 - c0) / max(n, 1) * 1e6,
                        "requests": n, "errors": errors}
                results["cells"].setdefault(scn, {}).setdefault(name, []).append(cell)
                print(f"{scn:18} round {r + 1} {name:13} {cell['rps']:>11,.0f} req/s "
                      f"{cell['cpu_us']:8.2f} us CPU/req  errors {errors}", flush=True)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    path = os.path.join(BENCH, "results", time.strftime("tls-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {os.path.relpath(path, ROOT)}\n")
    for name in write_plots([results]):
        print(f"wrote bench/plots/{name}")
    print(markdown(results, names))


COLORS = {"canter": "#d62728", "canter-plain": "#ff9896", "nginx": "#2ca02c",
          "go-nethttp": "#1f77b4", "hyper-rustls": "#9467bd"}


def write_plots(results_list):
    """Draws CPU per request, requests/s and idle memory from one or more results files (a
    later file's cells replace an earlier one's); returns the file names written."""
    cells = {}
    for res in results_list:
        for scn, by_server in res["cells"].items():
            cells[(scn, res["key"])] = by_server
    med = statistics.median
    cpu, rps, mem = [], [], []
    order = list(SCENARIOS) + ["idle-memory"]
    for (scn, key) in sorted(cells, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1])):
        by_server = cells[(scn, key)]
        title = f"{scn} ({key})"
        if scn == "idle-memory":
            mem.append((title, [(n, rows[0]["kib_per_conn"], COLORS.get(n, "#888"))
                                for n, rows in sorted(by_server.items(), key=lambda kv: kv[1][0]["kib_per_conn"])]))
            continue
        cpu.append((title, sorted(((n, med(r["cpu_us"] for r in rows), COLORS.get(n, "#888"))
                                   for n, rows in by_server.items()), key=lambda t: t[1])))
        rps.append((title, sorted(((n, med(r["rps"] for r in rows), COLORS.get(n, "#888"))
                                   for n, rows in by_server.items()), key=lambda t: -t[1])))
    out = []
    os.makedirs(run.PLOTS, exist_ok=True)
    for name, svg in (
            ("tls-cpu-per-request.svg", run.svg_bar_panels(
                "HTTPS: server CPU time per request or handshake (median, us)", cpu, " us",
                lower_is_better=True) if cpu else None),
            ("tls-throughput.svg", run.svg_bar_panels(
                "HTTPS: requests or handshakes per second (median)", rps, "") if rps else None),
            ("tls-idle-memory.svg", run.svg_bar_panels(
                "HTTPS: server RSS per idle TLS keep-alive connection (KiB)", mem, " KiB",
                lower_is_better=True) if mem else None)):
        if svg:
            with open(os.path.join(run.PLOTS, name), "w") as f:
                f.write(svg)
            out.append(name)
    return out


def markdown(results, names):
    med = statistics.median
    lines = []
    for scn, cells in results["cells"].items():
        if scn == "idle-memory":
            lines.append(f"\n**{scn}** ({results['key']}): RSS growth per idle TLS keep-alive connection\n")
            lines.append("| server | KiB per connection |\n|---|---|")
            for n in names:
                if n in cells:
                    lines.append(f"| {n} | {cells[n][0]['kib_per_conn']:.2f} |")
            continue
        lines.append(f"\n**{scn}** ({results['key']}, median of {results['rounds']} rounds)\n")
        lines.append("| server | req/s | CPU µs/req | vs canter CPU | rounds (req/s) |\n|---|---|---|---|---|")
        base = cells.get("canter")
        base_cpu = med(c["cpu_us"] for c in base) if base else None
        for n in names:
            if n not in cells:
                continue
            rows = cells[n]
            cpu = med(c["cpu_us"] for c in rows)
            ratio = f"{cpu / base_cpu:.2f}×" if base_cpu else "—"
            spread = ", ".join(f"{c['rps']:,.0f}" for c in rows)
            lines.append(f"| {n} | {med(c['rps'] for c in rows):,.0f} | {cpu:.2f} | {ratio} | {spread} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("tls", " ".join(["python3", "bench/tls.py"] + sys.argv[1:])):
        main()
