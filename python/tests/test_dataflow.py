"""Dataflow steps of canter.pipeline: final aggregations, state a step drops, end-of-input
hooks, collected windows, and the iterable, stdin and stdout ends; each against a reference
computed here."""

import itertools
import json
import operator
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

import canter.pipeline as cp

HERE = os.path.dirname(os.path.abspath(__file__))


def run(flow, workers=1, timeout=60, **kw):
    flow.start(workers=workers, **kw)
    if not flow.wait(timeout):
        flow.shutdown()
        flow.wait(10)
        raise AssertionError("the flow did not end in time")
    return flow.stats()


def wait_until(cond, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def events(n=20_000, seed=7):
    rng = random.Random(seed)
    return [(f"k{rng.randrange(53)}", rng.randrange(1000)) for _ in range(n)]


def test_an_iterable_source_passes_its_items_in_order_as_they_are():
    items = [{"n": i, "tags": ["a"] * (i % 3)} for i in range(5000)]
    got = []
    flow = cp.Flow()
    flow.source(cp.iterable(iter(items))).sink(cp.collect(got))
    stats = run(flow)
    assert got == items
    assert all(a is b for a, b in zip(got, items)), "the objects themselves, not copies"
    assert stats["p1"]["source"] == 5000


@pytest.mark.parametrize("workers", [1, 2])
def test_final_aggregations_emit_one_value_per_key_when_the_input_ends(workers):
    data = events()
    ref_count, ref_sum, ref_max, ref_min, ref_cat = {}, {}, {}, {}, {}
    for k, v in data:
        ref_count[k] = ref_count.get(k, 0) + 1
        ref_sum[k] = ref_sum.get(k, 0) + v
        if k not in ref_max or v > ref_max[k][1]:
            ref_max[k] = (k, v)
        if k not in ref_min or v < ref_min[k][1]:
            ref_min[k] = (k, v)
        ref_cat[k] = ref_cat.get(k, ()) + (v,)
    outs = {name: [] for name in ("count", "fold", "reduce", "max", "min")}
    flow = cp.Flow()

    def keyed(name):
        return flow.source(cp.iterable(data)).named(name).key_by(lambda e: e[0])

    keyed("count").count_final().sink(cp.collect(outs["count"]))
    keyed("fold").fold_final(int, lambda acc, e: acc + e[1]).sink(cp.collect(outs["fold"]))
    (flow.source(cp.iterable(data)).named("reduce")
        .map(lambda e: (e[0], (e[1],)))
        .key_by(lambda e: e[0])
        .reduce_final(lambda a, b: (a[0], a[1] + b[1]))
        .sink(cp.collect(outs["reduce"])))
    keyed("max").max_final(by=lambda e: e[1]).sink(cp.collect(outs["max"]))
    keyed("min").min_final(by=lambda e: e[1]).sink(cp.collect(outs["min"]))
    run(flow, workers=workers)
    assert sorted(outs["count"]) == sorted(ref_count.items())
    assert sorted(outs["fold"]) == sorted(ref_sum.items())
    assert sorted(outs["reduce"]) == sorted((k, (k, v)) for k, v in ref_cat.items())
    assert sorted(outs["max"]) == sorted(ref_max.items())
    assert sorted(outs["min"]) == sorted(ref_min.items())


def test_max_final_without_by_compares_the_records_and_keeps_the_first_of_equals():
    a1, a2, b = ["a", 1], ["a", 1], ["b", 0]
    got = []
    flow = cp.Flow()
    flow.source(cp.iterable([a1, b, a2])).key_by(lambda r: r[0]).max_final().sink(cp.collect(got))
    run(flow)
    assert sorted(got) == [("a", ["a", 1]), ("b", ["b", 0])]
    assert [r for k, r in got if k == "a"][0] is a1


def test_a_fold_that_raises_fails_its_record_and_keeps_the_value(tmp_path):
    dead = tmp_path / "dead.jsonl"
    got = []
    flow = cp.Flow()

    def fold(acc, v):
        if v == 3:
            raise ValueError("three")
        return acc + v

    (flow.source(cp.iterable([1, 2, 3, 4])).key_by(lambda v: "k")
        .fold_final(int, fold).sink(cp.collect(got)))
    stats = run(flow, errors=cp.dead_letter(dead))
    assert got == [("k", 7)]
    assert stats["p1"]["failed"] == 1
    line = json.loads(dead.read_text().splitlines()[0])
    assert "three" in line["error"] and line["record"] == "3"


def test_final_aggregations_in_two_processes_give_each_key_once(tmp_path):
    data = events(10_000, seed=3)
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{k} {v}\n" for k, v in data))
    out = tmp_path / "out.jsonl"
    flow = cp.Flow()
    (flow.source(cp.file(src, frame="lines", decode=cp.text))
        .map(str.split)
        .key_by(lambda e: e[0])
        .fold_final(int, lambda acc, e: acc + int(e[1]))
        .sink(cp.file_out(out, encode=cp.json, frame="lines")))
    stats = flow.run(workers=1, processes=2)
    ref = {}
    for k, v in data:
        ref[k] = ref.get(k, 0) + v
    got = [tuple(json.loads(line)) for line in out.read_text().splitlines()]
    assert sorted(got) == sorted(ref.items())
    assert stats["p1"]["sink"] == len(ref)


@pytest.mark.parametrize("workers", [1, 2])
def test_stateful_map_returning_none_as_the_state_drops_the_key(workers):
    """Sums that restart once they pass 3000: the state factory runs once per key and once
    after each drop, and the emitted sums equal a plain loop's."""
    data = events()
    ref, sums = [], {}
    for k, v in data:
        s = sums.get(k, 0) + v
        if s > 3000:
            ref.append((k, s))
            sums.pop(k, None)
        else:
            sums[k] = s
    made = []
    got = []

    def factory():
        made.append(1)
        return 0

    def add(total, e):
        total += e[1]
        if total > 3000:
            return None, (e[0], total)
        return total, None

    flow = cp.Flow()
    state = flow.keyed_state(factory)
    (flow.source(cp.iterable(data)).key_by(lambda e: e[0])
        .stateful_map(state, add).sink(cp.collect(got)))
    run(flow, workers=workers)
    assert sorted(got) == sorted(ref)
    assert len(made) == len(ref) + len(sums)


def test_on_eof_hooks_emit_what_update_and_stateful_map_hold_at_the_end():
    data = events(5000, seed=11)
    ref = {}
    for k, v in data:
        ref[k] = ref.get(k, 0) + v
    held, mapped = [], []
    flow = cp.Flow()
    a = flow.keyed_state(lambda: {"sum": 0, "key": None})

    def add(st, e):
        st["sum"] += e[1]
        st["key"] = e[0]

    (flow.source(cp.iterable(data)).named("update").key_by(lambda e: e[0])
        .update(a, add, on_eof=lambda st: (st["key"], st["sum"]))
        .sink(cp.collect(held)))
    b = flow.keyed_state(lambda: None)
    (flow.source(cp.iterable(data)).named("map").key_by(lambda e: e[0])
        .stateful_map(b, lambda st, e: ((e[0], (st[1] if st else 0) + e[1]), None),
                      on_eof=lambda st: st)
        .sink(cp.collect(mapped)))
    run(flow, workers=2)
    assert sorted(held) == sorted(ref.items())
    assert sorted(mapped) == sorted(ref.items())


def test_a_short_last_count_window_is_emitted_with_the_end_it_reached():
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable(["a0", "a1", "a2", "a3", "b0"])).key_by(lambda r: r[0])
        .count_window(3, init=list, fold=lambda acc, r: acc + [r]).sink(cp.collect(got)))
    run(flow)
    assert sorted(got) == [("a", 0, 3, ["a0", "a1", "a2"]), ("a", 3, 4, ["a3"]),
                           ("b", 0, 1, ["b0"])]


