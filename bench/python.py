#!/usr/bin/env python3
"""The Python front end side by side: canter's native API and its ASGI server against granian
(RSGI and ASGI), Robyn, socketify and uvicorn (httptools + uvloop), and the same routes in Rust
(`canter serve`), to measure what Python adds.

    python3 bench/python.py [--rounds 3] [--duration 4] [--only native,asgi]

Every server runs one worker process pinned to CPU 0; `canter load` runs on CPU 1. Handlers:
plaintext ("Hello, World!") and a JSON dict ({"message": "Hello, World!"}); the ASGI servers all
run the same Starlette app (bench/python_apps/). Rounds are interleaved (each round starts every
server in turn); each cell warms up for 1 s, then measures requests/s and the server's CPU time
(utime+stime of its process tree) per request; tables give medians over rounds.

The peers and canter are installed into bench/build/python-venv on first use (pip).

Japronto (`--only japronto`) needs what a fresh machine does not have: PyPI holds only CPython
3.5-3.7 wheels of it and no source distribution (its last release, 0.1.2, is from 2018), and its
C extension does not compile on 3.11 or later. Give it a checkout of
github.com/squeaky-pl/japronto (`JAPRONTO_SRC`, measured at e73b76e) and a CPython 3.8-3.10
(`JAPRONTO_PYTHON`): both Japronto and canter's package are then installed into
bench/build/japronto-venv, and canter's native API is measured beside it on that same Python.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the suite's helpers: process-tree CPU, load runs, quiet wait)

BENCH = run.BENCH
VENV = os.path.join(BENCH, "build", "python-venv")
PY = os.path.join(VENV, "bin", "python")
APPS = os.path.join(BENCH, "python_apps")
PEERS = ["granian==2.8.7", "robyn==0.88.0", "socketify==0.0.31", "uvicorn[standard]==0.54.0",
         "starlette==1.10.0"]


def setup():
    if not os.path.exists(PY):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEERS],
                   check=True)
    subprocess.run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    os.path.join(run.ROOT, "python")], check=True)
    if not os.path.exists(run.CANTER_BIN):
        subprocess.run(["cargo", "build", "--release", "-p", "canter-cli"], cwd=run.ROOT, check=True)


JP_VENV = os.path.join(BENCH, "build", "japronto-venv")
JP_PY = os.path.join(JP_VENV, "bin", "python")


def setup_japronto():
    src, python = os.environ.get("JAPRONTO_SRC"), os.environ.get("JAPRONTO_PYTHON")
    if not src or not python:
        sys.exit("--only japronto needs JAPRONTO_SRC (a checkout of squeaky-pl/japronto) and "
                 "JAPRONTO_PYTHON (a CPython 3.8-3.10); see the module doc")
    if not os.path.exists(JP_PY):
        subprocess.run([python, "-m", "venv", JP_VENV], check=True)
    pip = [JP_PY, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["uvloop==0.16.0", "setuptools", "wheel"], check=True)
    subprocess.run(pip + ["--no-build-isolation", src], check=True)
    subprocess.run(pip + [os.path.join(run.ROOT, "python")], check=True)
    if not os.path.exists(run.CANTER_BIN):
        subprocess.run(["cargo", "build", "--release", "-p", "canter-cli"], cwd=run.ROOT, check=True)


def granian(interface, app):
    return [os.path.join(VENV, "bin", "granian"), "--interface", interface, "--host",
            "127.0.0.1", "--port", "{port}", "--workers", "1", "--runtime-threads", "1",
            "--runtime-mode", "st", "--loop", "uvloop", "--log-level", "warning", app]


# name -> (argv with {port}, extra environment)
SERVERS = {
    "canter-native": ([PY, "canter_native.py", "{port}"], {}),
    "canter-rust": ([run.CANTER_BIN, "serve", "--addr", "127.0.0.1:{port}", "--workers", "1"], {}),
    "granian-rsgi": (granian("rsgi", "rsgi_app:app"), {}),
    "robyn": ([PY, "robyn_app.py", "--processes", "1", "--workers", "1"], {"PORT": "{port}"}),
    "socketify": ([PY, "socketify_app.py", "{port}"], {}),
    "canter-asgi": ([PY, "-m", "canter", "serve", "starlette_app:app", "--port", "{port}"], {}),
    "canter-native-jp-python": ([JP_PY, "canter_native.py", "{port}"], {}),
    "japronto": ([JP_PY, "japronto_app.py", "{port}"], {}),
    "granian-asgi": (granian("asgi", "starlette_app:app"), {}),
    "uvicorn": ([os.path.join(VENV, "bin", "uvicorn"), "--loop", "uvloop", "--http", "httptools",
                 "--port", "{port}", "--log-level", "warning", "--no-access-log",
                 "starlette_app:app"], {}),
}

# group -> (servers, scenarios: name -> (path, connections, pipeline))
GROUPS = {
    "native": (["canter-native", "canter-rust", "granian-rsgi", "robyn", "socketify"],
               {"plaintext-50": ("/plaintext", 50, 1), "json-50": ("/json", 50, 1),
                "pipeline-16x256": ("/plaintext", 256, 16)}),
    "asgi": (["canter-asgi", "granian-asgi", "uvicorn"],
             {"plaintext-50": ("/plaintext", 50, 1), "json-50": ("/json", 50, 1)}),
    # Both on JAPRONTO_PYTHON (see the module doc).
    "japronto": (["canter-native-jp-python", "japronto"],
                 {"plaintext-50": ("/plaintext", 50, 1), "json-50": ("/json", 50, 1),
                  "pipeline-16x256": ("/plaintext", 256, 16)}),
}


def start(name, port):
    argv, env = SERVERS[name]
    argv = [a.replace("{port}", str(port)) for a in argv]
    env = {**os.environ, **{k: v.replace("{port}", str(port)) for k, v in env.items()}}
    proc = subprocess.Popen(["taskset", "-c", run.SERVER_CPU] + argv, cwd=APPS, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if run.http_get(port, "/plaintext", timeout=1.0)[0] == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{name} did not start")


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def cell(name, scenario, port, duration):
    path, conns, pipeline = scenario
    proc = start(name, port)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        run.run_load("canter", url, conns, 1.0, pipeline)  # warm-up
        c0 = run.cpu_seconds(proc.pid)
        r = run.run_load("canter", url, conns, duration, pipeline)
        c1 = run.cpu_seconds(proc.pid)
        errors = sum(r["errors"].values()) + (r.get("non2xx") or 0)
        return {"rps": r["rps"], "cpu_us": (c1 - c0) / r["requests"] * 1e6, "errors": errors}
    finally:
        stop(proc)


COLORS = {"canter-native": "#d9480f", "canter-rust": "#f08c00", "canter-asgi": "#d9480f",
          "canter-native-jp-python": "#d9480f", "japronto": "#e64980",
          "granian-rsgi": "#1c7ed6", "granian-asgi": "#1c7ed6", "robyn": "#7048e8",
          "socketify": "#2b8a3e", "uvicorn": "#495057"}


def plots(results):
    """bench/plots/python-cpu-per-request.svg and python-throughput.svg; returns their paths."""
    med = statistics.median
    cpu, rps = [], []
    for key, by_server in results.items():
        cpu.append((key, sorted(((n, med(r["cpu_us"] for r in rs), COLORS.get(n, "#888"))
                                 for n, rs in by_server.items()), key=lambda t: t[1])))
        rps.append((key, sorted(((n, med(r["rps"] for r in rs), COLORS.get(n, "#888"))
                                 for n, rs in by_server.items()), key=lambda t: -t[1])))
    os.makedirs(run.PLOTS, exist_ok=True)
    written = []
    # A Japronto-only run has plots of its own, beside the main comparison's.
    stem = "python-japronto" if all(k.startswith("japronto/") for k in results) else "python"
    for name, svg in (
            (f"{stem}-cpu-per-request.svg", run.svg_bar_panels(
                "Python servers: server CPU time per request (median, us)", cpu, " us",
                lower_is_better=True)),
            (f"{stem}-throughput.svg", run.svg_bar_panels(
                "Python servers: requests per second (median)", rps, ""))):
        with open(os.path.join(run.PLOTS, name), "w") as f:
            f.write(svg)
        written.append(os.path.join("bench", "plots", name))
    return written


def report(results):
    for key, by_server in results.items():
        print(f"### {key}\n\n| server | req/s | server CPU µs/req | errors |\n|---|---:|---:|---:|")
        for name, runs in by_server.items():
            rps = statistics.median(r["rps"] for r in runs)
            cpu = statistics.median(r["cpu_us"] for r in runs)
            errs = sum(r["errors"] for r in runs)
            print(f"| {name} | {rps:,.0f} | {cpu:.2f} | {errs} |")
        print()
    for path in plots(results):
        print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--only", default="native,asgi")
    ap.add_argument("--servers", default="", help="comma-separated subset of the servers")
    ap.add_argument("--quiet-wait", type=float, default=5.0)
    ap.add_argument("--from-json", help="measure nothing: report and plot a results file")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            report(json.load(f))
        return
    groups = args.only.split(",")
    if set(groups) - {"japronto"}:
        setup()
    if "japronto" in groups:
        setup_japronto()
    run.raise_nofile()
    wanted = set(filter(None, args.servers.split(",")))
    results = {}
    port = 7440
    for group in groups:
        servers, scenarios = GROUPS[group]
        servers = [s for s in servers if not wanted or s in wanted]
        for sc_name, sc in scenarios.items():
            for rnd in range(args.rounds):
                order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
                for name in order:
                    run.wait_quiet(args.quiet_wait)
                    port += 1
                    r = cell(name, sc, port, args.duration)
                    results.setdefault(f"{group}/{sc_name}", {}).setdefault(name, []).append(r)
                    print(f"{group} {sc_name} round {rnd + 1} {name}: {r['rps']:,.0f} req/s, "
                          f"{r['cpu_us']:.2f} us CPU/req, {r['errors']} errors", flush=True)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    out = os.path.join(BENCH, "results", time.strftime("python-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {out}\n")
    report(results)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("python", " ".join(["python3", "bench/python.py"] + sys.argv[1:])):
        main()
