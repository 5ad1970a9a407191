#!/usr/bin/env python3
"""Market Spread side by side: `canter pipeline market-spread` against the same job written by
hand with no framework (bench/peers/rust/ms-epoll: one thread, one epoll loop, the ceiling),
and, with `--servers canter,epoll,bytewax`, in Bytewax over the same TCP streams
(`tcp_flow` in bench/market_spread_bytewax.py, one worker; installed into bench/build/bytewax-venv).

    bench/build.sh && python3 bench/market_spread.py [--rounds 3] [--duration 30] [--rates 750000,1500000] [--batch 64]

Data: 1,000 symbols, half NBBO and half orders, about 10% of the orders rejected (`canter send
market-spread --write-dir`, 10 million records, generated once under bench/build/market-spread).
The server runs on CPU 0 (canter with one worker, pinned); the two `canter send` processes (NBBO
and orders, each replaying its file with --repeat) and `canter receive` run on CPU 1.

- peak: the senders write as fast as the server reads (backpressure paces them) for --duration.
- fixed-N: each stream offered N records/s (2N in all), paced without coordinated omission.
  `--rates 80%` offers each server 80% of its own peak in the same round (40% of it on each
  stream), so the peak runs first in every round.
- peak-2w (canter only): two workers, on both CPUs, sharing them with the load generator.
- `--servers canter,canter-base` with `CANTER_BASE=path/to/canter`: a change before and after,
  interleaved.
- `--servers canter,canter-py,bytewax`: Market Spread with its steps written in Python on
  canter's engine (python/examples/market_spread.py, one worker thread on CPU 0), run by the
  Python of bench/build/canter-venv (`pip install ./python` there, release build), or the one
  in CANTER_PY.
- `--servers canter,canter-ckpt`: the cost of checkpoints. canter-ckpt checkpoints every
  --checkpoint-interval (1 s) into a fresh directory under bench/build, its senders speak the
  resend protocol (`canter send --resend`, records kept until acknowledged) and the receiver
  drops repeats and acknowledges (`canter receive --dedupe`): everything a crash-safe run does.

Per run: input records/s, results received, the server's CPU (utime+stime of every thread) per
input record, and end-to-end latency percentiles from `canter receive` (each result's
timestamp is when its order was read from the source). Every run checks nothing was lost: the
results received equal the rejected orders among those sent (computed from the files here).
Rounds interleave the servers; tables show medians. Results go to
bench/results/market-spread-<time>.json and Markdown on standard output.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the suite's helpers: plots)

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CANTER = os.path.join(ROOT, "target", "release", "canter")
EPOLL = os.path.join(BENCH, "target", "release", "ms-epoll")
DATA = os.path.join(BENCH, "build", "market-spread")
RECV, NBBO, ORDERS, METRICS = (f"127.0.0.1:{p}" for p in (7300, 7301, 7302, 7303))
CKPT_DIR = os.path.join(BENCH, "build", "market-spread-checkpoints")
#: BENCHMARKS.md's section (--area) and the plots' name prefix.
AREA = "market-spread"
CKPT_INTERVAL = "1s"


def generate():
    if not os.path.exists(os.path.join(DATA, "orders.bin")):
        os.makedirs(DATA, exist_ok=True)
        subprocess.run([CANTER, "send", "market-spread", "--write-dir", DATA, "--symbols", "1000",
                        "--reject-share", "0.1", "--count", "10000000"], check=True)


def frames(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        yield data[at + 4:at + 4 + n]
        at += 4 + n


def reject_prefix():
    """prefix[i]: rejected orders among the first i of orders.bin (quotes are fixed per symbol)."""
    reject = {}
    for q in frames(os.path.join(DATA, "nbbo.bin")):
        b, o = struct.unpack(">dd", q[26:42])
        spread = o - b
        reject[q[1:5]] = spread >= 0.05 or spread / ((b + o) / 2) >= 0.05
    prefix = array("I", [0])
    n = 0
    for r in frames(os.path.join(DATA, "orders.bin")):
        n += reject.get(r[12:16], True)
        prefix.append(n)
    return prefix


def expected_results(prefix, sent):
    total = len(prefix) - 1
    return (sent // total) * prefix[-1] + prefix[sent % total]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BYTEWAX_VENV = os.path.join(BENCH, "build", "bytewax-venv")


def bytewax_python():
    python = os.path.join(BYTEWAX_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", BYTEWAX_VENV], check=True)
        subprocess.run([os.path.join(BYTEWAX_VENV, "bin", "pip"), "install", "-q", "bytewax==0.21.1"],
                       check=True)
    return python


CANTER_VENV = os.path.join(BENCH, "build", "canter-venv")


def canter_python():
    """A Python with the canter package (release build) installed."""
    if os.environ.get("CANTER_PY"):
        return os.environ["CANTER_PY"]
    python = os.path.join(CANTER_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", CANTER_VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", os.path.join(ROOT, "python")],
                       check=True)
    return python


def listening(port):
    """Whether something listens on 127.0.0.1:port (from /proc/net/tcp, without connecting)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(line.split()[1] == want and line.split()[3] == "0A" for line in list(f)[1:])