def test_partial_false_drops_short_last_count_windows_and_counts_them():
    recs = [f"{k}{i}" for k in "abc" for i in range(7 if k == "c" else 5)]
    for workers in (1, 2):
        got = []
        flow = cp.Flow()
        (flow.source(cp.iterable(recs)).named("w").key_by(lambda r: r[0])
            .count_window(3, slide=2, init=list, fold=lambda acc, r: acc + [r], partial=False)
            .sink(cp.collect(got)))
        stats = run(flow, workers=workers)
        # Windows of 3 every 2: a and b (5 records) fill [0, 3) and [2, 5), and leave [4, 7)
        # short; c (7 records) fills [0, 3), [2, 5) and [4, 7), and leaves [6, 9) short.
        want = [(k, s, s + 3, [f"{k}{i}" for i in range(s, s + 3)])
                for k, n in (("a", 5), ("b", 5), ("c", 7)) for s in range(0, n - 2, 2)]
        assert sorted(got) == sorted(want)
        assert stats["w"]["dropped_windows"] == 3
        assert stats["w"]["late"] == 0


def test_collect_window_sorts_a_time_windows_records_by_time():
    recs = [("k", 3.5, "c"), ("k", 1.0, "a"), ("k", 2.0, "b"), ("k", 2.0, "b2"),
            ("k", 12.0, "z")]
    timed, counted = [], []
    flow = cp.Flow()
    (flow.source(cp.iterable(recs)).named("t").key_by(lambda r: r[0])
        .collect_window(10.0, time=lambda r: r[1]).sink(cp.collect(timed)))
    (flow.source(cp.iterable(recs)).named("c").key_by(lambda r: r[0])
        .collect_window(2, by="count").sink(cp.collect(counted)))
    run(flow)
    assert timed == [("k", 0.0, 10.0, [recs[1], recs[2], recs[3], recs[0]]),
                     ("k", 10.0, 20.0, [recs[4]])]
    assert counted == [("k", 0, 2, recs[0:2]), ("k", 2, 4, recs[2:4]), ("k", 4, 5, recs[4:])]


def test_time_windows_take_any_positive_size_and_refuse_others_saying_why():
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable([("k", 1.0), ("k", 2e8)])).key_by(lambda r: r[0])
        .time_window(1e9, time=lambda r: r[1], init=int, fold=lambda a, r: a + 1)
        .sink(cp.collect(got)))
    run(flow)
    assert got == [("k", 0.0, 1e9, 2)]
    for size, why in [(0, "positive seconds, not size 0"), (-1.0, "positive seconds"),
                      (float("nan"), "positive seconds"), (1e-12, "at least 1 ns")]:
        flow = cp.Flow()
        (flow.source(cp.iterable([1])).key_by(str)
            .time_window(size, time=float, init=int, fold=lambda a, r: a)
            .sink(cp.discard()))
        with pytest.raises(ValueError, match=why):
            flow.start()


def test_lines_out_and_a_record_holding_a_newline(tmp_path):
    out = tmp_path / "out.txt"
    flow = cp.Flow()
    (flow.source(cp.iterable(["one", "two\nthree", "four"]))
        .sink(cp.file_out(out, encode=cp.text, frame="lines")))
    stats = run(flow)
    assert out.read_text() == "one\nfour\n"
    assert stats["p1"]["failed"] == 1


def test_lines_out_refuses_checkpoints(tmp_path):
    flow = cp.Flow()
    flow.source(cp.iterable(["a"])).sink(cp.file_out(tmp_path / "o", frame="lines"))
    with pytest.raises(OSError, match="writes lines"):
        flow.start(checkpoint_dir=tmp_path / "ck")


