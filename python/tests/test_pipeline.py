"""canter.pipeline: flows written in Python, run on the Rust pipeline engine (in this process,
on worker threads), fed and read over real sockets and files."""

import json
import operator
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import canter.pipeline as cp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def framed(records):
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def write_framed(path, records):
    with open(path, "wb") as f:
        f.write(framed(records))
    return str(path)


def unframe(data):
    out, at = [], 0
    while at + 4 <= len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out


def run(flow, workers=1, timeout=30, **kw):
    flow.start(workers=workers, **kw)
    if not flow.wait(timeout):
        flow.shutdown()
        flow.wait(10)
        raise AssertionError("the flow did not end in time")
    return flow.stats()


class Receiver:
    """A TCP receiver of framed records (what `canter receive` does), on a thread; `paused`
    makes it accept and read nothing."""

    def __init__(self, paused=False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.records = []
        self.lock = threading.Lock()
        self.go = threading.Event()
        if not paused:
            self.go.set()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._read, args=(c,), daemon=True).start()

    def _read(self, c):
        self.go.wait()
        buf = b""
        while True:
            try:
                d = c.recv(1 << 16)
            except OSError:
                return
            if not d:
                return
            buf += d
            complete, at = [], 0
            while at + 4 <= len(buf):
                n = int.from_bytes(buf[at:at + 4], "big")
                if at + 4 + n > len(buf):
                    break
                complete.append(buf[at + 4:at + 4 + n])
                at += 4 + n
            buf = buf[at:]
            with self.lock:
                self.records.extend(complete)

    def wait_for(self, n, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if len(self.records) >= n:
                    return list(self.records)
            time.sleep(0.02)
        with self.lock:
            raise AssertionError(f"{len(self.records)} of {n} records arrived")

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def send(addr, records, conns=1):
    """Sends the framed records over `conns` connections (records dealt round-robin)."""
    host, port = addr
    socks = [socket.create_connection((host, port)) for _ in range(conns)]
    parts = [framed(records[i::conns]) for i in range(conns)]
    for s, p in zip(socks, parts):
        s.sendall(p)
    for s in socks:
        s.close()


def test_stateless_steps_in_order_with_inspect(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"1 2 3", b"4 5", b"", b"6"])
    seen, out = [], []
    flow = cp.Flow()
    (flow.source(cp.file(src, decode=cp.text))
        .flat_map(str.split)
        .map(int)
        .filter(lambda n: n % 2 == 0)
        .inspect(seen.append)
        .map(lambda n: n * 10)
        .sink(cp.collect(out)))
    stats = run(flow)
    assert out == [20, 40, 60]
    assert seen == [2, 4, 6]
    assert stats["p1"]["source"] == 4
    assert stats["p1"]["sink"] == 3
    assert stats["p1"]["failed"] == 0


def test_lines_framing_and_json_codecs_over_tcp():
    rx = Receiver()
    flow = cp.Flow()
    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.json)).named("events")
        .filter(lambda e: e["kind"] == "click")
        .map(lambda e: {"user": e["user"], "n": len(e["path"])})
        .sink(cp.tcp_out(rx.addr, encode=cp.json)))
    flow.start()
    try:
        lines = [b'{"kind":"click","user":"ann","path":"/a/b"}',
                 b'{"kind":"view","user":"bob","path":"/"}',
                 b'not json',
                 b'{"kind":"click","user":"cy","path":"/xyz"}']
        with socket.create_connection(flow.addrs()["events"]) as s:
            s.sendall(b"\n".join(lines) + b"\n")
        got = rx.wait_for(2)
        assert got == [b'{"user":"ann","n":4}', b'{"user":"cy","n":4}']
        deadline = time.time() + 10
        while flow.stats()["events"]["rejected"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        assert flow.stats()["events"]["rejected"] == 1, "the line that is not JSON is rejected input"
    finally:
        flow.shutdown()
        flow.wait(10)
        rx.close()


def test_struct_codecs_run_both_ways(tmp_path):
    fmt = ">B4sdq"
    recs = [struct.pack(fmt, i, b"AB%02d" % i, i / 4, -i) for i in range(5)]
    recs.append(b"short")
    src = write_framed(tmp_path / "in.bin", recs)
    out_path = tmp_path / "out.bin"
    flow = cp.Flow()
    (flow.source(cp.file(src, decode=cp.struct(fmt)))
        .map(lambda t: (t[0] + 1, t[1].lower(), t[2] * 2, t[3]))
        .sink(cp.file_out(out_path, encode=cp.struct(fmt))))
    stats = run(flow)
    got = [struct.unpack(fmt, r) for r in unframe(out_path.read_bytes())]
    assert got == [(i + 1, b"ab%02d" % i, i / 2, -i) for i in range(5)]
    assert stats["p1"]["rejected"] == 1, "a record of the wrong size is rejected input"


def test_python_decoder_and_encoder_functions(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"a=1", b"b=2", b"broken"])
    out_path = tmp_path / "out.bin"

    def decode(b):
        k, v = b.decode().split("=")
        return k, int(v)

    flow = cp.Flow()
    (flow.source(cp.file(src, decode=decode))
        .sink(cp.file_out(out_path, encode=lambda kv: f"{kv[0]}:{kv[1] * 2}".encode())))
    stats = run(flow)
    assert unframe(out_path.read_bytes()) == [b"a:2", b"b:4"]
    assert stats["p1"]["rejected"] == 1


def test_keyed_state_lives_on_one_worker_of_two():
    """Records of 200 keys arrive on 8 connections (spread over both workers' accept loops):
    each key's count goes 1, 2, ..., n in order, and each key is only ever handled by one
    worker thread, while both threads do work."""
    rx = Receiver()
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0})
    threads = {}

    def count(state, rec):
        key = rec.split(b":")[0]
        threads.setdefault(key, set()).add(threading.get_ident())
        state["n"] += 1
        return key + b" %d" % state["n"]

    (flow.source(cp.tcp("127.0.0.1:0")).named("in")
        .key_by(lambda r: r.split(b":")[0])
        .update(counts, count)
        .sink(cp.tcp_out(rx.addr)))
    flow.start(workers=2)
    try:
        records = [b"k%d:%d" % (i % 200, i) for i in range(20_000)]
        senders = [threading.Thread(target=send, args=(flow.addrs()["in"], records[j::4], 2))
                   for j in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        got = rx.wait_for(20_000)
    finally:
        flow.shutdown()
        flow.wait(10)
        rx.close()
    per_key = {}
    for r in got:
        k, n = r.split(b" ")
        per_key.setdefault(k, []).append(int(n))
    assert len(per_key) == 200
    for k, ns in per_key.items():
        assert sorted(ns) == list(range(1, 101)), k
    assert all(len(t) == 1 for t in threads.values()), "a key moved between workers"
    assert len(set().union(*threads.values())) == 2, "both workers own keys"


def test_shared_state_and_stateful_map(tmp_path):
    """Two pipelines share a state (one writes, the other reads it, as Market Spread's quotes
    and orders do); stateful_map replaces an immutable state."""
    quotes = write_framed(tmp_path / "q.bin", [b"a 1", b"b 2"])
    flow = cp.Flow()
    prices = flow.keyed_state(lambda: None)
    totals = flow.keyed_state(lambda: 0)
    out, sums = [], []

    def set_price(state, rec):
        state["price"] = int(rec.split()[1])

    flow.source(cp.file(quotes, decode=cp.text)).named("quotes") \
        .key_by(lambda r: r.split()[0]) \
        .update(flow.keyed_state(dict), set_price) \
        .sink(cp.discard())
    src = write_framed(tmp_path / "n.bin", [b"x 1", b"x 2", b"y 5", b"x 3"])
    flow.source(cp.file(src, decode=cp.text)).named("sums") \
        .map(str.split) \
        .key_by(lambda r: r[0]) \
        .stateful_map(totals, lambda total, r: (total + int(r[1]), (r[0], total + int(r[1])))) \
        .sink(cp.collect(sums))
    del prices, out
    run(flow, workers=2)
    assert sorted(sums) == [("x", 1), ("x", 3), ("x", 6), ("y", 5)]


def test_count_windows_tumbling_and_sliding(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"a%d" % i for i in range(7)] + [b"b1"])
    tumbling, sliding = [], []
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).named("t") \
        .key_by(lambda r: r[0]) \
        .count_window(3, init=list, fold=lambda acc, r: acc + [r]) \
        .sink(cp.collect(tumbling))
    flow.source(cp.file(src, decode=cp.text)).named("s") \
        .key_by(lambda r: r[0]) \
        .count_window(4, slide=2, reduce=lambda a, b: a + "," + b) \
        .sink(cp.collect(sliding))
    run(flow)
    # The windows still short at the end come out last, with the end they reached.
    assert tumbling[:2] == [("a", 0, 3, ["a0", "a1", "a2"]), ("a", 3, 6, ["a3", "a4", "a5"])]
    assert sorted(tumbling[2:]) == [("a", 6, 7, ["a6"]), ("b", 0, 1, ["b1"])]
    assert sliding[:2] == [("a", 0, 4, "a0,a1,a2,a3"), ("a", 2, 6, "a2,a3,a4,a5")]
    assert sorted(sliding[2:]) == [("a", 4, 7, "a4,a5,a6"), ("a", 6, 7, "a6"), ("b", 0, 1, "b1")]


def test_time_windows_tumbling_sliding_and_late(tmp_path):
    # (key, event time in seconds, value)
    events = [("k", 0.5, 1), ("k", 1.2, 2), ("k", 1.9, 3), ("k", 3.1, 4),
              ("k", 1.5, 100),  # late: its window [1, 2) closed when 3.1 arrived
              ("j", 10.0, 7)]
    src = write_framed(tmp_path / "in.bin", [f"{k} {t} {v}".encode() for k, t, v in events])
    tumbling, sliding = [], []
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).named("t") \
        .map(str.split) \
        .key_by(lambda e: e[0]) \
        .time_window(1.0, time=lambda e: float(e[1]), init=int, fold=lambda a, e: a + int(e[2])) \
        .sink(cp.collect(tumbling))
    flow.source(cp.file(src, decode=cp.text)).named("s") \
        .map(str.split) \
        .key_by(lambda e: e[0]) \
        .time_window(2.0, slide=1.0, time=lambda e: float(e[1]), init=int,
                     fold=lambda a, e: a + int(e[2])) \
        .sink(cp.collect(sliding))
    stats = run(flow)
    assert sorted(tumbling) == [("j", 10.0, 11.0, 7), ("k", 0.0, 1.0, 1), ("k", 1.0, 2.0, 5),
                                ("k", 3.0, 4.0, 4)]
    assert stats["t"]["late"] == 1
    # Windows of 2 s every 1 s: [-1,1) [0,2) [1,3) [2,4) [3,5); 3.1 closed every window
    # ending by then, both of 1.5's among them.
    assert sorted(sliding) == [("j", 9.0, 11.0, 7), ("j", 10.0, 12.0, 7),
                               ("k", -1.0, 1.0, 1), ("k", 0.0, 2.0, 6), ("k", 1.0, 3.0, 5),
                               ("k", 2.0, 4.0, 4), ("k", 3.0, 5.0, 4)]
    assert stats["s"]["late"] == 1


