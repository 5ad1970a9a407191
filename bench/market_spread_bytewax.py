"""Market Spread in Bytewax (https://bytewax.io), the same job as `canter pipeline market-spread`:
NBBO quotes and orders keyed by symbol through one shared state, a 55-byte result for every
order of a symbol whose spread is too wide. Two dataflows:

- `flow` reads the framed files written by `canter send market-spread --write-dir` (every
  symbol's first quote first, then the two streams alternating in chunks) and writes the framed
  results to a file:

      NBBO=file ORDERS=file OUT=file python -m bytewax.run bench.market_spread_bytewax:flow

- `tcp_flow` takes the same wire format as canter's pipeline: the two streams framed (4-byte
  big-endian length) on two listeners, one connection each, and the framed results to a
  receiver its sink connects to; each result carries the time its order was read from the
  socket, as canter's do. Each source ends when its sender closes, the dataflow when both have.
  Reads are non-blocking and at most 256 KiB per call (Bytewax polls a source that returned
  nothing again after a millisecond), so a slow pipeline leaves input in the kernel and TCP
  holds the senders back, as with canter:

      NBBO=127.0.0.1:7301 ORDERS=127.0.0.1:7302 OUT=127.0.0.1:7300 \\
          python -m bytewax.run bench.market_spread_bytewax:tcp_flow
"""
import os
import socket
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


READ = 256 * 1024


def addr(name):
    host, port = os.environ[name].rsplit(":", 1)
    return host, int(port)


def listener(name):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(addr(name))
    s.listen(1)
    s.setblocking(False)
    return s


LISTENERS = {}


class TcpStream(StatefulSourcePartition):
    """One framed stream: accepts its connection, then hands out the complete frames of each
    read; an order gets the read's time appended (8 bytes, ns since the epoch)."""

    def __init__(self, name):
        self.listener = LISTENERS[name]
        self.stamp = name == "orders"
        self.conn = None
        self.buf = bytearray()

    def next_batch(self):
        if self.conn is None:
            try:
                self.conn, _ = self.listener.accept()
            except BlockingIOError:
                return []
            self.conn.setblocking(False)
        try:
            data = self.conn.recv(READ)
        except BlockingIOError:
            return []
        if not data:
            raise StopIteration()
        now = struct.pack(">Q", time.time_ns()) if self.stamp else b""
        buf = self.buf
        buf += data
        out = []
        at = 0
        while len(buf) - at >= 4:
            n = int.from_bytes(buf[at:at + 4], "big")
            if len(buf) - at - 4 < n:
                break
            out.append(bytes(buf[at + 4:at + 4 + n]) + now)
            at += 4 + n
        del buf[:at]
        return out

    def snapshot(self):
        return None

    def close(self):
        if self.conn is not None:
            self.conn.close()


class TcpInput(FixedPartitionedSource):
    def list_parts(self):
        # Bound when the dataflow starts, before any partition is built (the benchmark waits
        # for both ports to listen before it starts the senders).
        if not LISTENERS:
            LISTENERS.update(nbbo=listener("NBBO"), orders=listener("ORDERS"))
        return ["nbbo", "orders"]

    def build_part(self, step_id, for_part, resume_state):
        return TcpStream(for_part)


class TcpOut(StatefulSinkPartition):
    def __init__(self):
        self.sock = socket.create_connection(addr("OUT"))

    def write_batch(self, items):
        self.sock.sendall(b"".join(items))

    def snapshot(self):
        return None

    def close(self):
        self.sock.close()


class TcpOutput(FixedPartitionedSink):
    def list_parts(self):
        return ["out"]

    def build_part(self, step_id, for_part, resume_state):
        return TcpOut()


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
    # An order: 53 bytes, and from the TCP sources the 8-byte time it was read.
    if rec[0] == 1 and len(rec) in (53, 61) and state[0]:
        read_at = rec[53:61] if len(rec) == 61 else struct.pack(">Q", time.time_ns())
        result = rec[1:2] + rec[2:16] + rec[16:32] + struct.pack(">dd", state[1], state[2]) + read_at
        return state, struct.pack(">I", 55) + result
    return state, None


def market_spread(name, source, sink):
    flow = Dataflow(name)
    records = op.input("in", flow, source)
    keyed = op.key_on("symbol", records, symbol_of)
    results = op.stateful_map("check", keyed, check)
    # The sink is partitioned by key: it takes (key, result) pairs and writes the results.
    rejected = op.filter_map("rejected", results, lambda kv: kv if kv[1] is not None else None)
    op.output("out", rejected, sink)
    return flow


flow = market_spread("market_spread", Input(), Output())
tcp_flow = market_spread("market_spread_tcp", TcpInput(), TcpOutput())