def test_stdin_to_stdout_in_a_child_process(tmp_path):
    prog = (
        "import canter.pipeline as cp\n"
        "flow = cp.Flow()\n"
        "(flow.source(cp.stdin(decode=cp.text)).flat_map(str.split)\n"
        " .key_by(lambda w: w).count_final()\n"
        " .map(lambda kv: f'{kv[0]} {kv[1]}').sink(cp.stdout(encode=cp.text)))\n"
        "flow.run()\n"
    )
    text = "the cat and the hat\nand the bat"
    r = subprocess.run([sys.executable, "-c", prog], input=text.encode(), capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    got = sorted(r.stdout.decode().splitlines())
    ref = {}
    for w in text.split():
        ref[w] = ref.get(w, 0) + 1
    assert got == sorted(f"{w} {n}" for w, n in ref.items())


def test_kafka_flows_refuse_final_aggregations_and_on_eof():
    for build in (lambda k: k.count_final(),
                  lambda k: k.update(k.flow.keyed_state(dict), lambda s, r: None,
                                     on_eof=lambda s: s)):
        flow = cp.Flow()
        keyed = flow.source(cp.kafka("t", "127.0.0.1:1")).key_by(len)
        build(keyed).sink(cp.kafka_out("o"))
        with pytest.raises(ValueError, match="needs? an input that ends"):
            flow.start()


@pytest.mark.parametrize("workers", [1, 2])
def test_merge_branch_and_fan_out_shape_a_flow(workers):
    """Two sources merged, branched by a predicate; the even side read by two steps (fan-out),
    one of them keyed and counted; the odd side keyed, summed, and keyed again (a second
    key_by after a stateful step) to total by parity of the key."""
    a = events(6000, seed=1)
    b = events(4000, seed=2)
    both = a + b
    evens_seen, counts, sums, totals = [], [], [], []
    flow = cp.Flow()
    merged = cp.merge(flow.source(cp.iterable(a)), flow.source(cp.iterable(b)))
    evens, odds = merged.branch(lambda e: e[1] % 2 == 0)
    evens.sink(cp.collect(evens_seen))
    evens.key_by(lambda e: e[0]).count_final().sink(cp.collect(counts))
    summed = odds.key_by(lambda e: e[0]).fold_final(int, lambda s, e: s + e[1])
    summed.sink(cp.collect(sums))
    (summed.key_by(lambda kv: int(kv[0][1:]) % 2)
        .fold_final(int, lambda s, kv: s + kv[1]).sink(cp.collect(totals)))
    stats = run(flow, workers=workers)
    assert sorted(evens_seen) == sorted(e for e in both if e[1] % 2 == 0)
    ref_count, ref_sum = {}, {}
    for k, v in both:
        if v % 2 == 0:
            ref_count[k] = ref_count.get(k, 0) + 1
        else:
            ref_sum[k] = ref_sum.get(k, 0) + v
    assert sorted(counts) == sorted(ref_count.items())
    assert sorted(sums) == sorted(ref_sum.items())
    ref_tot = {}
    for k, v in ref_sum.items():
        ref_tot[int(k[1:]) % 2] = ref_tot.get(int(k[1:]) % 2, 0) + v
    assert sorted(totals) == sorted(ref_tot.items())
    assert stats["p1"]["source"] == len(a) and stats["p2"]["source"] == len(b)


def test_a_keyed_stream_read_by_two_stateful_steps():
    data = events(3000, seed=5)
    counts, maxes = [], []
    flow = cp.Flow()
    keyed = flow.source(cp.iterable(data)).key_by(lambda e: e[0])
    keyed.count_final().sink(cp.collect(counts))
    keyed.max_final(by=lambda e: e[1]).sink(cp.collect(maxes))
    run(flow, workers=2)
    ref_c, ref_m = {}, {}
    for k, v in data:
        ref_c[k] = ref_c.get(k, 0) + 1
        if k not in ref_m or v > ref_m[k][1]:
            ref_m[k] = (k, v)
    assert sorted(counts) == sorted(ref_c.items())
    assert sorted(maxes) == sorted(ref_m.items())


def bytewax_join(sides, insert, emit):
    """Bytewax's join, computed here on the records of each side in order (one worker's
    view: the sides interleaved as given)."""
    state, out = {}, []
    for side, key, value in sides:
        seen = state.setdefault(key, [[] for _ in range(2)])
        if insert == "first" and seen[side]:
            pass
        elif insert == "last":
            seen[side] = [value]
        else:
            seen[side].append(value)
        rows = lambda: list(itertools.product(*(v if v else [None] for v in seen)))  # noqa: E731
        if emit == "complete" and all(seen):
            out.extend((key, r) for r in rows())
            del state[key]
        elif emit == "running":
            out.extend((key, r) for r in rows())
    if emit == "final":
        for key, seen in state.items():
            out.extend((key, r) for r in itertools.product(*(v if v else [None] for v in seen)))
    return out


@pytest.mark.parametrize("insert", ["first", "last", "product"])
@pytest.mark.parametrize("emit", ["complete", "final", "running"])
def test_join_matches_bytewax_semantics(insert, emit):
    """Orders and fills by order id (several of each per id), the orders first: one worker
    sees each side in its order and the orders before the fills, so the reference (Bytewax's
    rules applied here to the same sequence) is exact for every mode."""
    rng = random.Random(9)
    recs = [("order", f"o{rng.randrange(300)}", i) for i in range(1500)]
    recs += [("fill", f"o{rng.randrange(300)}", i) for i in range(1500, 3000)]
    got = []
    flow = cp.Flow()
    orders, fills = flow.source(cp.iterable(recs)).branch(lambda r: r[0] == "order")
    (cp.join(orders.key_by(lambda r: r[1]), fills.key_by(lambda r: r[1]),
             insert=insert, emit=emit)
        .sink(cp.collect(got)))
    run(flow, workers=1)
    ref = bytewax_join([(0 if r[0] == "order" else 1, r[1], r) for r in recs], insert, emit)
    assert sorted(got, key=repr) == sorted(ref, key=repr)
    assert got, "the join emitted"


def test_join_across_two_sources_and_two_workers():
    orders = [(f"o{i}", "buy", i) for i in range(2000)]
    fills = [(f"o{i}", 10 * i) for i in range(0, 2000, 3)]
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable(orders)).key_by(lambda o: o[0])
        .join(flow.source(cp.iterable(fills)).key_by(lambda f: f[0]))
        .sink(cp.collect(got)))
    run(flow, workers=2)
    assert sorted(got) == sorted((f[0], (orders[int(f[0][1:])], f)) for f in fills)


def test_shapes_that_cannot_work_are_refused_clearly():
    flow = cp.Flow()
    a, b = flow.source(cp.iterable([1])).branch(bool)
    a.sink(cp.discard())
    with pytest.raises(ValueError, match="both streams of a branch"):
        flow.start()
    flow = cp.Flow()
    flow.source(cp.iterable([1])).map(str)
    with pytest.raises(ValueError, match="ends without a sink"):
        flow.start()
    with pytest.raises(TypeError, match="keyed streams"):
        cp.join(flow.source(cp.iterable([1])), flow.source(cp.iterable([2])).key_by(str))


def test_a_join_and_a_merge_in_two_processes(tmp_path):
    """Orders and fills from two files, joined by id, and merged with a branch of the orders
    into one count per side; in two processes, each key owned by one worker of the two."""
    orders = [(f"o{i}", i % 7) for i in range(3000)]
    fills = [(f"o{i}", 10 * i) for i in range(0, 3000, 2)]
    (tmp_path / "orders.jsonl").write_text("".join(json.dumps(o) + "\n" for o in orders))
    (tmp_path / "fills.jsonl").write_text("".join(json.dumps(f) + "\n" for f in fills))
    joined, counts = tmp_path / "joined.jsonl", tmp_path / "counts.jsonl"
    flow = cp.Flow()
    o = flow.source(cp.file(tmp_path / "orders.jsonl", frame="lines", decode=cp.json))
    f = flow.source(cp.file(tmp_path / "fills.jsonl", frame="lines", decode=cp.json))
    (cp.join(o.key_by(lambda r: r[0]), f.key_by(lambda r: r[0]))
        .sink(cp.file_out(joined, encode=cp.json, frame="lines")))
    big, _small = o.branch(lambda r: r[1] > 3)
    _small.sink(cp.discard())
    (cp.merge(big.map(lambda r: "big"), f.map(lambda r: "fill"))
        .key_by(lambda side: side).count_final()
        .sink(cp.file_out(counts, encode=cp.json, frame="lines")))
    flow.run(workers=1, processes=2)
    got = sorted(json.loads(line) for line in joined.read_text().splitlines())
    want = sorted([fl[0], [list(orders[int(fl[0][1:])]), list(fl)]] for fl in fills)
    assert got == want
    got = sorted(json.loads(line) for line in counts.read_text().splitlines())
    assert got == sorted([["big", sum(1 for r in orders if r[1] > 3)], ["fill", len(fills)]])


@pytest.mark.parametrize("workers", [1, 2])
def test_session_windows_on_time_sorted_input_match_a_plain_loop(workers):
    rng = random.Random(4)
    t, recs = 0.0, []
    for _ in range(5000):
        t += rng.choice([0.5, 1.0, 3.0, 12.0])
        recs.append((f"u{rng.randrange(20)}", round(t, 1)))
    gap = 10.0
    ref, cur = [], {}
    for k, ts in recs:
        s = cur.get(k)
        if s is not None and ts - s[1] > gap:
            ref.append((k, s[0], s[1], s[2]))
            s = None
        cur[k] = (ts, ts, 1) if s is None else (s[0], ts, s[2] + 1)
    ref += [(k, a, b, n) for k, (a, b, n) in cur.items()]
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable(recs)).key_by(lambda r: r[0])
        .session_window(gap, time=lambda r: r[1], init=int, fold=lambda n, r: n + 1)
        .sink(cp.collect(got)))
    stats = run(flow, workers=workers)
    assert sorted(got) == sorted(ref)
    assert stats["p1"]["late"] == 0