def test_exceptions_are_logged_counted_and_skipped(tmp_path, capfd):
    src = write_framed(tmp_path / "in.bin", [b"1", b"0", b"4", b"x"])
    out = []

    def invert(n):
        return 1 / n

    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).map(int).map(invert).sink(cp.collect(out))
    stats = run(flow)
    assert out == [1.0, 0.25]
    assert stats["p1"]["failed"] == 2
    err = capfd.readouterr().err
    assert "ZeroDivisionError" in err and "in invert" in err, err
    assert "invalid literal for int()" in err, err


def test_errors_stop_raises_and_dead_letter_keeps_the_records(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"1", b"oops", b"2"])
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).map(int).sink(cp.discard())
    flow.start(errors="stop")
    with pytest.raises(cp.PipelineError, match="invalid literal"):
        flow.wait(20)
    dead = tmp_path / "dead.jsonl"
    out = []
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).map(int).sink(cp.collect(out))
    stats = run(flow, errors=cp.dead_letter(dead))
    assert out == [1, 2]
    assert stats["p1"]["failed"] == 1
    import json
    lines = [json.loads(l) for l in dead.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["record"] == "'oops'" and "invalid literal" in lines[0]["error"]
    assert lines[0]["step"].endswith(":map:int")


def test_bad_keys_and_bad_specs_are_clear_errors(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"a", b"b"])
    flow = cp.Flow()
    out = []
    flow.source(cp.file(src, decode=cp.text)).key_by(lambda r: 1.5 if r == "a" else r) \
        .sink(cp.collect(out))
    stats = run(flow)
    assert out == ["b"] and stats["p1"]["failed"] == 1
    flow = cp.Flow()
    s = flow.source(cp.file(src))
    s.map(len)
    # A stream may take several next steps (fan-out); each must end in a sink.
    s.filter(bool).sink(cp.discard())
    with pytest.raises(ValueError, match="ends without a sink"):
        flow.start()
    with pytest.raises(ValueError, match="frame="):
        cp.tcp("127.0.0.1:0", frame="xml")
    with pytest.raises(ValueError, match="fold= .* or reduce="):
        cp.Flow().source(cp.file(src)).key_by(len).count_window(2)


def test_a_stalled_sink_holds_the_sources_back_with_bounded_memory():
    """The receiver takes the connection but reads nothing: the pipeline's buffers fill to
    their bounds, then its source stops reading and TCP holds the sender back. The process's
    memory stays bounded; once the receiver reads, every record arrives."""
    rx = Receiver(paused=True)
    flow = cp.Flow()
    (flow.source(cp.tcp("127.0.0.1:0")).named("in")
        .map(lambda r: r * 4)
        .sink(cp.tcp_out(rx.addr)))
    flow.start()
    record = b"x" * 1000
    total = 200_000  # 800 MB of output if nothing held the sender back
    sent = [0]
    stop = threading.Event()

    def sender():
        with socket.create_connection(flow.addrs()["in"]) as s:
            chunk = framed([record] * 100)
            while sent[0] < total and not stop.is_set():
                s.sendall(chunk)
                sent[0] += 100

    def rss_kib():
        with open("/proc/self/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    try:
        before = rss_kib()
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        time.sleep(3)
        stalled_at = sent[0]
        time.sleep(1)
        assert sent[0] == stalled_at, "the sender is held back while the sink is stalled"
        assert sent[0] < total // 4, f"{sent[0]} records taken in with the sink stalled"
        grown = rss_kib() - before
        assert grown < 200 * 1024, f"memory grew by {grown} KiB with the sink stalled"
        rx.go.set()
        t.join(60)
        assert not t.is_alive()
        got = rx.wait_for(total, timeout=60)
        assert len(got) == total and got[0] == record * 4
    finally:
        stop.set()
        rx.go.set()
        flow.shutdown()
        flow.wait(10)
        rx.close()


def test_python_m_canter_pipeline_runs_a_module_flow(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"hello world", b"bye"])
    out = tmp_path / "out.bin"
    (tmp_path / "wc.py").write_text(
        "import canter.pipeline as cp\n"
        "flow = cp.Flow()\n"
        f"flow.source(cp.file({str(src)!r}, decode=cp.text)).flat_map(str.split)"
        f".map(str.upper).sink(cp.file_out({str(out)!r}, encode=cp.text))\n")
    r = subprocess.run([sys.executable, "-m", "canter", "pipeline", "wc:flow", "--workers", "2"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(unframe(out.read_bytes())) == [b"BYE", b"HELLO", b"WORLD"]
    assert "'source': 2" in r.stderr


def test_the_readme_pipeline_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- pipeline example -->\s*```python\n(.*?)```", readme, re.S)
    assert m, "README.md has its pipeline example"
    code = m.group(1)
    # The example reads words.txt (lines) and writes running.txt and totals.txt (lines) in
    # its directory.
    (tmp_path / "words.txt").write_text("the cat\nthe dog\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    running = sorted((tmp_path / "running.txt").read_text().splitlines())
    assert running == ["cat 1", "dog 1", "the 1", "the 2"]
    totals = sorted((tmp_path / "totals.txt").read_text().splitlines())
    assert totals == ["cat 1", "dog 1", "the 2"]


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """One real Kafka broker for the suite (tools/kafka/kafka.sh: Kafka's jars from Maven
    Central on the machine's Java), stopped at the end; the tests fail if it cannot start."""
    script = os.path.join(ROOT, "tools", "kafka", "kafka.sh")
    d = tmp_path_factory.mktemp("kafka")
    r = subprocess.run(["bash", script, "start", str(d), "--watch", str(os.getpid())],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"kafka.sh start failed:\n{r.stdout}\n{r.stderr}"
    yield (d / "bootstrap").read_text().strip()
    subprocess.run(["bash", script, "stop", str(d)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def kafka_secure(tmp_path_factory):
    """A broker with secured listeners (kafka.sh --secure; a throwaway CA from trustme): its
    SASL_SSL address and the librdkafka settings of user alice with SCRAM-SHA-256, which
    confluent-kafka and canter both take."""
    import trustme
    tls = tmp_path_factory.mktemp("kafka-tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tls / "ca.pem"))
    ca.cert_pem.write_to_path(str(tls / "client-ca.pem"))
    from cryptography.hazmat.primitives import serialization as ser

    def keystore(name, path):
        # Kafka's PEM keystore reads PKCS#8 keys only; trustme writes OpenSSL's older form.
        cert = ca.issue_cert(name)
        key = ser.load_pem_private_key(cert.private_key_pem.bytes(), None)
        pkcs8 = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                  ser.NoEncryption())
        path.write_bytes(pkcs8 + b"".join(c.bytes() for c in cert.cert_chain_pems))

    keystore("localhost", tls / "localhost.keystore.pem")
    keystore("127.0.0.1", tls / "ip.keystore.pem")
    script = os.path.join(ROOT, "tools", "kafka", "kafka.sh")
    d = tmp_path_factory.mktemp("kafka-secure")
    r = subprocess.run(["bash", script, "start", str(d), "--secure", str(tls),
                        "--watch", str(os.getpid())],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"kafka.sh start --secure failed:\n{r.stdout}\n{r.stderr}"
    listeners = dict(line.split("=", 1) for line in (d / "listeners").read_text().split())
    config = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
              "sasl.username": "alice", "sasl.password": "alice-secret",
              "ssl.ca.location": str(tls / "ca.pem")}
    yield listeners["sasl_ssl"], config
    subprocess.run(["bash", script, "stop", str(d)], capture_output=True, timeout=120)


def kafka_topics(bootstrap, *names, partitions=2, config=None):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    for name, f in admin.create_topics(
            [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]).items():
        f.result(30)


def kafka_produce(bootstrap, topic, records, config=None):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})
    for k, v in records:
        p.produce(topic, key=k, value=v)
    assert p.flush(30) == 0


def kafka_read(bootstrap, topic, n, timeout=60, config=None, settle=0.0):
    """`topic`'s committed values (all partitions): at least `n` (within `timeout` seconds),
    and with `settle` any more that come within that many seconds after them (to see a
    record that came twice)."""
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.auto.commit": False, **(config or {})})
    c.subscribe([topic])
    out, deadline, quiet = [], time.time() + timeout, None
    try:
        while time.time() < deadline:
            if len(out) >= n:
                quiet = quiet or time.time() + settle
                if time.time() >= quiet:
                    break
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append((m.key(), m.value()))
    finally:
        c.close()
    assert len(out) >= n, f"{len(out)} of {n} results on {topic}"
    return out


def kafka_read_all(bootstrap, topic, n, settle=3.0):
    """`kafka_read` waiting `settle` seconds more after the `n`th value, for one that came
    twice."""
    return kafka_read(bootstrap, topic, n, settle=settle)


def test_errors_stop_under_exactly_once_commits_no_part_of_the_failing_record(kafka_bootstrap):
    """Under exactly-once, a record that changed its key's state and then raised
    (errors="stop") leaves nothing of itself committed: not its state change, not its offset;
    the transaction it was in aborts. The next run (without the bug) counts every record once:
    the running counts are exact, none twice."""
    tag = f"stopeos{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=1)
    kafka_produce(kafka_bootstrap, src, [(b"k", str(i).encode()) for i in range(500)])

    def flow_failing_at(bad):
        flow = cp.Flow()
        counts = flow.keyed_state(lambda: {"n": 0}, name="counts")

        def count(state, n):
            state["n"] += 1
            if n == bad:
                raise ValueError(f"{n} is bad")
            return f"{n} {state['n']}"
        (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text))
            .map(int).key_by(lambda n: "k").update(counts, count)
            .sink(cp.kafka_out(dst, encode=cp.text)))
        return flow

    # The step named as the file engine names it (its third step).
    with pytest.raises(cp.PipelineError, match="step 3:update raised.*300 is bad"):
        flow_failing_at(300).run(errors="stop", exactly_once=True, commit_interval=0.1)
    flow = flow_failing_at(None)
    flow.start(exactly_once=True, commit_interval=0.1)
    try:
        got = kafka_read_all(kafka_bootstrap, dst, 500)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert [v.decode() for _, v in got] == [f"{i} {i + 1}" for i in range(500)]


def word_count_flow(bootstrap, group, src, dst, config=None):
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0}, name="counts")

    def count(state, word):
        state["n"] += 1
        return f"{word} {state['n']}"

    (flow.source(cp.kafka(src, bootstrap, group=group, decode=cp.text, config=config))
        .key_by(lambda w: w)
        .update(counts, count)
        .sink(cp.kafka_out(dst, encode=cp.text, config=config)))
    return flow


