#!/usr/bin/env python3
"""Recovery of a checkpointed TCP pipeline, by state size: Market Spread with --checkpoint-dir
(one worker on CPU 0) is fed every symbol's quote and some orders by `canter send market-spread
--resend` until a checkpoint acknowledges all of it, then killed (SIGKILL) and started again on
the same directory. Measured: the time from the restart (the process spawned) to the first new
result at the receiver (an order for a rejecting symbol sent every millisecond on a plain
connection from the restart on), and the checkpoint directory's size.

    python3 bench/checkpoint_recovery.py [--symbols 10000,1000000,10000000] [--rounds 3]

Results: a table on standard output and in BENCHMARKS.md.
"""
import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CANTER = os.path.join(ROOT, "target", "release", "canter")
BUILD = os.path.join(BENCH, "build", "checkpoint-recovery")
NBBO, ORDERS, RECV = ("127.0.0.1", 7501), ("127.0.0.1", 7502), ("127.0.0.1", 7503)


def addr(a):
    return f"{a[0]}:{a[1]}"


def frames(data):
    at = 0
    while at < len(data):
        n = struct.unpack(">I", data[at:at + 4])[0]
        yield data[at + 4:at + 4 + n]
        at += 4 + n


def pipeline(ckpt):
    return subprocess.Popen(["taskset", "-c", "0", CANTER, "pipeline", "market-spread", "--nbbo",
                             addr(NBBO), "--orders", addr(ORDERS), "--out", addr(RECV),
                             "--checkpoint-dir", ckpt, "--checkpoint-interval", "1s"],
                            env=dict(os.environ, RUST_LOG="warn"), stderr=subprocess.DEVNULL)


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def one(symbols, data_dir):
    ckpt = os.path.join(BUILD, "ckpt")
    subprocess.run(["rm", "-rf", ckpt], check=True)
    count = 2 * symbols + 200_000
    # A receiver that takes everything, then the pipeline, then the first run's input.
    rx = subprocess.Popen(["taskset", "-c", "1", CANTER, "receive", "--listen", addr(RECV),
                           "--dedupe", "--interval", "0s", "--json"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    p = pipeline(ckpt)
    time.sleep(0.5)
    subprocess.run(["taskset", "-c", "1", CANTER, "send", "market-spread", "--resend", "--nbbo",
                    addr(NBBO), "--orders", addr(ORDERS), "--symbols", str(symbols), "--count",
                    str(count), "--reconnect-for", "120s"], check=True, stdout=subprocess.DEVNULL)
    size = dir_bytes(ckpt)
    p.kill()
    p.wait()
    rx.terminate()
    rx.wait()
    # An order for a rejecting symbol: its result is in the expected results.
    expected = open(os.path.join(data_dir, "expected.bin"), "rb").read()
    first = next(frames(expected))
    order_id = first[5:11]
    order = next(o for o in frames(open(os.path.join(data_dir, "orders.bin"), "rb").read())
                 if o[6:12] == order_id)
    framed = struct.pack(">I", len(order)) + order
    rx = subprocess.Popen(["taskset", "-c", "1", CANTER, "receive", "--listen", addr(RECV),
                           "--expect", "1", "--interval", "0s", "--json", "--duration", "300s"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    t0 = time.monotonic()
    p = pipeline(ckpt)
    sock = None
    while rx.poll() is None:
        try:
            if sock is None:
                sock = socket.create_connection(ORDERS, timeout=1)
            sock.sendall(framed)
        except OSError:
            sock = None
        time.sleep(0.001)
    took = time.monotonic() - t0
    if sock:
        sock.close()
    p.kill()
    p.wait()
    return took, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--symbols", default="10000,1000000,10000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    rows = []
    for symbols in (int(s) for s in args.symbols.split(",")):
        data_dir = os.path.join(BUILD, f"data-{symbols}")
        if not os.path.exists(os.path.join(data_dir, "orders.bin")):
            subprocess.run([CANTER, "send", "market-spread", "--write-dir", data_dir, "--symbols",
                            str(symbols), "--count", str(2 * symbols + 200_000)], check=True,
                           stdout=subprocess.DEVNULL)
        runs = [one(symbols, data_dir) for _ in range(args.rounds)]
        for took, size in runs:
            print(f"{symbols:,} keys: first new result {took:.3f} s after the restart; "
                  f"checkpoint directory {size / 1e6:.1f} MB", flush=True)
        rows.append((symbols, [t for t, _ in runs], statistics.median(s for _, s in runs)))
    lines = ["| keys (symbols) | restart to first new result, s (rounds) | median | checkpoint directory |",
             "|---:|---|---:|---:|"]
    for symbols, took, size in rows:
        lines.append(f"| {symbols:,} | {', '.join(f'{t:.2f}' for t in took)} | "
                     f"{statistics.median(took):.2f} | {size / 1e6:.1f} MB |")
    table = "\n".join(lines)
    print(table)
    if not args.no_summary:
        sys.path.insert(0, BENCH)
        import summary  # noqa: E402
        summary.record("checkpoints-recovery",
                       " ".join(["python3", "bench/checkpoint_recovery.py"] + sys.argv[1:]), table,
                       "Market Spread with --checkpoint-dir, one worker on CPU 0; every symbol's "
                       "quote acknowledged by a checkpoint, the process SIGKILLed and started "
                       "again; an order for a rejecting symbol is sent every millisecond from "
                       "the restart on.")


if __name__ == "__main__":
    main()