def test_session_windows_merge_late_records_and_say_what_they_lack():
    # gap 10, the clock 30 s behind the latest time: sessions [0, 1] and [20, 21], then 10.5
    # bridges them; 80 moves the clock to 50, closing the merged one ([40] stays open); 5 is
    # late (a session of its own would have closed at 15 < 50).
    recs = [("k", 0), ("k", 1), ("k", 20), ("k", 21), ("k", 10.5), ("k", 40), ("k", 80),
            ("k", 5)]
    got, late_seen = [], []
    flow = cp.Flow()
    windows, late = (flow.source(cp.iterable(recs)).key_by(lambda r: r[0])
                     .session_window(10, wait=30, time=lambda r: r[1],
                                     reduce=lambda a, b: a + b, late=True))
    windows.sink(cp.collect(got))
    late.sink(cp.collect(late_seen))
    stats = run(flow)
    # reduce over the records (tuples): concatenated, the earlier session's first.
    assert got == [("k", 0.0, 21.0, ("k", 0, "k", 1, "k", 20, "k", 21, "k", 10.5)),
                   ("k", 40.0, 40.0, ("k", 40)), ("k", 80.0, 80.0, ("k", 80))]
    assert late_seen == [("k", ("k", 5))]
    assert stats["p1"]["late"] == 1
    # With no wait, a record more than gap after a session closes it (10.5 joins [20, 21]
    # backwards, within gap of it; [0, 1] closed when 20 came).
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable(recs)).key_by(lambda r: r[0])
        .session_window(10, time=lambda r: r[1], init=int, fold=lambda n, r: n + 1)
        .sink(cp.collect(got)))
    stats = run(flow)
    assert got == [("k", 0.0, 1.0, 2), ("k", 10.5, 21.0, 3), ("k", 40.0, 40.0, 1),
                   ("k", 80.0, 80.0, 1)]
    assert stats["p1"]["late"] == 1
    # A fold cannot merge two sessions without merge=: the bridging record fails, saying so.
    flow = cp.Flow()
    (flow.source(cp.iterable(recs[:5])).key_by(lambda r: r[0])
        .session_window(10, wait=30, time=lambda r: r[1], init=int, fold=lambda n, r: n + 1)
        .sink(cp.discard()))
    with pytest.raises(cp.PipelineError, match="no merge="):
        run(flow, errors="stop")
    got = []
    flow = cp.Flow()
    (flow.source(cp.iterable(recs[:5])).key_by(lambda r: r[0])
        .session_window(10, wait=30, time=lambda r: r[1], init=int, fold=lambda n, r: n + 1,
                        merge=lambda a, b: a + b)
        .sink(cp.collect(got)))
    run(flow)
    assert got == [("k", 0.0, 21.0, 5)]


def test_time_windows_hand_on_their_late_records_when_asked():
    recs = [("k", 0.5), ("k", 1.5), ("k", 3.2), ("k", 1.1), ("j", 0.0)]
    got, late_seen = [], []
    flow = cp.Flow()
    windows, late = (flow.source(cp.iterable(recs)).key_by(lambda r: r[0])
                     .time_window(1.0, time=lambda r: r[1], init=int, fold=lambda n, r: n + 1,
                                  late=True))
    windows.sink(cp.collect(got))
    late.sink(cp.collect(late_seen))
    run(flow)
    assert sorted(got) == [("j", 0.0, 1.0, 1), ("k", 0.0, 1.0, 1), ("k", 1.0, 2.0, 1),
                           ("k", 3.0, 4.0, 1)]
    assert late_seen == [("k", ("k", 1.1))]


class Counter(cp.StatefulLogic):
    """Counts a key's records; a record "reset" drops the logic after emitting the count;
    the end of input emits the count."""

    def __init__(self, resume):
        assert resume is None
        self.n = 0

    def on_item(self, value):
        if value[1] == "reset":
            return [("reset", self.n)], True
        self.n += 1
        return [], False

    def on_eof(self):
        return [("eof", self.n)], False


@pytest.mark.parametrize("workers", [1, 2])
def test_stateful_logic_on_item_discard_and_eof(workers):
    rng = random.Random(3)
    recs = [(f"k{rng.randrange(30)}", "reset" if rng.random() < 0.05 else "x")
            for _ in range(5000)]
    ref, n = [], {}
    for k, v in recs:
        if v == "reset":
            ref.append((k, ("reset", n.pop(k, 0))))
        else:
            n[k] = n.get(k, 0) + 1
    ref += [(k, ("eof", c)) for k, c in n.items()]
    got = []
    flow = cp.Flow()
    flow.source(cp.iterable(recs)).key_by(lambda r: r[0]).stateful(Counter).sink(cp.collect(got))
    run(flow, workers=workers)
    assert sorted(got) == sorted(ref)


class Debounce(cp.StatefulLogic):
    """A key's count goes out 0.05 s after its last record (a timer), then the logic is
    dropped."""

    def __init__(self, _resume):
        self.n, self.last = 0, 0.0

    def on_item(self, value):
        self.n += 1
        self.last = time.time()
        return [], False

    def notify_at(self):
        return self.last + 0.05

    def on_notify(self):
        return [self.n], True


def test_stateful_logic_timers_fire_without_input():
    got = []
    flow = cp.Flow()
    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("in")
        .key_by(lambda w: w).stateful(Debounce).sink(cp.collect(got)))
    flow.start(workers=2)
    try:
        s = socket.create_connection(flow.addrs()["in"])
        words = ["a", "b", "a", "c", "a", "b"] * 50
        s.sendall("".join(w + "\n" for w in words).encode())
        # The connection stays open: only the timers can bring the counts out.
        deadline = time.time() + 30
        while sum(n for _, n in got) < len(words):
            assert time.time() < deadline, got
            time.sleep(0.02)
        totals = {}
        for k, n in got:
            totals[k] = totals.get(k, 0) + n
        assert totals == {"a": 150, "b": 100, "c": 50}
        s.close()
    finally:
        flow.shutdown()
        flow.wait(20)


def test_a_state_with_a_ttl_is_dropped_after_that_long_without_records():
    got = []
    flow = cp.Flow()
    counts = flow.keyed_state(lambda: {"n": 0})

    def count(st, w):
        st["n"] += 1
        return (w, st["n"])

    (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("in")
        .key_by(lambda w: w).update(counts, count, ttl=0.2).sink(cp.collect(got)))
    flow.start()
    try:
        s = socket.create_connection(flow.addrs()["in"])
        s.sendall(b"k\n" * 100)
        deadline = time.time() + 30
        while len(got) < 100:
            assert time.time() < deadline, got
            time.sleep(0.01)
        # Records within the TTL of each other: one state counted them all.
        assert got == [("k", i) for i in range(1, 101)]
        # A record more than the TTL after the last one finds a new state (probes 0.4 s apart;
        # each one that still found the old state waits for the next).
        while got[-1] != ("k", 1):
            assert time.time() < deadline, got[-5:]
            time.sleep(0.4)
            seen = len(got)
            s.sendall(b"k\n")
            while len(got) == seen:
                assert time.time() < deadline
                time.sleep(0.01)
        s.close()
    finally:
        flow.shutdown()
        flow.wait(20)
    with pytest.raises(ValueError, match="ttl= is seconds"):
        f2 = cp.Flow()
        st = f2.keyed_state(dict)
        f2.source(cp.iterable([1])).key_by(str).update(st, lambda s, r: None, ttl=-1).sink(
            cp.discard())
        f2.start()


