#!/usr/bin/env python3
"""Side-by-side HTTP/1.1 benchmarks: canter vs. the ceiling vs. peers.

Method: /work/shared/PERFORMANCE.md (server pinned to CPU 0 with one worker,
load generator pinned to CPU 1, interleaved rounds A B C A B C, medians and
ratios, server CPU time per request from /proc/PID/stat).

Python 3 standard library only. Plots are hand-written SVG.

    python3 bench/run.py --quick
    python3 bench/run.py                      # full suite, 3 rounds x 10 s
    python3 bench/run.py --servers canter,ceiling,hyper --scenarios plaintext-50 --rounds 5

Writes bench/results/<timestamp>.json, bench/plots/*.svg, the full report
bench/notebook/http1-suite.md, and its summary table into BENCHMARKS.md (bench/summary.py).
"""
import argparse
import datetime as _dt
import json
import os
import platform
import re
import resource
import selectors
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
BUILD = os.path.join(BENCH, "build")
RUST_TARGET = os.path.join(BENCH, "target", "release")
CANTER_BIN = os.path.join(ROOT, "target", "release", "canter")
RESULTS = os.path.join(BENCH, "results")
PLOTS = os.path.join(BENCH, "plots")
BENCHMARKS_MD = os.path.join(BENCH, "notebook", "http1-suite.md")
KEEP_MARKER = "<!-- kept by bench/run.py: sections below come from other benchmark scripts -->"
PIPELINE_LUA = os.path.join(BENCH, "wrk", "pipeline.lua")

SERVER_CPU = "0"
LOAD_CPU = "1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------

class ServerDef:
    """How to start one server. cmd(port, scenario, prefix) -> argv list."""

    def __init__(self, name, kind, binary, cmd, env=None, note="", prepare=None):
        self.name = name
        self.kind = kind  # "canter" | "ceiling" | "peer"
        self.binary = binary
        self.cmd = cmd
        self.env = env or {}
        self.note = note
        self.prepare = prepare  # (port, prefix) -> None, writes config files


def _nginx_prepare(port, prefix):
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with open(os.path.join(BENCH, "peers", "nginx", "nginx.conf.in")) as f:
        conf = f.read()
    conf = (conf.replace("@PORT@", str(port)).replace("@PREFIX@", prefix)
            .replace("@NOFILE@", str(nofile)))
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)


def _h2o_prepare(port, prefix):
    with open(os.path.join(BENCH, "peers", "h2o", "h2o.conf.in")) as f:
        conf = f.read()
    user = ""
    if os.geteuid() == 0:
        user = "user: root"  # otherwise h2o drops to nobody and cannot write its pid/log
    conf = conf.replace("@PORT@", str(port)).replace("@PREFIX@", prefix).replace("@USER@", user)
    with open(os.path.join(prefix, "h2o.conf"), "w") as f:
        f.write(conf)


def _which(name):
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def server_defs():
    nginx = _which("nginx") or "/usr/sbin/nginx"
    h2o = _which("h2o") or "/usr/bin/h2o"
    ceiling = os.path.join(BUILD, "ceiling")
    return {
        "canter": ServerDef(
            "canter", "canter", CANTER_BIN,
            lambda port, sc, prefix: [CANTER_BIN, "serve", "--addr", f"127.0.0.1:{port}",
                                      "--workers", "1"]),
        "ceiling": ServerDef(
            "ceiling", "ceiling", ceiling,
            # The ceiling parses nothing: for the json scenario it is started with the
            # canned JSON response so that the response bytes match.
            lambda port, sc, prefix: [ceiling, str(port)] + (["json"] if sc.path == "/json" else []),
            note="C epoll responder, parses nothing (bench/peers/ceiling/ceiling.c)"),
        "ceiling-uring": ServerDef(
            "ceiling-uring", "ceiling", ceiling + "-uring",
            lambda port, sc, prefix: [ceiling + "-uring", str(port)] + (["json"] if sc.path == "/json" else []),
            note="the ceiling on io_uring: one system call submits and reaps for all ready "
                 "connections (bench/peers/ceiling/ceiling_uring.c)"),
        "may-minihttp": ServerDef(
            "may-minihttp", "peer", os.path.join(RUST_TARGET, "peer-may-minihttp"),
            lambda port, sc, prefix: [os.path.join(RUST_TARGET, "peer-may-minihttp"), str(port)],
            note="may_minihttp 0.1 techempower example, may workers=1"),
        "hyper": ServerDef(
            "hyper", "peer", os.path.join(RUST_TARGET, "peer-hyper"),
            lambda port, sc, prefix: [os.path.join(RUST_TARGET, "peer-hyper"), str(port)],
            note="hyper 1.x + hyper-util auto (h1 + h2c), tokio current_thread"),
        "actix": ServerDef(
            "actix", "peer", os.path.join(RUST_TARGET, "peer-actix"),
            lambda port, sc, prefix: [os.path.join(RUST_TARGET, "peer-actix"), str(port)],
            note="actix-web 4, workers(1)"),
        "fasthttp": ServerDef(
            "fasthttp", "peer", os.path.join(BUILD, "fasthttp"),
            lambda port, sc, prefix: [os.path.join(BUILD, "fasthttp"), str(port)],
            env={"GOMAXPROCS": "1"}, note="valyala/fasthttp, GOMAXPROCS=1"),
        "go-nethttp": ServerDef(
            "go-nethttp", "peer", os.path.join(BUILD, "go-nethttp"),
            lambda port, sc, prefix: [os.path.join(BUILD, "go-nethttp"), str(port)],
            env={"GOMAXPROCS": "1"}, note="Go net/http (+h2c), GOMAXPROCS=1"),
        "nginx": ServerDef(
            "nginx", "peer", nginx,
            lambda port, sc, prefix: [nginx, "-p", prefix, "-c", os.path.join(prefix, "nginx.conf")],
            prepare=_nginx_prepare,
            note="Debian nginx, worker_processes 1, `return 200` (master+worker CPU summed)"),
        "h2o": ServerDef(
            "h2o", "peer", h2o,
            lambda port, sc, prefix: [h2o, "-c", os.path.join(prefix, "h2o.conf")],
            prepare=_h2o_prepare,
            note="Debian h2o 2.2, num-threads 1, mruby handler"),
    }


ALL_SERVERS = ["canter", "ceiling", "ceiling-uring", "may-minihttp", "hyper", "actix", "fasthttp",
               "go-nethttp", "nginx", "h2o"]


def proc_tree(pid):
    """pid and all of its descendants (e.g. nginx master + worker)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        children.setdefault(int(rest[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid):
    """utime+stime (all threads) summed over the process tree, in seconds."""
    return sum(cpu_user_system(pid))


def cpu_user_system(pid):
    """(utime, stime) (all threads) summed over the process tree, in seconds: time in the
    program's own code and time in the kernel on its behalf."""
    user = system = 0
    for p in proc_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        user += int(rest[11])  # field 14: utime
        system += int(rest[12])  # field 15: stime
    return user / CLK_TCK, system / CLK_TCK


