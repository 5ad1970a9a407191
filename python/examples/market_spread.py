"""Market Spread in Python on canter's pipeline engine: the same job as `canter pipeline
market-spread` (NBBO quotes and orders keyed by symbol through one shared state; a 55-byte
result for every order of a symbol whose spread is too wide), with the steps written in Python.

    python examples/market_spread.py --nbbo 127.0.0.1:7001 --orders 127.0.0.1:7002 \\
        --out 127.0.0.1:7000 [--workers 2]
    python examples/market_spread.py --kafka 127.0.0.1:9092 --group ms \\
        --nbbo-topic nbbo --orders-topic orders --results-topic results \\
        [--kafka-config security.protocol=SASL_SSL ... | --kafka-config-file client.properties]

Feed it with `canter send market-spread --nbbo ... --orders ...` and read the results with
`canter receive`. Records are decoded and encoded by built-in `struct` codecs and keyed by
`operator.itemgetter` (both run in Rust); the per-symbol state is a Python list
[reject, bid, offer], and the two functions below are the Python that runs per record.
"""
import argparse
import sys
from operator import itemgetter

import canter.pipeline as cp

#: type (2), symbol, bid, offer (the 21-byte transact time skipped)
NBBO = cp.struct(">B4s21xdd")
#: type (1), side, account, order id, symbol, quantity, price (the transact time skipped)
ORDER = cp.struct(">BBI6s4sdd21x")
#: side, account, order id, symbol, quantity, price, bid, offer, time read (ns)
RESULT = cp.struct(">BI6s4sddddQ")


def on_nbbo(state, q):
    bid, offer = q[2], q[3]
    spread = offer - bid
    state[0] = spread >= 0.05 or spread / ((bid + offer) / 2) >= 0.05
    state[1] = bid
    state[2] = offer


def check_order(state, o):
    if state[0]:
        return (o[1], o[2], o[3], o[4], o[5], o[6], state[1], state[2], cp.source_time_ns())
    return None


def flow(nbbo, orders, out):
    """Market Spread over TCP: `nbbo` and `orders` listen, results go to `out`."""
    return market_spread(cp.tcp(nbbo, decode=NBBO), cp.tcp(orders, decode=ORDER),
                         cp.tcp_out(out, encode=RESULT))


def kafka_flow(bootstrap, group, nbbo, orders, results, config=None):
    """Market Spread on Kafka: topics `nbbo` and `orders` (keyed by symbol) in, `results` out;
    `config`: client settings by librdkafka's names."""
    return market_spread(cp.kafka(nbbo, bootstrap, group=group, decode=NBBO, config=config),
                         cp.kafka(orders, bootstrap, group=group, decode=ORDER, config=config),
                         cp.kafka_out(results, encode=RESULT, config=config))


def market_spread(nbbo, orders, out):
    f = cp.Flow()
    symbols = f.keyed_state(lambda: [True, 0.0, 0.0], name="symbols")
    (f.source(nbbo).named("nbbo")
        .key_by(itemgetter(1))
        .update(symbols, on_nbbo)
        .sink(cp.discard()))
    (f.source(orders).named("orders")
        .key_by(itemgetter(4))
        .with_state(symbols, check_order)
        .sink(out))
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nbbo", default="127.0.0.1:7001")
    ap.add_argument("--orders", default="127.0.0.1:7002")
    ap.add_argument("--out", default="127.0.0.1:7000")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--metrics", default=None, help="host:port for /metrics and the live page")
    ap.add_argument("--kafka", metavar="BOOTSTRAP", help="run on Kafka topics instead")
    ap.add_argument("--group", default="market-spread-py")
    ap.add_argument("--nbbo-topic", default="nbbo")
    ap.add_argument("--orders-topic", default="orders")
    ap.add_argument("--results-topic", default="results")
    ap.add_argument("--exactly-once", action="store_true")
    ap.add_argument("--kafka-config", metavar="KEY=VALUE", action="append", default=[],
                    help="a Kafka client setting by librdkafka's name (repeatable)")
    ap.add_argument("--kafka-config-file", metavar="FILE",
                    help="a properties file of Kafka client settings")
    args = ap.parse_args()
    if args.kafka:
        config = cp.kafka_config(args.kafka_config, args.kafka_config_file)
        f = kafka_flow(args.kafka, args.group, args.nbbo_topic, args.orders_topic,
                       args.results_topic, config)
        f.start(workers=args.workers, metrics=args.metrics, exactly_once=args.exactly_once)
    else:
        f = flow(args.nbbo, args.orders, args.out)
        f.start(workers=args.workers, metrics=args.metrics)
        addrs = f.addrs()
        print(f"listening nbbo={':'.join(map(str, addrs['nbbo']))} "
              f"orders={':'.join(map(str, addrs['orders']))}", flush=True)
    try:
        while not f.wait(0.2):
            pass
    except KeyboardInterrupt:
        f.shutdown()
        f.wait()
    print(f.stats(), file=sys.stderr)


if __name__ == "__main__":
    main()
