#!/usr/bin/env python3
"""Where a server's CPU goes, by whole call stack: QUIC's UDP syscalls, quinn-proto, crypto, ours.

Reads `perf script -F comm,tid,ip,sym,dso` output of a `perf record --call-graph dwarf` run and
puts every sample in the first bucket its stack matches (kernel time inside a UDP send or
receive is "udp syscalls", whoever called it; a sample anywhere below a quinn-proto frame is
"quinn-proto", its allocations included). With --per-request-us X, the shares are also given as
µs per request of a server that spent X µs of CPU per request in the timed run.

    perf record -F 1500 --call-graph dwarf,16384 -p PID -o perf.data -- sleep 2.5
    perf script -i perf.data -F comm,tid,ip,sym,dso > perf.txt
    bench/perf_share.py perf.txt --per-request-us 4.40
"""

import argparse
import collections

# (bucket, test on the stack's text); the first that matches wins.
BUCKETS = [
    ("epoll_wait (runtime, kernel)", lambda t: "epoll_wait" in t),
    ("tcp syscalls (kernel)", lambda t: "tcp_" in t or "writev" in t),
    ("udp syscalls (kernel)", lambda t: "udp_" in t or "quinn_udp" in t or "recvmmsg" in t),
    ("other kernel", lambda t: "kallsyms" in t),
    ("crypto (ring)", lambda t: "ring_core" in t or "\nring::" in t),
    ("rustls", lambda t: "rustls::" in t),
    ("quinn-proto", lambda t: "quinn_proto::" in t),
    ("canter-h3 (QPACK, frames)", lambda t: "canter_h3::" in t),
    ("canter-h2 (HPACK, frames)", lambda t: "canter_h2::" in t),
]


def stacks(path):
    """Yields each sample's stack as one string, a frame per line, innermost first."""
    cur = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                if cur is not None:
                    yield "\n" + "\n".join(cur)
                cur = None
            elif not line[0].isspace():
                cur = []
            elif cur is not None:
                cur.append(" ".join(line.split()[1:]))
    if cur:
        yield "\n" + "\n".join(cur)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("script", help="perf script output")
    ap.add_argument("--per-request-us", type=float, help="the server's CPU µs per request")
    args = ap.parse_args()
    counts = collections.Counter()
    for text in stacks(args.script):
        bucket = next((name for name, test in BUCKETS if test(text)), "the rest of ours (runtime, app)")
        counts[bucket] += 1
    total = sum(counts.values())
    print(f"{total} samples")
    for name, n in counts.most_common():
        share = n / total
        line = f"{name:34s} {100 * share:6.1f}%"
        if args.per_request_us:
            line += f"  {share * args.per_request_us:6.2f} µs/req"
        print(line)


if __name__ == "__main__":
    main()