def test_steps_named_by_the_user_in_errors_dead_letters_and_metrics(tmp_path):
    dead = tmp_path / "dead.jsonl"
    flow = cp.Flow()
    state = flow.keyed_state(lambda: {"n": 0})

    def parse(r):
        return int(r)

    def total(st, v):
        if v == 7:
            raise ValueError("seven")
        st["n"] += v

    (flow.source(cp.iterable(["1", "x", "7", "2"])).map(parse, name="parse")
        .key_by(lambda v: v % 2, name="parity")
        .update(state, total, name="totals").sink(cp.discard()))
    stats = run(flow, errors=cp.dead_letter(dead), metrics="127.0.0.1:0")
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert sorted(line["step"] for line in lines) == ["parse", "totals"]
    assert stats["p1"]["failed"] == 2
    assert 'step="parse"' in flow.prometheus()
    flow = cp.Flow()
    (flow.source(cp.iterable(["1", "x"])).map(parse, name="parse").sink(cp.discard()))
    with pytest.raises(cp.PipelineError, match="step parse raised ValueError"):
        run(flow, errors="stop")


def test_windows_and_final_aggregations_take_a_name_too(tmp_path):
    dead = tmp_path / "dead.jsonl"

    def add(acc, v):
        if v == 7:
            raise ValueError("seven")
        return acc + v

    flow = cp.Flow()
    k = flow.source(cp.iterable([1, 7, 2, 3])).key_by(lambda v: "k")
    k.fold_final(int, add, name="sums").sink(cp.discard())
    k.time_window(10, time=float, init=int, fold=add, name="tens").sink(cp.discard())
    k.count_window(2, init=int, fold=add, name="pairs").sink(cp.discard())
    k.session_window(5, time=float, init=int, fold=add, name="bursts").sink(cp.discard())
    run(flow, errors=cp.dead_letter(dead), metrics="127.0.0.1:0")
    steps = sorted(json.loads(line)["step"] for line in dead.read_text().splitlines())
    assert steps == ["bursts", "pairs", "sums", "tens"]


def test_a_directory_source_reads_each_matching_file_once(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    want = []
    for i in range(4):
        lines = [f"f{i} line {j}" for j in range(100 * (i + 1))]
        (d / f"part-{i}.log").write_text("\n".join(lines) + "\n")
        want += lines
    (d / "skip.txt").write_text("not me\n")
    got = []
    flow = cp.Flow()
    flow.source(cp.directory(d, glob="*.log", decode=cp.text)).sink(cp.collect(got))
    run(flow, workers=2)
    assert sorted(got) == sorted(want)
    with pytest.raises(FileNotFoundError, match="no file matches"):
        cp.Flow().source(cp.directory(d, glob="*.csv"))


def channels_flow(n, out, slow):
    """A branch whose sides are keyed otherwise, merged again and keyed a third way, with
    state at every step: records cross workers between each two."""
    def pace(i):
        if slow[0] and i % 4 == 0:
            time.sleep(0.001)
        return i

    def count(n, i):
        return (n or 0) + 1, i

    def total(s, i):
        s = (s[0] + 1, s[1] + i) if s else (1, i)
        return s, (i % 13, s)

    flow = cp.Flow()
    evens, odds = (flow.source(cp.iterable(range(n))).named("in")
                   .map(pace).branch(lambda i: i % 2 == 0))
    a = evens.key_by(lambda i: str(i % 7)).stateful_map(flow.keyed_state(lambda: None), count)
    b = odds.key_by(lambda i: str(i % 5)).stateful_map(flow.keyed_state(lambda: None), count)
    (cp.merge(a, b).key_by(lambda i: str(i % 13))
        .stateful_map(flow.keyed_state(lambda: None), total).sink(cp.collect(out)))
    return flow


def test_a_flow_of_channels_checkpoints_and_a_restart_counts_every_record_once(tmp_path):
    """Branch, merge and three keyed steps on two workers, checkpointed every 0.05 s: stopped
    in the middle of its file (after checkpoints taken while records were in every channel)
    and started again on the same directory, it ends with each key's count and sum equal to
    a plain loop's (a record held by one step's checkpoint and not by the next one's would be
    lost or counted twice)."""
    n = 20_000
    want = {}
    for i in range(n):
        c, s = want.get(i % 13, (0, 0))
        want[i % 13] = (c + 1, s + i)
    ckpt, slow = tmp_path / "ckpt", [True]
    out = []
    flow = channels_flow(n, out, slow)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.05)
    try:
        wait_until(lambda: len(out) >= 500, what="500 results")
        done = flow.stats()["checkpoints"]["completed"]
        wait_until(lambda: flow.stats()["checkpoints"]["completed"] >= done + 3,
                   what="three checkpoints")
    finally:
        slow[0] = False
        flow.shutdown()
        assert flow.wait(30)
    first = len(out)
    assert first < n, "the first run was to stop in the middle"
    flow = channels_flow(n, out, slow)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.05)
    assert flow.stats()["checkpoints"]["restored_epoch"] > 0
    assert flow.wait(60), "the restarted flow did not finish"
    last = {}
    for k, (c, s) in out:
        assert c <= want[k][0], f"key {k} counted {c} of {want[k][0]} records"
        if c >= last.get(k, (0, 0))[0]:
            last[k] = (c, s)
    assert last == want, f"{first} results before the restart"


def test_a_join_keeps_its_records_across_a_restart(tmp_path):
    """A join's records (and the state of the steps around it) are in the checkpoint: the
    orders sent before a restart meet the fills sent after it."""
    def joined(out):
        flow = cp.Flow()
        o = (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("orders")
             .key_by(lambda line: line.split()[0]))
        f = (flow.source(cp.tcp("127.0.0.1:0", frame="lines", decode=cp.text)).named("fills")
             .key_by(lambda line: line.split()[0]))
        o.join(f).sink(cp.collect(out))
        return flow

    def send(flow, name, lines):
        with socket.create_connection(flow.addrs()[name]) as s:
            s.sendall("".join(f"{line}\n" for line in lines).encode())

    ckpt, out = tmp_path / "ckpt", []
    flow = joined(out)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.05)
    try:
        send(flow, "orders", [f"o{i} buy {i}" for i in range(50)])
        send(flow, "fills", [f"o{i} {10 * i}" for i in range(0, 50, 2)])
        wait_until(lambda: len(out) == 25, what="25 joined rows")
        done = flow.stats()["checkpoints"]["completed"]
        wait_until(lambda: flow.stats()["checkpoints"]["completed"] >= done + 2,
                   what="two checkpoints after the last record")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    out2 = []
    flow = joined(out2)
    flow.start(workers=2, checkpoint_dir=ckpt, checkpoint_interval=0.05)
    try:
        assert flow.stats()["checkpoints"]["restored_epoch"] > 0
        send(flow, "fills", [f"o{i} {10 * i}" for i in range(1, 50, 2)])
        wait_until(lambda: len(out2) == 25, what="25 joined rows after the restart")
    finally:
        flow.shutdown()
        assert flow.wait(20)
    assert sorted(out2) == sorted((f"o{i}", (f"o{i} buy {i}", f"o{i} {10 * i}"))
                                  for i in range(1, 50, 2))


