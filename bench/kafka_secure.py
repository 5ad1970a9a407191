#!/usr/bin/env python3
"""Kafka where users run it: what SASL_SSL costs, and what the classic group protocol's
rebalance takes, on one broker with plaintext and secured listeners (tools/kafka/kafka.sh
--secure; a throwaway CA from trustme, in bench/build/kafka-secure).

    bench/build.sh && python3 bench/kafka_secure.py [--records 2000000] [--rounds 3]

CPU per record (bench/kafka.py's placement: broker and input producer on CPU 1, the client
under test alone on CPU 0):
- Market Spread (`canter pipeline market-spread --kafka`, one worker) over the plaintext
  listener and over SASL_SSL (SCRAM-SHA-512, TLS 1.3), rounds interleaved; target: SASL_SSL at
  most 1.3x plaintext.
- The bare consume loops of canter-kafka and of librdkafka (bench/peers/rust/kafka-rdkafka,
  the C library confluent-kafka wraps, built with OpenSSL) over the same two listeners with the
  same settings file.

Rebalance: a second process joins a group whose first process owns the 4 tasks; the time from
the second's start line to the moment the two own all 4 tasks between them, each some, under
KIP-848 (`group.protocol=consumer`) and the classic protocol (`group.protocol=classic`), the
same broker, 6 s sessions.

Results: bench/results/kafka-secure-<time>.json and Markdown on standard output.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka as kb  # noqa: E402  (bench/kafka.py's helpers)

PKI = r'''
import sys, trustme
from cryptography.hazmat.primitives import serialization as ser
d = sys.argv[1]
ca = trustme.CA()
ca.cert_pem.write_to_path(d + "/ca.pem")
ca.cert_pem.write_to_path(d + "/client-ca.pem")
for name, stem in (("localhost", "localhost"), ("127.0.0.1", "ip")):
    c = ca.issue_cert(name)
    key = ser.load_pem_private_key(c.private_key_pem.bytes(), None)
    pk8 = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    open(d + "/" + stem + ".keystore.pem", "wb").write(
        pk8 + b"".join(x.bytes() for x in c.cert_chain_pems))
'''


def rebalance(bootstrap, protocol, rnd, topics):
    """Seconds from a second process's start line to all 4 tasks owned by the two."""
    group = f"rebalance-{protocol}-{rnd}-{int(time.time())}"
    extra = ["--kafka-config", f"group.protocol={protocol}", "--session-timeout", "6s"]
    a, la = kb.start_canter(bootstrap, group, topics, extra)
    try:
        deadline = time.time() + 60
        while len(kb.owned_tasks(l for _, l in la)) < 4:
            if time.time() > deadline:
                raise RuntimeError(f"{protocol}: the first process owns {kb.owned_tasks(l for _, l in la)}")
            time.sleep(0.01)
        b, lb = kb.start_canter(bootstrap, group, topics, extra)
        try:
            while not any("canter pipeline market-spread: Kafka" in l for _, l in lb):
                if time.time() > deadline:
                    raise RuntimeError(f"{protocol}: the second process did not start")
                time.sleep(0.01)
            t0 = next(t for t, l in lb if "canter pipeline market-spread: Kafka" in l)
            while True:
                oa, ob = kb.owned_tasks(l for _, l in la), kb.owned_tasks(l for _, l in lb)
                if oa and ob and len(oa | ob) == 4 and not oa & ob:
                    return time.time() - t0
                if time.time() > deadline + 60:
                    raise RuntimeError(f"{protocol}: owned {oa} and {ob}")
                time.sleep(0.01)
        finally:
            kb.stop(b)
    finally:
        kb.stop(a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for path in (kb.CANTER, kb.BARE):
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run bench/build.sh")
    work = tempfile.mkdtemp(prefix="canter-bench-kafka-secure-")
    tls = os.path.join(work, "tls")
    os.makedirs(tls)
    python = kb.venv_python("kafka-secure", "trustme==1.2.1")
    subprocess.run([python, "-c", PKI, tls], check=True)
    cluster = os.path.join(work, "cluster")
    bootstrap = kb.kafka("start", cluster, "--heap", "2g", "--secure", tls,
                         cpu=1).stdout.strip().splitlines()[-1]
    listeners = dict(l.split("=", 1) for l in open(os.path.join(cluster, "listeners")).read().split())
    secure = listeners["sasl_ssl"]
    props = os.path.join(work, "client.properties")
    with open(props, "w") as f:
        f.write("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                "sasl.username=alice\nsasl.password=alice-secret\n"
                f"ssl.ca.location={tls}/ca.pem\n")
    broker_pid = int(open(os.path.join(cluster, "node-1", "pid")).read())
    runs, bare, reb = [], [], []
    try:
        for rnd in range(args.rounds):
            nbbo, orders = f"nbbo-{rnd}", f"orders-{rnd}"
            for t in (nbbo, orders):
                kb.topic(bootstrap, t)
            sent = subprocess.run(
                ["taskset", "-c", "1", kb.CANTER, "send", "market-spread", "--kafka", bootstrap,
                 "--nbbo-topic", nbbo, "--orders-topic", orders, "--symbols", "1000",
                 "--reject-share", "0.1", "--count", str(args.records), "--json"],
                check=True, capture_output=True, text=True).stdout
            expected = json.loads(sent)["expected_results"]
            kinds = [("plaintext", None, ()), ("sasl_ssl", secure, ("--kafka-config-file", props))]
            for name, via, extra in (kinds if rnd % 2 == 0 else kinds[::-1]):
                results = f"results-{name}-{rnd}"
                kb.topic(bootstrap, results)
                r = kb.pipeline("canter", bootstrap, rnd, nbbo, orders, results, expected,
                                args.records, broker_pid, via=via, extra=extra)
                r["listener"] = name
                print(f"round {rnd} pipeline {name}: {r['input_rate']:,.0f} records/s, "
                      f"{r['cpu_ns_per_record']:.0f} ns/record", flush=True)
                runs.append(r)
            clients = [("canter-kafka", "consume")] + (
                [("librdkafka", "rd-consume")] if os.path.exists(kb.RDKAFKA) else [])
            for client, mode in clients:
                for name, addr, cfg in (("plaintext", bootstrap, None), ("sasl_ssl", secure, props)):
                    rate, ns = kb.bare(mode, addr, orders, str(args.records // 2), config=cfg)
                    bare.append({"client": client, "listener": name, "round": rnd,
                                 "rate": rate, "ns": ns})
                    print(f"round {rnd} {client} consume {name}: {rate:,.0f} records/s, "
                          f"{ns:.0f} ns/record", flush=True)
            kb.topic(bootstrap, f"results-reb-{rnd}")
            for protocol in ("consumer", "classic"):
                s = rebalance(bootstrap, protocol, rnd, (nbbo, orders, f"results-reb-{rnd}"))
                reb.append({"protocol": protocol, "round": rnd, "seconds": s})
                print(f"round {rnd} rebalance {protocol}: {s:.2f} s", flush=True)
    finally:
        kb.kafka("stop", cluster, check=False)
        shutil.rmtree(work, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = os.path.join(kb.BENCH, "results", f"kafka-secure-{stamp}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"records": args.records, "runs": runs, "bare": bare, "rebalance": reb}, f,
                  indent=1)
    med = statistics.median
    pl = {n: med(r["cpu_ns_per_record"] for r in runs if r["listener"] == n)
          for n in ("plaintext", "sasl_ssl")}
    rate = {n: med(r["input_rate"] for r in runs if r["listener"] == n)
            for n in ("plaintext", "sasl_ssl")}
    lines = ["| what | listener | records/s | CPU ns per record |", "|---|---|---:|---:|"]
    for n in ("plaintext", "sasl_ssl"):
        lines.append(f"| canter pipeline (Market Spread) | {n} | {rate[n]:,.0f} | {pl[n]:,.0f} |")
    for client in sorted({b["client"] for b in bare}):
        for n in ("plaintext", "sasl_ssl"):
            rows = [b for b in bare if b["client"] == client and b["listener"] == n]
            lines.append(f"| {client} consume | {n} | {med(b['rate'] for b in rows):,.0f} | "
                         f"{med(b['ns'] for b in rows):,.0f} |")
    lines.append("")
    lines.append(f"SASL_SSL ÷ plaintext, CPU per record of the pipeline: "
                 f"{pl['sasl_ssl'] / pl['plaintext']:.2f}x (target ≤ 1.3x).")
    cons = {(b["client"], b["listener"]): med(x["ns"] for x in bare if x["client"] == b["client"]
                                               and x["listener"] == b["listener"]) for b in bare}
    if ("librdkafka", "sasl_ssl") in cons:
        lines.append(f"canter-kafka ÷ librdkafka consume over SASL_SSL, CPU per record: "
                     f"{cons[('canter-kafka', 'sasl_ssl')] / cons[('librdkafka', 'sasl_ssl')]:.2f}x.")
    lines.append("")
    lines.append("| rebalance (a second process joins) | median s | rounds |")
    lines.append("|---|---:|---|")
    for p in ("consumer", "classic"):
        xs = [r["seconds"] for r in reb if r["protocol"] == p]
        lines.append(f"| {p} | {med(xs):.2f} | {', '.join(f'{x:.2f}' for x in xs)} |")
    lines.append(f"\nraw: {os.path.relpath(out, kb.ROOT)}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
