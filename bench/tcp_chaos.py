#!/usr/bin/env python3
"""The long run of the fault harness for TCP pipelines (crates/canter-cli/tests/tcp_chaos.rs):
Market Spread with --checkpoint-dir on two workers, fed by `canter send market-spread --resend`
at a steady rate and read by `canter receive --dedupe`, proxies on every connection, and a fault
every 0.3-1.5 s chosen by the seed (pipeline SIGKILL and restart, one restart in four into a
checkpoint failpoint; pipeline SIGSTOP/SIGCONT; source connections dropped; sink connections
dropped). The deduplicated results are checked against the independent reference: missing
results and unmarked repeats must both be 0.

    python3 bench/tcp_chaos.py [--seconds 600] [--rate 20000] [--seeds 1,2]

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
                        "tcp_chaos", "--", "--nocapture"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    line = next((l for l in p.stderr.splitlines() if l.startswith("tcp chaos: seed=")
                 and " faults=" in l), None)
    if line is None:
        sys.stderr.write(p.stderr[-5000:])
        raise SystemExit(f"seed {seed}: no summary line (exit {p.returncode})")
    print(line, flush=True)
    fields = dict(re.findall(r" (\w+)=(\d+)", line))
    return {"seed": seed, "passed": p.returncode == 0, "wall": time.time() - t0,
            **{k: int(v) for k, v in fields.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    rows = [run(int(s), args.seconds, args.rate) for s in args.seeds.split(",")]
    lines = [f"Market Spread with --checkpoint-dir (200 ms), two workers, {args.rate:,} input "
             f"records/s for {args.seconds} s per seed, a fault every 0.3-1.5 s; results "
             "deduplicated by `canter receive --dedupe` and checked against the reference.", "",
             "| seed | faults | pipeline kills (into a failpoint) | freezes | source drops "
             "| sink drops | records resent | results expected | kept | repeats dropped "
             "| missing | unmarked repeats | verdict |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ok = r["passed"] and r["missing"] == 0 and r["unmarked"] == 0
        lines.append(f"| {r['seed']} | {r['faults']} | {r['kills']} ({r['failpoints']}) | "
                     f"{r['stops']} | {r['source_drops']} | {r['sink_drops']} | "
                     f"{r['resent']:,} | {r['expected']:,} | {r['got']:,} | {r['repeats']:,} | "
                     f"{r['missing']} | {r['unmarked']} | "
                     f"{'every result, repeats marked' if ok else 'FAILED'} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_summary:
        sys.path.insert(0, BENCH)
        import summary  # noqa: E402
        summary.record("tcp-chaos", " ".join(["python3", "bench/tcp_chaos.py"] + sys.argv[1:]),
                       table)
    if not all(r["passed"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