@pytest.mark.parametrize("product", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_join_window_matches_bytewax_rules(product, workers):
    """`join_window` (Bytewax's): per key and 10 s window, the latest record of each side (None
    for a side with none), or every combination with `product=True`; the same rows as Bytewax's
    fold of `(side, record)` into per-side lists and `itertools.product`, computed here."""
    rng = random.Random(11)
    clicks = [(f"u{rng.randrange(20)}", "click", t) for t in range(0, 600, 2)]
    buys = [(f"u{rng.randrange(20)}", "buy", t) for t in range(1, 600, 7)]
    want = []
    windows = {}
    for side, recs in enumerate((clicks, buys)):
        for r in recs:
            w = windows.setdefault((r[0], r[2] // 10 * 10), [[], []])
            if product:
                w[side].append(r)
            else:
                w[side] = [r]
    for (key, start), acc in windows.items():
        for row in itertools.product(*(v or [None] for v in acc)):
            want.append((key, float(start), float(start + 10), row))
    got = []
    flow = cp.Flow()
    # Two sources read at once: their records come out of order between them by up to the
    # whole input (600 s), which the windows wait for.
    c = flow.source(cp.iterable(clicks)).key_by(lambda r: r[0])
    b = flow.source(cp.iterable(buys)).key_by(lambda r: r[0])
    (c.join_window(b, size=10, time=lambda r: r[2], product=product, wait=600)
        .map(lambda w: (w[0], float(w[1]), float(w[2]), w[3])).sink(cp.collect(got)))
    stats = run(flow, workers=workers)
    assert sorted(got) == sorted(want)
    assert sum(v["late"] for v in stats.values() if isinstance(v, dict) and "late" in v) == 0


def test_time_window_waits_for_records_out_of_order_and_counts_later_ones_as_late():
    """`wait=`: a window closes once a record `wait` seconds past its end comes; until then a
    record out of order still joins it; after, it is late."""
    got, late = [], []
    flow = cp.Flow()
    wins, lates = (flow.source(cp.iterable([("k", 1), ("k", 12), ("k", 3), ("k", 16), ("k", 4),
                                             ("k", 25)]))
                   .key_by(lambda r: r[0])
                   .time_window(10, time=lambda r: r[1], init=list,
                                fold=lambda acc, r: acc + [r[1]], wait=5, late=True))
    wins.sink(cp.collect(got))
    lates.sink(cp.collect(late))
    run(flow)
    # 3 came while the clock (latest 12, less 5) had not passed 10; 16 closed [0, 10); 4 is late.
    assert sorted(got) == [("k", 0.0, 10.0, [1, 3]), ("k", 10.0, 20.0, [12, 16]),
                           ("k", 20.0, 30.0, [25])]
    assert late == [("k", ("k", 4))]
    with pytest.raises((TypeError, ValueError), match="wait"):
        flow = cp.Flow()
        (flow.source(cp.iterable([1])).key_by(str)
            .time_window(1, time=float, init=list, fold=lambda a, r: a, wait=-1)
            .sink(cp.discard()))
        run(flow)


def test_join_window_refuses_what_cannot_work():
    flow = cp.Flow()
    a = flow.source(cp.iterable([1])).key_by(str)
    with pytest.raises(ValueError, match="two or more"):
        cp.join_window(a, size=1, time=float)
    with pytest.raises(TypeError, match="keyed streams"):
        cp.join_window(a, flow.source(cp.iterable([2])), size=1, time=float)
    with pytest.raises(ValueError, match="slide"):
        a.join_window(flow.source(cp.iterable([2])).key_by(str), size=1, slide=2, time=float)


def test_a_finished_run_started_again_on_its_checkpoints_emits_nothing_again(tmp_path):
    """A file flow with checkpoints that reads its file to the end puts the end in a last
    checkpoint (final aggregations emitted and dropped, the file at its end): the same flow
    started again on that directory reads nothing and emits nothing (Bytewax's resume after
    EOF); a longer file then gives only what the new lines add."""
    src = tmp_path / "words.txt"
    src.write_text("".join(f"w{i % 5}\n" for i in range(100)))
    ckpt = tmp_path / "ckpt"

    def counts(out):
        flow = cp.Flow()
        (flow.source(cp.file(src, frame="lines", decode=cp.text)).key_by(lambda w: w)
            .count_final().sink(cp.collect(out)))
        return flow
    out = []
    run(counts(out), checkpoint_dir=ckpt, checkpoint_interval=0.05)
    assert sorted(out) == [(f"w{i}", 20) for i in range(5)]
    again = []
    flow = counts(again)
    stats = run(flow, checkpoint_dir=ckpt, checkpoint_interval=0.05)
    assert stats["checkpoints"]["restored_epoch"] > 0
    assert again == []
    with src.open("a") as f:
        f.write("w1\nw7\n")
    more = []
    run(counts(more), checkpoint_dir=ckpt, checkpoint_interval=0.05)
    assert sorted(more) == [("w1", 1), ("w7", 1)]


def test_a_checkpointed_state_no_pipeline_holds_any_more_is_said(tmp_path, capfd):
    """A flow restarted on a checkpoint of another shape (here its pipeline renamed, so its
    window's state is named otherwise) restores what it can and says which state it left out,
    instead of starting over in silence."""
    src = tmp_path / "words.txt"
    src.write_text("".join(f"w{i % 3}\n" for i in range(10)))
    ckpt = tmp_path / "ckpt"

    def windows(name):
        flow = cp.Flow()
        (flow.source(cp.file(src, frame="lines", decode=cp.text)).named(name)
            .key_by(lambda w: w).count_window(100, init=int, fold=lambda n, w: n + 1)
            .sink(cp.discard()))
        return flow
    run(windows("words"), checkpoint_dir=ckpt, checkpoint_interval=0.05)
    capfd.readouterr()
    run(windows("renamed"), checkpoint_dir=ckpt, checkpoint_interval=0.05)
    err = capfd.readouterr().err
    assert "no pipeline of this topology has" in err and "words window" in err, err


GROUP_FLOW = """
import json, os, sys, time
import canter.pipeline as cp

slow = os.environ.get("SLOW") == "1"


def pace(line):
    i = int(line)
    if slow and i % 4 == 0:
        time.sleep(0.001)
    return i


flow = cp.Flow()
(flow.source(cp.file(sys.argv[1], frame="lines", decode=cp.text)).map(pace)
    .key_by(lambda i: str(i % 13))
    .fold_final(lambda: [0, 0], lambda a, i: [a[0] + 1, a[1] + i])
    .map(lambda kv: [kv[0], kv[1][0], kv[1][1], os.getpid()])
    .sink(cp.file_out(sys.argv[2], encode=cp.json)))
stats = flow.run(workers=1, processes=2, checkpoint_dir=sys.argv[3], checkpoint_interval=0.05)
print(json.dumps(stats["checkpoints"]))
"""


def checkpoint_epoch(d):
    """The latest checkpoint file's epoch in directory `d` (0: none yet)."""
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    return max((int(n.split(".")[0]) for n in names
                if n.endswith((".full", ".delta")) and not n.startswith(".")), default=0)


def sequenced(path):
    """The records of a framed file sink with checkpoints: each frame's 24-byte sequence
    header dropped."""
    b, at, out = path.read_bytes() if path.exists() else b"", 0, []
    while at < len(b):
        n = int.from_bytes(b[at:at + 4], "big")
        out.append(b[at + 4 + 24:at + 4 + n])
        at += 4 + n
    return out


def test_a_flow_of_two_processes_checkpoints_as_one_and_a_restart_counts_every_record_once(
        tmp_path):
    """`run(processes=2, checkpoint_dir=...)`: the two processes checkpoint as one (the first
    takes every worker's keys into the directory). Stopped with SIGTERM in the middle of the
    file after checkpoints, it emits no final aggregation (the input has not ended); started
    again, the final count and sum of each key come once, equal to a plain loop's, from the
    process owning the key (both own some)."""
    n = 20_000
    src, out, ckpt = tmp_path / "in.txt", tmp_path / "out.bin", tmp_path / "ckpt"
    # Lines of 101 bytes: the file is read in several chunks of 256 KiB (a checkpoint comes
    # between two).
    src.write_text("".join(f"{i:0100d}\n" for i in range(n)))
    (tmp_path / "gflow.py").write_text(GROUP_FLOW)
    want = {}
    for i in range(n):
        c, s = want.get(str(i % 13), (0, 0))
        want[str(i % 13)] = (c + 1, s + i)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), SLOW="1")
    cmd = [sys.executable, "gflow.py", str(src), str(out), str(ckpt)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_until(lambda: checkpoint_epoch(ckpt) >= 3 or proc.poll() is not None, timeout=60,
                   what="three checkpoints of the group")
    finally:
        ended = proc.poll()
        if ended is None:
            os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert ended is None, f"the first run ended before the stop ({ended}): {err}"
    assert sequenced(out) == [], "finals at a shutdown"
    env["SLOW"] = "0"
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["restored_epoch"] > 0, done.stdout
    got, pids = {}, set()
    for rec in sequenced(out):
        k, c, s, pid = json.loads(rec)
        assert k not in got, f"key {k} came twice"
        got[k] = (c, s)
        pids.add(pid)
    assert got == want
    assert len(pids) == 2, "both processes own keys"


class _Counter:
    """A `stateful()` logic counting a key's records; emits the count every 10th and at the
    end."""

    def __init__(self, resume):
        self.n = resume or 0

    def on_item(self, _r):
        self.n += 1
        return ([self.n] if self.n % 10 == 0 else []), False

    def on_notify(self):
        return [], False

    def on_eof(self):
        return [("end", self.n)], True

    def notify_at(self):
        return None

    def snapshot(self):
        return self.n


def windowed_flow(src, out):
    """Count, time, session and collect windows, `stateful()` logic and a windowed join over
    the lines of `src` ("key time value"), each into a file of its own in directory `out`."""
    flow = cp.Flow()

    def recs():
        return (flow.source(cp.file(src, frame="lines", decode=cp.text)).map(str.split)
                .map(lambda r: (r[0], float(r[1]), int(r[2]))))

    def into(stream, name):
        stream.sink(cp.file_out(out / f"{name}.jsonl", encode=cp.json, frame="lines"))

    t = operator.itemgetter(1)
    add = lambda acc, r: acc + r[2]  # noqa: E731
    into(recs().key_by(lambda r: r[0]).count_window(7, init=int, fold=add), "count")
    into(recs().key_by(lambda r: r[0]).time_window(5.0, time=t, slide=2.5, init=int, fold=add),
         "time")
    into(recs().key_by(lambda r: r[0]).session_window(1.5, time=t, init=int, fold=add),
         "session")
    into(recs().key_by(lambda r: r[0]).collect_window(10.0, time=t)
         .map(lambda w: (w[0], w[1], [r[2] for r in w[3]])), "collect")
    into(recs().key_by(lambda r: r[0]).stateful(_Counter), "logic")
    left, right = recs().branch(lambda r: r[2] % 2 == 0)
    into(cp.join_window(left.key_by(lambda r: r[0]), right.key_by(lambda r: r[0]), size=4.0,
                        time=t, product=True, wait=100.0)
         .map(lambda w: (w[0], w[1], [None if x is None else x[2] for x in w[3]])),
         "join_window")
    return flow


def test_windows_joins_and_logic_give_the_same_output_in_two_processes(tmp_path):
    """The same flow of windows (count, time, session, collect), `stateful()` logic and a
    windowed join, in one process and in two (keys spread over both, records crossing
    pickled): every output equal, sorted."""
    rng = random.Random(11)
    t, lines = 0.0, []
    for i in range(6000):
        t += rng.choice([0.1, 0.3, 0.7, 2.0])
        lines.append(f"k{rng.randrange(17)} {t:.1f} {i}\n")
    src = tmp_path / "in.txt"
    src.write_text("".join(lines))
    outs = {}
    for processes in (1, 2):
        out = tmp_path / f"out{processes}"
        out.mkdir()
        flow = windowed_flow(src, out)
        if processes == 1:
            run(flow, workers=2)
        else:
            flow.run(workers=1, processes=2)
        outs[processes] = {p.stem: sorted(p.read_text().splitlines()) for p in out.iterdir()}
    assert sorted(outs[1]) == ["collect", "count", "join_window", "logic", "session", "time"]
    assert all(outs[1][name] for name in outs[1]), "every step emitted"
    assert outs[2] == outs[1]


@pytest.mark.parametrize("records", ["tuple", "dict"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_keyed_stream_shared_by_joins_and_finals_gives_what_separate_key_bys_give(records,
                                                                                   workers):
    """One `key_by` read by two joins, a join window and a final aggregation: each gives the
    same output as a flow in which every consumer has a `key_by` of its own."""
    rng = random.Random(21)

    def rec(side, i):
        key, t = f"o{rng.randrange(40)}", float(i)
        return {"id": key, "side": side, "t": t} if records == "dict" else (key, side, t)

    lefts = [rec("L", i) for i in range(400)]
    rights = [rec("R", i) for i in range(400, 800)]
    key = (lambda r: r["id"]) if records == "dict" else (lambda r: r[0])
    at = (lambda r: r["t"]) if records == "dict" else (lambda r: r[2])

    def build(shared):
        flow = cp.Flow()
        outs = {n: [] for n in ("running", "final", "window", "count")}
        left = flow.source(cp.iterable(lefts))
        right = flow.source(cp.iterable(rights))
        if shared:
            kl = left.key_by(key)
            kls = [kl] * 4
        else:
            kls = [left.key_by(key) for _ in range(4)]
        kr = [right.key_by(key) for _ in range(3)]
        kls[0].join(kr[0], emit="running").sink(cp.collect(outs["running"]))
        kls[1].join(kr[1], emit="final").sink(cp.collect(outs["final"]))
        (kls[2].join_window(kr[2], size=100, time=at, wait=1000)
            .map(lambda w: (w[0], float(w[1]), w[3])).sink(cp.collect(outs["window"])))
        kls[3].count_final().sink(cp.collect(outs["count"]))
        stats = run(flow, workers=workers)
        failed = sum(v.get("failed", 0) for v in stats.values() if isinstance(v, dict))
        return {n: sorted(v, key=repr) for n, v in outs.items()}, failed

    want, failed = build(shared=False)
    assert failed == 0
    assert all(want.values()), want
    got, failed = build(shared=True)
    assert failed == 0
    for name in want:
        assert got[name] == want[name], name


def test_a_keyed_stream_joined_with_itself_pairs_each_key_with_itself():
    data = [(f"k{i % 7}", i) for i in range(70)]
    got = []
    flow = cp.Flow()
    k = flow.source(cp.iterable(data)).key_by(lambda r: r[0])
    cp.join(k, k, emit="final").sink(cp.collect(got))
    run(flow)
    last = {}
    for r in data:
        last[r[0]] = r
    assert sorted(got) == sorted((key, (r, r)) for key, r in last.items())


def test_stdout_shares_the_offset_of_prints_when_redirected_to_a_file(tmp_path):
    """`python flow.py > out.txt`: what the program prints before and after `run` and the
    sink's lines all stay, in order."""
    prog = (
        "import canter.pipeline as cp\n"
        "print('before', flush=False)\n"
        "flow = cp.Flow()\n"
        "flow.source(cp.iterable([f'record {i}' for i in range(1, 6)]))"
        ".sink(cp.stdout(encode=cp.text))\n"
        "stats = flow.run()\n"
        "print('done', stats['p1']['sink'])\n"
    )
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, "-c", prog], stdout=f, stderr=subprocess.PIPE,
                           timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert out.read_text().splitlines() == (
        ["before"] + [f"record {i}" for i in range(1, 6)] + ["done 5"])


def test_file_out_starts_afresh_on_a_run_without_a_checkpoint(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("left over from before\n")
    for _ in range(2):
        flow = cp.Flow()
        (flow.source(cp.iterable(["a", "b"]))
            .sink(cp.file_out(out, encode=cp.text, frame="lines")))
        run(flow)
        assert out.read_text() == "a\nb\n"


def test_file_out_in_two_processes_starts_afresh_once(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(b"left over")
    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"w{i % 10}\n" for i in range(1000)))
    for _ in range(2):
        flow = cp.Flow()
        (flow.source(cp.file(inp, frame="lines", decode=cp.text)).key_by(lambda w: w)
            .count_final().map(lambda kv: f"{kv[0]} {kv[1]}")
            .sink(cp.file_out(out, encode=cp.text, frame="lines")))
        flow.run(processes=2)
        assert sorted(out.read_text().splitlines()) == sorted(f"w{i} 100" for i in range(10))


WORD_COUNT = (
    "import sys\n"
    "import canter.pipeline as cp\n"
    "flow = cp.Flow()\n"
    "(flow.source(cp.file(sys.argv[1], frame='lines', decode=cp.text))\n"
    " .flat_map(str.split).key_by(lambda w: w).count_final()\n"
    " .map(lambda kv: f'{kv[0]} {kv[1]}')\n"
    " .sink(cp.file_out(sys.argv[2], encode=cp.text, frame='lines')))\n"
    "print('running', flush=True)\n"
    "flow.run()\n"
    "print('finished', flush=True)\n"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_by_signal_emits_no_finals_and_exits_non_zero(tmp_path, sig):
    """A word count of a file too long to finish killed mid-way: Bytewax's behaviour, nothing
    final written (the counts would be of part of the file), and a non-zero exit."""
    inp = tmp_path / "in.txt"
    with open(inp, "w") as f:
        for i in range(400_000):
            f.write(f"w{i % 5000} w{i % 7}\n")
    out = tmp_path / "out.txt"
    prog = tmp_path / "wc.py"
    # A map slow enough that the file is far from read when the signal comes; its first call
    # leaves a mark: the flow is running.
    mark = tmp_path / "started"
    prog.write_text(
        f"import os, time\nMARK = {str(mark)!r}\n"
        "def slow(line):\n"
        "    if not os.path.exists(MARK):\n"
        "        open(MARK, 'w').close()\n"
        "    time.sleep(0.0002)\n"
        "    return line\n"
        + WORD_COUNT.replace(".flat_map(str.split)", ".map(slow).flat_map(str.split)"))
    p = subprocess.Popen([sys.executable, str(prog), str(inp), str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"running\n"
    wait_until(mark.exists, timeout=60, what="the flow's first record")
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    # SIGINT: the KeyboardInterrupt ends Python by the signal itself, as Bytewax ends.
    want = 143 if sig == signal.SIGTERM else -signal.SIGINT
    assert p.returncode == want, (p.returncode, stderr.decode()[-2000:])
    assert b"finished" not in stdout
    assert out.read_text() == "", out.read_text()[:200]


def test_a_flow_read_to_its_end_still_emits_its_finals_and_exits_zero(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("a b a\nc a\n")
    out = tmp_path / "out.txt"
    prog = tmp_path / "wc.py"
    prog.write_text(WORD_COUNT)
    r = subprocess.run([sys.executable, str(prog), str(inp), str(out)], capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["running", "finished"]
    assert sorted(out.read_text().splitlines()) == ["a 3", "b 1", "c 1"]


PIPE_TIMER = """
import sys, time
import canter.pipeline as cp

class Later(cp.StatefulLogic):
    # Emits the time its timer fired, 0.5 s after its key's record.
    def __init__(self):
        self.due = None
    def on_item(self, value):
        self.due = time.time() + 0.5
        return (), False
    def notify_at(self):
        return self.due
    def on_notify(self):
        return [time.time()], True

got = []
flow = cp.Flow()
(flow.source(cp.file(sys.argv[1], frame="lines", decode=cp.text)).key_by(lambda line: line)
    .stateful(lambda _: Later()).sink(cp.collect(got)))
flow.start(workers=1)
print("started", time.time(), flush=True)
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.02)
print("fired", repr(got), flush=True)
flow.shutdown()
print("ended", flow.wait(30), flush=True)
"""


def test_timers_fire_while_a_pipe_source_awaits_input_and_a_shutdown_ends_it(tmp_path):
    """A source that is a pipe (the standard input, a FIFO) waits for input without holding
    its worker (nor the interpreter): a record's timer fires while the pipe is still open, and
    a shutdown ends the flow with no further input. In a child process, so that a worker that
    blocks fails the test instead of hanging it."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    # Held open for reading and writing: the flow's open does not wait for a writer, and the
    # input never ends.
    w = os.open(fifo, os.O_RDWR)
    p = subprocess.Popen([sys.executable, "-c", PIPE_TIMER, str(fifo)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline().split()
        assert first[:1] == ["started"], (first, p.stderr.read() if p.poll() else "")
        sent = time.time()
        os.write(w, b"a\n")
        out, err = p.communicate(timeout=90)
    finally:
        p.kill()
        p.wait()
        os.close(w)
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("fired [('a', "), (out, err)
    fired = float(lines[0].split(", ")[1].rstrip(")]"))
    assert fired >= sent + 0.5, (fired, sent)
    assert lines[1] == "ended True", (out, err)


def test_a_flow_whose_stderr_is_gone_ends_and_counts_what_it_could_not_log():
    """`python flow.py 2>&1 | head -1`: the standard error is a pipe whose reader left, and a
    step raises on every other record. The log lines are dropped and counted; the flow ends
    with every other record delivered."""
    prog = (
        "import canter.pipeline as cp\n"
        "out = []\n"
        "flow = cp.Flow()\n"
        "(flow.source(cp.iterable(range(2000))).map(lambda i: i // (i % 2))"
        ".sink(cp.collect(out)))\n"
        "stats = flow.run(workers=2)\n"
        "print(len(out), stats['p1']['failed'], cp.log_lines_dropped() > 0, flush=True)\n"
    )
    r, w = os.pipe()
    os.close(r)
    p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, stderr=w)
    os.close(w)
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, (p.returncode, out)
    assert out.decode().split() == ["1000", "1000", "True"], out
