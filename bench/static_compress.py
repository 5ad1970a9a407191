#!/usr/bin/env python3
"""Compressed static files side by side: a 100 KB JavaScript file fetched again and again with
`Accept-Encoding: br, gzip` over 50 keep-alive connections.

    bench/build.sh && python3 bench/static_compress.py [--rounds 5] [--duration 5s]

Servers (each pinned to CPU 0 with one worker; `canter load` on CPU 1):

  canter-identity     canter serve --static, no Accept-Encoding: the file through sendfile
                      (the reference the compressed file is held to: within 1.2x)
  canter-compress     canter serve --static --compress: a compressed copy from the cache
  canter-sibling      canter serve --static with a precompressed app.js.br beside the file
  nginx-gzip-static   nginx, gzip_static on, app.js.gz beside the file
  nginx-gzip          nginx, gzip on (compressing per request, gzip_comp_level 1)

Each round starts every server in turn (the order rotating), warms it for 1 s and measures for
--duration; the table gives medians over the rounds of server CPU (utime+stime of the process
tree) per request and requests/s, and the bytes of one response. Results go to
bench/results/static-compress-<time>.json. Python 3 standard library (and brotli from pip for
the sibling; gzip from the standard library).
"""
import argparse
import gzip
import json
import os
import random
import resource
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
# Another build of canter (--base BIN), served as canter-compress-base for before/after runs.
BASE = None
WORK = os.path.join(BENCH, "build", "static-compress")


def make_files():
    """Three directories with the same 100 KB app.js: plain, with app.js.br, with app.js.gz."""
    rng = random.Random(7)
    words = ["function", "return", "const", "let", "if", "else", "for", "while", "value", "index",
             "element", "document", "window", "length", "push", "map", "filter", "reduce"]
    lines = []
    size = 0
    i = 0
    while size < 100_000:
        line = (f"function f{i}({rng.choice(words)}, {rng.choice(words)}) {{ "
                f"{rng.choice(words)}.{rng.choice(words)}({rng.randint(0, 99999)}); "
                f"return {rng.choice(words)} + {rng.randint(0, 999)}; }}\n")
        lines.append(line)
        size += len(line)
        i += 1
    data = "".join(lines).encode()[:100_000]
    dirs = {k: os.path.join(WORK, k) for k in ("plain", "br", "gz")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "app.js"), "wb") as f:
            f.write(data)
    with open(os.path.join(dirs["gz"], "app.js.gz"), "wb") as f:
        f.write(gzip.compress(data, 9))
    br = subprocess.run([sys.executable, "-c",
                         "import sys, brotli; sys.stdout.buffer.write(brotli.compress(sys.stdin.buffer.read(), quality=11))"],
                        input=data, capture_output=True)
    if br.returncode != 0:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "brotli==1.1.0"], check=True)
        br = subprocess.run([sys.executable, "-c",
                             "import sys, brotli; sys.stdout.buffer.write(brotli.compress(sys.stdin.buffer.read(), quality=11))"],
                            input=data, capture_output=True, check=True)
    with open(os.path.join(dirs["br"], "app.js.br"), "wb") as f:
        f.write(br.stdout)
    return dirs


NGINX_CONF = """daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    fastcgi_temp_path {prefix}/tmp;
    uwsgi_temp_path {prefix}/tmp;
    scgi_temp_path {prefix}/tmp;
    types {{ application/javascript js; }}
    {gzip}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /static/ {{ alias {root}/; }}
    }}
}}
"""


def nginx_argv(port, prefix, root, gzip_conf):
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(NGINX_CONF.format(nofile=nofile, prefix=prefix, port=port, root=root, gzip=gzip_conf))
    return ["nginx", "-p", prefix, "-c", os.path.join(prefix, "nginx.conf")]