def test_time_windows_on_kafka_keep_their_open_windows_in_the_changelog(kafka_bootstrap):
    """A time window on a Kafka flow: windows close as later records of their key come, and
    the window still open when the flow stops is in the changelog: the next run (the same
    group) closes it with the records from before the restart."""
    tag = f"win{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=2)
    words = ["a", "b", "c"]
    kafka_produce(kafka_bootstrap, src,
                  [(w.encode(), f"{w} {t}".encode()) for t in range(200) for w in words])

    def windows():
        flow = cp.Flow()
        (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text))
            .map(str.split).key_by(lambda r: r[0])
            .time_window(10, time=lambda r: int(r[1]), init=int, fold=lambda n, r: n + 1)
            .map(lambda w: f"{w[0]} {int(w[1])} {w[3]}")
            .sink(cp.kafka_out(dst, encode=cp.text)))
        return flow
    flow = windows()
    flow.start(commit_interval=0.1)
    try:
        got = kafka_read(kafka_bootstrap, dst, 57)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    closed = [f"{w} {s} 10" for w in words for s in range(0, 190, 10)]
    assert sorted(v.decode() for _, v in got) == sorted(closed)
    kafka_produce(kafka_bootstrap, src, [(w.encode(), f"{w} 205".encode()) for w in words])
    flow = windows()
    flow.start(commit_interval=0.1)
    try:
        got = kafka_read(kafka_bootstrap, dst, 60)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    # A clean stop commits what it wrote: nothing comes twice.
    assert sorted(v.decode() for _, v in got) == sorted(closed + [f"{w} 190 10" for w in words])


def test_session_windows_on_kafka_close_across_a_restart(kafka_bootstrap):
    """Session windows on a Kafka flow: bursts 100 s apart are sessions (gap 10 s), each
    emitted when the next burst's first record comes; the open one is in the changelog, and
    the next run closes it."""
    tag = f"ses{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=2)
    words = ["a", "b"]
    times = [100 * b + i for b in range(5) for i in range(0, 8, 2)]
    kafka_produce(kafka_bootstrap, src,
                  [(w.encode(), f"{w} {t}".encode()) for t in times for w in words])

    def sessions():
        flow = cp.Flow()
        (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text))
            .map(str.split).key_by(lambda r: r[0])
            .session_window(10, time=lambda r: int(r[1]), init=int, fold=lambda n, r: n + 1)
            .map(lambda w: f"{w[0]} {int(w[1])} {int(w[2])} {w[3]}")
            .sink(cp.kafka_out(dst, encode=cp.text)))
        return flow
    closed = [f"{w} {100 * b} {100 * b + 6} 4" for w in words for b in range(4)]
    flow = sessions()
    flow.start(commit_interval=0.1)
    try:
        got = kafka_read(kafka_bootstrap, dst, len(closed))
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert sorted(v.decode() for _, v in got) == sorted(closed)
    kafka_produce(kafka_bootstrap, src, [(w.encode(), f"{w} 1000".encode()) for w in words])
    flow = sessions()
    flow.start(commit_interval=0.1)
    try:
        got = kafka_read(kafka_bootstrap, dst, len(closed) + 2)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert sorted(v.decode() for _, v in got) == sorted(closed + [f"{w} 400 406 4" for w in words])


class _Summer:
    """A `stateful()` logic: sums a key's records, and when its time comes (`due`, set by
    the first record `delay` seconds on) emits the sum and discards itself."""
    delay = 1.0
    fires = True

    def __init__(self, resume):
        self.total, self.due = (resume["total"], resume["due"]) if resume else (0, None)

    def on_item(self, r):
        self.total += int(r[1])
        if self.due is None:
            self.due = time.time() + self.delay
        return [], False

    def on_notify(self):
        return [self.total], True

    def on_eof(self):
        return [], False

    def notify_at(self):
        return self.due if self.fires else None

    def snapshot(self):
        return {"total": self.total, "due": self.due}


class _SummerNotFiring(_Summer):
    fires = False


def _summer_flow(bootstrap, group, src, dst, logic):
    flow = cp.Flow()
    (flow.source(cp.kafka(src, bootstrap, group=group, decode=cp.text))
        .map(str.split).key_by(lambda r: r[0]).stateful(logic)
        .map(lambda kv: f"{kv[0]} {kv[1]}").sink(cp.kafka_out(dst, encode=cp.text)))
    return flow


def _committed(bootstrap, group, topic, partitions):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    return sum(max(tp.offset, 0) for tp in tps)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_stateful_logic_on_kafka_wakes_its_keys_at_their_notify_at(kafka_bootstrap,
                                                                  exactly_once):
    """`stateful()` on a Kafka flow: a key's logic is woken at the time its `notify_at()`
    gives, with no record coming after it: each key's sum is emitted by `on_notify`, once."""
    tag = f"logic{int(exactly_once)}{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=2)
    recs = [("a", 1), ("b", 5), ("a", 2), ("c", 7), ("b", 1)]
    kafka_produce(kafka_bootstrap, src, [(k.encode(), f"{k} {v}".encode()) for k, v in recs])
    flow = _summer_flow(kafka_bootstrap, tag, src, dst, _Summer)
    flow.start(workers=2, exactly_once=exactly_once, commit_interval=0.1)
    try:
        got = kafka_read_all(kafka_bootstrap, dst, 3)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert sorted(v.decode() for _, v in got) == ["a 3", "b 6", "c 7"]


def test_stateful_logic_on_kafka_keeps_its_snapshot_and_wake_ups_across_a_restart(
        kafka_bootstrap):
    """A key's logic goes to the changelog as its `snapshot()`: the next run of the group
    builds it again from that (Bytewax's resume state), asks its `notify_at()`, and wakes it
    then, with no new record: the sums of the first run's records come out once."""
    tag = f"logicr{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=2)
    recs = [("a", 1), ("b", 5), ("a", 2), ("c", 7), ("b", 1)]
    kafka_produce(kafka_bootstrap, src, [(k.encode(), f"{k} {v}".encode()) for k, v in recs])
    # The first run's logic never asks to be woken: it only keeps the sums.
    flow = _summer_flow(kafka_bootstrap, tag, src, dst, _SummerNotFiring)
    flow.start(commit_interval=0.1)
    try:
        deadline = time.time() + 60
        while _committed(kafka_bootstrap, tag, src, 2) < len(recs):
            assert time.time() < deadline, "the first run did not commit its records"
            time.sleep(0.2)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    flow = _summer_flow(kafka_bootstrap, tag, src, dst, _Summer)
    flow.start(commit_interval=0.1)
    try:
        got = kafka_read_all(kafka_bootstrap, dst, 3)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert sorted(v.decode() for _, v in got) == ["a 3", "b 6", "c 7"]


def _bounded_count_flow(bootstrap, group, src, dst):
    flow = cp.Flow()
    (flow.source(cp.kafka(src, bootstrap, group=group, decode=cp.text, tail=False))
        .key_by(lambda w: w).count_final()
        .map(lambda kv: f"{kv[0]} {kv[1]}").sink(cp.kafka_out(dst, encode=cp.text)))
    return flow


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_bounded_kafka_read_ends_with_its_final_aggregations(kafka_bootstrap, exactly_once):
    """`kafka(..., tail=False)`: the flow reads the topic's partitions to their ends, emits
    each key's `count_final`, commits, and `run` returns by itself (two workers sharing three
    partitions). A second run of the group reads only what came since: its counts are the new
    records', and none of the first run's comes again."""
    tag = f"bnd{int(exactly_once)}{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=3)
    words = [f"w{i % 30}" for i in range(3000)]
    kafka_produce(kafka_bootstrap, src, [(w.encode(), w.encode()) for w in words])
    stats = _bounded_count_flow(kafka_bootstrap, tag, src, dst).run(
        workers=2, exactly_once=exactly_once, commit_interval=0.1)
    assert stats["kafka"]["records_in"] == 3000, stats
    got = kafka_read_all(kafka_bootstrap, dst, 30)
    assert sorted(v.decode() for _, v in got) == sorted(f"w{i} 100" for i in range(30))
    more = [f"w{i % 7}" for i in range(70)]
    kafka_produce(kafka_bootstrap, src, [(w.encode(), w.encode()) for w in more])
    _bounded_count_flow(kafka_bootstrap, tag, src, dst).run(
        workers=2, exactly_once=exactly_once, commit_interval=0.1)
    got = kafka_read_all(kafka_bootstrap, dst, 37)
    assert sorted(v.decode() for _, v in got) == sorted(
        [f"w{i} 100" for i in range(30)] + [f"w{i} 10" for i in range(7)])


def test_a_bounded_kafka_read_flushes_open_windows_and_runs_on_eof(kafka_bootstrap):
    """At the end of a bounded read, the windows still open are emitted (as at the end of a
    file), and an `update`'s `on_eof(state)` runs for each key."""
    tag = f"bndw{time.time_ns() % 10**9}"
    src, dst, dst2 = f"{tag}-in", f"{tag}-out", f"{tag}-eof"
    kafka_topics(kafka_bootstrap, src, dst, dst2, partitions=2)
    recs = [(w, t) for t in range(0, 30, 3) for w in ("a", "b")]
    kafka_produce(kafka_bootstrap, src, [(w.encode(), f"{w} {t}".encode()) for w, t in recs])
    flow = cp.Flow()
    (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text, tail=False))
        .map(str.split).key_by(lambda r: r[0])
        .time_window(10, time=lambda r: int(r[1]), init=int, fold=lambda n, r: n + 1)
        .map(lambda w: f"{w[0]} {int(w[1])} {w[3]}").sink(cp.kafka_out(dst, encode=cp.text)))
    flow.run(commit_interval=0.1)
    got = kafka_read_all(kafka_bootstrap, dst, 6)
    # Windows [0, 10), [10, 20), [20, 30) of each key: 4, 3 and 3 records; the last was open.
    assert sorted(v.decode() for _, v in got) == sorted(
        f"{w} {s} {n}" for w in ("a", "b") for s, n in ((0, 4), (10, 3), (20, 3)))
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0}, name="counts")

    def count(state, r):
        state["n"] += 1
    (flow.source(cp.kafka(src, kafka_bootstrap, group=f"{tag}-2", decode=cp.text, tail=False))
        .map(str.split).key_by(lambda r: r[0])
        .update(counts, count, on_eof=lambda state: f"{state['n']} in all")
        .map(lambda kv: kv if isinstance(kv, str) else str(kv))
        .sink(cp.kafka_out(dst2, encode=cp.text)))
    flow.run(commit_interval=0.1)
    got = kafka_read_all(kafka_bootstrap, dst2, 2)
    assert sorted(v.decode() for _, v in got) == ["10 in all", "10 in all"]


