#!/usr/bin/env bash
# Instructions per record of Market Spread in Python (python/examples/market_spread.py), counted
# by callgrind: deterministic, so a change to the Python package's hot path is measured exactly
# where timing on this machine drifts by a third.
#
#   bench/cg_python_pipeline.sh PYTHON [RECORDS]     # RECORDS: 200000 by default
#
# PYTHON is the interpreter's binary (not a wrapper script: valgrind runs it) with the canter
# package importable, a release build: the bench's bench/build/canter-venv/bin/python, or any
# Python 3 with PYTHONPATH set to a folder holding the package.
# Runs the example under callgrind, sends RECORDS records (half quotes, half orders, the
# bench's generator with its default seed) once with `canter send market-spread`, waits for
# every result at `canter receive`, stops the flow and prints the instructions of the worker's
# read path (the inclusive count of the Python package's `Head::records`) and of the whole
# process, each divided by the records. PYTHONHASHSEED is fixed (the interpreter's string
# hashing moves its counts). Leaves the profile in bench/results/callgrind-py.out. CG_ARGS adds
# options to callgrind (`CG_ARGS="--toggle-collect=*Head*records*"`: the read path alone).
set -euo pipefail
set -m  # background jobs get SIGINT (a non-interactive shell has them ignore it)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${1:?usage: bench/cg_python_pipeline.sh PYTHON [RECORDS]}"
RECORDS="${2:-200000}"
CANTER="$ROOT/target/release/canter"
OUT="$ROOT/bench/results/callgrind-py.out"
DATA="$ROOT/bench/build/cg-python-$RECORDS"
NBBO=127.0.0.1:31061 ORDERS=127.0.0.1:31062 SINK=127.0.0.1:31060
command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install -y valgrind" >&2; exit 1; }
[ -x "$CANTER" ] || { echo "needs $CANTER: cargo build --release -p canter-cli" >&2; exit 1; }
mkdir -p "$ROOT/bench/results" "$DATA"
[ -f "$DATA/expected.bin" ] || "$CANTER" send market-spread --write-dir "$DATA" --count "$RECORDS" >/dev/null
# The results expected: frames in expected.bin (u32 big-endian length, then the record).
EXPECT=$(python3 -c '
import sys
d = open(sys.argv[1], "rb").read(); at = n = 0
while at < len(d): at += 4 + int.from_bytes(d[at:at + 4], "big"); n += 1
print(n)' "$DATA/expected.bin")
"$CANTER" receive --listen "$SINK" --expect "$EXPECT" --duration 600s --interval 0s --json \
    >"$DATA/receive.json" 2>/dev/null &
RECV=$!
PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file="$OUT" --dump-instr=no ${CG_ARGS:-} \
    "$PYTHON" "$ROOT/python/examples/market_spread.py" --nbbo "$NBBO" --orders "$ORDERS" \
    --out "$SINK" >"$DATA/flow.out" 2>"$DATA/flow.err" &
FLOW=$!
trap 'kill -INT $FLOW $RECV 2>/dev/null || true' EXIT
for _ in $(seq 600); do  # the interpreter starts slowly under valgrind
    grep -q listening "$DATA/flow.out" 2>/dev/null && break
    sleep 0.2
done
grep -q listening "$DATA/flow.out" || { echo "the flow did not start" >&2; cat "$DATA/flow.err" >&2; exit 1; }
"$CANTER" send market-spread --nbbo "$NBBO" --orders "$ORDERS" --count "$RECORDS" >/dev/null
wait $RECV || { echo "not every result arrived" >&2; exit 1; }
kill -INT $FLOW
wait $FLOW || true
trap - EXIT
python3 - "$OUT" "$RECORDS" <<'PY'
import re, subprocess, sys
out, records = sys.argv[1], int(sys.argv[2])
text = subprocess.run(["callgrind_annotate", "--inclusive=yes", out], capture_output=True,
                      text=True, check=True).stdout
total = int(re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
head = [int(m.group(1).replace(",", "")) for m in
        re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*Head\S* as \S*>::records", text, re.M)]
if not head:
    head = [int(m.group(1).replace(",", "")) for m in
            re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+.*Head.*records", text, re.M)][:1]
print(f"read path (Head::records, inclusive): {head[0] if head else 0:,} "
      f"= {head[0] / records if head else 0:,.1f} per record")
print(f"whole process: {total:,} = {total / records:,.1f} per record (start-up included)")
PY
