"""Market Spread in Quix Streams (https://quix.io), the same job as `canter pipeline
market-spread --kafka`: the NBBO and orders topics (keyed by symbol, co-partitioned) merged into
one StreamingDataFrame, a stateful step per symbol (its last quote in the key's state, in
RocksDB as Quix keeps it) and a 55-byte result for every order of a symbol whose spread is too
wide, to the results topic, keyed by symbol. One process, at least once.

    BOOTSTRAP=127.0.0.1:9092 GROUP=ms NBBO=nbbo ORDERS=orders RESULTS=results \\
        python bench/market_spread_quix.py

Prints READY on standard error when the first record arrives (the benchmark takes its CPU and
time from there, leaving out start-up and the group join, as for the other pipelines).
"""
import os
import struct
import sys
import time

from quixstreams import Application

QUOTE = struct.Struct(">B4s21xdd")
ORDER = struct.Struct(">BBI6s4sdd21x")
RESULT = struct.Struct(">BI6s4sddddQ")


def main():
    app = Application(
        broker_address=os.environ["BOOTSTRAP"],
        consumer_group=os.environ["GROUP"],
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        state_dir=os.environ.get("STATE_DIR", "state"),
        loglevel="WARNING",
    )
    raw = dict(key_deserializer="bytes", value_deserializer="bytes")
    nbbo = app.topic(os.environ["NBBO"], **raw)
    orders = app.topic(os.environ["ORDERS"], **raw)
    results = app.topic(os.environ["RESULTS"], key_serializer="bytes", value_serializer="bytes")
    ready = [False]

    def step(value, state):
        if not ready[0]:
            ready[0] = True
            print("READY", file=sys.stderr, flush=True)
        if value[0] == 2:
            _, symbol, bid, offer = QUOTE.unpack(value)
            spread = offer - bid
            state.set("q", (spread >= 0.05 or spread / ((bid + offer) / 2) >= 0.05, bid, offer))
            return None
        _, side, account, oid, symbol, qty, price = ORDER.unpack(value)
        reject, bid, offer = state.get("q", (True, 0.0, 0.0))
        if reject:
            return RESULT.pack(side, account, oid, symbol, qty, price, bid, offer, time.time_ns())
        return None

    sdf = app.dataframe(nbbo).concat(app.dataframe(orders))
    sdf = sdf.apply(step, stateful=True).filter(lambda v: v is not None)
    sdf.to_topic(results)
    app.run()


if __name__ == "__main__":
    main()
