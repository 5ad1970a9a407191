"""Market Spread in Bytewax (https://bytewax.io), the same job as `canter pipeline market-spread`:
NBBO quotes and orders keyed by symbol through one shared state, a 55-byte result for every
order of a symbol whose spread is too wide. Reads the framed files written by `canter send
market-spread --write-dir` (every symbol's first quote first, then the two streams alternating
in chunks) and writes the framed results to a file.

    NBBO=... ORDERS=... OUT=... python -m bytewax.run bench/market_spread_bytewax:flow
"""
import os
import struct
import time

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

CHUNK = 1 << 20


def frames(data):
    at = 0
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        yield data[at + 4:at + 4 + n]
        at += 4 + n


class Files(StatefulSourcePartition):
    def __init__(self):
        nbbo = list(frames(open(os.environ["NBBO"], "rb").read()))
        orders = list(frames(open(os.environ["ORDERS"], "rb").read()))
        # The first quote of every symbol first (1,000 symbols), then both streams in batches.
        self.batches = [nbbo[:1000]]
        q, o = nbbo[1000:], orders
        for i in range(0, max(len(q), len(o)), 4096):
            self.batches.append(q[i:i + 4096] + o[i:i + 4096])
        self.batches.reverse()
        self.started = time.time()

    def next_batch(self):
        if not self.batches:
            raise StopIteration()
        return self.batches.pop()

    def snapshot(self):
        return None


class Input(FixedPartitionedSource):
    def list_parts(self):
        return ["files"]

    def build_part(self, step_id, for_key, resume_state):
        return Files()


class Out(StatefulSinkPartition):
    def __init__(self):
        self.f = open(os.environ["OUT"], "wb")

    def write_batch(self, items):
        self.f.write(b"".join(items))
        self.f.flush()

    def snapshot(self):
        return None

    def close(self):
        self.f.close()


class Output(FixedPartitionedSink):
    def list_parts(self):
        return ["out"]

    def build_part(self, step_id, for_part, resume_state):
        return Out()


def symbol_of(rec):
    return (rec[1:5] if rec[0] == 2 else rec[12:16]).decode("ascii")


def check(state, rec):
    """state: (reject, bid, offer); a quote updates it, an order may make a result."""
    if state is None:
        state = (True, 0.0, 0.0)
    if rec[0] == 2 and len(rec) == 42:
        bid, offer = struct.unpack(">dd", rec[26:42])
        spread = offer - bid
        return ((spread >= 0.05 or spread / ((bid + offer) / 2) >= 0.05), bid, offer), None
    if rec[0] == 1 and len(rec) == 53 and state[0]:
        ts = time.time_ns()
        result = (rec[1:2] + rec[2:16] + rec[16:32] + struct.pack(">ddQ", state[1], state[2], ts))
        return state, struct.pack(">I", 55) + result
    return state, None


flow = Dataflow("market_spread")
records = op.input("in", flow, Input())
keyed = op.key_on("symbol", records, symbol_of)
results = op.stateful_map("check", keyed, check)
rejected = op.filter_map("rejected", results, lambda kv: kv if kv[1] is not None else None)
op.output("out", rejected, Output())