def server_cmd(kind, read_budget=None):
    if kind == "bytewax":
        return ["taskset", "-c", "0", bytewax_python(), "-m", "bytewax.run",
                "bench.market_spread_bytewax:tcp_flow"]
    if kind in ("canter-py", "canter-py-base"):
        # canter-py-base: another build of the Python package (CANTER_PY_BASE=its Python).
        python = os.environ["CANTER_PY_BASE"] if kind == "canter-py-base" else canter_python()
        return ["taskset", "-c", "0", python,
                os.path.join(ROOT, "python", "examples", "market_spread.py"), "--nbbo", NBBO,
                "--orders", ORDERS, "--out", RECV, "--metrics", METRICS, "--workers", "1"]
    if kind == "epoll":
        return ["taskset", "-c", "0", EPOLL, "--nbbo", NBBO, "--orders", ORDERS, "--out", RECV]
    workers, cpus = ("2", "0,1") if kind == "canter-2w" else ("1", "0")
    budget = ["--read-budget", str(read_budget)] if read_budget else []
    # canter-base: another build of canter (CANTER_BASE=path), to measure a change before/after.
    binary = os.environ.get("CANTER_BASE", CANTER) if kind == "canter-base" else CANTER
    ckpt = []
    if kind == "canter-ckpt":
        subprocess.run(["rm", "-rf", CKPT_DIR], check=True)
        ckpt = ["--checkpoint-dir", CKPT_DIR, "--checkpoint-interval", CKPT_INTERVAL]
    return ["taskset", "-c", cpus, binary, "pipeline", "market-spread", "--nbbo", NBBO, "--orders",
            ORDERS, "--out", RECV, "--metrics", METRICS, "--workers", workers, "--pin"] + budget + ckpt


