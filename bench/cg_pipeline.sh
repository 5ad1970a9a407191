#!/usr/bin/env bash
# Instructions per pipelined request, counted by callgrind (deterministic: every code change on
# the request path can be measured exactly, with no timing noise).
#
#   bench/cg_pipeline.sh [BIN] [PATH]     # defaults: target/release/canter, /plaintext
#
# Runs `BIN serve --workers 1` under callgrind, sends 2,000 batches of 16 pipelined
# `GET PATH` on one connection (Python standard library), stops the server and prints the
# whole program's instruction count divided by the 32,000 requests (start-up included, a few
# thousand instructions in all). Leaves the profile in bench/results/callgrind.out.
#
# DEPTH=1 (requests per batch, default 16) measures requests sent one at a time; BATCHES sets
# how many batches (default 2,000); HEADER="Name: value" adds a header line to every request.
#
# SERVER="..." runs another server command instead (it must listen on 127.0.0.1:31050), e.g.
#   SERVER="target/release/examples/app_overhead bare 127.0.0.1:31050" bench/cg_pipeline.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/target/release/canter}"
TARGET="${2:-/plaintext}"
PORT=31050
BATCHES=${BATCHES:-2000}
DEPTH=${DEPTH:-16}
OUT="$ROOT/bench/results/callgrind.out"
command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install -y valgrind" >&2; exit 1; }
mkdir -p "$ROOT/bench/results"
if [ -n "${SERVER:-}" ]; then
    read -r -a CMD <<<"$SERVER"
else
    CMD=("$BIN" serve --addr 127.0.0.1:$PORT --workers 1)
fi
valgrind --tool=callgrind --callgrind-out-file="$OUT" --dump-instr=no \
    "${CMD[@]}" >/dev/null 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null || true' EXIT
python3 - "$PORT" "$BATCHES" "$DEPTH" "$TARGET" "${HEADER:-}" <<'PY'
import socket, sys, time
port, batches, depth, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
extra = f"{sys.argv[5]}\r\n" if sys.argv[5] else ""
for _ in range(300):  # the server starts slowly under valgrind
    try:
        s = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("server did not start")
req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode() * depth
buf = b""
for _ in range(batches):
    s.sendall(req)
    got = 0
    while got < depth:
        data = s.recv(65536)
        if not data:
            sys.exit("connection closed early")
        buf += data
        while (i := buf.find(b"\r\n\r\n")) >= 0:
            n = int(buf[:i].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(buf) < i + 4 + n:
                break
            buf = buf[i + 4 + n:]
            got += 1
PY
kill -INT $SERVER
wait $SERVER || true
trap - EXIT
TOTAL=$(callgrind_annotate "$OUT" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "instructions: $TOTAL for $((BATCHES * DEPTH)) requests = $((TOTAL / (BATCHES * DEPTH))) per request"