@pytest.mark.parametrize("exactly_once", [False, True])
def test_merge_branch_and_fan_out_on_kafka(kafka_bootstrap, exactly_once):
    """A graph on Kafka: two co-partitioned topics merged (one with steps of its own), keyed,
    counted by `stateful_map`, the counts read by two steps (fan-out): a branch on parity
    whose two sides both write the output topic, and a map that writes it too. Every record
    of both topics is counted once (each word's counts run 1..n over both topics), every
    result is keyed by its word (through the branch), and `run` ends by itself (tail=False)
    over two workers sharing three partitions."""
    tag = f"graph{int(exactly_once)}{time.time_ns() % 10**9}"
    src_a, src_b, dst = f"{tag}-a", f"{tag}-b", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src_a, src_b, dst, partitions=3)
    a = [f"w{i % 20}" for i in range(600)]
    b = [f"w{i % 15}" for i in range(450)]
    kafka_produce(kafka_bootstrap, src_a, [(w.encode(), w.encode()) for w in a])
    # Topic b's records are upper case; its own steps make them the same words.
    kafka_produce(kafka_bootstrap, src_b, [(w.encode(), w.upper().encode()) for w in b])
    flow = cp.Flow()
    ka = flow.source(cp.kafka(src_a, kafka_bootstrap, group=tag, decode=cp.text, tail=False))
    kb = (flow.source(cp.kafka(src_b, kafka_bootstrap, group=tag, decode=cp.text, tail=False))
          .map(str.lower).filter(lambda w: w.startswith("w")))
    counted = (cp.merge(ka, kb).key_by(lambda w: w)
               .stateful_map(flow.keyed_state(int), lambda n, w: (n + 1, (w, n + 1))))
    even, odd = counted.branch(lambda wn: wn[1] % 2 == 0)
    even.map(lambda wn: f"even {wn[0]} {wn[1]}").sink(cp.kafka_out(dst, encode=cp.text))
    odd.map(lambda wn: f"odd {wn[0]} {wn[1]}").sink(cp.kafka_out(dst, encode=cp.text))
    counted.map(lambda wn: f"all {wn[0]} {wn[1]}").sink(cp.kafka_out(dst, encode=cp.text))
    stats = flow.run(workers=2, exactly_once=exactly_once, commit_interval=0.1)
    assert stats["kafka"]["records_in"] == len(a) + len(b), stats
    total = {}
    for w in a + b:
        total[w] = total.get(w, 0) + 1
    want = sorted([f"{'even' if n % 2 == 0 else 'odd'} {w} {n}"
                   for w, t in total.items() for n in range(1, t + 1)]
                  + [f"all {w} {n}" for w, t in total.items() for n in range(1, t + 1)])
    got = kafka_read_all(kafka_bootstrap, dst, len(want))
    assert sorted(v.decode() for _, v in got) == want
    for k, v in got:
        assert k == v.decode().split()[1].encode(), f"{v!r} keyed {k!r}"


@pytest.mark.parametrize("exactly_once", [False, True])
def test_join_on_kafka_keeps_its_sides_in_the_changelog(kafka_bootstrap, exactly_once):
    """Orders and fills on two co-partitioned topics joined by order id (Bytewax's defaults:
    insert "last", emit "complete"). The first run reads only orders (each waits in its key's
    state, in the changelog); a second run of the group, after the fills came, restores them
    and emits one row per filled order, keyed by the id; a third sees nothing new. With
    emit="final", a group's one run emits every order, with its fill or None, at the end."""
    tag = f"kjoin{int(exactly_once)}{time.time_ns() % 10**9}"
    orders_t, fills_t, dst = f"{tag}-orders", f"{tag}-fills", f"{tag}-out"
    kafka_topics(kafka_bootstrap, orders_t, fills_t, dst, partitions=3)
    orders = [(f"o{i}", i % 7) for i in range(300)]
    fills = [(f"o{i}", 10 * i) for i in range(0, 300, 3)]

    def flow(group=tag, out=dst, emit="complete"):
        f = cp.Flow()
        o = (f.source(cp.kafka(orders_t, kafka_bootstrap, group=group, decode=cp.json,
                               tail=False)).key_by(lambda r: r[0]))
        x = (f.source(cp.kafka(fills_t, kafka_bootstrap, group=group, decode=cp.json,
                               tail=False)).key_by(lambda r: r[0]))
        (o.join(x, emit=emit)
            .map(lambda kv: json.dumps([kv[0]] + [s and s[1] for s in kv[1]]))
            .sink(cp.kafka_out(out, encode=cp.text)))
        return f

    kafka_produce(kafka_bootstrap, orders_t, [(k.encode(), json.dumps([k, q]).encode())
                                              for k, q in orders])
    stats = flow().run(workers=2, exactly_once=exactly_once, commit_interval=0.1)
    assert stats["kafka"]["records_in"] == len(orders), stats
    assert stats["kafka"]["records_out"] == 0, stats
    kafka_produce(kafka_bootstrap, fills_t, [(k.encode(), json.dumps([k, p]).encode())
                                             for k, p in fills])
    stats = flow().run(workers=2, exactly_once=exactly_once, commit_interval=0.1)
    assert stats["kafka"]["records_in"] == len(fills), stats
    got = kafka_read_all(kafka_bootstrap, dst, len(fills))
    want = sorted(json.dumps([k, int(k[1:]) % 7, p]) for k, p in fills)
    assert sorted(v.decode() for _, v in got) == want
    for k, v in got:
        assert k == json.loads(v)[0].encode()
    stats = flow().run(workers=1, exactly_once=exactly_once, commit_interval=0.1)
    assert stats["kafka"]["records_in"] == 0 and stats["kafka"]["records_out"] == 0, stats
    # emit="final": at the end of the read, every order with its fill or None.
    kafka_topics(kafka_bootstrap, f"{dst}-final", partitions=3)
    flow(f"{tag}-final", f"{dst}-final", "final").run(
        workers=2, exactly_once=exactly_once, commit_interval=0.1)
    got = kafka_read_all(kafka_bootstrap, f"{dst}-final", len(orders))
    paid = dict(fills)
    assert sorted(v.decode() for _, v in got) == sorted(
        json.dumps([k, q, paid.get(k)]) for k, q in orders)


def test_a_kafka_flow_writes_one_output_topic_and_keeps_one_state(kafka_bootstrap):
    """What a graph on Kafka cannot do yet is refused by name: two output topics, two states."""
    flow = cp.Flow()
    yes, no = flow.source(cp.kafka("t", kafka_bootstrap, group="g")).branch(bool)
    yes.sink(cp.kafka_out("o1"))
    no.sink(cp.kafka_out("o2"))
    with pytest.raises(ValueError, match="one output topic"):
        flow.start()
    flow = cp.Flow()
    k = flow.source(cp.kafka("t", kafka_bootstrap, group="g")).key_by(len)
    k.update(flow.keyed_state(dict), lambda s, r: r).sink(cp.kafka_out("o"))
    k.update(flow.keyed_state(dict), lambda s, r: r).sink(cp.kafka_out("o"))
    with pytest.raises(ValueError, match="share one keyed state"):
        flow.start()
    flow = cp.Flow()
    counts = flow.keyed_state(int)
    (flow.source(cp.kafka("t", kafka_bootstrap, group="g")).key_by(len)
        .stateful_map(counts, lambda n, r: (n + 1, r)).key_by(str)
        .stateful_map(counts, lambda n, r: (n + 1, r)).sink(cp.kafka_out("o")))
    with pytest.raises(ValueError, match="changes the key"):
        flow.start()


def test_final_aggregations_on_kafka_need_tail_false(kafka_bootstrap):
    flow = cp.Flow()
    (flow.source(cp.kafka("a", kafka_bootstrap, group="g")).key_by(lambda w: w).count_final()
        .sink(cp.kafka_out("b")))
    with pytest.raises(ValueError, match="tail=False"):
        flow.start()


def test_ttl_on_kafka_expires_a_keys_state_into_a_tombstone(kafka_bootstrap):
    """`ttl=` on a Kafka flow: a key with no record for `ttl` seconds loses its state (a
    tombstone in the changelog); its next record counts from the factory's state again."""
    from confluent_kafka import Consumer
    tag = f"ttl{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=1)
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0}, name="counts")

    def count(state, word):
        state["n"] += 1
        return f"{word} {state['n']}"
    (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text))
        .key_by(lambda w: w).update(counts, count, ttl=0.5)
        .sink(cp.kafka_out(dst, encode=cp.text)))
    kafka_produce(kafka_bootstrap, src, [(b"a", b"a")] * 3)
    flow.start(commit_interval=0.1)
    try:
        assert sorted(v.decode() for _, v in kafka_read(kafka_bootstrap, dst, 3)) == [
            "a 1", "a 2", "a 3"]
        c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"cl-{tag}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([f"{tag}-state-changelog"])
        deadline, tombstone = time.time() + 60, False
        try:
            while not tombstone:
                assert time.time() < deadline, "no tombstone in the changelog"
                m = c.poll(0.5)
                tombstone = m is not None and m.error() is None and m.value() is None
        finally:
            c.close()
        kafka_produce(kafka_bootstrap, src, [(b"a", b"a")])
        got = kafka_read(kafka_bootstrap, dst, 4)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert [v.decode() for _, v in got][3:] == ["a 1"]


@pytest.mark.parametrize("exactly_once", [False, True])
def test_errors_stop_on_kafka_commits_nothing_from_the_failing_record_on(kafka_bootstrap,
                                                                        exactly_once):
    """errors="stop" on a Kafka flow: the results of the records before the failing one are
    written, none after it; the group's committed offset is the failing record's (under
    exactly-once, the last commit's before it: the failing record's transaction aborts), so
    the next run (without the bug) starts there and every record has its result once."""
    from confluent_kafka import Consumer, TopicPartition
    tag = f"stop{time.time_ns() % 10**9}{int(exactly_once)}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=1)
    kafka_produce(kafka_bootstrap, src, [(None, str(i).encode()) for i in range(500)])

    def flow_failing_at(bad):
        def check(n):
            if n == bad:
                raise ValueError(f"{n} is bad")
            return n
        flow = cp.Flow()
        (flow.source(cp.kafka(src, kafka_bootstrap, group=tag, decode=cp.text))
            .map(int).map(check).map(str).sink(cp.kafka_out(dst, encode=cp.text)))
        return flow

    with pytest.raises(cp.PipelineError, match="300 is bad"):
        flow_failing_at(300).run(errors="stop", exactly_once=exactly_once,
                                 commit_interval=0.1)
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": tag})
    try:
        [tp] = c.committed([TopicPartition(src, 0)], timeout=30)
    finally:
        c.close()
    if exactly_once:
        assert tp.offset <= 300, tp
    else:
        assert tp.offset == 300, tp
    done = max(tp.offset, 0)
    got = kafka_read_all(kafka_bootstrap, dst, done)
    assert [int(v) for _, v in got] == list(range(done))
    flow = flow_failing_at(None)
    flow.start(exactly_once=exactly_once, commit_interval=0.1)
    try:
        got = kafka_read(kafka_bootstrap, dst, 500)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert [int(v) for _, v in got] == list(range(500))