def servers(dirs):
    """name -> (argv(port, prefix), Accept-Encoding sent)."""
    ae = "br, gzip"
    canter = lambda root, extra, bin=None: (lambda p, _: [bin or CANTER, "serve", "--addr",
                                                          f"127.0.0.1:{p}", "--workers", "1",
                                                          "--static", root, *extra])
    base = {"canter-compress-base": (canter(dirs["plain"], ["--compress"], BASE), ae)} if BASE else {}
    return base | {
        "canter-identity": (canter(dirs["plain"], []), None),
        "canter-compress": (canter(dirs["plain"], ["--compress"]), ae),
        "canter-sibling": (canter(dirs["br"], []), ae),
        "nginx-gzip-static": (lambda p, prefix: nginx_argv(p, prefix, dirs["gz"], "gzip_static on;"), ae),
        "nginx-gzip": (lambda p, prefix: nginx_argv(
            p, prefix, dirs["plain"], "gzip on; gzip_types application/javascript; gzip_vary on;"), ae),
    }


def fetch_once(port, ae):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    extra = f"Accept-Encoding: {ae}\r\n" if ae else ""
    s.sendall(f"GET /static/app.js HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode(errors="replace"), body


def start(name, argv, port):
    prefix = os.path.join(WORK, "run", f"{name}-{port}")
    os.makedirs(prefix, exist_ok=True)
    proc = subprocess.Popen(["taskset", "-c", "0"] + argv(port, prefix), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < 10:
        try:
            head, _ = fetch_once(port, None)
            if head.startswith("HTTP/1.1 200"):
                return proc
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"{name} did not answer on {port}")


def load(port, ae, conns, duration):
    argv = ["taskset", "-c", "1", CANTER, "load", f"http://127.0.0.1:{port}/static/app.js",
            "-c", str(conns), "-t", "1", "-d", duration, "--json", "--no-progress"]
    if ae:
        argv += ["-H", f"Accept-Encoding: {ae}"]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", default="5s")
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--quiet-wait", type=float, default=5.0)
    ap.add_argument("--port-base", type=int, default=23400)
    ap.add_argument("--servers", help="a comma-separated subset of the servers (canter-identity is "
                    "always measured: it is the reference)")
    ap.add_argument("--base", help="another canter binary, served as canter-compress-base")
    args = ap.parse_args()
    global BASE
    BASE = args.base
    run.raise_nofile()
    os.sched_setaffinity(0, {1})
    dirs = make_files()
    defs = servers(dirs)
    names = list(defs)
    if args.servers:
        wanted = set(args.servers.split(",")) | {"canter-identity"}
        names = [n for n in names if n in wanted]
    results = {"rounds": args.rounds, "duration": args.duration, "conns": args.conns,
               "cells": {}, "bytes": {}, "encoding": {}}
    port = args.port_base
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            argv, ae = defs[name]
            port += 1
            run.wait_quiet(args.quiet_wait)
            proc = start(name, argv, port)
            try:
                head, body = fetch_once(port, ae)
                enc = [l.split(":", 1)[1].strip() for l in head.split("\r\n")
                       if l.lower().startswith("content-encoding:")]
                results["bytes"][name] = len(body)
                results["encoding"][name] = enc[0] if enc else "identity"
                load(port, ae, args.conns, "1s")
                c0 = run.cpu_seconds(proc.pid)
                out = load(port, ae, args.conns, args.duration)
                c1 = run.cpu_seconds(proc.pid)
            finally:
                stop(proc)
            n = out["requests"]
            errors = sum(v for v in out["errors"].values() if isinstance(v, int))
            cell = {"rps": out["rps"], "cpu_us": (c1 - c0) / max(n, 1) * 1e6, "requests": n,
                    "errors": errors}
            results["cells"].setdefault(name, []).append(cell)
            print(f"round {r + 1} {name:18} {cell['rps']:>10,.0f} req/s {cell['cpu_us']:8.2f} us CPU/req "
                  f"errors {errors}", flush=True)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    path = os.path.join(BENCH, "results",
                        time.strftime("static-compress-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {os.path.relpath(path, ROOT)}\n")
    med = statistics.median
    ref = med(c["cpu_us"] for c in results["cells"]["canter-identity"])
    print("| server | encoding | bytes | CPU µs/request | × identity | requests/s |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        cells = results["cells"][name]
        cpu = med(c["cpu_us"] for c in cells)
        print(f"| {name} | {results['encoding'][name]} | {results['bytes'][name]:,} | {cpu:.2f} | "
              f"{cpu / ref:.2f} | {med(c['rps'] for c in cells):,.0f} |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    with summary.capture("static", " ".join(["python3", "bench/static_compress.py"] + sys.argv[1:])):
        main()