def one(kind, rate, prefix, opts):
    """One run of `kind` at `rate` (0: peak) with the command line's `opts`; returns its
    figures."""
    duration = opts.duration
    batch = opts.fixed_batch if rate and opts.fixed_batch else opts.batch
    subprocess.run(["pkill", "-f", "canter receive"], stderr=subprocess.DEVNULL)
    # With --rt-receiver the receiver runs at real-time priority on its core, so the senders
    # sharing that core do not delay its reads (their lag would count as the server's latency).
    rt = ["chrt", "-f", "50"] if opts.rt_receiver else []
    ckpt = kind == "canter-ckpt"
    dedupe = ["--dedupe"] if ckpt else []
    rx = subprocess.Popen(rt + ["taskset", "-c", "1", CANTER, "receive", "--listen", RECV, "--duration",
                           f"{duration + 8}s", "--json", "--interval", "0s"] + dedupe,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    # The servers listen with SO_REUSEPORT, so one left over from an earlier run would share
    # the senders' connections with this one, unseen: refuse to measure beside it.
    ports = [int(a.rsplit(":", 1)[1]) for a in (NBBO, ORDERS, METRICS)]
    if any(listening(p) for p in ports):
        rx.kill()
        sys.exit(f"something already listens on one of the ports {ports}: stop it first")
    env = dict(os.environ, RUST_LOG="warn", NBBO=NBBO, ORDERS=ORDERS, OUT=RECV)
    srv = subprocess.Popen(server_cmd(kind, opts.read_budget), env=env, stderr=subprocess.DEVNULL, cwd=ROOT)
    time.sleep(0.7)
    # Python and Bytewax take longer to start than the Rust servers.
    for _ in range(100):
        if all(listening(p) for p in ports[:2]):
            break
        time.sleep(0.1)
    if srv.poll() is not None:
        rx.kill()
        sys.exit(f"{kind} exited at start with status {srv.returncode}")
    pace = ["--rate", str(rate)] if rate else []
    resend = lambda stream: ["--resend", str(stream)] if ckpt else []  # noqa: E731
    send = lambda to, f, stream: subprocess.Popen(  # noqa: E731
        ["taskset", "-c", "1", CANTER, "send", "--to", to, "--file", os.path.join(DATA, f), "--repeat",
         "--duration", str(duration), "--batch", str(batch), "--json"] + pace + resend(stream),
        stdout=subprocess.PIPE)
    s1 = send(NBBO, "nbbo.bin", 1)
    time.sleep(0.3)
    c0, t0 = cpu_seconds(srv.pid), time.time()
    s2 = send(ORDERS, "orders.bin", 2)
    r1, r2 = (json.loads(s.communicate()[0]) for s in (s1, s2))
    c1, t1 = cpu_seconds(srv.pid), time.time()
    recv = json.loads(rx.communicate()[0])
    counted = {}
    if kind.startswith("canter"):
        # The pipeline's own counts: orders read, results handed to the sink.
        import urllib.request
        text = urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            for name in ("canter_source_records_total", "canter_sink_records_total"):
                if line.startswith(name + '{pipeline="orders"'):
                    counted[name] = counted.get(name, 0) + int(line.rsplit(" ", 1)[1])
            if line.startswith('canter_checkpoints_total{result="completed"}'):
                counted["checkpoints"] = int(line.rsplit(" ", 1)[1])
    srv.terminate()
    try:
        srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        print(f"{kind} did not stop within 30 s of SIGTERM: killed", file=sys.stderr)
        srv.kill()
        srv.wait()
    records = r1["records"] + r2["records"]
    expected = expected_results(prefix, r2["records"])
    lat = recv["latency_us"]
    return {
        "server": kind, "offered_per_stream": rate, "input_records": records,
        "input_rate": r1["rate"] + r2["rate"], "results": recv["records"], "expected": expected,
        "lost": expected - recv["records"], "cpu_share": (c1 - c0) / (t1 - t0),
        "cpu_ns_per_record": (c1 - c0) / records * 1e9, "p50_us": lat["p50"], "p99_us": lat["p99"],
        "p999_us": lat["p999"],
        "p9999_us": lat["p9999"], "max_us": lat["max"],
        "sender_lag_ms": max(r1["max_lag_ms"], r2["max_lag_ms"]),
        "orders_sent": r2["records"], "batch": batch, "orders_read": counted.get("canter_source_records_total"),
        "results_made": counted.get("canter_sink_records_total"),
        "repeats": recv.get("repeats", 0), "checkpoints": counted.get("checkpoints"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--rates", default="750000,1500000",
                    help="per-stream rates for fixed-rate runs; N%% is that share of each server's "
                         "own peak in the same round, over both streams")
    ap.add_argument("--servers", default="canter,epoll")
    ap.add_argument("--no-2w", action="store_true", help="skip the two-worker canter peak")
    ap.add_argument("--batch", type=int, default=64,
                    help="records per write of each sender (1024 makes the senders cheap enough "
                         "that the server, not CPU 1, limits the peak)")
    ap.add_argument("--fixed-batch", type=int, default=None,
                    help="records per write of each sender in the fixed-rate runs (default: --batch)")
    ap.add_argument("--rt-receiver", action="store_true",
                    help="run canter receive at real-time priority (chrt -f 50) on CPU 1")
    ap.add_argument("--read-budget", type=int, default=None,
                    help="canter's --read-budget (bytes per source connection per turn)")
    ap.add_argument("--from-json", help="measure nothing: report and plot a results file")
    args = ap.parse_args()
    if args.from_json:
        report(json.load(open(args.from_json)), args.from_json)
        return
    generate()
    prefix = reject_prefix()
    servers = args.servers.split(",")
    # A rate is records/s per stream, or "N%": that share of the server's own peak in the same
    # round, over both streams.
    scenarios = [("peak", 0)] + [(f"fixed-{r}", r) for r in args.rates.split(",") if r]
    runs = []
    for rnd in range(args.rounds):
        for name, given in scenarios:
            order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
            kinds = order + (["canter-2w"] if name == "peak" and not args.no_2w else [])
            for kind in kinds:
                if isinstance(given, str) and given.endswith("%"):
                    peak = next(r["input_rate"] for r in runs
                                if r["round"] == rnd and r["scenario"] == "peak" and r["server"] == kind)
                    rate = int(peak * float(given[:-1]) / 100 / 2)
                else:
                    rate = int(given)
                r = one(kind, rate, prefix, args)
                r["scenario"], r["round"] = name, rnd
                runs.append(r)
                print(f"round {rnd} {name} {kind}: {r['input_rate']:,.0f} in/s, {r['results']:,} results "
                      f"(lost {r['lost']}; orders sent {r['orders_sent']:,} read {r['orders_read']}, results made {r['results_made']}), CPU {r['cpu_share']:.0%}, {r['cpu_ns_per_record']:.0f} ns/record, "
                      f"p50 {r['p50_us']:.0f} us p99 {r['p99_us']:.0f} us p99.99 {r['p9999_us']:.0f} us",
                      file=sys.stderr)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    out = os.path.join(BENCH, "results", time.strftime("market-spread-%Y%m%d-%H%M%S.json"))
    json.dump(runs, open(out, "w"), indent=1)
    report(runs, out)
    print(f"\n{len(runs)} runs, {args.duration} s each, --batch {args.batch}")


COLORS = {"canter": "#d9480f", "canter-2w": "#f08c00", "canter-py": "#e8590c",
          "canter-py-base": "#ffa94d", "epoll": "#1c7ed6",
          "bytewax": "#2b8a3e"}


def report(runs, out):
    """The table of medians, canter against the ceiling round by round, and the plots."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in runs))
    servers = list(dict.fromkeys(r["server"] for r in runs))
    rounds = sorted({r["round"] for r in runs})
    med = {}
    for sc in scenarios:
        for srv in servers:
            rs = [r for r in runs if (r["scenario"], r["server"]) == (sc, srv)]
            if rs:
                med[sc, srv] = ({k: statistics.median(r[k] for r in rs) for k in (
                    "input_rate", "cpu_share", "cpu_ns_per_record", "p50_us", "p99_us", "p9999_us")},
                    sum(r["lost"] for r in rs))
    print("| scenario | server | input records/s | server CPU | CPU ns/record | p50 µs | p99 µs | p99.99 µs | lost |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (sc, srv), (m, lost) in med.items():
        print(f"| {sc} | {srv} | {m['input_rate']:,.0f} | {m['cpu_share']:.0%} | "
              f"{m['cpu_ns_per_record']:.0f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} | "
              f"{m['p9999_us']:.0f} | {lost} |")
    # Round by round, each scenario's canter against the ceiling run in the same round.
    for sc in scenarios:
        ratios = []
        for rnd in rounds:
            got = {r["server"]: r for r in runs if r["scenario"] == sc and r["round"] == rnd}
            if "canter" in got and "epoll" in got:
                ratios.append((got["canter"]["input_rate"] / got["epoll"]["input_rate"],
                               got["canter"]["cpu_ns_per_record"] / got["epoll"]["cpu_ns_per_record"]))
        # At a share of each one's own peak the offered rates differ by design: CPU only.
        if ratios and sc.endswith("%"):
            print(f"\n{sc}, canter ÷ epoll ceiling per round: CPU per record "
                  + ", ".join(f"{c:.2f}x" for _, c in ratios))
        elif ratios:
            print(f"\n{sc}, canter ÷ epoll ceiling per round: throughput "
                  + ", ".join(f"{t:.2f}x" for t, _ in ratios) + "; CPU per record "
                  + ", ".join(f"{c:.2f}x" for _, c in ratios))
    # Plots: input records/s and CPU per record by scenario, and the latency percentiles.
    def panels(key):
        return [(sc, [(srv, med[sc, srv][0][key], COLORS.get(srv, run.PEER_COLOR))
                      for srv in servers if (sc, srv) in med]) for sc in scenarios]
    def pcts(sc, srv):
        rs = [r for r in runs if (r["scenario"], r["server"]) == (sc, srv)]
        # Runs recorded before p99.9 was kept have none; the plot leaves that bar out.
        p999 = [r["p999_us"] for r in rs if "p999_us" in r]
        return {"p50": med[sc, srv][0]["p50_us"], "p99": med[sc, srv][0]["p99_us"],
                "p99_9": statistics.median(p999) if p999 else None,
                "p99_99": med[sc, srv][0]["p9999_us"]}
    lat = [(sc, [(srv, pcts(sc, srv)) for srv in servers if (sc, srv) in med]) for sc in scenarios]
    os.makedirs(run.PLOTS, exist_ok=True)
    for name, svg in (
            (f"{AREA}-throughput.svg", run.svg_bar_panels(
                "Market Spread: input records per second (median)", panels("input_rate"), "")),
            (f"{AREA}-cpu-per-record.svg", run.svg_bar_panels(
                "Market Spread: server CPU per input record (median, ns)",
                panels("cpu_ns_per_record"), " ns", lower_is_better=True)),
            (f"{AREA}-latency.svg", run.svg_latency(
                "Market Spread: end-to-end latency, order read to result received (median)", lat))):
        if svg:
            with open(os.path.join(run.PLOTS, name), "w") as f:
                f.write(svg)
            print(f"plot: bench/plots/{name}")
    print(f"raw: {os.path.relpath(out, ROOT)}")

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import summary  # noqa: E402  (bench/summary.py: BENCHMARKS.md's table of this area)

    # --no-summary: an experiment, BENCHMARKS.md untouched; --area NAME: its own section there
    # (python-pipelines for the canter-py runs).
    argv = sys.argv[1:]
    area = "market-spread"
    if "--area" in argv:
        i = argv.index("--area")
        area = argv[i + 1]
        del argv[i:i + 2]
    AREA = area
    if "--no-summary" in argv:
        argv.remove("--no-summary")
        sys.argv[1:] = argv
        main()
    else:
        command = " ".join(["python3", "bench/market_spread.py"] + sys.argv[1:])
        sys.argv[1:] = argv
        note = ""
        if area != "market-spread":
            note = (f"![throughput](bench/plots/{area}-throughput.svg)\n\n"
                    f"![CPU per record](bench/plots/{area}-cpu-per-record.svg)")
        with summary.capture(area, command, note):
            main()