@pytest.mark.parametrize("exactly_once", [False, True])
def test_kafka_flow_over_sasl_ssl_with_librdkafkas_settings(kafka_secure, exactly_once):
    """The settings dict confluent-kafka takes (SASL_SSL, SCRAM-SHA-256, a CA file) is the one
    `config=` takes: word counts over the secured listener, written and read by
    confluent-kafka with the same dict."""
    bootstrap, config = kafka_secure
    tag = f"wcs{int(exactly_once)}{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(bootstrap, src, dst, config=config)
    words = [f"w{i % 20}" for i in range(400)]
    kafka_produce(bootstrap, src, [(w.encode(), w.encode()) for w in words], config=config)
    flow = word_count_flow(bootstrap, tag, src, dst, config=config)
    flow.start(workers=2, exactly_once=exactly_once, commit_interval=0.2)
    try:
        got = kafka_read(bootstrap, dst, 400, config=config)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    per_word = {}
    for _, v in got:
        w, n = v.decode().split()
        per_word.setdefault(w, []).append(int(n))
    assert {w: sorted(ns) for w, ns in per_word.items()} == {
        f"w{i}": list(range(1, 21)) for i in range(20)}


def test_kafka_settings_that_cannot_work_are_refused_by_name(kafka_secure):
    bootstrap, config = kafka_secure
    with pytest.raises(ValueError, match="sasl.jaas.config"):
        word_count_flow(bootstrap, "g", "a", "b",
                        config={**config, "sasl.jaas.config": "x"}).start()
    # A wrong password: the start fails at once, naming the user and the mechanism, and the
    # password is nowhere in the message.
    flow = word_count_flow(bootstrap, "g", "a", "b",
                           config={**config, "sasl.password": "not-the-one"})
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        flow.start()
    assert "SCRAM-SHA-256" in str(e.value) and "alice" in str(e.value), str(e.value)
    assert "not-the-one" not in str(e.value)
    assert time.monotonic() - t0 < 20
    # Settings that disagree between a source and the sink.
    f2 = cp.Flow()
    (f2.source(cp.kafka("a", bootstrap, config={**config, "linger.ms": 5}))
        .sink(cp.kafka_out("b", config={**config, "linger.ms": 50})))
    with pytest.raises(ValueError, match="linger.ms differs"):
        f2.start()


@pytest.mark.parametrize("exactly_once", [False, True])
def test_kafka_source_and_sink_with_state_that_survives_a_restart(kafka_bootstrap, exactly_once):
    """Word counts over a real broker, two workers: every word's counts go 1..n, results keyed
    by the word; a second run of the same group restores each word's state from the changelog
    and goes on counting."""
    tag = f"wc{int(exactly_once)}{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst)
    words = [f"w{i % 50}" for i in range(1000)]
    kafka_produce(kafka_bootstrap, src, [(w.encode(), w.encode()) for w in words])
    flow = word_count_flow(kafka_bootstrap, tag, src, dst)
    flow.start(workers=2, exactly_once=exactly_once, commit_interval=0.2)
    try:
        got = kafka_read(kafka_bootstrap, dst, 1000)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    per_word = {}
    for k, v in got:
        w, n = v.decode().split()
        assert k == w.encode(), "results are keyed by their key_by key"
        per_word.setdefault(w, []).append(int(n))
    assert len(per_word) == 50
    for w, ns in per_word.items():
        assert sorted(ns) == list(range(1, 21)), w
    stats = flow.stats()
    assert stats["kafka"]["records_in"] == 1000 and stats["kafka"]["records_out"] == 1000
    # The same group again: the state comes back from the changelog.
    kafka_produce(kafka_bootstrap, src, [(b"w7", b"w7")])
    flow = word_count_flow(kafka_bootstrap, tag, src, dst)
    flow.start(workers=1, exactly_once=exactly_once, commit_interval=0.2)
    try:
        got = kafka_read(kafka_bootstrap, dst, 1001)
    finally:
        flow.shutdown()
        assert flow.wait(60)
    assert (b"w7", b"w7 21") in got


def counting_flow(ckpt, out):
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0})

    def count(state, word):
        state["n"] += 1
        return (word, state["n"])

    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("words")
        .key_by(lambda w: w)
        .update(counts, count)
        .sink(cp.collect(out)))
    return flow


def wait_until(cond, timeout=20, what="condition"):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_checkpoints_keep_the_pickled_state_across_a_restart(tmp_path):
    """Checkpoints every 0.1 s into a directory: the states (Python dicts, pickled) of a flow
    stopped after its checkpoints come back in a new flow on the same directory, on two
    workers, and counting goes on."""
    ckpt = tmp_path / "ckpt"
    out = []
    flow = counting_flow(ckpt, out)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.1)
    try:
        with socket.create_connection(flow.addrs()["words"]) as s:
            s.sendall(b"".join(b"w%d\n" % (i % 20) for i in range(200)))
        wait_until(lambda: len(out) == 200, what="200 counts")
        done = flow.stats()["checkpoints"]["completed"]
        wait_until(lambda: flow.stats()["checkpoints"]["completed"] >= done + 2,
                   what="two checkpoints after the last record")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    assert sorted(n for w, n in out if w == "w3") == list(range(1, 11))
    assert any(p.suffix in (".full", ".delta") for p in ckpt.iterdir())
    out2 = []
    flow = counting_flow(ckpt, out2)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.1)
    try:
        assert flow.stats()["checkpoints"]["restored_epoch"] > 0
        with socket.create_connection(flow.addrs()["words"]) as s:
            s.sendall(b"w3\nw19\nnew\n")
        wait_until(lambda: len(out2) == 3, what="3 counts")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    assert sorted(out2) == [("new", 1), ("w19", 11), ("w3", 11)]


class Tally(cp.StatefulLogic):
    """Counts a key's records; its snapshot is the count (Bytewax's resume state)."""

    def __init__(self, resume):
        self.n = resume or 0

    def on_item(self, value):
        self.n += 1
        return [self.n], False

    def snapshot(self):
        return self.n


def windowed_flow(out, tallies):
    flow = cp.Flow()
    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("words")
        .key_by(lambda w: w)
        .count_window(4, init=list, fold=lambda acc, w: acc + [w]).sink(cp.collect(out)))
    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("tally")
        .key_by(lambda w: w).stateful(Tally).sink(cp.collect(tallies)))
    return flow


def send_both(flow, data):
    for name in ("words", "tally"):
        with socket.create_connection(flow.addrs()[name]) as s:
            s.sendall(data)


def test_windows_and_logic_keep_their_state_across_a_restart(tmp_path):
    """Count windows and a StatefulLogic, checkpointed: a shutdown of a flow that checkpoints
    does not flush the windows still open (they are not at the end of their input), and a
    new flow on the same directory finishes them with the records that came before."""
    ckpt = tmp_path / "ckpt"
    out, tallies = [], []
    flow = windowed_flow(out, tallies)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.1)
    try:
        send_both(flow, b"".join(b"w%d\n" % (i % 20) for i in range(200)))
        wait_until(lambda: len(out) == 40 and len(tallies) == 200, what="40 windows")
        done = flow.stats()["checkpoints"]["completed"]
        wait_until(lambda: flow.stats()["checkpoints"]["completed"] >= done + 2,
                   what="two checkpoints after the last record")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    assert len(out) == 40, "no short window flushed by the shutdown"
    out2, tallies2 = [], []
    flow = windowed_flow(out2, tallies2)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.1)
    try:
        assert flow.stats()["checkpoints"]["restored_epoch"] > 0
        send_both(flow, b"w3\nw3\nw19\nw19\n")
        wait_until(lambda: len(out2) == 2 and len(tallies2) == 4, what="2 windows")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    assert sorted(out2) == [("w19", 8, 12, ["w19"] * 4), ("w3", 8, 12, ["w3"] * 4)]
    assert sorted(tallies2) == [("w19", 11), ("w19", 12), ("w3", 11), ("w3", 12)]


def test_metrics_are_served_for_a_python_flow(tmp_path):
    import urllib.request
    src = write_framed(tmp_path / "in.bin", [b"1", b"x", b"3"])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    flow = cp.Flow()
    (flow.source(cp.file(src, decode=cp.text)).named("nums").map(int).sink(cp.discard()))
    # The metrics server stays up until `wait` sees the end.
    flow.start(metrics=f"127.0.0.1:{port}")
    try:
        text = ""
        deadline = time.time() + 20
        while 'canter_pipeline_failed_total{pipeline="nums"} 1' not in text:
            assert time.time() < deadline, text
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
            time.sleep(0.05)
        assert 'canter_source_records_total{pipeline="nums"' in text, text
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
        assert "<html" in page.lower()
    finally:
        flow.wait(20)


def test_kafka_flow_in_two_processes_shares_the_partitions(kafka_bootstrap, tmp_path):
    """`python -m canter pipeline --processes 2` on a Kafka flow: two processes join the group,
    the 4 partitions' tasks start among them, and every word's counts go 1..n (no record lost or
    counted twice while the partitions are shared out)."""
    tag = f"wcp{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=4)
    words = [f"w{i % 40}" for i in range(800)]
    kafka_produce(kafka_bootstrap, src, [(w.encode(), w.encode()) for w in words])
    (tmp_path / "wc.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from test_pipeline import word_count_flow\n"
        f"flow = word_count_flow({kafka_bootstrap!r}, {tag!r}, {src!r}, {dst!r})\n")
    proc = subprocess.Popen([sys.executable, "-m", "canter", "pipeline", "wc:flow",
                             "--processes", "2"], cwd=tmp_path, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        got = kafka_read(kafka_bootstrap, dst, 800)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    # Stopped by SIGTERM, not at the end of its input: 143, as a process the signal ended.
    assert proc.returncode == 143, err
    per_word = {}
    for _, v in got:
        w, n = v.decode().split()
        per_word.setdefault(w, []).append(int(n))
    for w, ns in per_word.items():
        assert sorted(ns) == list(range(1, 21)), w
    assert len(re.findall(r"process \d of 2 \(pid \d+\) joins the group", err)) == 2, err
    started = [line for line in err.splitlines() if "task started" in line]
    assert len(started) >= 4, err


def test_struct_decoding_of_repeated_and_unique_short_fields(tmp_path):
    """Short bytes fields are handed out from a per-field cache where their values repeat (a
    symbol) and not where they do not (an id: the cache turns itself off): every value decodes
    exactly either way, over more records than the cache's trial."""
    fmt = ">4s6sI"
    recs = [struct.pack(fmt, b"S%03d" % (i % 37), b"%06d" % i, i) for i in range(10_000)]
    src = write_framed(tmp_path / "in.bin", recs)
    out = []
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.struct(fmt))).sink(cp.collect(out))
    run(flow)
    assert out == [(b"S%03d" % (i % 37), b"%06d" % i, i) for i in range(10_000)]


