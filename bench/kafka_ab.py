#!/usr/bin/env python3
"""A/B of the Kafka Market Spread pipeline: two canter binaries on the same inputs, 5 rounds in
alternating order, bench/kafka.py's placement and measurement (CPU per input record).

    python3 bench/kafka_ab.py OLD_CANTER NEW_CANTER [RECORDS]
"""
import json, os, subprocess, sys, tempfile, shutil, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka as kb  # noqa: E402
A, B = sys.argv[1], sys.argv[2]
records = int(sys.argv[3]) if len(sys.argv) > 3 else 2_000_000
work = tempfile.mkdtemp(prefix="canter-ab-kafka-")
cluster = os.path.join(work, "cluster")
bootstrap = kb.kafka("start", cluster, "--heap", "2g", cpu=1).stdout.strip().splitlines()[-1]
pid = int(open(os.path.join(cluster, "node-1", "pid")).read())
res = {"A": [], "B": []}
try:
    for rnd in range(5):
        nbbo, orders = f"nbbo-{rnd}", f"orders-{rnd}"
        for t in (nbbo, orders):
            kb.topic(bootstrap, t)
        sent = subprocess.run(["taskset", "-c", "1", B, "send", "market-spread", "--kafka", bootstrap,
                               "--nbbo-topic", nbbo, "--orders-topic", orders, "--symbols", "1000",
                               "--reject-share", "0.1", "--count", str(records), "--json"],
                              check=True, capture_output=True, text=True).stdout
        expected = json.loads(sent)["expected_results"]
        order = [("A", A), ("B", B)] if rnd % 2 == 0 else [("B", B), ("A", A)]
        for name, binary in order:
            kb.CANTER = binary
            results = f"results-{name}-{rnd}"
            kb.topic(bootstrap, results)
            r = kb.pipeline("canter", bootstrap, rnd, nbbo, orders, results, expected, records, pid)
            res[name].append(r["cpu_ns_per_record"])
            print(f"round {rnd} {name}: {r['input_rate']:,.0f} rec/s, {r['cpu_ns_per_record']:.1f} ns/record", flush=True)
finally:
    kb.kafka("stop", cluster, check=False)
    shutil.rmtree(work, ignore_errors=True)
ma, mb = statistics.median(res["A"]), statistics.median(res["B"])
print(f"median A {ma:.1f} ns/record, B {mb:.1f} ns/record, B/A {mb/ma:.3f}")
print(json.dumps(res))