def cpu_busy_ticks():
    """{cpu index: (busy ticks, total ticks)} from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                parts = line.split()
                v = [int(x) for x in parts[1:]]
                idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
                out[int(parts[0][3:])] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def wait_quiet(max_wait, threshold=0.15):
    """Wait (up to max_wait s) until both CPUs are nearly idle: on a shared machine other jobs
    would otherwise be measured too. Returns (seconds waited, busy fraction seen last)."""
    t0 = time.time()
    busy = None
    while True:
        # busy ticks over wall time (the idle counter of a tickless idle CPU lags behind)
        t1, a = time.time(), cpu_busy_ticks()
        time.sleep(0.5)
        t2, b = time.time(), cpu_busy_ticks()
        busy = max(((b[c][0] - a[c][0]) / ((t2 - t1) * CLK_TCK) for c in b if c in a), default=0)
        if busy < threshold or time.time() - t0 >= max_wait:
            return time.time() - t0, busy


def rss_kib(pid):
    total = 0
    for p in proc_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def http_get(port, path, timeout=2.0):
    """One GET over a fresh connection; returns (status, headers dict, body bytes, raw len)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
        headers = {}
        for l in lines[1:]:
            k, _, v = l.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0") or 0)
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, headers, body, len(head) + 4 + len(body)


class Running:
    def __init__(self, sdef, port, proc, prefix, logf):
        self.sdef, self.port, self.proc, self.prefix, self.logf = sdef, port, proc, prefix, logf

    @property
    def pid(self):
        return self.proc.pid


_port_counter = [0]


def next_port(base):
    """A fresh port per server start (no TIME_WAIT reuse), skipping ports someone else holds."""
    for _ in range(200):
        _port_counter[0] += 1
        port = base + (_port_counter[0] % 9000)
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            probe.close()
    raise RuntimeError("no free port")


LIVE = []  # every server we started and have not stopped yet


def start_server(sdef, scenario, base_port, timeout=15.0):
    r, err = _start_server(sdef, scenario, base_port, timeout)
    if r is None:  # one retry on another port (a port grabbed by someone else in between)
        log(f"{sdef.name}: start failed ({err[:200]}); retrying once")
        r, err = _start_server(sdef, scenario, base_port, timeout)
    return r, err


def _start_server(sdef, scenario, base_port, timeout):
    port = next_port(base_port)
    prefix = tempfile.mkdtemp(prefix=f"canter-bench-{sdef.name}-", dir=os.path.join(BUILD, "run"))
    if sdef.prepare:
        sdef.prepare(port, prefix)
    argv = ["taskset", "-c", SERVER_CPU] + sdef.cmd(port, scenario, prefix)
    env = dict(os.environ)
    env.update(sdef.env)
    logf = open(os.path.join(prefix, "server.log"), "w+")
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=prefix)
    r = Running(sdef, port, proc, prefix, logf)
    LIVE.append(r)
    deadline = time.time() + timeout
    last_err = None
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            st, hdrs, body, _ = http_get(port, "/plaintext", timeout=1.0)
            if st == 200:
                return r, None
            last_err = f"status {st}"
        except OSError as e:
            last_err = str(e)
        time.sleep(0.05)
    stop_server(r)
    with open(os.path.join(prefix, "server.log")) as f:
        tail = f.read()[-800:]
    why = (f"exited with {proc.returncode}" if proc.returncode is not None
           else f"not ready after {timeout:.0f}s ({last_err})")
    return None, f"{why}; argv={' '.join(argv)}; log tail: {tail.strip()}"