def test_struct_records_kept_by_steps_and_states_keep_their_values(tmp_path):
    """A decoded record's tuple that nothing holds any more is refilled for the next record,
    with the floats, ints and bytes in it that nothing else holds: a record, or a value of
    one, that a step or a keyed state kept must keep its value however many records follow
    (two workers, so records also wait in another worker's inbox), and a bytes value hashed
    and let go hashes as its new value when refilled."""
    fmt = ">Bdd4sIq6sQ"
    n = 6000
    recs = [struct.pack(fmt, i % 200, i / 8, -i / 16, b"S%03d" % (i % 50),
                        (i * 2654435761) % 2**32, (i - 3000) * (1 << 35) + i, b"%06d" % i,
                        2**64 - 1 - i if i % 5 == 0 else i * 977)
            for i in range(n)]
    want = [struct.unpack(fmt, r) for r in recs]
    src = write_framed(tmp_path / "in.bin", recs)
    kept, floats, sums, held = [], [], [], {}
    ints, ids, hashes, seen = [], [], [], []

    def look(r):
        if r[0] % 3 == 0:
            kept.append(r)
        elif r[0] % 3 == 1:
            floats.append(r[1])
            ints.append((r[4], r[5], r[7]))
            ids.append(r[6])
        else:  # nothing of it kept: seen as text, its bytes refilled by the next record
            seen.append((str(r[4]), str(r[5]), r[6].hex(), str(r[7])))
        sums.append(r[1] + r[2])
        hashes.append(hash(r[6]))

    def keep(state, r):
        if r[0] % 7 == 0:
            state.append(r)
        held[r[3]] = state

    flow = cp.Flow()
    states = flow.keyed_state(list)
    flow.source(cp.file(src, decode=cp.struct(fmt))).named("look").inspect(look) \
        .sink(cp.discard())
    flow.source(cp.file(src, decode=cp.struct(fmt))).named("keep") \
        .key_by(operator.itemgetter(3)).update(states, keep).sink(cp.discard())
    run(flow, workers=2)
    assert kept == [w for w in want if w[0] % 3 == 0]
    assert floats == [w[1] for w in want if w[0] % 3 == 1]
    assert ints == [(w[4], w[5], w[7]) for w in want if w[0] % 3 == 1]
    assert ids == [w[6] for w in want if w[0] % 3 == 1]
    assert sums == [w[1] + w[2] for w in want]
    assert hashes == [hash(w[6]) for w in want]
    assert seen == [(str(w[4]), str(w[5]), w[6].hex(), str(w[7])) for w in want if w[0] % 3 == 2]
    assert {k: v for k, v in held.items()} == {
        b"S%03d" % s: [w for w in want if w[3] == b"S%03d" % s and w[0] % 7 == 0]
        for s in range(50)}


def test_short_bytes_fields_of_every_length_decode_and_key_apart(tmp_path):
    """Short bytes fields (1 to 7 bytes, and 8) are cached and keyed as words made of their
    bytes: values that differ in any one byte, of every length, decode as themselves and key
    apart (a state per value), one worker and two."""
    for n in range(1, 9):
        fmt = f">{n}sH"
        values = [bytes((65 + (i // n + j) % 26 if j != i % n else 48 + i % 10)
                        for j in range(n)) for i in range(400)]
        recs = [struct.pack(fmt, values[i % len(values)], i) for i in range(4000)]
        want = [struct.unpack(fmt, r) for r in recs]
        for workers in (1, 2):
            src = write_framed(tmp_path / f"in{n}.bin", recs)
            got, counts = [], {}

            def count(state, r):
                state[0] += 1
                counts[r[0]] = state

            flow = cp.Flow()
            states = flow.keyed_state(lambda: [0])
            flow.source(cp.file(src, decode=cp.struct(fmt))).named("look") \
                .inspect(lambda r: got.append(r)).sink(cp.discard())
            flow.source(cp.file(src, decode=cp.struct(fmt))).named("count") \
                .key_by(operator.itemgetter(0)).update(states, count).sink(cp.discard())
            run(flow, workers=workers)
            assert got == want, (n, workers)
            expect = {}
            for v, _ in want:
                expect[v] = expect.get(v, 0) + 1
            assert {k: s[0] for k, s in counts.items()} == expect, (n, workers)


def test_time_windows_take_event_times_at_the_ends_of_the_range(tmp_path):
    """Event times come from the records (from a peer): the first and last seconds the range
    holds open and close windows without an overflow, a time past the range is a failed
    record, and a window of more than 10,000 slides is refused when the flow starts."""
    # The first and last whole seconds whose nanoseconds fit in an i64.
    times = [b"-9223372036", b"9223372036", b"99999999999", b"5"]
    src = write_framed(tmp_path / "in.bin", times)
    out = []
    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).key_by(lambda r: "k") \
        .time_window(2.0, slide=1.0, time=int, init=int, fold=lambda a, r: a + 1) \
        .sink(cp.collect(out))
    stats = run(flow)
    assert stats["p1"]["failed"] == 1, "the time past the range"
    assert stats["p1"]["late"] == 1, "5 s, after the last second closed its windows"
    # The first second has one window (none starts before it); the last has two, their ends
    # held at the top of the range.
    assert [(round(s), n) for _, s, _, n in out] == [
        (-9223372036, 1), (9223372035, 1), (9223372036, 1)]
    assert all(s < e for _, s, e, _ in out)
    flow = cp.Flow()
    flow.source(cp.file(src)).key_by(len).time_window(
        100.0, slide=0.001, time=len, reduce=max).sink(cp.discard())
    with pytest.raises(ValueError, match="at most 10000 times its slide"):
        flow.start()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send_when_listening(port, records, conns, timeout=30):
    """`send` once something listens on `port` (the flow's processes are starting)."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    send(("127.0.0.1", port), records, conns)


def keyed_count_flow(source, sink):
    """Counts each key's records; each result names the key, its count and the process."""
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0})

    def count(state, rec):
        state["n"] += 1
        return b"%s %d %d" % (rec.split(b":")[0], state["n"], os.getpid())

    (flow.source(source).named("in")
        .map(lambda r: r)
        .key_by(lambda r: r.split(b":")[0])
        .update(counts, count)
        .sink(sink))
    return flow


def check_counts(got, keys, per_key):
    """Each key counted 1..per_key, all in one process; both processes own keys."""
    counts, pids = {}, {}
    for r in got:
        k, n, pid = r.split(b" ")
        counts.setdefault(k, []).append(int(n))
        pids.setdefault(k, set()).add(pid)
    assert len(counts) == keys
    for k, ns in counts.items():
        assert sorted(ns) == list(range(1, per_key + 1)), k
    assert all(len(p) == 1 for p in pids.values()), "a key counted in two processes"
    assert len(set().union(*pids.values())) == 2, "both processes own keys"


def flow_module(tmp_path, body):
    (tmp_path / "pflow.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import canter.pipeline as cp\n"
        "from test_pipeline import keyed_count_flow\n" + body)


