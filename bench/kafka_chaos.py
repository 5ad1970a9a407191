#!/usr/bin/env python3
"""The long run of the black-box fault harness (crates/canter-cli/tests/kafka_chaos.rs):
Market Spread with --exactly-once on three brokers, two pipeline processes, input at a steady
rate for --seconds, and a fault every 0.3-1.5 s chosen by the seed (pipeline SIGKILL and
restart, with its instance id or a new one; pipeline SIGSTOP/SIGCONT, past the session timeout
a fenced zombie; broker SIGKILL and restart; broker SIGSTOP/SIGCONT). The results, read
read_committed, are checked against the independent reference: duplicates and losses must
both be 0.

    python3 bench/kafka_chaos.py [--seconds 600] [--rate 10000] [--seeds 1,2]

Results: the harness's summary line per seed, a table on standard output and in BENCHMARKS.md.
"""
import argparse
import os
import re
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)


def run(seed, seconds, rate):
    env = dict(os.environ, CANTER_CHAOS_SEED=str(seed), CANTER_CHAOS_SECONDS=str(seconds),
               CANTER_CHAOS_RATE=str(rate))
    t0 = time.time()
    p = subprocess.run(["cargo", "test", "--release", "-q", "-p", "canter-cli", "--test",
                        "kafka_chaos", "--", "--nocapture"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    line = next((l for l in p.stderr.splitlines() if l.startswith("kafka chaos: seed=")
                 and " faults=" in l), None)
    if line is None:
        sys.stderr.write(p.stderr[-5000:])
        raise SystemExit(f"seed {seed}: no summary line (exit {p.returncode})")
    print(line, flush=True)
    counts = dict(re.findall(r"(\w+): (\d+)", line.split("Counts")[1].split("}")[0]))
    fields = dict(re.findall(r" (\w+)=(\d+)", line))
    return {"seed": seed, "passed": p.returncode == 0, "wall": time.time() - t0,
            **{k: int(v) for k, v in counts.items()}, **{k: int(v) for k, v in fields.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    rows = [run(int(s), args.seconds, args.rate) for s in args.seeds.split(",")]
    lines = [f"Market Spread with --exactly-once, three brokers, two pipeline processes, "
             f"{args.rate:,} input records/s for {args.seconds} s per seed, a fault every "
             "0.3-1.5 s; results read read_committed and checked against the reference.", "",
             "| seed | faults | pipeline kills (new instance id) | pipeline freezes (past the session) "
             "| broker kills | broker freezes | results expected | received | duplicates | missing "
             "| verdict |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['faults']} | {r['kills']} ({r['new_ids']}) | "
                     f"{r['stops']} ({r['zombies']}) | {r['broker_kills']} | {r['broker_stops']} | "
                     f"{r['expected']:,} | {r['got']:,} | {r['duplicates']} | {r['missing']} | "
                     f"{'exactly once' if r['passed'] and r['duplicates'] == 0 and r['missing'] == 0 else 'FAILED'} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_summary:
        sys.path.insert(0, BENCH)
        import summary  # noqa: E402
        summary.record("kafka-chaos", " ".join(["python3", "bench/kafka_chaos.py"] + sys.argv[1:]),
                       table)
    if not all(r["passed"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
