#!/usr/bin/env python3
"""The TechEmpower database tests side by side: canter (`serve --app techempower`) against
actix-web with tokio-postgres (bench/peers/rust/actix-pg), xitca-web with xitca-postgres
(bench/peers/rust/xitca-pg, the stack of TFB's xitca-web entries) and may-minihttp with
may_postgres (bench/peers/may-pg, the stack of TFB's may-minihttp entry), on one PostgreSQL.

    bench/build.sh && python3 bench/techempower.py [--rounds 5] [--duration 5s] [--db-conns 2]

A throwaway PostgreSQL (Debian's package; initdb under bench/build/techempower, fsync off,
pinned to CPU 1) is filled by `canter db-setup`. Each server runs pinned to CPU 0 with one
worker and --db-conns connections; canter with event coalescing at COALESCE_US (`serve
--coalesce`; `--servers canter-nocoalesce` runs it without). `canter load` runs on CPU 1 beside
PostgreSQL. Every round
starts each server in turn (the order rotating), warms it for 1 s and measures for --duration;
the tables give medians over the rounds. Scenarios, 256 connections each: /db,
/queries?queries=20, /fortunes, /updates?queries=20; as many requests as the servers answer, or
with --fixed-rate the same offered rate for every server (RATES, about half the peak here).

Per request: the server's CPU (utime+stime), PostgreSQL's CPU (every backend), the load
generator's CPU, and how busy CPU 1 was (PostgreSQL and the load generator share it: near 100%
means the database side is the bottleneck, not the server, and requests/s follows PostgreSQL's
and the load generator's CPU per request, both of which move with how the server batches).
Results go to bench/results/techempower-<time>.json, Markdown on standard output and
bench/plots/techempower-*.svg. Python 3 standard library only.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the suite's helpers: process-tree CPU, load runs)
import tls  # noqa: E402  (stop)

BENCH = run.BENCH
CANTER = run.CANTER_BIN
ACTIX_PG = os.path.join(BENCH, "target", "release", "peer-actix-pg")
XITCA_PG = os.path.join(BENCH, "target", "release", "peer-xitca-pg")
MAY_PG = os.path.join(BENCH, "target", "release", "peer-may-pg")
PG_DIR = os.path.join(BENCH, "build", "techempower")
PG_PORT = 25432

# With --fixed-rate: requests/s offered in each scenario, about half of what the database side
# sustains here, so that every server sees the same load and its CPU per request is compared at
# equal batching (at peak, CPU per request moves with how the database's core is shared).
RATES = {"db": 28000, "queries-20": 1800, "fortunes": 28000, "updates-20": 1200}

SCENARIOS = {
    "db": "/db",
    "queries-20": "/queries?queries=20",
    "fortunes": "/fortunes",
    "updates-20": "/updates?queries=20",
}


def pg_bin():
    versions = sorted((int(v), v) for v in os.listdir("/usr/lib/postgresql") if v.isdigit())
    return os.path.join("/usr/lib/postgresql", versions[-1][1], "bin")


def as_postgres(argv):
    return (["runuser", "-u", "postgres", "--"] + argv) if os.geteuid() == 0 else argv


def pg_start():
    """A fresh cluster on PG_PORT, pinned to CPU 1; returns the postmaster's pid."""
    binary = pg_bin()
    pg_stop()
    shutil.rmtree(PG_DIR, ignore_errors=True)
    os.makedirs(PG_DIR)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "postgres:postgres", PG_DIR], check=True)
    data = os.path.join(PG_DIR, "data")
    subprocess.run(as_postgres([os.path.join(binary, "initdb"), "-D", data, "-U", "canter",
                                "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]),
                   check=True, stdout=subprocess.DEVNULL)
    opts = (f"-p {PG_PORT} -k {PG_DIR} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c max_connections=300 -c shared_buffers=256MB")
    subprocess.run(["taskset", "-c", "1"] + as_postgres(
        [os.path.join(binary, "pg_ctl"), "-D", data, "-o", opts, "-l",
         os.path.join(PG_DIR, "log"), "-w", "start"]), check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(data, "postmaster.pid")) as f:
        return int(f.readline())


def pg_stop():
    data = os.path.join(PG_DIR, "data")
    if os.path.exists(os.path.join(data, "postmaster.pid")):
        subprocess.run(as_postgres([os.path.join(pg_bin(), "pg_ctl"), "-D", data, "-m", "fast",
                                    "-w", "stop"]), stdout=subprocess.DEVNULL)


# canter's event coalescing delay in these runs (`serve --coalesce`).
COALESCE_US = 20


def db_url():
    return f"postgres://canter@127.0.0.1:{PG_PORT}/postgres"


def servers(db_conns):
    url = db_url()
    canter = lambda port: [CANTER, "serve", "--addr", f"127.0.0.1:{port}", "--workers", "1",
                           "--app", "techempower", "--db", url,
                           "--db-connections", str(db_conns)]
    return {
        # With event coalescing (`--coalesce`, microseconds): see BENCHMARKS.md.
        "canter": lambda port: canter(port) + ["--coalesce", str(COALESCE_US)],
        # The same without it, to measure what it changes (not in the default list).
        "canter-nocoalesce": canter,
        "actix-pg": lambda port: [ACTIX_PG, str(port), url, str(db_conns)],
        "xitca-pg": lambda port: [XITCA_PG, str(port), url, str(db_conns)],
        "may-pg": lambda port: [MAY_PG, str(port), url, str(db_conns)],
    }


def wait_ok(port, timeout=15.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/db", timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.1)
    return False


def start(argv, port):
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv(port), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    if not wait_ok(port):
        tls.stop(proc)
        raise RuntimeError(f"{argv(port)[0]} did not answer /db on port {port}")
    return proc


def cpu1_busy():
    return run.cpu_busy_ticks()[1]


def measure(proc, pg_pid, path, port, conns, duration, rate=None):
    url = f"http://127.0.0.1:{port}{path}"
    run.run_load("canter", url, conns, 1.0, rate=rate)  # warm-up
    s0, p0, c0 = run.cpu_seconds(proc.pid), run.cpu_seconds(pg_pid), cpu1_busy()
    r = run.run_load("canter", url, conns, duration, rate=rate)
    s1, p1, c1 = run.cpu_seconds(proc.pid), run.cpu_seconds(pg_pid), cpu1_busy()
    n = max(1, r["requests"])
    return {
        "rps": r["rps"],
        "requests": r["requests"],
        "non2xx": r["non2xx"],
        "errors": sum(r["errors"].values()),
        "server_us": (s1 - s0) * 1e6 / n,
        "pg_us": (p1 - p0) * 1e6 / n,
        "loadgen_us": r["loadgen_cpu_s"] * 1e6 / n,
        "cpu1_busy": (c1[0] - c0[0]) / max(1, c1[1] - c0[1]),
        "p99_us": r["latency_us"].get("p99"),
    }


COLORS = {"canter": "#d9480f", "canter-nocoalesce": "#f59f00", "actix-pg": "#1c7ed6", "xitca-pg": "#5c940d",
          "may-pg": "#7048e8"}


def plots(results):
    """bench/plots/techempower-cpu-per-request.svg and techempower-throughput.svg (medians)."""
    med = statistics.median
    cpu, rps, pg = [], [], []
    for sc, by_server in results.items():
        def panel(key):
            return [(n, med(m[key] for m in rs), COLORS.get(n, "#888"))
                    for n, rs in by_server.items() if rs]
        cpu.append((sc, sorted(panel("server_us"), key=lambda t: t[1])))
        pg.append((sc, sorted(panel("pg_us"), key=lambda t: t[1])))
        rps.append((sc, sorted(panel("rps"), key=lambda t: -t[1])))
    os.makedirs(run.PLOTS, exist_ok=True)
    for name, svg in (
            ("techempower-cpu-per-request.svg", run.svg_bar_panels(
                "TechEmpower database tests: server CPU per request (median, us)", cpu, " us",
                lower_is_better=True)),
            ("techempower-pg-cpu-per-request.svg", run.svg_bar_panels(
                "TechEmpower database tests: PostgreSQL CPU per request (median, us)", pg,
                " us", lower_is_better=True)),
            ("techempower-throughput.svg", run.svg_bar_panels(
                "TechEmpower database tests: requests per second (median; database-bound)",
                rps, ""))):
        with open(os.path.join(run.PLOTS, name), "w") as f:
            f.write(svg)


def table(results):
    print("| scenario | server | req/s | server CPU µs/req | PostgreSQL CPU µs/req "
          "| load generator CPU µs/req | CPU 1 busy | p99 ms | non-2xx + errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for sc, by_server in results.items():
        for name, rs in by_server.items():
            med = lambda k: statistics.median(m[k] for m in rs)  # noqa: E731
            p99 = [m["p99_us"] for m in rs if m["p99_us"]]
            bad = sum(m["non2xx"] + m["errors"] for m in rs)
            # Results written before the load generator's CPU was recorded have no figure.
            lg = [m["loadgen_us"] for m in rs if "loadgen_us" in m]
            lg = f"{statistics.median(lg):.1f}" if lg else "–"
            print(f"| {sc} | {name} | {med('rps'):,.0f} | {med('server_us'):.1f} | "
                  f"{med('pg_us'):.1f} | {lg} | {med('cpu1_busy') * 100:.0f}% | "
                  f"{(statistics.median(p99) / 1000 if p99 else 0):.1f} | {bad} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conns", type=int, default=256)
    ap.add_argument("--db-conns", type=int, default=2)
    ap.add_argument("--servers", default="canter,actix-pg,xitca-pg,may-pg")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--fixed-rate", action="store_true",
                    help="offer each scenario's RATES requests/s instead of as many as possible")
    ap.add_argument("--from-json", metavar="PATH",
                    help="measure nothing: print the table and redraw the plots from a results file")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)["results"]
        table(results)
        plots(results)
        return
    run.raise_nofile()
    names = args.servers.split(",")
    scenarios = args.scenarios.split(",")
    defs = servers(args.db_conns)
    pg_pid = pg_start()
    try:
        subprocess.run(["taskset", "-c", "1", CANTER, "db-setup", "--db", db_url()], check=True,
                       stderr=subprocess.DEVNULL)
        results = {s: {n: [] for n in names} for s in scenarios}
        port = 28080
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                port += 1
                proc = start(defs[name], port)
                try:
                    for sc in scenarios:
                        rate = RATES[sc] if args.fixed_rate else None
                        m = measure(proc, pg_pid, SCENARIOS[sc], port, args.conns, args.duration,
                                    rate)
                        results[sc][name].append(m)
                        print(f"round {rnd + 1} {name:9} {sc:11} {m['rps']:9.0f} req/s "
                              f"server {m['server_us']:7.1f} us/req  pg {m['pg_us']:7.1f} us/req "
                              f"load {m['loadgen_us']:5.1f} us/req  "
                              f"cpu1 {m['cpu1_busy'] * 100:5.1f}%  non2xx {m['non2xx']} "
                              f"errors {m['errors']}", file=sys.stderr, flush=True)
                finally:
                    tls.stop(proc)
    finally:
        pg_stop()
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    out = os.path.join(BENCH, "results", time.strftime("techempower-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    table(results)
    plots(results)
    print(f"\nresults: {os.path.relpath(out, run.ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("techempower", " ".join(["python3", "bench/techempower.py"] + sys.argv[1:])):
        main()