def start_tcp_group(tmp_path):
    """`keyed_count_flow` on a TCP source at a free port, into a `Receiver`, run by
    `python -m canter pipeline --processes 2`: (receiver, port, the command's process)."""
    rx = Receiver()
    port = free_port()
    flow_module(tmp_path, f"flow = keyed_count_flow(cp.tcp('127.0.0.1:{port}'), "
                          f"cp.tcp_out({rx.addr!r}))\n")
    proc = subprocess.Popen([sys.executable, "-m", "canter", "pipeline", "pflow:flow",
                             "--processes", "2"], cwd=tmp_path, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    return rx, port, proc


def test_tcp_flow_in_two_processes_owns_each_key_once(tmp_path):
    """`python -m canter pipeline --processes 2` on a TCP flow: both processes accept on the
    shared port, records cross to the process owning their key (pickled, in batches), and each
    of 200 keys is counted 1..100 in one process while both processes own keys."""
    rx, port, proc = start_tcp_group(tmp_path)
    try:
        records = [b"k%d:%d" % (i % 200, i) for i in range(20_000)]
        send_when_listening(port, records, conns=8)
        got = rx.wait_for(20_000)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        rx.close()
    # Stopped by SIGTERM, not at the end of its input: 143, as a process the signal ended.
    assert proc.returncode == 143, err
    check_counts(got, 200, 100)
    assert len(re.findall(r"process \d of 2 \(pid \d+\) joins the group", err)) == 2, err
    assert "lost the link" not in err, err


def test_file_flow_in_two_processes_reads_the_file_once_and_ends(tmp_path):
    """A file source in two processes: the first reads it, records of the other's keys cross
    over, each process appends its results to the sink file, and both end by themselves once
    the file is read and delivered."""
    records = [b"k%d:%d" % (i % 50, i) for i in range(5_000)]
    src = write_framed(tmp_path / "in.bin", records)
    out = tmp_path / "out.bin"
    flow_module(tmp_path, f"flow = keyed_count_flow(cp.file({src!r}), cp.file_out({str(out)!r}))\n")
    proc = subprocess.run([sys.executable, "-m", "canter", "pipeline", "pflow:flow",
                           "--processes", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    check_counts(unframe(out.read_bytes()), 50, 100)


def test_processes_refuse_what_they_cannot_share(tmp_path):
    sink = []
    with pytest.raises(ValueError, match="collect"):
        keyed_count_flow(cp.tcp(f"127.0.0.1:{free_port()}"), cp.collect(sink)).run(processes=2)
    with pytest.raises(ValueError, match="fixed port"):
        keyed_count_flow(cp.tcp("127.0.0.1:0"), cp.discard()).run(processes=2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="taken"):
            keyed_count_flow(cp.tcp(f"127.0.0.1:{port}"), cp.discard()).run(processes=2)


def gone(pid):
    """Whether process `pid` has exited with all its threads (so its sockets are closed): a
    zombie with no thread left but its first, or reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (FileNotFoundError, ProcessLookupError):
        # Reaped before the open, or between the open and the read (ESRCH).
        return True


def test_a_killed_process_of_the_group_leaves_the_other_running(tmp_path):
    """One of two processes is killed: the other logs the lost links, keeps counting the keys it
    owns (records for the dead one's keys are dropped, not queued), and stops cleanly on
    SIGTERM; the command reports the dead process."""
    rx, port, proc = start_tcp_group(tmp_path)
    try:
        records = [b"k%d:%d" % (i % 200, i) for i in range(4_000)]
        send_when_listening(port, records, conns=4)
        first = rx.wait_for(4_000)
        pids = {r.split(b" ")[2] for r in first}
        assert len(pids) == 2
        victim = int(sorted(pids)[0])
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: gone(victim), what="the killed process to exit")
        survivor = (pids - {b"%d" % victim}).pop()
        mine = {r.split(b" ")[0] for r in first if r.split(b" ")[2] == survivor}
        # The dead process's listeners are gone: every connection now reaches the survivor.
        send_when_listening(port, records, conns=4)
        deadline = time.time() + 30
        while time.time() < deadline:
            with rx.lock:
                later = rx.records[4_000:]
            if len(later) >= 20 * len(mine):
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        rx.close()
    # The survivor's keys each got their second 20 records, counted on from 20.
    counts = {}
    for r in later:
        k, n, pid = r.split(b" ")
        assert pid == survivor, r
        counts.setdefault(k, []).append(int(n))
    assert set(counts) == mine
    for k, ns in counts.items():
        assert sorted(ns) == list(range(21, 41)), k
    assert "lost the link" in err, err
    assert proc.returncode == 1, err
    assert f"ended with signal {signal.SIGKILL}" in err, err


def test_flat_map_batch_calls_once_per_batch_before_and_after_the_state(tmp_path):
    """A batch step before `key_by` gets the records of a read in lists of at most 1024 (far
    fewer calls than records), one after the stateful step gets its outputs in batches too,
    and every record comes through each once, over two workers."""
    n = 5_000
    src = write_framed(tmp_path / "in.bin", [b"k%d:%d" % (i % 7, i) for i in range(n)])
    sizes, after, out = [], [], []
    lock = threading.Lock()

    def decode_all(batch):
        with lock:
            sizes.append(len(batch))
        return [(r.split(b":")[0], int(r.split(b":")[1])) for r in batch]

    def twice(batch):
        with lock:
            after.append(len(batch))
        return [x for v in batch for x in (v, -v)]

    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0})

    def count(state, rec):
        state["n"] += 1
        return rec[1]

    (flow.source(cp.file(src))
        .flat_map_batch(decode_all)
        .key_by(operator.itemgetter(0))
        .update(counts, count)
        .flat_map_batch(twice)
        .sink(cp.collect(out)))
    stats = run(flow, workers=2)
    assert sorted(out) == sorted(list(range(n)) + [-v for v in range(n)])
    assert sum(sizes) == n and max(sizes) <= 1024 and len(sizes) < n // 100, sizes
    assert sum(after) == n and len(after) < n // 100, after
    assert stats["p1"]["source"] == n and stats["p1"]["failed"] == 0


def test_a_failing_batch_counts_each_record_and_dead_letters_them(tmp_path):
    src = write_framed(tmp_path / "in.bin", [b"1", b"2", b"3"])
    dead = tmp_path / "dead.jsonl"

    def boom(batch):
        raise RuntimeError(f"a batch of {len(batch)}")

    flow = cp.Flow()
    flow.source(cp.file(src, decode=cp.text)).flat_map_batch(boom).sink(cp.discard())
    stats = run(flow, errors=cp.dead_letter(dead))
    assert stats["p1"]["failed"] == 3
    import json
    lines = [json.loads(l) for l in dead.read_text().splitlines()]
    assert sorted(l["record"] for l in lines) == ["'1'", "'2'", "'3'"]
    assert all("a batch of 3" in l["error"] and l["step"].endswith("flat_map_batch:boom")
               for l in lines), lines
    with pytest.raises(ValueError, match="checkpointed"):
        flow = cp.Flow()
        flow.source(cp.file(src)).flat_map_batch(list).sink(cp.discard())
        flow.start(checkpoint_dir=str(tmp_path / "ck"))


def shared_keys_flow(tmp, int_format):
    """Two states, each updated by a pipeline whose key is read from the raw record in a group
    (`struct` decoder, `itemgetter` key) and by one whose key a Python function gives: the same
    key must be the same key both ways (negative integers, short bytes)."""
    flow = cp.Flow()
    ints = flow.keyed_state(lambda: [0])
    names = flow.keyed_state(lambda: [0])

    def count(state, rec):
        state[0] += 1
        k = rec[0] if isinstance(rec[0], bytes) else b"%d" % rec[0]
        return b"%s %d %d" % (k, state[0], os.getpid())

    out = cp.file_out(str(tmp / "out.bin"))
    (flow.source(cp.file(str(tmp / "ints.bin"), decode=cp.struct(int_format + "Q")))
        .named("raw-ints")
        .key_by(operator.itemgetter(0)).update(ints, count).sink(out))
    (flow.source(cp.file(str(tmp / "ints.txt"), frame="lines", decode=cp.text)).named("py-ints")
        .map(lambda line: (int(line), 0)).key_by(lambda r: r[0]).update(ints, count).sink(out))
    (flow.source(cp.file(str(tmp / "names.bin"), decode=cp.struct(">3sQ"))).named("raw-names")
        .key_by(operator.itemgetter(0)).update(names, count).sink(out))
    (flow.source(cp.file(str(tmp / "names.txt"), frame="lines")).named("py-names")
        .map(lambda line: (line, 0)).key_by(lambda r: r[0]).update(names, count).sink(out))
    return flow


@pytest.mark.parametrize("int_format,values", [
    (">h", [-3000, -2000, -1000, 0, 1000, 2000, 3000]),
    ("<b", [-128, -3, -1, 0, 1, 2, 127]),
    (">I", [0, 1, 2, 65535, 65536, 2**31, 2**32 - 1]),
    ("<q", [-2**63, -2**40, -1, 0, 1, 2**40, 2**63 - 1]),
    (">Q", [0, 1, 2, 3, 2**32, 2**62, 2**63 - 1]),
    ("<?", [False, True, False, True, False, True, False]),
])
def test_raw_keys_in_a_group_match_the_keys_python_gives(tmp_path, int_format, values):
    """In two processes, records keyed in Rust from their bytes cross raw (decoded by their
    owner); the keys are those Python's values give: each key's count runs 1..n over both
    pipelines sharing its state, in one process, for integers of every width, sign and order
    (and bools) and for short bytes."""
    ints = [values[i % 7] for i in range(700)]
    names = [b"s%02d" % (i % 13) for i in range(650)]
    write_framed(tmp_path / "ints.bin",
                 [struct.pack(int_format + "Q", v, i) for i, v in enumerate(ints)])
    (tmp_path / "ints.txt").write_text("".join(f"{int(v)}\n" for v in ints))
    write_framed(tmp_path / "names.bin", [struct.pack(">3sQ", v, i) for i, v in enumerate(names)])
    (tmp_path / "names.txt").write_bytes(b"".join(v + b"\n" for v in names))
    flow_module(tmp_path, "from test_pipeline import shared_keys_flow\n"
                          f"flow = shared_keys_flow(__import__('pathlib').Path({str(tmp_path)!r}), "
                          f"{int_format!r})\n")
    proc = subprocess.run([sys.executable, "-m", "canter", "pipeline", "pflow:flow",
                           "--processes", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    counts, pids = {}, {}
    for r in unframe((tmp_path / "out.bin").read_bytes()):
        k, n, pid = r.rsplit(b" ", 2)
        counts.setdefault(k, []).append(int(n))
        pids.setdefault(k, set()).add(pid)
    assert len(counts) == len(set(values)) + 13, sorted(counts)
    for k, ns in counts.items():
        assert sorted(ns) == list(range(1, len(ns) + 1)), k
    assert sum(len(ns) for ns in counts.values()) == 2 * (700 + 650)
    assert all(len(p) == 1 for p in pids.values()), "a key counted in two processes"
    assert len(set().union(*pids.values())) == 2, "both processes own keys"


def test_a_missing_input_file_raises_file_not_found_naming_it(tmp_path):
    """A file source whose file is missing fails `run` with FileNotFoundError naming it, not an
    ERROR line and a normal return."""
    out = []
    flow = cp.Flow()
    flow.source(cp.file(tmp_path / "no-such-input.bin")).sink(cp.collect(out))
    with pytest.raises(FileNotFoundError, match="no-such-input.bin"):
        flow.run()


def test_the_last_line_of_a_text_file_is_a_record_without_its_newline(tmp_path):
    for name, text in (("ended.txt", "a\nbb\nccc\n"), ("unended.txt", "a\nbb\nccc")):
        (tmp_path / name).write_text(text)
        out = []
        flow = cp.Flow()
        flow.source(cp.file(tmp_path / name, frame="lines", decode=cp.text)).sink(cp.collect(out))
        run(flow)
        assert out == ["a", "bb", "ccc"], name


def test_sigint_drains_the_flow_then_raises_keyboard_interrupt(tmp_path):
    """Ctrl-C: `run` stops reading, delivers what it read, then raises KeyboardInterrupt (an
    interrupted run is not a finished one); `stats()` still answers."""
    port = free_port()
    (tmp_path / "interrupted.py").write_text(
        "import threading, time\n"
        "import canter.pipeline as cp\n"
        "out = []\n"
        "flow = cp.Flow()\n"
        f"flow.source(cp.tcp('127.0.0.1:{port}', frame='lines', decode=cp.text)).named('in')"
        ".sink(cp.collect(out))\n"
        "def watch():\n"
        "    while len(out) < 100:\n"
        "        time.sleep(0.01)\n"
        "    print('seen', flush=True)\n"
        "threading.Thread(target=watch, daemon=True).start()\n"
        "try:\n"
        "    flow.run()\n"
        "except KeyboardInterrupt:\n"
        "    s = flow.stats()['in']\n"
        "    print('interrupted', s['source'], s['sink'], len(out), flush=True)\n"
        "else:\n"
        "    print('returned', flush=True)\n")
    # As from a terminal: SIGINT not ignored (a shell's background job, as CI may be, would
    # have it ignored, and a child inherits that).
    proc = subprocess.Popen([sys.executable, str(tmp_path / "interrupted.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"".join(b"line %d\n" % i for i in range(100)))
                break
            except OSError:
                assert time.time() < deadline, "the flow did not listen"
                time.sleep(0.05)
        assert proc.stdout.readline().strip() == "seen"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.strip() == "interrupted 100 100 100", (out, err)


def test_processes_return_their_stats_summed_and_raise_as_one_process_does(tmp_path):
    """`run(processes=2)` returns the two processes' stats summed (not their exit statuses), and
    `errors="stop"` in one of them raises PipelineError in the caller, as one process would."""
    records = [b"k%d:%d" % (i % 50, i) for i in range(5_000)]
    src = write_framed(tmp_path / "in.bin", records)
    (tmp_path / "merged.py").write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import canter.pipeline as cp\n"
        "from test_pipeline import keyed_count_flow\n"
        f"stats = keyed_count_flow(cp.file({src!r}), cp.discard()).run(processes=2)\n"
        "print(json.dumps(stats), flush=True)\n"
        "flow = cp.Flow()\n"
        "counts = flow.keyed_state(lambda: {'n': 0})\n"
        "def boom(r):\n"
        "    if r.endswith(b':777'):\n"
        "        raise ValueError('no 777')\n"
        "    return r\n"
        "def count(state, r):\n"
        "    state['n'] += 1\n"
        "    return r\n"
        f"(flow.source(cp.file({src!r})).named('in').map(boom)"
        ".key_by(lambda r: r.split(b':')[0]).update(counts, count).sink(cp.discard()))\n"
        "try:\n"
        "    flow.run(processes=2, errors='stop')\n"
        "except cp.PipelineError as e:\n"
        "    print('raised', e, flush=True)\n")
    proc = subprocess.run([sys.executable, str(tmp_path / "merged.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    stats = json.loads(first)["in"]
    assert (stats["source"], stats["sink"], stats["failed"]) == (5_000, 5_000, 0), stats
    assert second.startswith("raised process "), second
    assert "no 777" in second, second


def stopping_flow(src, out, keyed):
    """Lines `0..n` of `src` through a map that raises on line 1000, into `out`; keyed: through
    key_by and a state (records then cross workers)."""
    flow = cp.Flow()

    def check(n):
        if n == 1000:
            raise ValueError("line 1000 is bad")
        return n

    s = flow.source(cp.file(src, frame="lines", decode=cp.text)).named("lines").map(int).map(check)
    if keyed:
        seen = flow.keyed_state(lambda: {"n": 0})

        def count(state, n):
            state["n"] += 1
            return n
        s = s.key_by(lambda n: n % 64).update(seen, count)
    s.sink(cp.collect(out))
    return flow


@pytest.mark.parametrize("workers,keyed", [(1, False), (2, True)])
def test_errors_stop_lets_nothing_read_after_the_failure_reach_the_sink(tmp_path, workers, keyed):
    """errors="stop" on line 1000 of 200,000: `run` raises PipelineError naming the pipeline,
    the step, the exception and the record; the sink gets no record from line 1000 on (one
    worker: exactly the lines before it, in order), however far the reader had got."""
    src = tmp_path / "lines.txt"
    src.write_text("".join(f"{i}\n" for i in range(200_000)))
    for _ in range(3):
        out = []
        flow = stopping_flow(src, out, keyed)
        with pytest.raises(cp.PipelineError) as e:
            flow.run(workers=workers, errors="stop")
        text = str(e.value)
        assert "pipeline lines" in text and ":map:check" in text, text
        assert "ValueError: line 1000 is bad" in text and "on record 1000" in text, text
        assert all(n < 1000 for n in out), max(out)
        if workers == 1:
            assert out == list(range(1000))


def test_a_record_that_fails_to_decode_goes_through_errors(tmp_path):
    """Bad JSON and bad UTF-8 are failures like a raising function: "stop" raises naming the
    cause, a dead-letter file gets each record (its text, or base64 where not UTF-8), "skip"
    counts them as rejected input and goes on."""
    src = tmp_path / "events.jsonl"
    src.write_bytes(b'{"a": 1}\n{"a": \n{"a": 2}\n\xff\xfe\n{"a": 3}\n')

    def flow_into(out, decode=cp.json):
        flow = cp.Flow()
        flow.source(cp.file(src, frame="lines", decode=decode)).named("events").sink(
            cp.collect(out))
        return flow

    out = []
    with pytest.raises(cp.PipelineError, match="failed to decode") as e:
        flow_into(out).run(errors="stop")
    assert '{\\"a\\": ' in str(e.value) or '{"a": ' in str(e.value), str(e.value)
    assert out == [{"a": 1}], out
    dead = tmp_path / "dead.jsonl"
    out = []
    stats = flow_into(out).run(errors=cp.dead_letter(dead))
    assert out == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert stats["events"]["rejected"] == 2, stats
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [line["step"] for line in lines] == ["decode", "decode"], lines
    assert lines[0]["record"] == '{"a": ', lines
    assert "record" not in lines[1] and lines[1]["record_base64"] == "//4=", lines
    out = []
    stats = flow_into(out, decode=cp.text).run(errors="skip")
    assert out == ['{"a": 1}', '{"a": ', '{"a": 2}', '{"a": 3}'], out
    assert stats["events"]["rejected"] == 1, stats


def test_a_state_factory_that_raises_fails_the_record_and_is_tried_again(tmp_path, capfd):
    """The factory raising for a key's first record fails that record (counted, logged with
    the key and the traceback); the key's next record makes its state afresh."""
    src = write_framed(tmp_path / "in.bin", [b"a:1", b"a:2", b"a:3", b"b:1"])
    made = []

    def factory():
        made.append(1)
        if len(made) == 1:
            raise RuntimeError("no state yet")
        return {"n": 0}

    def count(state, rec):
        state["n"] += 1
        return (rec, state["n"])

    out = []
    flow = cp.Flow()
    counts = flow.keyed_state(factory)
    (flow.source(cp.file(src)).named("p").key_by(lambda r: r.split(b":")[0])
        .update(counts, count).sink(cp.collect(out)))
    stats = run(flow)
    assert out == [(b"a:2", 1), (b"a:3", 2), (b"b:1", 1)], out
    assert stats["p"]["failed"] == 1, stats
    err = capfd.readouterr().err
    assert "for key b'a'" in err and "RuntimeError: no state yet" in err, err


def test_update_over_an_immutable_state_is_refused_pointing_to_stateful_map(tmp_path):
    """`s += 1` on an int state changes nothing the engine keeps: refused at the first record
    (errors="stop" raises), with the way out in the message."""
    src = write_framed(tmp_path / "in.bin", [b"a", b"a", b"b"])

    def add(state, rec):
        state += 1
        return state

    flow = cp.Flow()
    n = flow.keyed_state(lambda: 0)
    flow.source(cp.file(src)).key_by(lambda r: r).update(n, add).sink(cp.discard())
    with pytest.raises(cp.PipelineError, match="immutable int.*stateful_map"):
        flow.run(errors="stop")
    out = []
    flow = cp.Flow()
    n = flow.keyed_state(lambda: 0)
    (flow.source(cp.file(src)).key_by(lambda r: r)
        .stateful_map(n, lambda s, r: (s + 1, (r, s + 1))).sink(cp.collect(out)))
    run(flow)
    assert sorted(out) == [(b"a", 1), (b"a", 2), (b"b", 1)]


def test_the_struct_encoder_is_as_strict_as_struct_pack(tmp_path):
    """Values `struct.pack` refuses are refused (a str for `s` is not truncated into bytes), and
    the error names the value, its code and the format."""
    fmt = ">4sH"
    src = write_framed(tmp_path / "in.bin", [b"x"])
    for value, kind, words in [(("ABCD", 1), "TypeError", "value 0 ('4s'): needs bytes, not str"),
                               ((b"ABCD", 70_000), "OverflowError", "value 1 ('H')")]:
        with pytest.raises(struct.error):
            struct.pack(fmt, *value)
        flow = cp.Flow()
        (flow.source(cp.file(src)).map(lambda _r, v=value: v)
            .sink(cp.file_out(tmp_path / "out.bin", encode=cp.struct(fmt))))
        with pytest.raises(cp.PipelineError) as e:
            flow.run(errors="stop")
        text = str(e.value)
        assert kind in text and words in text and "'>4sH'" in text, text
    out = tmp_path / "good.bin"
    flow = cp.Flow()
    (flow.source(cp.file(src)).map(lambda _r: (bytearray(b"AB"), 65_535))
        .sink(cp.file_out(out, encode=cp.struct(fmt))))
    run(flow)
    assert unframe(out.read_bytes()) == [struct.pack(fmt, b"AB", 65_535)]


def test_a_kafka_record_that_fails_to_decode_goes_through_errors(kafka_bootstrap, tmp_path):
    """On a Kafka flow too, a record the decoder refuses reaches the dead-letter file (its
    bytes, base64 where not UTF-8) and the others go on."""
    tag = f"kdec{time.time_ns() % 10**9}"
    src, dst = f"{tag}-in", f"{tag}-out"
    kafka_topics(kafka_bootstrap, src, dst, partitions=1)
    kafka_produce(kafka_bootstrap, src, [(b"k", b"one"), (b"k", b"\xff\xfe"), (b"k", b"two")])
    dead = tmp_path / "dead.jsonl"
    flow = word_count_flow(kafka_bootstrap, tag, src, dst)
    flow.start(errors=cp.dead_letter(dead))
    try:
        got = kafka_read(kafka_bootstrap, dst, 2)
        deadline = time.time() + 30
        while not dead.exists() or not dead.read_text():
            assert time.time() < deadline, "nothing in the dead-letter file"
            time.sleep(0.05)
    finally:
        flow.shutdown()
        flow.wait(30)
    assert sorted(v for _, v in got) == [b"one 1", b"two 1"], got
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [(d["step"], d["record_base64"]) for d in lines] == [("decode", "//4=")], lines


def test_with_state_reads_an_immutable_state(tmp_path):
    """`with_state` only reads the state: an int state is fine there (only `update`, which
    would change it in place, refuses one)."""
    src = write_framed(tmp_path / "in.bin", [b"a", b"b"])
    out = []
    flow = cp.Flow()
    limit = flow.keyed_state(lambda: 7)
    (flow.source(cp.file(src)).key_by(lambda r: r)
        .with_state(limit, lambda s, r: (r, s)).sink(cp.collect(out)))
    run(flow, errors="stop")
    assert sorted(out) == [(b"a", 7), (b"b", 7)]


def test_the_readme_dataflow_example_runs(tmp_path):
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- dataflow example -->\s*```python\n(.*?)```", readme, re.S)
    assert m, "README.md has its dataflow example"
    orders = [{"id": i, "qty": i % 5 + 1} for i in range(100)]
    fills = [{"id": i, "price": 100 + i, "symbol": "AB"[i % 2], "ts": i * 7, "qty": i % 3 + 1}
             for i in range(0, 100, 4)]
    (tmp_path / "orders.jsonl").write_text("".join(json.dumps(o) + "\n" for o in orders))
    (tmp_path / "fills.jsonl").write_text("".join(json.dumps(f) + "\n" for f in fills))
    r = subprocess.run([sys.executable, "-c", m.group(1)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    filled = [json.loads(line) for line in (tmp_path / "filled.jsonl").read_text().splitlines()]
    assert sorted(filled, key=lambda f: f["id"]) == [
        {"id": f["id"], "qty": orders[f["id"]]["qty"], "price": f["price"]} for f in fills]
    volume = sorted(tuple(json.loads(line)) for line in
                    (tmp_path / "volume.jsonl").read_text().splitlines())
    want = {}
    for f in fills:
        w = (f["symbol"], f["ts"] // 60 * 60.0)
        want[w] = want.get(w, 0) + f["qty"]
    assert volume == sorted((k, s, s + 60.0, n) for (k, s), n in want.items())
