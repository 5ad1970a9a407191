#!/usr/bin/env bash
# Instructions per record of Market Spread in Rust (`canter pipeline market-spread`), counted
# by callgrind: deterministic, so a change to the engine's hot path is measured exactly where
# timing on this machine drifts.
#
#   bench/cg_market_spread.sh [BIN] [RECORDS]     # defaults: target/release/canter, 200000
#
# Runs `BIN pipeline market-spread --workers 1` under callgrind, sends RECORDS records (half
# quotes, half orders, the bench's generator with its default seed) once with
# `BIN send market-spread`, waits for every result at `BIN receive`, stops the pipeline and
# prints the instructions of the worker's read path (the inclusive count of `Head::records`)
# and of the whole process, each divided by the records. Leaves the profile in
# bench/results/callgrind-ms.out.
set -euo pipefail
set -m  # background jobs get SIGINT (a non-interactive shell has them ignore it)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/target/release/canter}"
RECORDS="${2:-200000}"
OUT="$ROOT/bench/results/callgrind-ms.out"
DATA="$ROOT/bench/build/cg-ms-$RECORDS"
NBBO=127.0.0.1:31071 ORDERS=127.0.0.1:31072 SINK=127.0.0.1:31070
command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install -y valgrind" >&2; exit 1; }
mkdir -p "$ROOT/bench/results" "$DATA"
[ -f "$DATA/expected.bin" ] || "$BIN" send market-spread --write-dir "$DATA" --count "$RECORDS" >/dev/null
EXPECT=$(python3 -c '
import sys
d = open(sys.argv[1], "rb").read(); at = n = 0
while at < len(d): at += 4 + int.from_bytes(d[at:at + 4], "big"); n += 1
print(n)' "$DATA/expected.bin")
"$BIN" receive --listen "$SINK" --expect "$EXPECT" --duration 600s --interval 0s --json \
    >"$DATA/receive.json" 2>/dev/null &
RECV=$!
valgrind --tool=callgrind --callgrind-out-file="$OUT" --dump-instr=no \
    "$BIN" pipeline market-spread --nbbo "$NBBO" --orders "$ORDERS" --out "$SINK" --workers 1 \
    >"$DATA/flow.out" 2>"$DATA/flow.err" &
FLOW=$!
trap 'kill -INT $FLOW $RECV 2>/dev/null || true' EXIT
for _ in $(seq 600); do  # slow to start under valgrind
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", 31072), 0.2)' \
        2>/dev/null && break
    sleep 0.2
done
"$BIN" send market-spread --nbbo "$NBBO" --orders "$ORDERS" --count "$RECORDS" >/dev/null
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
        re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+.*Head.*records", text, re.M)][:1]
print(f"read path (Head::records, inclusive): {head[0] if head else 0:,} "
      f"= {head[0] / records if head else 0:,.1f} per record")
print(f"whole process: {total:,} = {total / records:,.1f} per record (start-up included)")
PY