def stop_server(r):
    if r in LIVE:
        LIVE.remove(r)
    try:
        os.killpg(r.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        r.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    try:  # anything left in the group (nginx worker, h2o helpers)
        os.killpg(r.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        r.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    r.logf.close()


def stop_all():
    for r in list(LIVE):
        stop_server(r)


def check_headers(port, only_path=None):
    """Check the required headers on /plaintext and /json; returns (ok, note, info)."""
    info, problems = {}, []
    for path, body_want, ctype in (("/plaintext", b"Hello, World!", "text/plain"),
                                   ("/json", None, "application/json")):
        if only_path and path != only_path:
            continue
        try:
            st, h, body, n = http_get(port, path)
        except OSError as e:
            problems.append(f"{path}: {e}")
            continue
        info[path] = {"status": st, "response_bytes": n, "headers": h}
        if st != 200:
            problems.append(f"{path}: status {st}")
        for k in ("server", "date", "content-type", "content-length"):
            if k not in h:
                problems.append(f"{path}: no {k}")
        if not h.get("content-type", "").startswith(ctype):
            problems.append(f"{path}: content-type {h.get('content-type')}")
        if body_want is not None and body != body_want:
            problems.append(f"{path}: body {body[:40]!r}")
        if body_want is None:
            try:
                if json.loads(body) != {"message": "Hello, World!"}:
                    problems.append(f"{path}: body {body[:40]!r}")
            except ValueError:
                problems.append(f"{path}: body not JSON {body[:40]!r}")
        if h.get("connection", "").lower() == "close":
            problems.append(f"{path}: Connection: close")
    return not problems, "; ".join(problems), info


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------

class Scenario:
    def __init__(self, name, title, path="/plaintext", conns=50, pipeline=1, kind="load",
                 rate_frac=None, idle_conns=0, desc=""):
        self.name, self.title, self.path, self.conns = name, title, path, conns
        self.pipeline, self.kind, self.rate_frac = pipeline, kind, rate_frac
        self.idle_conns, self.desc = idle_conns, desc


def scenario_defs():
    return {s.name: s for s in [
        Scenario("plaintext-50", "plaintext, 50 connections", conns=50,
                 desc="GET /plaintext, 50 keep-alive connections, no pipelining (like wrk -t1 -c50)"),
        Scenario("json-50", "json, 50 connections", path="/json", conns=50,
                 desc="GET /json (body serialized per request), 50 connections, no pipelining"),
        Scenario("pipeline-16x256", "plaintext, pipelined 16 deep, 256 connections", conns=256,
                 pipeline=16, desc="GET /plaintext, 256 connections, 16 requests written at once"),
        Scenario("conns-1000", "plaintext, 1,000 connections", conns=1000,
                 desc="GET /plaintext, 1,000 connections, no pipelining"),
        Scenario("conns-10000", "plaintext, 10,000 connections", conns=10000,
                 desc="GET /plaintext, 10,000 connections, no pipelining"),
        Scenario("latency-50pct", "fixed rate at 50% of the best peer's peak", conns=50,
                 kind="rate", rate_frac=0.5,
                 desc="GET /plaintext, 50 connections, fixed total rate = 0.5 x the best peer's "
                      "plaintext-50 median; coordinated-omission corrected latency"),
        Scenario("latency-80pct", "fixed rate at 80% of the best peer's peak", conns=50,
                 kind="rate", rate_frac=0.8,
                 desc="as above at 0.8 x the best peer's peak"),
        Scenario("idle-memory", "RSS per idle keep-alive connection", kind="idle",
                 idle_conns=10000,
                 desc="open 10,000 keep-alive connections, one request each, then idle; "
                      "server RSS (VmRSS, all its processes) after minus before, per connection"),
    ]}


ALL_SCENARIOS = ["plaintext-50", "json-50", "pipeline-16x256", "conns-1000", "conns-10000",
                 "latency-50pct", "latency-80pct", "idle-memory"]


# --------------------------------------------------------------------------------------
# Load generators
# --------------------------------------------------------------------------------------

def canter_subcommand_available(sub):
    """Whether `canter SUB --help` runs: (ok, reason)."""
    if not os.access(CANTER_BIN, os.X_OK):
        return False, f"{CANTER_BIN} not built (bench/build.sh builds it)"
    try:
        p = subprocess.run([CANTER_BIN, sub, "--help"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if p.returncode != 0:
        return False, f"`canter {sub} --help` exited {p.returncode}: {(p.stderr or p.stdout)[-300:]}"
    return True, ""


def canter_load_available():
    return canter_subcommand_available("load")


def canter_serve_available():
    return canter_subcommand_available("serve")


def fmt_dur(seconds):
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{int(seconds * 1000)}ms"


def loadgen_argv(gen, url, conns, duration, pipeline=1, rate=None):
    if gen == "wrk":
        argv = ["wrk", "-t1", f"-c{conns}", f"-d{max(1, int(round(duration)))}s", "--latency",
                "--timeout", "10s"]
        if pipeline > 1:
            argv += ["-s", PIPELINE_LUA]
        argv.append(url)
        if pipeline > 1:
            argv += ["--", str(pipeline)]
    else:
        argv = [CANTER_BIN, "load", url, "-c", str(conns), "-t", "1", "-d", fmt_dur(duration),
                "--json", "--no-progress"]
        if pipeline > 1:
            argv += ["--pipeline", str(pipeline)]
        if rate:
            argv += ["--rate", str(int(rate))]
    return ["taskset", "-c", LOAD_CPU] + argv


_UNITS = {"us": 1.0, "ms": 1000.0, "s": 1e6, "m": 60e6, "h": 3600e6}


def _to_us(tok):
    m = re.match(r"([\d.]+)(us|ms|s|m|h)$", tok)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_wrk(out):
    r = {"errors": {"connect": 0, "read": 0, "write": 0, "timeout": 0, "parse": 0},
         "latency_us": {}, "non2xx": 0}
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+), ([\d.]+\w+) read", out)
    if not m:
        raise ValueError("could not parse wrk output:\n" + out[-1000:])
    r["requests"] = int(m.group(1))
    r["duration_s"] = _to_us(m.group(2) + m.group(3)) / 1e6
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    r["rps"] = float(m.group(1)) if m else r["requests"] / r["duration_s"]
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        for k, v in zip(("connect", "read", "write", "timeout"), m.groups()):
            r["errors"][k] = int(v)
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        r["non2xx"] = int(m.group(1))
    for pct, key in (("50", "p50"), ("75", "p75"), ("90", "p90"), ("99", "p99")):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M)
        if m and _to_us(m.group(1)):  # wrk prints 0.00us for percentiles it did not record
            r["latency_us"][key] = _to_us(m.group(1))
    m = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if m:
        r["latency_us"]["mean"] = _to_us(m.group(1))
        r["latency_us"]["max"] = _to_us(m.group(3))
    return r


def parse_canter(out):
    obj = None
    for line in out.splitlines()[::-1]:
        line = line.strip()
        if line.startswith("{"):
            obj = json.loads(line)
            break
    if obj is None:
        obj = json.loads(out)
    errs = obj.get("errors") or {}
    status = obj.get("status") or {}
    non2xx = sum(int(v) for k, v in status.items() if not str(k).startswith("2"))
    return {"requests": int(obj["requests"]), "rps": float(obj["rps"]),
            "duration_s": float(obj.get("duration_s") or 0),
            "errors": {k: int(errs.get(k, 0)) for k in ("connect", "read", "write", "timeout", "parse")},
            "non2xx": non2xx, "latency_us": obj.get("latency_us") or {}, "raw": obj}


def run_load(gen, url, conns, duration, pipeline=1, rate=None):
    argv = loadgen_argv(gen, url, conns, duration, pipeline, rate)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    wall = time.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    r = parse_wrk(p.stdout) if gen == "wrk" else parse_canter(p.stdout)
    r["argv"] = argv
    r["wall_s"] = wall
    r["loadgen_cpu_s"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return r


# --------------------------------------------------------------------------------------
# Idle memory
# --------------------------------------------------------------------------------------

def idle_connections(port, n, timeout=60.0):
    """Open n connections, one GET /plaintext each, read the response, keep them open.
    Returns (list of open sockets, number that got a full response)."""
    sel = selectors.DefaultSelector()
    req = f"GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    socks, done = [], 0
    pending = {}
    deadline = time.time() + timeout
    batch = 500  # connect in batches so the accept queue is not flooded
    i = 0
    while (i < n or pending) and time.time() < deadline:
        while i < n and len(pending) < batch:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect_ex(("127.0.0.1", port))
            except OSError:
                s.close()
                i += 1
                continue
            socks.append(s)
            pending[s] = [b"", False]
            sel.register(s, selectors.EVENT_WRITE)
            i += 1
        for key, ev in sel.select(timeout=0.5):
            s = key.fileobj
            st = pending.get(s)
            if st is None:
                continue
            try:
                if ev & selectors.EVENT_WRITE and not st[1]:
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, os.strerror(err))
                    s.send(req)
                    st[1] = True
                    sel.modify(s, selectors.EVENT_READ)
                elif ev & selectors.EVENT_READ:
                    chunk = s.recv(4096)
                    if not chunk:
                        raise OSError("closed")
                    st[0] += chunk
                    if b"\r\n\r\n" in st[0] and st[0].endswith(b"Hello, World!"):
                        sel.unregister(s)
                        del pending[s]
                        done += 1
            except OSError:
                sel.unregister(s)
                del pending[s]
    for s in list(pending):
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
    sel.close()
    return socks, done


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def machine_info():
    info = {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "Architecture", "CPU(s)", "Thread(s) per core",
                             "CPU max MHz", "L3 cache"):
                info[k.strip()] = v.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open("/proc/meminfo") as f:
            info["MemTotal"] = f.readline().split(":")[1].strip()
    except OSError:
        pass
    for tool, argv in (("wrk", ["wrk", "--version"]), ("nginx", ["nginx", "-v"]),
                       ("h2o", ["h2o", "--version"]), ("go", ["go", "version"]),
                       ("rustc", ["rustc", "--version"]), ("gcc", ["gcc", "--version"])):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            info[tool] = (p.stdout + p.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    try:
        info["git_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loadgen", choices=["auto", "canter", "wrk"], default="auto",
                    help="load generator (auto: `canter load` if it works, else wrk)")
    ap.add_argument("--servers", default=",".join(ALL_SERVERS),
                    help="comma-separated, from: " + ",".join(ALL_SERVERS))
    ap.add_argument("--scenarios", default=",".join(ALL_SCENARIOS),
                    help="comma-separated, from: " + ",".join(ALL_SCENARIOS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load first")
    ap.add_argument("--idle-conns", type=int, default=10000)
    ap.add_argument("--port-base", type=int, default=20000)
    ap.add_argument("--quick", action="store_true",
                    help="under 2 minutes: plaintext-50, pipeline-16x256, latency-50pct (with canter "
                         "load), idle-memory (2,000 conns); canter vs ceiling vs may-minihttp, hyper; "
                         "1 round of 3 s")
    ap.add_argument("--quiet-wait", type=float, default=10.0,
                    help="before each cell wait up to S seconds for both CPUs to be idle (0: never)")
    ap.add_argument("--no-markdown", action="store_true", help="do not rewrite BENCHMARKS.md / plots")
    ap.add_argument("--from-json", metavar="PATH",
                    help="do not measure: rebuild BENCHMARKS.md and the plots from a results file")
    args = ap.parse_args()

    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        sd = server_defs()
        for cell in results["scenarios"].values():
            summarize(cell, sd)
        write_plots(results)
        write_markdown(results, os.path.relpath(os.path.abspath(args.from_json), ROOT))
        log(f"wrote {BENCHMARKS_MD} and {PLOTS}/*.svg from {args.from_json}")
        return 0

    if args.quick:
        given = " ".join(sys.argv)
        for opt, val in (("rounds", 1), ("duration", 3.0), ("warmup", 0.5), ("quiet-wait", 1.0)):
            if f"--{opt}" not in given:
                setattr(args, opt.replace("-", "_"), val)
        if "--servers" not in " ".join(sys.argv):
            args.servers = "canter,ceiling,may-minihttp,hyper"
        if "--scenarios" not in " ".join(sys.argv):
            args.scenarios = "plaintext-50,pipeline-16x256,latency-50pct,idle-memory"
        if "--idle-conns" not in " ".join(sys.argv):
            args.idle_conns = 2000

    t_start = time.time()
    nofile = raise_nofile()
    try:  # the runner (and the idle-memory client) live on the load generator's CPU
        os.sched_setaffinity(0, {int(LOAD_CPU)})
    except OSError:
        pass
    os.makedirs(os.path.join(BUILD, "run"), exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)

    notes = []
    global CANTER_BIN
    canter_info = {}
    if os.access(CANTER_BIN, os.X_OK):
        # snapshot the binary: others may rebuild target/release/canter during a long run
        import hashlib
        snap = os.path.join(BUILD, "run", "canter-snapshot")
        shutil.copy2(CANTER_BIN, snap + ".tmp")
        os.replace(snap + ".tmp", snap)
        with open(snap, "rb") as f:
            canter_info = {"sha256": hashlib.sha256(f.read()).hexdigest()[:16],
                           "mtime": _dt.datetime.fromtimestamp(os.path.getmtime(CANTER_BIN),
                                                               _dt.timezone.utc).isoformat(timespec="seconds")}
        CANTER_BIN = snap
    gen = args.loadgen
    ok, why = canter_load_available()
    if gen == "auto":
        gen = "canter" if ok else "wrk"
        if not ok:
            notes.append(f"`canter load` not usable ({why}); used wrk instead.")
    elif gen == "canter" and not ok:
        log(f"error: --loadgen canter but `canter load` is not usable: {why}")
        return 2
    if gen == "wrk" and not _which("wrk"):
        log("error: wrk not installed (run bench/build.sh)")
        return 2
    log(f"load generator: {gen}")

    sdefs = server_defs()
    sdefs_all = sdefs
    servers = []
    for name in [s.strip() for s in args.servers.split(",") if s.strip()]:
        if name not in sdefs:
            log(f"error: unknown server {name!r}; known: {', '.join(ALL_SERVERS)}")
            return 2
        sd = sdefs[name]
        if name == "canter":
            ok, why = canter_serve_available()
            if not ok:
                msg = f"SKIPPED canter: {why}"
                log(msg)
                notes.append(msg)
                continue
        if not (sd.binary and os.access(sd.binary, os.X_OK)):
            msg = f"SKIPPED {name}: {sd.binary} not built (run bench/build.sh; see its report)"
            log(msg)
            notes.append(msg)
            continue
        servers.append(sd)

    scdefs = scenario_defs()
    scenarios = []
    for name in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        if name not in scdefs:
            log(f"error: unknown scenario {name!r}; known: {', '.join(ALL_SCENARIOS)}")
            return 2
        scenarios.append(scdefs[name])
    if any(s.kind == "rate" for s in scenarios):
        if gen != "canter":
            msg = ("SKIPPED latency-* scenarios: a fixed request rate with coordinated-omission "
                   "correction needs `canter load --rate` (wrk cannot; wrk2 is not packaged).")
            log(msg)
            notes.append(msg)
            scenarios = [s for s in scenarios if s.kind != "rate"]
        elif not any(s.name == "plaintext-50" for s in scenarios):
            scenarios.insert(0, scdefs["plaintext-50"])  # the rate is derived from its peak
            notes.append("plaintext-50 added: the fixed rates are derived from its peak.")
    for s in scenarios:
        if s.kind == "idle":
            s.idle_conns = args.idle_conns
            s.desc = s.desc.replace("10,000", f"{args.idle_conns:,}")
        if s.conns + 100 > nofile[0]:
            notes.append(f"RLIMIT_NOFILE {nofile[0]} is low for {s.name}")

    est = 0
    for s in scenarios:
        per = 2.0 + (args.warmup + args.duration if s.kind != "idle" else 8)
        est += per * len(servers) * args.rounds
    log(f"servers: {', '.join(s.name for s in servers)}")
    log(f"scenarios: {', '.join(s.name for s in scenarios)}; rounds {args.rounds}, "
        f"{args.duration}s each (+{args.warmup}s warm-up); estimated {est/60:.1f} min")

    results = {
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv, "loadgen": gen, "rounds": args.rounds, "duration_s": args.duration,
        "warmup_s": args.warmup, "quick": args.quick, "quiet_wait_s": args.quiet_wait, "machine": machine_info(),
        "rlimit_nofile": nofile[0], "notes": notes, "canter_binary": canter_info,
        "servers": {s.name: {"kind": s.kind, "note": s.note, "env": s.env,
                             "cmd": " ".join(["taskset", "-c", SERVER_CPU] +
                                              [shlex.quote(a) for a in s.cmd("PORT", scdefs["plaintext-50"], "PREFIX")])}
                    for s in servers},
        "scenarios": {}, "header_checks": {}, "failed": {},
    }
    failed = results["failed"]  # server -> reason; a failed server is skipped from then on

    try:
        for sc in scenarios:
            cell = {"desc": sc.desc, "title": sc.title, "kind": sc.kind, "path": sc.path,
                    "connections": sc.conns if sc.kind != "idle" else sc.idle_conns,
                    "pipeline": sc.pipeline, "runs": {s.name: [] for s in servers}}
            results["scenarios"][sc.name] = cell
            rate = None
            if sc.kind == "rate":
                peak = results["scenarios"].get("plaintext-50", {}).get("summary", {})
                peers = {k: v["rps"] for k, v in peak.items()
                         if sdefs_all[k].kind == "peer" and v.get("rps")}
                if not peers:
                    msg = f"SKIPPED {sc.name}: no peer peak measured in plaintext-50"
                    log(msg)
                    notes.append(msg)
                    continue
                best = max(peers, key=peers.get)
                rate = sc.rate_frac * peers[best]
                cell["rate"] = rate
                cell["rate_basis"] = f"{sc.rate_frac:.0%} of {best}'s {peers[best]:,.0f} req/s"
            for rnd in range(args.rounds):
                for sd in servers:
                    if sd.name in failed:
                        continue
                    label = f"[{sc.name} r{rnd + 1}/{args.rounds}] {sd.name}"
                    waited, busy = wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else (0, None)
                    if busy is not None and busy >= 0.15:
                        log(f"{label}: machine still {busy:.0%} busy after waiting {waited:.0f}s")
                    run, err = start_server(sd, sc, args.port_base)
                    if run is None:
                        failed[sd.name] = f"did not start: {err}"
                        log(f"{label}: FAILED to start: {err}")
                        continue
                    try:
                        if sd.name not in results["header_checks"]:
                            # the ceiling serves one canned response (plaintext, or json in json scenarios)
                            ok, why, info = check_headers(
                                run.port, "/plaintext" if sd.kind == "ceiling" and sc.path != "/json" else
                                ("/json" if sd.kind == "ceiling" else None))
                            results["header_checks"][sd.name] = {"ok": ok, "problems": why,
                                                                 "info": info}
                            if not ok:
                                log(f"{label}: header check: {why}")
                        url = f"http://127.0.0.1:{run.port}{sc.path}"
                        if sc.kind == "idle":
                            time.sleep(0.3)
                            before = rss_kib(run.pid)
                            socks, done = idle_connections(run.port, sc.idle_conns)
                            time.sleep(1.0)
                            after = rss_kib(run.pid)
                            alive = run.proc.poll() is None
                            for s in socks:
                                s.close()
                            rec = {"rss_before_kib": before, "rss_after_kib": after,
                                   "opened": len(socks), "answered": done, "alive": alive,
                                   "kib_per_conn": (after - before) / done if done else None}
                            log(f"{label}: {done}/{sc.idle_conns} idle conns, RSS {before} -> "
                                f"{after} KiB = {rec['kib_per_conn'] or 0:.2f} KiB/conn")
                        else:
                            if args.warmup > 0:
                                try:
                                    run_load(gen, url, sc.conns, args.warmup, sc.pipeline, rate)
                                except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                                    log(f"{label}: warm-up failed: {e}")
                            c0, b0, t0 = cpu_seconds(run.pid), cpu_busy_ticks(), time.time()
                            r = run_load(gen, url, sc.conns, args.duration, sc.pipeline, rate)
                            c1, b1, t1 = cpu_seconds(run.pid), cpu_busy_ticks(), time.time()
                            # how busy CPU 0 was with anything but the server under test: on a
                            # shared machine this is the noise that makes a cell untrustworthy
                            sc0 = int(SERVER_CPU)
                            if sc0 in b0 and sc0 in b1 and t1 > t0:
                                busy0 = (b1[sc0][0] - b0[sc0][0]) / ((t1 - t0) * CLK_TCK)
                                r["cpu0_busy"] = busy0
                                r["cpu0_other"] = max(0.0, busy0 - (c1 - c0) / (t1 - t0))
                            lc = int(LOAD_CPU)
                            if lc in b0 and lc in b1 and t1 > t0:
                                busy1 = (b1[lc][0] - b0[lc][0]) / ((t1 - t0) * CLK_TCK)
                                r["cpu1_busy"] = busy1
                                r["cpu1_other"] = max(0.0, busy1 - r["loadgen_cpu_s"] / (t1 - t0))
                            r["server_cpu_s"] = c1 - c0
                            r["cpu_us_per_req"] = (c1 - c0) * 1e6 / r["requests"] if r["requests"] else None
                            r["server_cpu_util"] = (c1 - c0) / r["duration_s"] if r["duration_s"] else None
                            r["loadgen_cpu_util"] = r["loadgen_cpu_s"] / r["wall_s"] if r["wall_s"] else None
                            r["alive"] = run.proc.poll() is None
                            rec = r
                            errs = sum(r["errors"].values())
                            lat = r["latency_us"]
                            log(f"{label}: {r['rps']:,.0f} req/s, "
                                f"{r['cpu_us_per_req'] or 0:.2f} us CPU/req (server "
                                f"{r['server_cpu_util'] or 0:.0%} busy, client "
                                f"{r['loadgen_cpu_util'] or 0:.0%}, others on CPU0 {r.get('cpu0_other', 0):.0%}, CPU1 {r.get('cpu1_other', 0):.0%}), errors {errs}, non-2xx "
                                f"{r['non2xx']}, p99 {lat.get('p99', 0) or 0:.0f} us")
                            if not r["alive"]:
                                log(f"{label}: server DIED during the run")
                        rec["quiet_wait_s"] = waited
                        rec["busy_before"] = busy
                        cell["runs"][sd.name].append(rec)
                    except (RuntimeError, ValueError, subprocess.TimeoutExpired, OSError) as e:
                        log(f"{label}: FAILED: {e}")
                        cell["runs"][sd.name].append({"error": str(e)})
                    finally:
                        stop_server(run)
                        shutil.rmtree(run.prefix, ignore_errors=True)
            summarize(cell, sdefs_all)
            results["elapsed_s"] = time.time() - t_start
            path = write_json(results)
            if not args.no_markdown:  # keep BENCHMARKS.md valid even if the run is cut short
                write_plots(results)
                write_markdown(results, os.path.relpath(path, ROOT))
    finally:
        stop_all()

    results["elapsed_s"] = time.time() - t_start
    path = write_json(results)
    log(f"results: {path}")
    if not args.no_markdown:
        write_plots(results)
        write_markdown(results, os.path.relpath(path, ROOT))
        log(f"wrote {BENCHMARKS_MD} and {PLOTS}/*.svg")
    log(f"done in {results['elapsed_s']:.0f}s")
    return 0


def summarize(cell, sdefs):
    summ = {}
    for name, runs in cell["runs"].items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            if runs:
                summ[name] = {"error": runs[-1]["error"]}
            continue
        if cell["kind"] == "idle":
            summ[name] = {"kib_per_conn": median([r["kib_per_conn"] for r in ok]),
                          "rss_before_kib": median([r["rss_before_kib"] for r in ok]),
                          "rss_after_kib": median([r["rss_after_kib"] for r in ok]),
                          "answered": min(r["answered"] for r in ok), "n": len(ok)}
            continue
        s = {"rps": median([r["rps"] for r in ok]),
             "cpu_us_per_req": median([r["cpu_us_per_req"] for r in ok]),
             "server_cpu_util": median([r["server_cpu_util"] for r in ok]),
             "loadgen_cpu_util": median([r["loadgen_cpu_util"] for r in ok]),
             "cpu0_other": median([r.get("cpu0_other") for r in ok]),
             "cpu1_other": median([r.get("cpu1_other") for r in ok]),
             "errors": sum(sum(r["errors"].values()) for r in ok),
             "non2xx": sum(r["non2xx"] for r in ok),
             "rps_all": [r["rps"] for r in ok],
             "cpu_all": [r["cpu_us_per_req"] for r in ok],
             "other_all": [r.get("cpu0_other") for r in ok],
             # noise on a shared machine only ever slows a server down: the best round is the
             # least disturbed estimate, shown next to the median
             "rps_best": max(r["rps"] for r in ok),
             "cpu_best": min((r["cpu_us_per_req"] for r in ok if r["cpu_us_per_req"]), default=None),
             "n": len(ok)}
        lat = {}
        for k in ("p50", "p75", "p90", "p99", "p99_9", "p99_99", "max", "mean"):
            v = median([r["latency_us"].get(k) for r in ok])
            if v is not None:
                lat[k] = v
        s["latency_us"] = lat
        summ[name] = s
    # ratios against the best peer and the ceiling
    if cell["kind"] != "idle":
        peers = {k: v for k, v in summ.items() if sdefs[k].kind == "peer" and v.get("rps")}
        best_rps = max(peers, key=lambda k: peers[k]["rps"]) if peers else None
        best_cpu = min(peers, key=lambda k: peers[k]["cpu_us_per_req"] or 1e18) if peers else None
        ceil = summ.get("ceiling") if summ.get("ceiling", {}).get("rps") else None
        for k, v in summ.items():
            if not v.get("rps"):
                continue
            if best_rps:
                v["rps_vs_best_peer"] = v["rps"] / peers[best_rps]["rps"]
            if best_cpu and v["cpu_us_per_req"] and peers[best_cpu]["cpu_us_per_req"]:
                v["cpu_vs_best_peer"] = v["cpu_us_per_req"] / peers[best_cpu]["cpu_us_per_req"]
            if ceil:
                v["rps_vs_ceiling"] = v["rps"] / ceil["rps"]
                if v["cpu_us_per_req"] and ceil["cpu_us_per_req"]:
                    v["cpu_vs_ceiling"] = v["cpu_us_per_req"] / ceil["cpu_us_per_req"]
        cell["best_peer_rps"] = best_rps
        cell["best_peer_cpu"] = best_cpu
    cell["summary"] = summ


def write_json(results):
    stamp = results["started"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = os.path.join(RESULTS, f"{stamp}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    return path


# --------------------------------------------------------------------------------------
# SVG plots (hand-written, no dependencies)
# --------------------------------------------------------------------------------------

COLORS = {"canter": "#d62728", "ceiling": "#7f7f7f", "ceiling-uring": "#bdbdbd"}
PEER_COLOR = "#1f77b4"
PCT_COLORS = ["#9ecae1", "#4292c6", "#2171b5", "#08306b"]


def _esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if v >= 100000:
        s = f"{v / 1000:,.0f}k"
    elif v >= 1000:
        s = f"{v:,.0f}"
    elif v >= 100:
        s = f"{v:.0f}"
    elif v >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return s + unit


def _fmt_us(v):
    """A latency in microseconds, in the unit a reader wants."""
    if v is None:
        return "-"
    if v < 1000:
        return f"{v:.0f} us"
    if v < 1e6:
        return f"{v / 1000:.3g} ms" if v < 100000 else f"{v / 1000:.0f} ms"
    return f"{v / 1e6:.2f} s"


def svg_bar_panels(title, panels, unit, lower_is_better=False, width=760):
    """panels: list of (panel title, [(label, value, color)]). Horizontal bars."""
    row_h, pad, label_w, right_w = 20, 8, 120, 90
    y = 40
    parts = []
    for ptitle, rows in panels:
        rows = [r for r in rows if r[1] is not None]
        if not rows:
            continue
        parts.append(f'<text x="10" y="{y + 14}" font-weight="bold">{_esc(ptitle)}</text>')
        y += 22
        vmax = max(r[1] for r in rows) or 1
        bar_w = width - label_w - right_w - 20
        for label, v, color in rows:
            w = max(1.0, bar_w * v / vmax)
            parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{_esc(label)}</text>')
            parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row_h - 4}" '
                         f'fill="{color}"><title>{_esc(label)}: {_esc(_fmt(v, unit))}</title></rect>')
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}">{_esc(_fmt(v, unit))}</text>')
            y += row_h
        y += pad + 6
    h = y + 10
    sub = "lower is better" if lower_is_better else "higher is better"
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
            f'viewBox="0 0 {width} {h}" font-family="sans-serif" font-size="12">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="10" y="22" font-size="15" font-weight="bold">{_esc(title)}</text>'
            f'<text x="{width - 10}" y="22" text-anchor="end" fill="#555">{sub}</text>')
    return head + "".join(parts) + "</svg>\n"


def svg_latency(title, panels, width=760):
    """panels: list of (panel title, [(server, {p50, p99, p99_9, p99_99})]); log-scale bars."""
    import math
    keys = [("p50", "p50"), ("p99", "p99"), ("p99_9", "p99.9"), ("p99_99", "p99.99")]
    label_w, right_w, bar_h = 120, 80, 9
    bar_w = width - label_w - right_w - 20
    vals = [l.get(k) for _, rows in panels for _, l in rows for k, _ in keys if l.get(k)]
    if not vals:
        return None
    lo = 10 ** math.floor(math.log10(max(1.0, min(vals))))
    hi = 10 ** math.ceil(math.log10(max(vals) * 1.01))
    if hi <= lo:
        hi = lo * 10

    def xpos(v):
        return label_w + bar_w * (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    parts = []
    # legend
    for i, (_, name) in enumerate(keys):
        parts.append(f'<rect x="{label_w + i * 90}" y="32" width="12" height="10" fill="{PCT_COLORS[i]}"/>'
                     f'<text x="{label_w + i * 90 + 16}" y="41">{name}</text>')
    y = 56
    for ptitle, rows in panels:
        parts.append(f'<text x="10" y="{y + 12}" font-weight="bold">{_esc(ptitle)}</text>')
        y += 18
        top = y
        for server, lat in rows:
            parts.append(f'<text x="{label_w - 6}" y="{y + 20}" text-anchor="end">{_esc(server)}</text>')
            for i, (k, name) in enumerate(keys):
                v = lat.get(k)
                if v is None:
                    continue
                x1 = xpos(v)
                parts.append(f'<rect x="{label_w}" y="{y + i * (bar_h + 1)}" width="{max(1, x1 - label_w):.1f}" '
                             f'height="{bar_h}" fill="{PCT_COLORS[i]}"><title>{_esc(server)} {name}: '
                             f'{_esc(_fmt_us(v))}</title></rect>')
                parts.append(f'<text x="{x1 + 3:.1f}" y="{y + i * (bar_h + 1) + 8}" font-size="9">'
                             f'{_esc(_fmt_us(v))}</text>')
            y += 4 * (bar_h + 1) + 8
        # log axis
        d = lo
        while d <= hi * 1.0001:
            x = xpos(d)
            parts.append(f'<line x1="{x:.1f}" y1="{top - 2}" x2="{x:.1f}" y2="{y}" stroke="#ccc" '
                         f'stroke-dasharray="2,2"/>')
            lab = f"{d:g} us" if d < 1000 else (f"{d / 1000:g} ms" if d < 1e6 else f"{d / 1e6:g} s")
            parts.append(f'<text x="{x:.1f}" y="{y + 12}" text-anchor="middle" font-size="10" '
                         f'fill="#555">{lab}</text>')
            d *= 10
        y += 26
    h = y + 6
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
            f'viewBox="0 0 {width} {h}" font-family="sans-serif" font-size="12">'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="10" y="22" font-size="15" font-weight="bold">{_esc(title)}</text>'
            f'<text x="{width - 10}" y="22" text-anchor="end" fill="#555">log scale, lower is better</text>')
    return head + "".join(parts) + "</svg>\n"


def _color(name):
    return COLORS.get(name, PEER_COLOR)


def _ordered(summ, key, reverse):
    rows = [(k, v) for k, v in summ.items() if v.get(key) is not None]
    return sorted(rows, key=lambda kv: kv[1][key], reverse=reverse)


def write_plots(results):
    os.makedirs(PLOTS, exist_ok=True)
    tp, cpu, lat, mem = [], [], [], []
    for name, cell in results["scenarios"].items():
        summ = cell.get("summary", {})
        if cell["kind"] == "idle":
            mem.append((f"{cell['title']} ({cell['connections']:,} conns)",
                        [(k, v["kib_per_conn"], _color(k)) for k, v in _ordered(summ, "kib_per_conn", False)]))
            continue
        if cell["kind"] == "rate":
            lat.append((f"{name}: {cell.get('rate_basis', '')}",
                        [(k, v["latency_us"]) for k, v in _by_p99(summ)]))
            continue
        tp.append((f"{name}: {cell['title']}",
                   [(k, v["rps"], _color(k)) for k, v in _ordered(summ, "rps", True)]))
        cpu.append((f"{name}: {cell['title']}",
                    [(k, v["cpu_us_per_req"], _color(k)) for k, v in _ordered(summ, "cpu_us_per_req", False)]))
    written = {}
    for fname, svg in (
            ("throughput.svg", svg_bar_panels("Requests per second (median)", tp, "") if tp else None),
            ("cpu-per-request.svg", svg_bar_panels("Server CPU time per request (median, us)", cpu,
                                                   " us", lower_is_better=True) if cpu else None),
            ("latency.svg", svg_latency("Latency at a fixed rate (coordinated-omission corrected)", lat)
             if lat else None),
            ("idle-memory.svg", svg_bar_panels("Server RSS per idle keep-alive connection (KiB)", mem,
                                               " KiB", lower_is_better=True) if mem else None)):
        p = os.path.join(PLOTS, fname)
        if svg:
            with open(p, "w") as f:
                f.write(svg)
            written[fname] = True
        elif os.path.exists(p):
            os.remove(p)  # stale plot from an earlier run with other scenarios
    order = ["throughput.svg", "cpu-per-request.svg", "latency.svg", "idle-memory.svg"]
    results["plots"] = [p for p in order if p in written]


# --------------------------------------------------------------------------------------
# BENCHMARKS.md
# --------------------------------------------------------------------------------------

def _by_p99(summ):
    rows = [(k, v) for k, v in summ.items() if v.get("rps")]
    return sorted(rows, key=lambda kv: kv[1]["latency_us"].get("p99") or 1e18)


def _pct(v):
    return "-" if v is None else f"{v:.0%}"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _tidy(s):
    """Paths as a reader would type them (the runner uses a snapshot of the canter binary)."""
    return s.replace(os.path.join(BUILD, "run", "canter-snapshot"), "target/release/canter") \
            .replace(ROOT + "/", "")


def write_markdown(results, json_rel):
    m = results["machine"]
    L = []
    L.append("# The HTTP/1.1 suite (bench/run.py), full report of its last run")
    L.append("")
    L.append("<!-- Generated by bench/run.py; do not edit by hand. -->")
    L.append("")
    kind = "QUICK run (1 short round; indicative only)" if results["quick"] else \
        f"{results['rounds']} interleaved rounds x {results['duration_s']:g} s"
    L.append(f"Run {results['started']} ({kind}), load generator **{results['loadgen']}**, "
             f"took {results.get('elapsed_s', 0) / 60:.1f} min. Raw data: `{json_rel}` "
             "(bench/results is gitignored: kept on the machine that ran it).")
    L.append("")
    L.append("Method (see [bench/README.md](../README.md)): the server under test runs on CPU 0 with "
             "one worker (`taskset -c 0`, `GOMAXPROCS=1`), the load generator on CPU 1 "
             "(`taskset -c 1`, one thread). Every cell starts a fresh server, warms it up "
             f"({results['warmup_s']:g} s, unmeasured), then measures; servers are interleaved "
             "within each round (A B C A B C). Numbers are medians over rounds. "
             "**CPU/req** = (utime+stime of the server's whole process tree from `/proc/PID/stat`, "
             "after - before) / requests served: it ranks servers even when the load generator, "
             "not the server, is the bottleneck (see the *server busy* column: below ~95% the client "
             "was the limit). Ratios: req/s relative to the best peer / the ceiling (higher is "
             "better); CPU/req relative to the best peer / the ceiling (lower is better). "
             "*Peers* excludes canter and the ceiling. *others CPU0 / CPU1* = share of CPU 0 busy with "
             "anything but the server under test, and of CPU 1 with anything but the load generator "
             "(other jobs, interrupts): the machine is shared, "
             f"so before each cell the runner waits up to {results.get('quiet_wait_s', 0):g} s for "
             "both CPUs to go idle.")
    L.append("")
    L.append("## Machine")
    L.append("")
    for k in ("Model name", "Architecture", "CPU(s)", "Thread(s) per core", "L3 cache", "MemTotal",
              "kernel", "wrk", "nginx", "h2o", "go", "rustc", "gcc", "git_commit"):
        if k in m:
            L.append(f"- {k}: `{m[k]}`")
    L.append(f"- RLIMIT_NOFILE: {results['rlimit_nofile']}")
    if results.get("canter_binary"):
        cb = results["canter_binary"]
        L.append(f"- canter binary: sha256 `{cb['sha256']}`, built {cb['mtime']}")
    L.append("")
    if results["notes"] or results["failed"]:
        L.append("## Notes")
        L.append("")
        for n in results["notes"]:
            L.append(f"- {n}")
        for k, v in results["failed"].items():
            L.append(f"- **{k} failed**: {v[:400]}")
        for k, v in results["header_checks"].items():
            if not v["ok"]:
                L.append(f"- header check {k}: {v['problems']}")
        L.append("")
    # one-glance summary for canter
    rows = []
    for name, cell in results["scenarios"].items():
        v = cell.get("summary", {}).get("canter")
        if not v or "error" in v:
            continue
        if cell["kind"] == "load":
            rows.append(f"| {name} | {v['rps']:,.0f} | {_x(v.get('rps_vs_best_peer'))} | "
                        f"{_x(v.get('rps_vs_ceiling'))} | {_fmt(v['cpu_us_per_req'])} | "
                        f"{_x(v.get('cpu_vs_best_peer'))} | {_x(v.get('cpu_vs_ceiling'))} |")
        elif cell["kind"] == "rate":
            rows.append(f"| {name} | {v['rps']:,.0f} (p99 {_fmt_us(v['latency_us'].get('p99'))}) | | | "
                        f"{_fmt(v['cpu_us_per_req'])} | {_x(v.get('cpu_vs_best_peer'))} | "
                        f"{_x(v.get('cpu_vs_ceiling'))} |")
        elif cell["kind"] == "idle" and v.get("kib_per_conn") is not None:
            rows.append(f"| {name} | {v['kib_per_conn']:.2f} KiB/conn | | | | | |")
    if rows:
        L.append("## canter at a glance")
        L.append("")
        L.append("Medians; req/s ratios: higher is better; CPU/req ratios: lower is better.")
        L.append("")
        L.append("| scenario | canter req/s | vs best peer | vs ceiling | CPU/req (us) | vs best peer | vs ceiling |")
        L.append("|---|--:|--:|--:|--:|--:|--:|")
        L.extend(rows)
        L.append("")
    for p in results.get("plots", []):
        L.append(f"![{p}](../plots/{p})")
        L.append("")

    for name, cell in results["scenarios"].items():
        summ = cell.get("summary", {})
        L.append(f"## {name}: {cell['title']}")
        L.append("")
        L.append(cell["desc"] + ".")
        if cell.get("rate_basis"):
            L.append(f"Target rate: {cell['rate']:,.0f} req/s ({cell['rate_basis']}). Sorted by p99; "
                     "a server whose achieved rate is below the target could not keep up.")
        L.append("")
        if not summ:
            L.append("_no results_")
            L.append("")
            continue
        if cell["kind"] == "idle":
            L.append("| server | answered | RSS before (KiB) | RSS after (KiB) | KiB / connection |")
            L.append("|---|--:|--:|--:|--:|")
            for k, v in _ordered(summ, "kib_per_conn", False):
                L.append(f"| {'**canter**' if k == 'canter' else k} | {v['answered']:,} | {v['rss_before_kib']:,.0f} | "
                         f"{v['rss_after_kib']:,.0f} | **{v['kib_per_conn']:.2f}** |")
            for k, v in summ.items():
                if "error" in v:
                    L.append(f"| {k} | failed: {_esc(v['error'][:120])} | | | |")
            L.append("")
            continue
        if cell["kind"] == "rate":
            L.append("| server | achieved req/s | p50 | p90 | p99 | p99.9 | p99.99 | max | CPU/req (us) "
                     "| others CPU0 / CPU1 | errors |")
            L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
            for k, v in _by_p99(summ):
                lat = v["latency_us"]
                cells = [_fmt_us(lat.get(q)) for q in ("p50", "p90", "p99", "p99_9", "p99_99", "max")]
                L.append(f"| {'**canter**' if k == 'canter' else k} | {v['rps']:,.0f} | " + " | ".join(cells) +
                         f" | {_fmt(v['cpu_us_per_req'])} | {_pct(v.get('cpu0_other'))} / "
                         f"{_pct(v.get('cpu1_other'))} | {v['errors'] + v['non2xx']} |")
            L.append("")
            continue
        L.append("| server | req/s | vs best peer | vs ceiling | CPU/req (us) | vs best peer | vs ceiling "
                 "| best round req/s | min CPU/req (us) | server busy | client busy | others CPU0 / CPU1 | p50 | p99 "
                 "| errors | rounds: req/s (CPU0 others) |")
        L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
        for k, v in _ordered(summ, "rps", True):
            lat = v["latency_us"]
            name_md = f"**{k}**" if k == "canter" else k
            rounds = ", ".join(f"{x:,.0f} ({_pct(o)})"
                               for x, o in zip(v["rps_all"], v.get("other_all") or [None] * len(v["rps_all"])))
            L.append(f"| {name_md} | {v['rps']:,.0f} | {_x(v.get('rps_vs_best_peer'))} | "
                     f"{_x(v.get('rps_vs_ceiling'))} | {_fmt(v['cpu_us_per_req'])} | "
                     f"{_x(v.get('cpu_vs_best_peer'))} | {_x(v.get('cpu_vs_ceiling'))} | "
                     f"{v.get('rps_best') or 0:,.0f} | {_fmt(v.get('cpu_best'))} | "
                     f"{(v['server_cpu_util'] or 0):.0%} | {(v['loadgen_cpu_util'] or 0):.0%} | "
                     f"{_pct(v.get('cpu0_other'))} / {_pct(v.get('cpu1_other'))} | "
                     f"{_fmt_us(lat.get('p50'))} | {_fmt_us(lat.get('p99'))} | "
                     f"{v['errors'] + v['non2xx']} | {rounds} |")
        for k, v in summ.items():
            if "error" in v:
                L.append(f"| {k} | failed: {_esc(v['error'][:160])} |" + " |" * 14)
        L.append("")
        noisy = [k for k, v in summ.items() if (v.get("cpu0_other") or 0) > 0.2]
        if noisy:
            L.append(f"_Noise: CPU 0 was more than 20% busy with other work during {', '.join(noisy)}: "
                     "treat those cells with suspicion._")
            L.append("")
        if cell.get("best_peer_rps"):
            L.append(f"Best peer by req/s: {cell['best_peer_rps']}; by CPU/req: {cell['best_peer_cpu']}.")
            L.append("")

    L.append("## HTTP/2")
    L.append("")
    L.append("Measured by `bench/h2.py` (`canter load -m`, h2load as a cross-check): see")
    L.append("[HTTP/2 (h2c and h2 over TLS)](#http2-h2c-and-h2-over-tls) below.")
    L.append("")
    L.append("## Servers")
    L.append("")
    L.append("| server | command (PORT/PREFIX filled in by the runner) | notes | /plaintext response bytes |")
    L.append("|---|---|---|--:|")
    for k, v in results["servers"].items():
        hc = results["header_checks"].get(k, {})
        nbytes = hc.get("info", {}).get("/plaintext", {}).get("response_bytes", "-")
        env = " ".join(f"{a}={b}" for a, b in v["env"].items())
        cmd = (env + " " if env else "") + _tidy(v["cmd"])
        L.append(f"| {k} | `{cmd}` | {_esc(v['note'])} | {nbytes} |")
    L.append("")
    L.append("## Commands")
    L.append("")
    L.append("```sh")
    L.append("bench/build.sh                      # installs what is missing, builds peers + canter")
    L.append("python3 " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(os.path.abspath(results["argv"][0]), ROOT)]
                                   + results["argv"][1:]))
    L.append("```")
    L.append("")
    L.append("Load generator command per scenario (URL port varies per run):")
    L.append("")
    L.append("```sh")
    for name, cell in results["scenarios"].items():
        if cell["kind"] == "idle":
            L.append(f"# {name}: the runner itself opens {cell['connections']:,} connections "
                     "(one GET /plaintext each) and reads VmRSS of the server's processes")
            continue
        runs = [r for rs in cell["runs"].values() for r in rs if "argv" in r]
        if runs:
            argv = [_tidy(a) for a in runs[0]["argv"]]
            argv = [re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", a) for a in argv]
            L.append(f"# {name}")
            L.append(" ".join(shlex.quote(a) for a in argv))
    L.append("```")
    L.append("")
    # Sections measured by other scripts (e.g. bench/overhead.py) follow KEEP_MARKER and are
    # carried over from the current page.
    kept = ""
    try:
        with open(BENCHMARKS_MD) as f:
            old = f.read()
        if KEEP_MARKER in old:
            kept = old[old.index(KEEP_MARKER):]
    except OSError:
        pass
    with open(BENCHMARKS_MD, "w") as f:
        f.write("\n".join(L))
        if kept:
            f.write("\n" + kept)
    if rows:
        import summary  # bench/summary.py: BENCHMARKS.md's table of this area
        glance = ["Medians of " + kind + "; req/s ratios: higher is better; CPU/req ratios: lower "
                  "is better. The full report, every peer and round: "
                  "[bench/notebook/http1-suite.md](bench/notebook/http1-suite.md).", "",
                  "| scenario | canter req/s | vs best peer | vs ceiling | CPU/req (us) | vs best peer "
                  "| vs ceiling |", "|---|--:|--:|--:|--:|--:|--:|"] + rows + [""]
        glance += [f"![{p}](bench/plots/{p})\n" for p in results.get("plots", [])]
        summary.record("http1", "python3 bench/run.py " + " ".join(sys.argv[1:]),
                       "\n".join(glance))


if __name__ == "__main__":
    def _term(signum, frame):
        stop_all()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    try:
        sys.exit(main())
    finally:
        stop_all()
