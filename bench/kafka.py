#!/usr/bin/env python3
"""Market Spread from Kafka to Kafka: `canter pipeline market-spread --kafka` against the same
job on Kafka Streams 4.1 (and, with `--pipelines canter-py,quix`, the job written in Python:
python/examples/market_spread.py on canter's engine against Quix Streams 3.28,
bench/market_spread_quix.py, each in a virtual environment under bench/build) (bench/peers/kafka-streams: the NBBO topic as a table, orders
left-joined to it), and the bare clients' ceiling, all on one broker.

    bench/build.sh && python3 bench/kafka.py [--records 4000000] [--rounds 3]

Placement: the broker (tools/kafka/kafka.sh, one KRaft node, 2 GiB heap) and the input
producer on CPU 1; the pipeline under test alone on CPU 0 (canter: one worker; Kafka Streams:
one stream thread, its JVM pinned to CPU 0 with every thread it starts). The broker's CPU for
each run is reported beside it (it serves fetches, produces and commits of the one under test).

Per round: fresh topics (4 partitions each) filled with --records Market Spread records (half
NBBO, half orders, 1,000 symbols, about 10% of the orders rejected, `canter send market-spread
--kafka` on CPU 1); then each pipeline, with its own group and results topic, reads them from
the beginning. From the moment it is ready (canter: every task started; Kafka Streams: state
RUNNING) to the moment the last expected result is in the results topic (polled every 20 ms),
the script takes the pipeline process's CPU time (utime + stime of all its threads) and the
wall time: CPU per input record and input records/s (startup, the JVM's and the group join,
left out for both). Every run checks that the results topic holds exactly the expected number
of results.

Ceiling: canter-kafka's `bare pipe` (consume the inputs, produce every record unchanged to
its key's partition: a pipeline doing nothing) and the bare consume and produce loops of
canter-kafka and of librdkafka (bench/peers/rust/kafka-rdkafka), on CPU 0.

Exactly once: the `-eos` kinds run the same job with canter's --exactly-once and Kafka
Streams' exactly_once_v2 (100 ms commits for both); the end offset then counts transaction
markers too, so such a run ends when the results topic's end offset last moved (it stood still
for a second after passing the expected count), and its results are counted read_committed.

Results: bench/results/kafka-<time>.json and Markdown on standard output (medians of the rounds).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
# CANTER_BIN: another build of canter (an A/B of two builds: bench/kafka_ab.sh).
CANTER = os.environ.get("CANTER_BIN") or os.path.join(ROOT, "target", "release", "canter")
BARE = os.path.join(ROOT, "target", "release", "examples", "bare")
RDKAFKA = os.path.join(BENCH, "target", "release", "peer-kafka-rdkafka")
KAFKA_SH = os.path.join(ROOT, "tools", "kafka", "kafka.sh")
STREAMS = os.path.join(BENCH, "peers", "kafka-streams", "target")


def cpu_seconds(pid):
    """utime + stime of a process and all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc):
    """SIGTERM (a pipeline commits and leaves its group), SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def end(bootstrap, topic):
    # On CPU 1, beside the broker: CPU 0 is the pipeline's alone.
    out = subprocess.run(["taskset", "-c", "1", BARE, "end", bootstrap, topic],
                         capture_output=True, text=True)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def kafka(*args, cpu=None, check=True, capture=True):
    cmd = ([] if cpu is None else ["taskset", "-c", str(cpu)]) + [KAFKA_SH, *args]
    return subprocess.run(cmd, check=check, capture_output=capture, text=True)


def topic(bootstrap, name, partitions=4, cpu=1):
    kafka("run", "-", "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap,
          "--create", "--if-not-exists", "--topic", name, "--partitions", str(partitions), cpu=cpu)


def bare(mode, bootstrap, *args, config=None):
    """A bare-client run on CPU 0; (records/s, CPU ns per record) from its report line.
    `config`: a properties file of client settings (a secured listener's)."""
    exe = RDKAFKA if mode.startswith("rd-") else BARE
    m = mode[3:] if mode.startswith("rd-") else mode
    env = dict(os.environ, **({"KAFKA_CONFIG": config} if config else {}))
    out = subprocess.run(["taskset", "-c", "0", exe, m, bootstrap, *args],
                         capture_output=True, text=True, check=True, env=env).stdout
    # "... wall 0.23s (857059 rec/s), cpu 0.04s = 200 ns/record"
    rate = float(out.split("(")[1].split(" rec/s")[0])
    ns = float(out.split("= ")[1].split(" ns/record")[0])
    return rate, ns


def committed(bootstrap, topic):
    """Records of `topic` a read_committed consumer sees (markers and aborted ones left out)."""
    out = subprocess.run(["taskset", "-c", "1", BARE, "committed", bootstrap, topic],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def venv_python(name, *packages):
    """The Python of bench/build/<name> (made, with `packages` installed, on first use)."""
    venv = os.path.join(BENCH, "build", name)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    return python


def pipeline(kind, bootstrap, rnd, nbbo, orders, results, expected, records, broker_pid,
             via=None, extra=()):
    """`via`: the address the pipeline connects to, if not `bootstrap` (a secured listener of
    the same broker, `extra` then carrying its settings); results are counted on `bootstrap`."""
    group = f"{kind}-{rnd}-{int(time.time())}"
    eos = kind.endswith("-eos")
    env = dict(os.environ, RUST_LOG="info")
    if kind.startswith("canter-py"):
        # Market Spread with its steps in Python on canter's Kafka engine, one worker.
        python = os.environ.get("CANTER_PY") or venv_python("canter-venv", os.path.join(ROOT, "python"))
        cmd = ["taskset", "-c", "0", python, os.path.join(ROOT, "python", "examples", "market_spread.py"),
               "--kafka", bootstrap, "--group", group, "--nbbo-topic", nbbo, "--orders-topic",
               orders, "--results-topic", results] + (["--exactly-once"] if eos else [])
    elif kind == "quix":
        python = venv_python("quix-venv", "quixstreams==3.28.1")
        state = tempfile.mkdtemp(prefix="canter-bench-quix-")
        cmd = ["taskset", "-c", "0", python, os.path.join(BENCH, "market_spread_quix.py")]
        env.update(BOOTSTRAP=bootstrap, GROUP=group, NBBO=nbbo, ORDERS=orders, RESULTS=results,
                   STATE_DIR=state)
    elif kind.startswith("canter"):
        cmd = ["taskset", "-c", "0", CANTER, "pipeline", "market-spread", "--kafka",
               via or bootstrap, "--group", group, "--nbbo-topic", nbbo, "--orders-topic",
               orders, "--results-topic", results, "--workers", "1", *extra] + (
                   ["--exactly-once"] if eos else [])
    else:
        cp = os.path.join(STREAMS, "classes") + ":" + os.path.join(STREAMS, "dependency", "*")
        cmd = ["taskset", "-c", "0", "java", "-Xms1g", "-Xmx1g", "-cp", cp, "bench.MarketSpread",
               bootstrap, group, "1", "100", nbbo, orders, results,
               "exactly_once_v2" if eos else "at_least_once"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    # Ready: every task started (canter logs one line per task; 4 partitions, one worker),
    # the Kafka Streams instance RUNNING, or Quix's first record (READY). CPU and time are
    # taken at that moment, so startup (the JVM's, the group join) is left out for all.
    ready = {}
    marker = {"quix": "READY"}.get(kind, "task started" if kind.startswith("canter") else "RUNNING")
    need = 4 if kind.startswith("canter") else 1

    def watch():
        seen = 0
        for line in proc.stderr:
            if marker in line:
                seen += 1
                if seen == need and not ready:
                    ready.update(t=time.time(), cpu=cpu_seconds(proc.pid),
                                 broker=cpu_seconds(broker_pid))
    threading.Thread(target=watch, daemon=True).start()
    try:
        deadline = time.time() + 600
        count, last, moved = 0, -1, None
        while time.time() < deadline:
            count = end(bootstrap, results)
            sample = time.time(), cpu_seconds(proc.pid), cpu_seconds(broker_pid)
            if count != last:
                last, moved = count, sample
            now, cpu, bcpu = sample
            if count >= expected and not eos:
                break
            # Transactions: markers take offsets too, so the end offset passes the expected
            # count before the last commit. The run ends at the end offset's last move (the
            # last transaction's commit marker), once it stood still for a second.
            if count >= expected and eos and sample[0] - moved[0] >= 1.0:
                now, cpu, bcpu = moved
                break
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {proc.returncode}")
            time.sleep(0.02)
        # Nothing more may come: exactly the expected results (read_committed under
        # exactly-once).
        time.sleep(1.0)
        final = committed(bootstrap, results) if eos else end(bootstrap, results)
    finally:
        stop(proc)
    if not ready or count < expected:
        raise RuntimeError(f"{kind}: {count} of {expected} results, ready: {bool(ready)}")
    wall = max(now - ready["t"], 1e-3)
    return {
        "pipeline": kind, "round": rnd, "results": final, "expected": expected,
        "seconds": wall, "input_rate": records / wall,
        "cpu_ns_per_record": (cpu - ready["cpu"]) * 1e9 / records,
        "cpu_share": (cpu - ready["cpu"]) / wall,
        "broker_cpu_share": (bcpu - ready["broker"]) / wall,
    }


def ends(bootstrap, topic):
    out = subprocess.run(["taskset", "-c", "1", BARE, "ends", bootstrap, topic],
                         capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def owned_tasks(lines):
    """The tasks a canter process owns, from its log: started minus given up."""
    owned = set()
    for line in lines:
        if "task started" in line:
            owned.add(int(line.split(" task=")[1].split()[0]))
        elif "tasks given up" in line:
            given = line.split("tasks={")[1].split("}")[0]
            owned -= {int(x) for x in given.split(",") if x.strip()}
    return owned


def start_canter(bootstrap, group, topics, extra=()):
    cmd = ["taskset", "-c", "0", CANTER, "pipeline", "market-spread", "--kafka", bootstrap,
           "--group", group, "--nbbo-topic", topics[0], "--orders-topic", topics[1],
           "--results-topic", topics[2], *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RUST_LOG="info"))
    lines = []
    threading.Thread(target=lambda: [lines.append((time.time(), l)) for l in proc.stderr],
                     daemon=True).start()
    return proc, lines


def failover(bootstrap, symbols, session, eos=False):
    """Two canter processes share a group; one is killed with SIGKILL while records flow.
    At least once: time from the kill to the first new result from its partitions (written by
    the other), and the other's restore of their state. Exactly once (--exactly-once): the
    killed one is restarted at once with its instance id (which aborts its open
    transaction), and the time is from the restart to the first new committed result from its
    partitions (read read_committed), restores counted in both processes."""
    tag = f"{symbols}-eos" if eos else str(symbols)
    topics = (f"fo-nbbo-{tag}", f"fo-orders-{tag}", f"fo-results-{tag}")
    for t in topics:
        topic(bootstrap, t)
    # The state: every symbol's quote, processed by both before the kill.
    sent = subprocess.run(
        ["taskset", "-c", "1", CANTER, "send", "market-spread", "--kafka", bootstrap,
         "--nbbo-topic", topics[0], "--orders-topic", topics[1], "--symbols", str(symbols),
         "--count", str(4 * symbols), "--json"], check=True, capture_output=True, text=True).stdout
    expected = json.loads(sent)["expected_results"]
    group = f"fo-{tag}-{int(time.time())}"
    extra = lambda name: ("--session-timeout", session) + (  # noqa: E731
        ("--exactly-once", "--instance-id", name) if eos else ())
    a, a_log = start_canter(bootstrap, group, topics, extra("a"))
    b, b_log = start_canter(bootstrap, group, topics, extra("b"))
    count = (lambda: committed(bootstrap, topics[2])) if eos else (lambda: end(bootstrap, topics[2]))
    logs = [a_log, b_log]
    try:
        # Time to produce and process 4 records a symbol, and to settle (10 M symbols: 40 M
        # input records and their state, on one broker).
        deadline = time.time() + max(300, symbols / 10_000)
        while count() < expected or not owned_tasks(l for _, l in a_log) \
                or not owned_tasks(l for _, l in b_log):
            if time.time() > deadline:
                raise RuntimeError("failover: the two processes did not settle")
            time.sleep(0.5 if eos else 0.2)
        time.sleep(1.0)
        lost = owned_tasks(l for _, l in a_log)
        # Records keep flowing (20,000/s), then A dies.
        feeder = subprocess.Popen(
            ["taskset", "-c", "1", CANTER, "send", "market-spread", "--kafka", bootstrap,
             "--nbbo-topic", topics[0], "--orders-topic", topics[1], "--symbols", str(symbols),
             "--count", "2000000", "--rate", "20000", "--seed", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)
        a.kill()
        killed = time.time()
        a.wait()
        # Requests of A's already on the wire (a Produce, an EndTxn) still land, later under
        # load: the base is taken half a second after the kill (a takeover cannot come sooner
        # than the 1 s session; a restart comes after it).
        time.sleep(0.5)
        first = None
        if eos:
            watcher = subprocess.Popen(
                ["taskset", "-c", "1", BARE, "first", bootstrap, topics[2], "90",
                 ",".join(str(p) for p in sorted(lost))], stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)  # its start offsets taken before anything new can commit
            a, a_log = start_canter(bootstrap, group, topics, extra("a"))
            logs.append(a_log)
            restarted = time.time()
            out = watcher.communicate(timeout=120)[0].strip()
            first = float(out) - restarted if out not in ("", "none") else None
        else:
            # The base is taken once B has started one of the dead one's tasks (restored):
            # what lands on their partitions from then on is B's, not a late write of A's.
            while time.time() < killed + 60 and not any(
                    "task started" in l and t > killed for t, l in b_log):
                time.sleep(0.01)
            base = ends(bootstrap, topics[2])
            while time.time() < killed + 60:
                now_ends = ends(bootstrap, topics[2])
                if any(now_ends[p] > base[p] for p in lost):
                    first = time.time() - killed
                    break
                time.sleep(0.01)
        feeder.kill()
        feeder.wait()
    finally:
        for p in (a, b):
            stop(p)
    restored = took = 0
    for t, line in [x for log in logs for x in log]:
        if "task started" in line and t > killed:
            restored += int(line.split(" restored=")[1].split()[0])
            took += int(line.split(" took_ms=")[1].split()[0])
    return {"symbols": symbols, "session_timeout": session, "tasks_moved": sorted(lost),
            "mode": "exactly once, restarted" if eos else "at least once, taken over",
            "first_result_s": first, "restored": restored, "restore_ms": took,
            "restore_per_s": restored * 1000 / took if took else None}


def latency(kind, bootstrap, rnd, rate, seconds, broker_pid, commit=None):
    """End-to-end latency at `rate` input records/s: producer timestamp to the result's
    arrival in a consumer (both on CPU 1), while the pipeline runs alone on CPU 0 (canter
    with --commit-interval `commit` if given)."""
    tag = f"{kind}-{commit}" if commit else kind
    topics = (f"lat-nbbo-{tag}-{rnd}", f"lat-orders-{tag}-{rnd}", f"lat-results-{tag}-{rnd}")
    for t in topics:
        topic(bootstrap, t)
    group = f"lat-{kind}-{rnd}-{int(time.time())}"
    eos = kind.endswith("-eos")
    if kind.startswith("canter"):
        proc, log = start_canter(bootstrap, group, topics,
                                 ("--workers", "1") + (("--exactly-once",) if eos else ())
                                 + (("--commit-interval", commit) if commit else ()))
        marker, need = "task started", 4
    else:
        cp = os.path.join(STREAMS, "classes") + ":" + os.path.join(STREAMS, "dependency", "*")
        proc = subprocess.Popen(
            ["taskset", "-c", "0", "java", "-Xms1g", "-Xmx1g", "-cp", cp, "bench.MarketSpread",
             bootstrap, group, "1", "100", *topics,
             "exactly_once_v2" if eos else "at_least_once"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = []
        threading.Thread(target=lambda: [log.append((time.time(), l)) for l in proc.stderr],
                         daemon=True).start()
        marker, need = "RUNNING", 1
    try:
        deadline = time.time() + 120
        while sum(marker in l for _, l in log) < need:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{kind} did not start for the latency run")
            time.sleep(0.1)
        # Under exactly-once the consumer reads read_committed: a result counts when its
        # transaction commits.
        consumer = subprocess.Popen(["taskset", "-c", "1", BARE, "latency", bootstrap, topics[2],
                                     str(seconds + 2)] + (["committed"] if eos else []),
                                    stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        subprocess.run(["taskset", "-c", "1", CANTER, "send", "market-spread", "--kafka",
                        bootstrap, "--nbbo-topic", topics[0], "--orders-topic", topics[1],
                        "--symbols", "1000", "--count", str(int(rate * seconds)),
                        "--rate", str(rate)], check=True, capture_output=True)
        out, _ = consumer.communicate(timeout=seconds + 60)
    finally:
        stop(proc)
    r = json.loads(out)
    r.update(pipeline=f"{kind} ({commit} commits)" if commit else kind, round=rnd, rate=rate)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pipelines", default="canter,kafka-streams,canter-eos,kafka-streams-eos")
    ap.add_argument("--no-summary", action="store_true")
    ap.add_argument("--area", default="kafka", help="BENCHMARKS.md's section for the results")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the bare clients' runs")
    ap.add_argument("--latency-seconds", type=int, default=10)
    ap.add_argument("--failover-symbols", default="1000,100000",
                    help="state sizes (symbols) of the failover runs; empty: none")
    ap.add_argument("--session-timeout", default="1s")
    ap.add_argument("--eos-commit-intervals", default="",
                    help="more latency runs of canter-eos with these --commit-interval values "
                         "(e.g. 20ms,50ms,200ms): what the interval costs in latency")
    ap.add_argument("--failover-modes", default="alo,eos",
                    help="alo: the other process takes over; eos: --exactly-once, restarted")
    args = ap.parse_args()
    for path in (CANTER, BARE):
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run bench/build.sh")
    kinds = args.pipelines.split(",")
    if any(k.startswith("kafka-streams") for k in kinds) and not os.path.isdir(os.path.join(STREAMS, "classes")):
        sys.exit("bench/peers/kafka-streams is not built: run bench/build.sh")
    work = tempfile.mkdtemp(prefix="canter-bench-kafka-")
    cluster = os.path.join(work, "cluster")
    bootstrap = kafka("start", cluster, "--heap", "2g", cpu=1).stdout.strip().splitlines()[-1]
    broker_pid = int(open(os.path.join(cluster, "node-1", "pid")).read())
    runs, ceiling, lat, fo = [], [], [], []
    try:
        for rnd in range(args.rounds):
            nbbo, orders = f"nbbo-{rnd}", f"orders-{rnd}"
            for t in (nbbo, orders):
                topic(bootstrap, t)
            sent = subprocess.run(
                ["taskset", "-c", "1", CANTER, "send", "market-spread", "--kafka", bootstrap,
                 "--nbbo-topic", nbbo, "--orders-topic", orders, "--symbols", "1000",
                 "--reject-share", "0.1", "--count", str(args.records), "--json"],
                check=True, capture_output=True, text=True).stdout
            expected = json.loads(sent)["expected_results"]
            order = kinds if rnd % 2 == 0 else list(reversed(kinds))
            for kind in order:
                results = f"results-{kind}-{rnd}"
                topic(bootstrap, results)
                r = pipeline(kind, bootstrap, rnd, nbbo, orders, results, expected,
                             args.records, broker_pid)
                print(f"round {rnd} {kind}: {r['input_rate']:,.0f} records/s, "
                      f"{r['cpu_ns_per_record']:.0f} ns/record, broker {r['broker_cpu_share']:.0%}",
                      flush=True)
                runs.append(r)
            if args.no_ceiling:
                continue
            # The ceilings on the same inputs.
            out = f"pipe-{rnd}"
            topic(bootstrap, out)
            rate, ns = bare("pipe", bootstrap, f"{nbbo},{orders}", str(args.records), out)
            ceiling.append({"client": "canter-kafka pipe", "round": rnd, "rate": rate, "ns": ns})
            rate, ns = bare("consume", bootstrap, orders, str(args.records // 2))
            ceiling.append({"client": "canter-kafka consume", "round": rnd, "rate": rate, "ns": ns})
            if os.path.exists(RDKAFKA):
                rate, ns = bare("rd-consume", bootstrap, orders, str(args.records // 2))
                ceiling.append({"client": "librdkafka consume", "round": rnd, "rate": rate, "ns": ns})
            prod = f"produce-{rnd}"
            topic(bootstrap, prod)
            rate, ns = bare("produce", bootstrap, prod, str(args.records // 2), "53")
            ceiling.append({"client": "canter-kafka produce", "round": rnd, "rate": rate, "ns": ns})
            if os.path.exists(RDKAFKA):
                topic(bootstrap, prod + "-rd")
                rate, ns = bare("rd-produce", bootstrap, prod + "-rd", str(args.records // 2))
                ceiling.append({"client": "librdkafka produce", "round": rnd, "rate": rate, "ns": ns})
        # Latency at half of Kafka Streams' peak for both (the load generator shares CPU 1
        # with the broker and cannot offer half of canter's own peak), and, for canter, at
        # the most that generator sustains.
        peak = {k: statistics.median(r["input_rate"] for r in runs if r["pipeline"] == k)
                for k in kinds}
        half = round(peak.get("kafka-streams", peak.get("canter", max(peak.values()))) / 2, -3)
        for rnd in range(args.rounds if args.latency_seconds > 0 else 0):
            for kind in kinds:
                r = latency(kind, bootstrap, rnd, half, args.latency_seconds, broker_pid)
                print(f"latency {kind} at {half:,.0f}/s: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
                      flush=True)
                lat.append(r)
            for commit in filter(None, args.eos_commit_intervals.split(",")):
                r = latency("canter-eos", bootstrap, rnd, half, args.latency_seconds, broker_pid,
                            commit)
                print(f"latency {r['pipeline']} at {half:,.0f}/s: p50 {r['p50_ms']} ms, "
                      f"p99 {r['p99_ms']} ms", flush=True)
                lat.append(r)
            if "canter" in kinds:
                r = latency("canter", bootstrap, f"{rnd}-hi", 400_000, args.latency_seconds, broker_pid)
                print(f"latency canter at 400,000/s: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
                      flush=True)
                lat.append(r)
        for mode in filter(None, args.failover_modes.split(",")):
            for s in filter(None, args.failover_symbols.split(",")):
                r = failover(bootstrap, int(s), args.session_timeout, eos=mode == "eos")
                print(f"failover ({r['mode']}), {s} symbols: first result {r['first_result_s']} s, "
                      f"{r['restored']} state records restored in {r['restore_ms']} ms", flush=True)
                fo.append(r)
    finally:
        kafka("stop", cluster, check=False)
        shutil.rmtree(work, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    out = os.path.join(BENCH, "results", f"kafka-{stamp}.json")
    with open(out, "w") as f:
        json.dump({"records": args.records, "runs": runs, "ceiling": ceiling, "latency": lat,
                   "failover": fo}, f, indent=1)
    table = report(runs, ceiling, args.records, lat, fo)
    if not args.no_summary:
        # The plots go with BENCHMARKS.md's table: an experiment leaves both alone.
        table += plots(runs, ceiling, lat, args.area)
    table += f"\nraw: {os.path.relpath(out, ROOT)}\n"
    print(table)
    if not args.no_summary:
        import summary  # noqa: E402
        summary.record(args.area, " ".join(["python3", "bench/kafka.py"] + sys.argv[1:]), table)


COLORS = {"canter": "#d9480f", "canter-py": "#e8590c", "quix": "#2b8a3e", "kafka-streams": "#1c7ed6", "canter-kafka pipe": "#f08c00",
          "canter-kafka consume": "#f08c00", "librdkafka consume": "#5c7cfa",
          "canter-kafka produce": "#f08c00", "librdkafka produce": "#5c7cfa"}


def plots(runs, ceiling, lat, area="kafka"):
    """Bar charts of throughput and CPU per record, and the latency percentiles, into
    bench/plots/; returns the Markdown lines that name them."""
    sys.path.insert(0, BENCH)
    import run  # noqa: E402  (the suite's SVG helpers)
    kinds = list(dict.fromkeys(r["pipeline"] for r in runs))
    clients = list(dict.fromkeys(c["client"] for c in ceiling))
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    pipes = lambda key: [(k, med([r for r in runs if r["pipeline"] == k], key),  # noqa: E731
                          COLORS.get(k, run.PEER_COLOR)) for k in kinds]
    bare = lambda key: [(c, med([x for x in ceiling if x["client"] == c], key),  # noqa: E731
                         COLORS.get(c, run.PEER_COLOR)) for c in clients]
    out = []
    os.makedirs(run.PLOTS, exist_ok=True)
    charts = [
        (f"{area}-throughput.svg", run.svg_bar_panels(
            "Market Spread on Kafka: input records per second (median)",
            [("pipeline", pipes("input_rate"))] + ([("bare client", bare("rate"))] if clients else []), "")),
        (f"{area}-cpu-per-record.svg", run.svg_bar_panels(
            "Market Spread on Kafka: CPU per input record (median, ns)",
            [("pipeline", pipes("cpu_ns_per_record"))] + ([("bare client", bare("ns"))] if clients else []), " ns",
            lower_is_better=True)),
    ]
    if lat:
        keys = list(dict.fromkeys((r["pipeline"], r["rate"]) for r in lat))
        panels = [(f"{k} at {rate:,.0f}/s", [(k, {
            "p50": med([r for r in lat if (r["pipeline"], r["rate"]) == (k, rate)], "p50_ms") * 1000,
            "p99": med([r for r in lat if (r["pipeline"], r["rate"]) == (k, rate)], "p99_ms") * 1000,
            "p99_9": med([r for r in lat if (r["pipeline"], r["rate"]) == (k, rate)], "p999_ms") * 1000,
            "p99_99": None})]) for k, rate in keys]
        charts.append((f"{area}-latency.svg", run.svg_latency(
            "Market Spread on Kafka: producer timestamp to result received (median)", panels)))
    for name, svg in charts:
        if svg:
            with open(os.path.join(run.PLOTS, name), "w") as f:
                f.write(svg)
            out.append(f"![{name[:-4]}](bench/plots/{name})")
    return "\n" + "\n\n".join(out) + "\n" if out else ""


def report(runs, ceiling, records, lat=(), fo=()):
    lines = [f"Market Spread, {records:,} input records per round from 4-partition topics, "
             f"medians of {len({r['round'] for r in runs})} rounds; pipeline alone on CPU 0, "
             "broker and producer on CPU 1.", "",
             "| pipeline | input records/s | CPU ns/record | pipeline CPU | broker CPU | results |",
             "|---|---:|---:|---:|---:|---:|"]
    med = {}
    for kind in dict.fromkeys(r["pipeline"] for r in runs):
        rs = [r for r in runs if r["pipeline"] == kind]
        m = {k: statistics.median(r[k] for r in rs)
             for k in ("input_rate", "cpu_ns_per_record", "cpu_share", "broker_cpu_share")}
        ok = all(r["results"] == r["expected"] for r in rs)
        med[kind] = m
        lines.append(f"| {kind} | {m['input_rate']:,.0f} | {m['cpu_ns_per_record']:,.0f} | "
                     f"{m['cpu_share']:.0%} | {m['broker_cpu_share']:.0%} | "
                     f"{'all, exactly' if ok else 'MISMATCH'} |")
    if ceiling:
        lines += ["", "| bare client (CPU 0) | records/s | CPU ns/record |", "|---|---:|---:|"]
    for client in dict.fromkeys(c["client"] for c in ceiling):
        cs = [c for c in ceiling if c["client"] == client]
        lines.append(f"| {client} | {statistics.median(c['rate'] for c in cs):,.0f} | "
                     f"{statistics.median(c['ns'] for c in cs):,.0f} |")
    for suffix, what in (("", ""), ("-eos", " (exactly once: exactly_once_v2)")):
        if "canter" + suffix in med and "kafka-streams" + suffix in med:
            c, k = med["canter" + suffix], med["kafka-streams" + suffix]
            lines.append("")
            lines.append(f"canter ÷ Kafka Streams{what}: CPU per record "
                         f"{c['cpu_ns_per_record'] / k['cpu_ns_per_record']:.3f}x (target ≤ 0.1x), "
                         f"throughput {c['input_rate'] / k['input_rate']:.1f}x.")
    if "canter" in med and "canter-eos" in med:
        c, e = med["canter"], med["canter-eos"]
        lines.append(f"canter exactly once ÷ at least once: throughput "
                     f"{e['input_rate'] / c['input_rate']:.2f}x (target ≥ 0.8x), CPU per record "
                     f"{e['cpu_ns_per_record'] / c['cpu_ns_per_record']:.2f}x.")
    pipe = [c["rate"] for c in ceiling if c["client"] == "canter-kafka pipe"]
    if "canter" in med and pipe:
        lines.append(f"canter ÷ bare pipe ceiling: throughput "
                     f"{med['canter']['input_rate'] / statistics.median(pipe):.2f}x (target ≥ 0.8x).")
    if lat:
        lines += ["", "End-to-end latency (producer timestamp to the result's arrival in a consumer, "
                  "ms resolution; medians of the rounds):", "",
                  "| pipeline | input records/s | results | p50 ms | p99 ms | p99.9 ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for key in dict.fromkeys((r["pipeline"], r["rate"]) for r in lat):
            rs = [r for r in lat if (r["pipeline"], r["rate"]) == key]
            m = {k: statistics.median(r[k] for r in rs) for k in ("records", "p50_ms", "p99_ms", "p999_ms")}
            lines.append(f"| {key[0]} | {key[1]:,.0f} | {m['records']:,.0f} | {m['p50_ms']:.1f} | "
                         f"{m['p99_ms']:.1f} | {m['p999_ms']:.1f} |")
    if fo:
        lines += ["", "Failover and recovery (two canter processes, SIGKILL to one while 20,000 "
                  "records/s flow; group session timeout set to " + fo[0]["session_timeout"] +
                  "). At least once: the other takes the dead one's tasks over, time from the kill "
                  "to their first new result after it started one of them. Exactly once: the dead one is restarted at once with "
                  "its instance id, time from the restart to their first new committed result:", "",
                  "| mode | state (symbols) | tasks moved | to first new result | state restored | restore time | restore rate |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in fo:
            first = f"{r['first_result_s']:.2f} s" if r["first_result_s"] is not None else "none in 60 s"
            rate = f"{r['restore_per_s']:,.0f}/s" if r["restore_per_s"] else "-"
            lines.append(f"| {r.get('mode', 'at least once')} | {r['symbols']:,} | {len(r['tasks_moved'])} | {first} | "
                         f"{r['restored']:,} records | {r['restore_ms']} ms | {rate} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
