//! Dataflow steps of the pipeline library on real worker threads and sockets: final
//! aggregations at the end of the input, state a step discards, file sinks of lines, channels
//! between pipelines (branch, merge, fan-out), joins and wake-ups; each checked against a
//! reference computed here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::PairWire;

use canter_stream::pipeline::{
    Collector, KeyedState, Pipeline, RunOptions, Sink, Source, Topology,
};

/// Record `i`: (key, value), 12 bytes big-endian; 97 keys, values spread over 0..1000.
fn make(i: u64, buf: &mut Vec<u8>) {
    buf.extend_from_slice(&(((i * 7919) % 97) as u32).to_be_bytes());
    buf.extend_from_slice(&((i * 104_729) % 1000).to_be_bytes());
}

fn decode(b: &[u8]) -> Result<(u32, u64), String> {
    let k: [u8; 4] = b.get(..4).and_then(|s| s.try_into().ok()).ok_or("short")?;
    let v: [u8; 8] = b
        .get(4..12)
        .and_then(|s| s.try_into().ok())
        .ok_or("short")?;
    Ok((u32::from_be_bytes(k), u64::from_be_bytes(v)))
}

/// The records `make` gives, in order.
fn records(n: u64) -> Vec<(u32, u64)> {
    (0..n)
        .map(|i| {
            let mut b = Vec::new();
            make(i, &mut b);
            decode(&b).expect("decodes")
        })
        .collect()
}

/// Runs `t` to its end (at most 60 s).
fn run_to_end(t: Topology, workers: usize) {
    let running = t
        .start(RunOptions::default().workers(workers))
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "the pipeline did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait().expect("workers");
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// count_final, fold_final, reduce_final, max_final and min_final emit one (key, value) per
/// key when the input ends, equal to a plain loop's, on one worker and on two.
#[test]
fn final_aggregations_emit_one_value_per_key_at_the_end_of_the_input() {
    const N: u64 = 50_000;
    let input = records(N);
    let mut count: BTreeMap<u32, u64> = BTreeMap::new();
    let mut sum: BTreeMap<u32, u64> = BTreeMap::new();
    let mut max: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    let mut min: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    for &(k, v) in &input {
        *count.entry(k).or_default() += 1;
        *sum.entry(k).or_default() += v;
        // The first of equals stays.
        max.entry(k)
            .and_modify(|m| {
                if v > m.1 {
                    *m = (k, v)
                }
            })
            .or_insert((k, v));
        min.entry(k)
            .and_modify(|m| {
                if v < m.1 {
                    *m = (k, v)
                }
            })
            .or_insert((k, v));
    }
    for workers in [1, 2] {
        let counts = Collector::new();
        let sums = Collector::new();
        let reduced = Collector::new();
        let maxes = Collector::new();
        let mins = Collector::new();
        let src = || Source::generate(N, make);
        let mut t = Topology::new();
        t.add(
            Pipeline::new("count", src(), decode)
                .key_by(|(k, _)| *k)
                .count_final()
                .sink(Sink::collect(&counts)),
        );
        t.add(
            Pipeline::new("fold", src(), decode)
                .key_by(|(k, _)| *k)
                .fold_final(|| 0u64, |acc: &mut u64, (_, v): (u32, u64)| *acc += v)
                .sink(Sink::collect(&sums)),
        );
        t.add(
            Pipeline::new("reduce", src(), decode)
                .key_by(|(k, _)| *k)
                .reduce_final(|(k, a): (u32, u64), (_, b)| (k, a + b))
                .map(|(k, (_, s))| (k, s))
                .sink(Sink::collect(&reduced)),
        );
        t.add(
            Pipeline::new("max", src(), decode)
                .key_by(|(k, _)| *k)
                .max_final(|(_, v): &(u32, u64)| *v)
                .sink(Sink::collect(&maxes)),
        );
        t.add(
            Pipeline::new("min", src(), decode)
                .key_by(|(k, _)| *k)
                .min_final(|(_, v): &(u32, u64)| *v)
                .sink(Sink::collect(&mins)),
        );
        run_to_end(t, workers);
        let by_key = |m: &BTreeMap<u32, u64>| m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>();
        assert_eq!(sorted(counts.take()), by_key(&count), "{workers} workers");
        assert_eq!(sorted(sums.take()), by_key(&sum), "{workers} workers");
        assert_eq!(sorted(reduced.take()), by_key(&sum), "{workers} workers");
        let items =
            |m: &BTreeMap<u32, (u32, u64)>| m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>();
        assert_eq!(sorted(maxes.take()), items(&max), "{workers} workers");
        assert_eq!(sorted(mins.take()), items(&min), "{workers} workers");
    }
}

/// A step that discards its key's state starts the key afresh on its next item: sums that
/// restart once they pass a limit, emitted when they do, equal a plain loop's.
#[test]
fn a_discarded_state_is_made_anew_on_the_keys_next_item() {
    const N: u64 = 50_000;
    const LIMIT: u64 = 5_000;
    let mut expected = Vec::new();
    let mut sums: BTreeMap<u32, u64> = BTreeMap::new();
    for (k, v) in records(N) {
        let s = sums.entry(k).or_default();
        *s += v;
        if *s > LIMIT {
            expected.push((k, *s));
            sums.remove(&k);
        }
    }
    assert!(expected.len() > 1000, "the test discards often");
    for workers in [1, 2] {
        // The factory counts the states it makes: one per key, and one after each discard.
        let made = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = made.clone();
        let state = KeyedState::new("sums", move |_: &u32| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            0u64
        });
        let out = Collector::new();
        let mut t = Topology::new();
        t.add(
            Pipeline::new("sums", Source::generate(N, make), decode)
                .key_by(|(k, _)| *k)
                .update(&state, |sum: &mut u64, (k, v): (u32, u64), out| {
                    *sum += v;
                    if *sum > LIMIT {
                        out.emit((k, *sum));
                        out.discard();
                    }
                })
                .sink(Sink::collect(&out)),
        );
        run_to_end(t, workers);
        assert_eq!(
            sorted(out.take()),
            sorted(expected.clone()),
            "{workers} workers"
        );
        let keys = sums.len() as u64 + expected.len() as u64;
        assert_eq!(
            made.load(std::sync::atomic::Ordering::Relaxed),
            keys,
            "a state per key and per discard ({workers} workers)"
        );
    }
}

/// A file sink of lines writes each record and a newline, no length; with checkpoints it is
/// refused at start, naming the file.
#[test]
fn a_file_sink_of_lines_writes_text_and_refuses_checkpoints() {
    let dir = std::env::temp_dir().join(format!("canter-lines-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let out = dir.join("counts.txt");
    let lines = |path: &std::path::Path| {
        let mut t = Topology::new();
        t.add(
            Pipeline::new("counts", Source::generate(1000, make), decode)
                .key_by(|(k, _)| *k)
                .count_final()
                .sink(Sink::file_lines(
                    path,
                    |(k, n): &(u32, u64), b: &mut Vec<u8>| {
                        b.extend_from_slice(format!("{k} {n}").as_bytes())
                    },
                )),
        );
        t
    };
    run_to_end(lines(&out), 2);
    let mut want: BTreeMap<u32, u64> = BTreeMap::new();
    for (k, _) in records(1000) {
        *want.entry(k).or_default() += 1;
    }
    let text = std::fs::read_to_string(&out).expect("read");
    assert!(text.ends_with('\n'));
    let got: Vec<String> = sorted(text.lines().map(str::to_owned).collect());
    let want: Vec<String> = sorted(want.iter().map(|(k, n)| format!("{k} {n}")).collect());
    assert_eq!(got, want);
    let e =
        lines(&dir.join("other.txt"))
            .start(RunOptions::default().checkpoint(
                canter_stream::pipeline::CheckpointOptions::new(dir.join("ckpt")),
            ))
            .expect_err("refused");
    assert!(e.to_string().contains("other.txt writes lines"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Channels make a graph of pipelines: one source branched by a predicate, each side keyed and
/// aggregated, both merged into one stream, which two pipelines read (fan-out) — one of them
/// keyed again; every result equals a plain loop's, on one worker and on three.
#[test]
fn channels_branch_merge_and_fan_out_between_pipelines() {
    use canter_stream::pipeline::Channel;
    const N: u64 = 30_000;
    let input = records(N);
    // Evens: a count per key; odds: a sum per key; then, per key, count + sum.
    let mut count: BTreeMap<u32, u64> = BTreeMap::new();
    let mut sum: BTreeMap<u32, u64> = BTreeMap::new();
    for &(k, v) in &input {
        if v % 2 == 0 {
            *count.entry(k).or_default() += 1;
        } else {
            *sum.entry(k).or_default() += v;
        }
    }
    let mut merged: Vec<(u32, u64)> = count
        .iter()
        .chain(sum.iter())
        .map(|(k, v)| (*k, *v))
        .collect();
    merged.sort();
    let mut totals: BTreeMap<u32, u64> = BTreeMap::new();
    for (k, v) in &merged {
        *totals.entry(*k).or_default() += v;
    }
    for workers in [1, 3] {
        let (evens, odds, both) = (Channel::new(), Channel::new(), Channel::new());
        let copy = Collector::new();
        let total = Collector::new();
        let mut t = Topology::new();
        t.add(
            Pipeline::new("in", Source::generate(N, make), decode)
                .key_by(|(k, _)| *k)
                .update(
                    &KeyedState::new("none", |_: &u32| ()),
                    |_: &mut (), x: (u32, u64), out| out.emit(x),
                )
                .sink(Sink::branch(
                    |(_, v): &(u32, u64)| v % 2 == 0,
                    &evens,
                    &odds,
                )),
        );
        t.add(
            Pipeline::from_channel("evens", &evens)
                .key_by(|(k, _)| *k)
                .count_final()
                .sink(Sink::channel(&both)),
        );
        t.add(
            Pipeline::from_channel("odds", &odds)
                .key_by(|(k, _)| *k)
                .fold_final(|| 0u64, |s: &mut u64, (_, v): (u32, u64)| *s += v)
                .sink(Sink::channel(&both)),
        );
        t.add(
            Pipeline::from_channel("copy", &both)
                .key_by(|(k, _)| *k)
                .update(
                    &KeyedState::new("pass", |_: &u32| ()),
                    |_: &mut (), x: (u32, u64), out| out.emit(x),
                )
                .sink(Sink::collect(&copy)),
        );
        t.add(
            Pipeline::from_channel("total", &both)
                .key_by(|(k, _)| *k)
                .fold_final(|| 0u64, |s: &mut u64, (_, v): (u32, u64)| *s += v)
                .sink(Sink::collect(&total)),
        );
        run_to_end(t, workers);
        assert_eq!(sorted(copy.take()), merged, "{workers} workers");
        let total: BTreeMap<u32, u64> = total.take().into_iter().collect();
        assert_eq!(total, totals, "{workers} workers");
    }
}

/// A channel written and never read is refused at start, naming the writer.
#[test]
fn a_channel_nobody_reads_is_refused() {
    let ch = canter_stream::pipeline::Channel::<(u32, u64)>::new();
    let mut t = Topology::new();
    t.add(
        Pipeline::new("lonely", Source::generate(10, make), decode)
            .key_by(|(k, _)| *k)
            .count_final()
            .map(|(k, n)| (k, n))
            .sink(Sink::channel(&ch)),
    );
    let e = t.start(RunOptions::default()).expect_err("refused");
    assert!(e.to_string().contains("pipeline lonely"), "{e}");
}

/// Orders and fills from two sources joined by order id through a channel (`Keyed::join`):
/// one row per filled order, with its quantity and price, on one worker and on two; with
/// `JoinEmit::Final`, the orders never filled come out at the end with no price.
#[test]
fn orders_and_fills_join_by_id() {
    use canter_stream::pipeline::{Channel, JoinEmit, JoinInsert};
    const ORDERS: u64 = 5_000;
    // Order i: id i, quantity i % 100 + 1; every third order is filled at price 1000 + i.
    let order = |i: u64, b: &mut Vec<u8>| {
        b.extend_from_slice(&(i as u32).to_be_bytes());
        b.extend_from_slice(&(i % 100 + 1).to_be_bytes());
    };
    let fill = |j: u64, b: &mut Vec<u8>| {
        let i = j * 3;
        b.extend_from_slice(&(i as u32).to_be_bytes());
        b.extend_from_slice(&(1000 + i).to_be_bytes());
    };
    for (emit, workers) in [
        (JoinEmit::Complete, 1),
        (JoinEmit::Complete, 2),
        (JoinEmit::Final, 2),
    ] {
        let sides: Channel<(u32, usize, u64)> = Channel::new();
        let rows = Collector::new();
        let mut t = Topology::new();
        t.add(
            Pipeline::new("orders", Source::generate(ORDERS, order), decode)
                .map(|(id, qty)| (id, 0usize, qty))
                .sink(Sink::channel(&sides)),
        );
        t.add(
            Pipeline::new("fills", Source::generate(ORDERS.div_ceil(3), fill), decode)
                .map(|(id, px)| (id, 1usize, px))
                .sink(Sink::channel(&sides)),
        );
        t.add(
            Pipeline::from_channel("join", &sides)
                .key_by(|(id, _, _)| *id)
                .join(2, JoinInsert::Last, emit)
                .sink(Sink::collect(&rows)),
        );
        run_to_end(t, workers);
        let want: Vec<(u32, Vec<Option<u64>>)> = (0..ORDERS)
            .filter(|i| emit == JoinEmit::Final || i % 3 == 0)
            .map(|i| {
                let px = (i % 3 == 0).then_some(1000 + i);
                (i as u32, vec![Some(i % 100 + 1), px])
            })
            .collect();
        assert_eq!(sorted(rows.take()), want, "{emit:?}, {workers} workers");
    }
}

/// A step with timers: each key's count goes out 50 ms after the key's last record (a
/// debounce), then the key's state is dropped; no further input is needed for the wake-ups to
/// run. The counts per key add up to what was sent, on one worker and on two.
#[test]
fn wake_ups_run_without_input_and_may_drop_the_state() {
    use canter_stream::pipeline::{Emit, KeyedState, Stateful};
    use std::io::Write;

    #[derive(Clone)]
    struct Debounce(KeyedState<u32, (u64, u64)>);

    fn now_ns() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    impl Stateful<u32, (u32, u64)> for Debounce {
        type State = (u64, u64);
        type Out = (u32, u64);
        const TIMERS: bool = true;
        fn state(&self) -> KeyedState<u32, (u64, u64)> {
            self.0.clone()
        }
        fn update(&mut self, st: &mut (u64, u64), _: (u32, u64), _: &mut Emit<'_, (u32, u64)>) {
            st.0 += 1;
            st.1 = now_ns();
        }
        fn wake_at(&mut self, _: &u32, st: &(u64, u64)) -> Option<u64> {
            Some(st.1 + 50_000_000)
        }
        fn notify(
            &mut self,
            key: &u32,
            st: &mut (u64, u64),
            _: u64,
            emit: &mut Emit<'_, (u32, u64)>,
        ) {
            emit.emit((*key, st.0));
            emit.discard();
        }
    }

    const N: u64 = 20_000;
    let mut want: BTreeMap<u32, u64> = BTreeMap::new();
    let mut data = Vec::new();
    for (i, (k, _)) in records(N).into_iter().enumerate() {
        *want.entry(k).or_default() += 1;
        let mut rec = Vec::new();
        make(i as u64, &mut rec);
        canter_stream::frame::encode(&rec, &mut data);
    }
    for workers in [1, 2] {
        let out = Collector::new();
        let mut t = Topology::new();
        t.add(
            Pipeline::new(
                "debounce",
                Source::tcp("127.0.0.1:0".parse().expect("addr")),
                decode,
            )
            .key_by(|(k, _)| *k)
            .stateful(Debounce(KeyedState::new("debounce", |_: &u32| (0, 0))))
            .sink(Sink::collect(&out)),
        );
        let running = t
            .start(RunOptions::default().workers(workers))
            .expect("start");
        let addr = running.source_addr("debounce").expect("address");
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(&data).expect("send");
        // The connection stays open: only the wake-ups can bring the counts out.
        let mut got: BTreeMap<u32, u64> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.values().sum::<u64>() < N {
            assert!(
                Instant::now() < deadline,
                "{} of {N} counted",
                got.values().sum::<u64>()
            );
            std::thread::sleep(Duration::from_millis(20));
            for (k, n) in out.take() {
                *got.entry(k).or_default() += n;
            }
        }
        assert_eq!(got, want, "{workers} workers");
        drop(s);
        running.shutdown_handle().shutdown();
        running.wait().expect("workers");
    }
}

/// A keyed state of `u64` words, checkpointed.
fn words_state<const N: usize>(name: &str) -> KeyedState<u32, [u64; N]> {
    KeyedState::new(name, |_: &u32| [0u64; N]).checkpointed(
        |k, b| b.extend_from_slice(&k.to_be_bytes()),
        |b| Some(u32::from_be_bytes(b.try_into().ok()?)),
        |s, b| s.iter().for_each(|w| b.extend_from_slice(&w.to_be_bytes())),
        |b| {
            let mut s = [0u64; N];
            for (w, c) in s.iter_mut().zip(b.chunks_exact(8)) {
                *w = u64::from_be_bytes(c.try_into().ok()?);
            }
            (b.len() == 8 * N).then_some(s)
        },
    )
}

/// Slows the first pipeline down (a sleep every few records) while set, so that a shutdown
/// comes in the middle of the input.
static SLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A branch, two keyed pipelines reading its sides (keyed otherwise) and a merge of theirs,
/// every one keeping checkpointed state: stopped in the middle of its input (after
/// checkpoints taken while records were in every channel) and started again on the same
/// directory, it ends with each key's count, even sum and odd sum equal to a plain loop's
/// (the last pipeline counts the records and sums them by parity). A checkpoint that held a
/// record in one pipeline's state and not in the next one's would lose it (the source resumes
/// after it) or count it twice.
#[test]
fn channels_checkpoint_and_a_restart_counts_every_record_once() {
    use canter_stream::pipeline::Channel;
    use std::sync::atomic::Ordering;
    const N: u64 = 40_000;
    let mut want: BTreeMap<u32, [u64; 3]> = BTreeMap::new();
    for (k, v) in records(N) {
        let w = want.entry(k).or_default();
        w[0] += 1;
        w[1 + (v % 2) as usize] += v;
    }
    for workers in [1, 2, 3] {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-channels-ckpt-{}-{workers}",
            std::process::id()
        ));
        let got = Collector::new();
        let topology = || {
            let (evens, odds, both) = (Channel::new(), Channel::new(), Channel::new());
            let mut t = Topology::new();
            t.add(
                Pipeline::new("in", Source::generate(N, make), decode)
                    .key_by(|(k, _)| *k)
                    .update(&words_state::<1>("seen"), |s, x: (u32, u64), out| {
                        s[0] += 1;
                        if SLOW.load(Ordering::Relaxed) && s[0] % 8 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        out.emit(x)
                    })
                    .sink(Sink::branch(
                        |(_, v): &(u32, u64)| v % 2 == 0,
                        &evens,
                        &odds,
                    )),
            );
            // Keyed otherwise than the first and the last pipeline: records cross workers
            // between each two.
            for (name, ch) in [("evens", &evens), ("odds", &odds)] {
                t.add(
                    Pipeline::from_channel(name, ch)
                        .key_by(|(_, v)| (*v % 10) as u32)
                        .update(&words_state::<1>(name), |s, x: (u32, u64), out| {
                            s[0] += 1;
                            out.emit(x)
                        })
                        .sink(Sink::channel(&both)),
                );
            }
            t.add(
                Pipeline::from_channel("total", &both)
                    .key_by(|(k, _)| *k)
                    .update(&words_state::<3>("total"), |s, (k, v): (u32, u64), out| {
                        s[0] += 1;
                        s[1 + (v % 2) as usize] += v;
                        out.emit((k, *s))
                    })
                    .sink(Sink::collect(&got)),
            );
            t
        };
        // Stopped once a part of the input went through and three checkpoints followed, then
        // run again to the end from the last checkpoint.
        let (before, after) = stopped_and_finished(&dir, workers, 2_000, &SLOW, &got, topology);
        let first = before.len() as u64;
        assert!(
            first < N,
            "the first run was to stop in the middle ({first} results)"
        );
        let seen: Vec<_> = before.into_iter().chain(after).collect();
        let mut last: BTreeMap<u32, [u64; 3]> = BTreeMap::new();
        for (k, s) in &seen {
            let n = want.get(k).map_or(0, |w| w[0]);
            assert!(
                s[0] <= n,
                "key {k} counted {} of {n} records ({workers} workers)",
                s[0]
            );
            let l = last.entry(*k).or_default();
            if s[0] >= l[0] {
                *l = *s;
            }
        }
        assert_eq!(
            last, want,
            "{workers} workers, {first} results before the restart"
        );
    }
}

/// Event `i`: key `i % 7`, time (ns) in bursts a second apart (each burst's 50 events spread
/// over 50 ms, out of order within it), value `i`.
fn event(i: u64, buf: &mut Vec<u8>) {
    let t = (i / 50) * 1_000_000_000 + ((i * 37) % 50) * 1_000_000;
    buf.extend_from_slice(&((i % 7) as u32).to_be_bytes());
    buf.extend_from_slice(&t.to_be_bytes());
    buf.extend_from_slice(&i.to_be_bytes());
}

fn decode_event(b: &[u8]) -> Result<(u32, u64, u64), String> {
    let word = |at: usize| -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            b.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .ok_or("short")?,
        ))
    };
    let k: [u8; 4] = b.get(..4).and_then(|s| s.try_into().ok()).ok_or("short")?;
    Ok((u32::from_be_bytes(k), word(4)?, word(12)?))
}

fn events(n: u64) -> Vec<(u32, u64, u64)> {
    (0..n)
        .map(|i| {
            let mut b = Vec::new();
            event(i, &mut b);
            decode_event(&b).expect("decodes")
        })
        .collect()
}

/// `stateful_map` (Bytewax's): the state goes in by value, and a new state of None drops the
/// key's, whose next item starts from the state's init: counts per key that restart after 5.
#[test]
fn stateful_map_returns_the_new_state_and_none_drops_it() {
    const N: u64 = 5_000;
    let mut want: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (k, ..) in events(N) {
        let v = want.entry(k).or_default();
        let n = v.last().map_or(1, |n| n % 5 + 1);
        v.push(n);
    }
    for workers in [1, 2] {
        let got = Collector::new();
        let mut t = Topology::new();
        t.add(
            Pipeline::new("count", Source::generate(N, event), decode_event)
                .key_by(|(k, ..)| *k)
                .stateful_map(
                    &KeyedState::new("n", |_: &u32| 0u64),
                    |n: u64, (k, ..): (u32, u64, u64)| {
                        let n = n + 1;
                        ((n < 5).then_some(n), (k, n))
                    },
                )
                .sink(Sink::collect(&got)),
        );
        run_to_end(t, workers);
        let mut per_key: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (k, n) in got.take() {
            per_key.entry(k).or_default().push(n);
        }
        assert_eq!(per_key, want, "{workers} workers");
    }
}

/// `session_window`: each key's events of one burst (out of order within it, all within the
/// gap) make one session, from its earliest time to one past its latest; `collect_window`
/// gives each tumbling window's events sorted by time.
#[test]
fn session_and_collect_windows_match_a_plain_loop() {
    use canter_stream::pipeline::{Aggregate, Span};
    const N: u64 = 5_000;
    const MS: u64 = 1_000_000;
    let evs = events(N);
    // Sessions: per (key, burst), the earliest and latest time and the values' sum.
    let mut sessions: BTreeMap<(u32, u64), (u64, u64, u64)> = BTreeMap::new();
    for (i, &(k, t, v)) in evs.iter().enumerate() {
        let s = sessions
            .entry((k, i as u64 / 50))
            .or_insert((u64::MAX, 0, 0));
        (s.0, s.1, s.2) = (s.0.min(t), s.1.max(t), s.2 + v);
    }
    let want_sessions: Vec<(u32, u64, u64, u64)> = sorted(
        sessions
            .iter()
            .map(|(&(k, _), &(first, last, sum))| (k, first, last + 1, sum))
            .collect(),
    );
    // Windows of 250 ms: per (key, window), the values in time order (arrival order for
    // equal times).
    let mut windows: BTreeMap<(u32, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for &(k, t, v) in &evs {
        windows.entry((k, t / (250 * MS))).or_default().push((t, v));
    }
    let want_windows: Vec<(u32, u64, Vec<u64>)> = windows
        .into_iter()
        .map(|((k, w), mut items)| {
            items.sort_by_key(|(t, _)| *t);
            (k, w * 250 * MS, items.into_iter().map(|(_, v)| v).collect())
        })
        .collect();
    for workers in [1, 2] {
        let (s, w) = (Collector::new(), Collector::new());
        let mut t = Topology::new();
        t.add(
            Pipeline::new("sessions", Source::generate(N, event), decode_event)
                .key_by(|(k, ..)| *k)
                .session_window(
                    Duration::from_millis(100),
                    |(_, t, _)| *t,
                    Aggregate::new(
                        || 0u64,
                        |sum: &mut u64, (_, _, v): (u32, u64, u64)| *sum += v,
                        |k: &u32, sum, span: Span| (*k, span.start, span.end, sum),
                    ),
                )
                .sink(Sink::collect(&s)),
        );
        t.add(
            Pipeline::new("windows", Source::generate(N, event), decode_event)
                .key_by(|(k, ..)| *k)
                .collect_window(Duration::from_millis(250), |(_, t, _)| *t)
                .map(|(k, span, items)| (k, span.start, items.into_iter().map(|x| x.2).collect()))
                .sink(Sink::collect(&w)),
        );
        run_to_end(t, workers);
        assert_eq!(sorted(s.take()), want_sessions, "{workers} workers");
        assert_eq!(sorted(w.take()), want_windows, "{workers} workers");
    }
}

/// `join_window` (Bytewax's): two sides read at once (their records out of order between them
/// by up to the whole input, which the windows wait for), joined per key and 10 ms window:
/// each side's latest record, or every combination; the same rows as a plain loop's.
#[test]
fn join_window_gives_each_windows_rows() {
    use canter_stream::pipeline::{Channel, Span};
    const N: u64 = 3_000;
    const MS: u64 = 1_000_000;
    // Side 0, item i: key i % 11 at i ms; side 1, item j: key (j * 7) % 11 at 3j + 1 ms.
    let side0 = |i: u64, b: &mut Vec<u8>| {
        b.extend_from_slice(&((i % 11) as u32).to_be_bytes());
        b.extend_from_slice(&(i * MS).to_be_bytes());
    };
    let side1 = |j: u64, b: &mut Vec<u8>| {
        b.extend_from_slice(&(((j * 7) % 11) as u32).to_be_bytes());
        b.extend_from_slice(&((3 * j + 1) * MS).to_be_bytes());
    };
    let items = |side: usize, n: u64, make: &dyn Fn(u64, &mut Vec<u8>)| -> Vec<(u32, usize, u64)> {
        (0..n)
            .map(|i| {
                let mut b = Vec::new();
                make(i, &mut b);
                let (k, t) = decode(&b).expect("decodes");
                (k, side, t)
            })
            .collect()
    };
    let all: Vec<_> = items(0, N, &side0)
        .into_iter()
        .chain(items(1, N / 3, &side1))
        .collect();
    for product in [false, true] {
        let mut windows: BTreeMap<(u32, u64), Vec<Vec<u64>>> = BTreeMap::new();
        for &(k, side, t) in &all {
            let w = windows
                .entry((k, t / (10 * MS) * 10 * MS))
                .or_insert_with(|| vec![Vec::new(), Vec::new()]);
            if product {
                w[side].push(t);
            } else {
                w[side] = vec![t];
            }
        }
        let mut want = Vec::new();
        for ((k, start), sides) in &windows {
            let firsts: Vec<Option<u64>> = sides.iter().map(|s| s.first().copied()).collect();
            if product {
                for a in sides[0]
                    .iter()
                    .map(Some)
                    .chain(sides[0].is_empty().then_some(None))
                {
                    for b in sides[1]
                        .iter()
                        .map(Some)
                        .chain(sides[1].is_empty().then_some(None))
                    {
                        want.push((*k, *start, vec![a.copied(), b.copied()]));
                    }
                }
            } else {
                want.push((*k, *start, firsts));
            }
        }
        want.sort();
        for workers in [1, 2] {
            let sides: Channel<(u32, usize, u64)> = Channel::new();
            let rows = Collector::new();
            let mut t = Topology::new();
            t.add(
                Pipeline::new("clicks", Source::generate(N, side0), decode)
                    .map(|(k, t)| (k, 0usize, t))
                    .sink(Sink::channel(&sides)),
            );
            t.add(
                Pipeline::new("buys", Source::generate(N / 3, side1), decode)
                    .map(|(k, t)| (k, 1usize, t))
                    .sink(Sink::channel(&sides)),
            );
            t.add(
                Pipeline::from_channel("join", &sides)
                    .key_by(|(k, ..)| *k)
                    .join_window(
                        2,
                        Duration::from_millis(10),
                        Duration::from_secs(N),
                        product,
                        |t: &u64| *t,
                    )
                    .map(|(k, span, row): (u32, Span, Vec<Option<u64>>)| (k, span.start, row))
                    .sink(Sink::collect(&rows)),
            );
            run_to_end(t, workers);
            assert_eq!(
                sorted(rows.take()),
                want,
                "product {product}, {workers} workers"
            );
        }
    }
}

/// A window's key, start, end, count and sum.
type WindowSum = (u32, u64, u64, u64, u64);

/// `(key, start, end, count, sum)` of every sliding window (of `size` ms, one every `slide` ms)
/// over `events(N)`, as a plain loop counts them; with `wait` (ms), an item behind its key's
/// watermark (the latest time of the key's items less `wait`) is late and left out, Bytewax's
/// rule. Also how many were late.
fn window_sums(size: u64, slide: u64, wait: Option<u64>) -> (Vec<WindowSum>, u64) {
    const MS: u64 = 1_000_000;
    let (size, slide) = (size * MS, slide * MS);
    let mut want: BTreeMap<(u32, u64), (u64, u64)> = BTreeMap::new();
    let mut latest: BTreeMap<u32, u64> = BTreeMap::new();
    let mut late = 0;
    for (k, t, v) in events(WINDOW_EVENTS) {
        let l = latest.entry(k).or_insert(t);
        *l = (*l).max(t);
        if wait.is_some_and(|w| t < l.saturating_sub(w * MS)) {
            late += 1;
            continue;
        }
        let mut s = t - t % slide;
        while s + size > t {
            let w = want.entry((k, s)).or_default();
            (w.0, w.1) = (w.0 + 1, w.1 + v);
            match s.checked_sub(slide) {
                Some(p) => s = p,
                None => break,
            }
        }
    }
    let want = want
        .into_iter()
        .map(|((k, s), (n, sum))| (k, s, s + size, n, sum))
        .collect();
    (want, late)
}

const WINDOW_EVENTS: u64 = 5_000;

/// The same windows from the engine's `time_window`, on `workers` workers.
fn time_window_sums(size: u64, slide: u64, wait: u64, workers: usize) -> Vec<WindowSum> {
    use canter_stream::pipeline::{Aggregate, Span};
    let got = Collector::new();
    let mut t = Topology::new();
    t.add(
        Pipeline::new(
            "windows",
            Source::generate(WINDOW_EVENTS, event),
            decode_event,
        )
        .key_by(|(k, ..)| *k)
        .time_window(
            Duration::from_millis(size),
            Duration::from_millis(slide),
            Duration::from_millis(wait),
            |(_, t, _)| *t,
            Aggregate::new(
                || (0u64, 0u64),
                |a: &mut (u64, u64), (_, _, v): (u32, u64, u64)| (a.0, a.1) = (a.0 + 1, a.1 + v),
                |k: &u32, (n, sum), span: Span| (*k, span.start, span.end, n, sum),
            ),
        )
        .sink(Sink::collect(&got)),
    );
    run_to_end(t, workers);
    sorted(got.take())
}

/// `time_window` (Python's, in Rust): sliding windows of 100 ms every 25 ms, waiting 60 ms for
/// the events that come out of order (within 50 ms of each other here): every window of every
/// key holds exactly the events whose time falls in it, as a plain loop counts them.
#[test]
fn sliding_time_windows_that_wait_match_a_plain_loop() {
    let (want, _) = window_sums(100, 25, None);
    for workers in [1, 2] {
        assert_eq!(
            time_window_sums(100, 25, 60, workers),
            want,
            "{workers} workers"
        );
    }
}

/// Late items follow Bytewax's rule: an item whose time is behind its key's watermark (the
/// latest time seen less `wait`) is late and dropped, even where a window holding it is still
/// open. Events out of order by up to 49 ms, a wait of 20 ms: the windows hold exactly the
/// items a loop applying that rule keeps.
#[test]
fn items_behind_the_watermark_are_late_as_in_bytewax() {
    let (want, late) = window_sums(30, 10, Some(20));
    assert!(late > 0, "the input has late items");
    for workers in [1, 2] {
        assert_eq!(
            time_window_sums(30, 10, 20, workers),
            want,
            "{workers} workers"
        );
    }
}

#[allow(clippy::type_complexity)]
fn u32_codec() -> (
    impl Fn(&u32, &mut Vec<u8>) + Send + Sync + 'static,
    impl Fn(&[u8]) -> Option<u32> + Send + Sync + 'static,
) {
    (
        |k: &u32, b: &mut Vec<u8>| b.extend_from_slice(&k.to_be_bytes()),
        |b: &[u8]| Some(u32::from_be_bytes(b.try_into().ok()?)),
    )
}

#[allow(clippy::type_complexity)]
fn u64_codec() -> (
    impl Fn(&u64, &mut Vec<u8>) + Send + Sync + 'static,
    impl Fn(&[u8]) -> Option<u64> + Send + Sync + 'static,
) {
    (
        |v: &u64, b: &mut Vec<u8>| b.extend_from_slice(&v.to_be_bytes()),
        |b: &[u8]| Some(u64::from_be_bytes(b.try_into().ok()?)),
    )
}

#[allow(clippy::type_complexity)]
fn pair_codec() -> (
    impl Fn(&(u64, u64), &mut Vec<u8>) + Send + Sync + Copy + 'static,
    impl Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync + Copy + 'static,
) {
    (
        |a: &(u64, u64), b: &mut Vec<u8>| {
            b.extend_from_slice(&a.0.to_le_bytes());
            b.extend_from_slice(&a.1.to_le_bytes());
        },
        |b: &[u8]| {
            let w = |i: usize| b.get(i..i + 8)?.try_into().ok();
            Some((u64::from_le_bytes(w(0)?), u64::from_le_bytes(w(8)?)))
        },
    )
}

/// [`SLOW`] for the tests of codecs (tests run at once, each with its own).
static SLOW_CODECS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `topology()` with checkpoints on `dir` until `enough` results (0: none needed) and
/// three checkpoints after them (the topology slowed while `slow` is set), stops it, and runs
/// it again to the end of its input: the results of both runs.
fn stopped_and_finished<O: Send + 'static>(
    dir: &std::path::Path,
    workers: usize,
    enough: usize,
    slow: &std::sync::atomic::AtomicBool,
    got: &Collector<O>,
    topology: impl Fn() -> Topology,
) -> (Vec<O>, Vec<O>) {
    use canter_stream::pipeline::CheckpointOptions;
    use std::sync::atomic::Ordering;
    let _ = std::fs::remove_dir_all(dir);
    let options = || {
        RunOptions::default()
            .workers(workers)
            .checkpoint(CheckpointOptions::new(dir).interval(Duration::from_millis(20)))
    };
    slow.store(true, Ordering::Relaxed);
    let running = topology().start(options()).expect("start");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first = Vec::new();
    while first.len() < enough {
        assert!(Instant::now() < deadline, "no results: {}", first.len());
        first.extend(got.take());
        std::thread::sleep(Duration::from_millis(5));
    }
    let at = running.metrics().checkpoints().completed;
    while running.metrics().checkpoints().completed < at + 3 {
        assert!(Instant::now() < deadline, "no checkpoints");
        std::thread::sleep(Duration::from_millis(5));
    }
    slow.store(false, Ordering::Relaxed);
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
    first.extend(got.take());
    restart_to_end(topology(), options(), deadline);
    let _ = std::fs::remove_dir_all(dir);
    (first, got.take())
}

/// Starts `topology` again on its checkpoints (it must restore one) and waits, until
/// `deadline`, for it to read its input to the end.
fn restart_to_end(topology: Topology, options: RunOptions, deadline: Instant) {
    let running = topology.start(options).expect("restart");
    assert!(running.metrics().checkpoints().restored_epoch > 0);
    while !running.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the restarted run did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait().expect("workers");
}

/// Final aggregations and a join with codecs (`checkpointed`) keep their state across a stop
/// in the middle of the input: the finals come once, at the end of the second run, equal to a
/// plain loop's; the join's rows are exactly the reference's (a row made after the last
/// checkpoint may come again after the restart, as any result does).
#[test]
fn final_aggregations_and_joins_checkpoint_with_codecs() {
    use canter_stream::pipeline::{Channel, JoinEmit, JoinInsert};
    use std::sync::atomic::Ordering;
    const N: u64 = 40_000;
    let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
    let mut sums: BTreeMap<u32, u64> = BTreeMap::new();
    for (k, v) in records(N) {
        *counts.entry(k).or_default() += 1;
        *sums.entry(k).or_default() += v;
    }
    for workers in [1, 2] {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-finals-ckpt-{}-{workers}",
            std::process::id()
        ));
        let got = Collector::new();
        let (first, second) = stopped_and_finished(&dir, workers, 0, &SLOW_CODECS, &got, || {
            let (both, finals) = (Channel::new(), Channel::new());
            let mut t = Topology::new();
            t.add(
                Pipeline::new("in", Source::generate(N, make), decode)
                    .key_by(|(k, _)| *k)
                    .update(&words_state::<1>("seen"), |s, x: (u32, u64), out| {
                        s[0] += 1;
                        if SLOW_CODECS.load(Ordering::Relaxed) && s[0] % 4 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        out.emit(x)
                    })
                    .sink(Sink::channel(&both)),
            );
            let (ek, dk) = u32_codec();
            let (ev, dv) = u64_codec();
            t.add(
                Pipeline::from_channel("counts", &both)
                    .key_by(|(k, _)| *k)
                    .count_final()
                    .checkpointed(ek, dk, ev, dv)
                    .map(|(k, n)| (k, 0u8, n))
                    .sink(Sink::channel(&finals)),
            );
            let (ek, dk) = u32_codec();
            let (ev, dv) = u64_codec();
            t.add(
                Pipeline::from_channel("sums", &both)
                    .key_by(|(k, _)| (*k + 1) % 97)
                    .fold_final(|| 0u64, |s: &mut u64, (_, v): (u32, u64)| *s += v)
                    .checkpointed(ek, dk, ev, dv)
                    .map(|(k, s)| ((k + 96) % 97, 1u8, s))
                    .sink(Sink::channel(&finals)),
            );
            t.add(Pipeline::from_channel("out", &finals).sink(Sink::collect(&got)));
            t
        });
        // The first run, stopped, ends no input: its finals stay in the checkpoint.
        assert!(first.is_empty(), "finals before the end: {}", first.len());
        let mut c: BTreeMap<u32, u64> = BTreeMap::new();
        let mut s: BTreeMap<u32, u64> = BTreeMap::new();
        for (k, which, n) in second {
            let into = if which == 0 { &mut c } else { &mut s };
            assert!(into.insert(k, n).is_none(), "key {k} came twice");
        }
        assert_eq!(c, counts, "{workers} workers");
        assert_eq!(s, sums, "{workers} workers");
    }
    // A join: orders and fills by id, the orders' side slowed.
    const ORDERS: u64 = 20_000;
    let want: std::collections::BTreeSet<(u32, Vec<Option<u64>>)> = (0..ORDERS)
        .filter(|i| i % 3 == 0)
        .map(|i| (i as u32, vec![Some(i % 100 + 1), Some(1000 + i)]))
        .collect();
    for workers in [1, 2] {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-join-ckpt-{}-{workers}",
            std::process::id()
        ));
        let got = Collector::new();
        let (first, second) = stopped_and_finished(&dir, workers, 100, &SLOW_CODECS, &got, || {
            let sides: Channel<(u32, usize, u64)> = Channel::new();
            let mut t = Topology::new();
            t.add(
                Pipeline::new(
                    "orders",
                    Source::generate(ORDERS, |i, b| {
                        b.extend_from_slice(&(i as u32).to_be_bytes());
                        b.extend_from_slice(&(i % 100 + 1).to_be_bytes());
                    }),
                    decode,
                )
                .map(|(id, qty)| {
                    if SLOW_CODECS.load(Ordering::Relaxed) && id % 4 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    (id, 0usize, qty)
                })
                .sink(Sink::channel(&sides)),
            );
            t.add(
                Pipeline::new(
                    "fills",
                    Source::generate(ORDERS.div_ceil(3), |j, b| {
                        b.extend_from_slice(&((j * 3) as u32).to_be_bytes());
                        b.extend_from_slice(&(1000 + j * 3).to_be_bytes());
                    }),
                    decode,
                )
                .map(|(id, px)| (id, 1usize, px))
                .sink(Sink::channel(&sides)),
            );
            let (ek, dk) = u32_codec();
            let (ev, dv) = u64_codec();
            t.add(
                Pipeline::from_channel("join", &sides)
                    .key_by(|(id, _, _)| *id)
                    .join(2, JoinInsert::Last, JoinEmit::Complete)
                    .checkpointed(ek, dk, ev, dv)
                    .sink(Sink::collect(&got)),
            );
            t
        });
        let rows: std::collections::BTreeSet<_> = first.into_iter().chain(second).collect();
        assert_eq!(rows, want, "{workers} workers");
    }
    // A windowed join (each order and its fill by id, in 10 ms windows of the order's time,
    // waiting for the whole input): every window is still open at the stop, and the restart
    // ends with every row once.
    let want: Vec<(u32, u64, Vec<Option<u64>>)> = (0..ORDERS)
        .map(|i| {
            let fill = (i % 3 == 0).then_some(1000 + i);
            (
                i as u32,
                i / 10 * 10 * 1_000_000,
                vec![Some(i % 100 + 1), fill],
            )
        })
        .collect();
    for workers in [1, 2] {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-join-window-ckpt-{}-{workers}",
            std::process::id()
        ));
        let got = Collector::new();
        let (first, second) = stopped_and_finished(&dir, workers, 0, &SLOW_CODECS, &got, || {
            let sides: Channel<(u32, usize, (u64, u64))> = Channel::new();
            let mut t = Topology::new();
            t.add(
                Pipeline::new(
                    "orders",
                    Source::generate(ORDERS, |i, b| {
                        b.extend_from_slice(&(i as u32).to_be_bytes());
                        b.extend_from_slice(&(i % 100 + 1).to_be_bytes());
                    }),
                    decode,
                )
                .map(|(id, qty)| {
                    if SLOW_CODECS.load(Ordering::Relaxed) && id % 4 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    (id, 0usize, (u64::from(id), qty))
                })
                .sink(Sink::channel(&sides)),
            );
            t.add(
                Pipeline::new(
                    "fills",
                    Source::generate(ORDERS.div_ceil(3), |j, b| {
                        b.extend_from_slice(&((j * 3) as u32).to_be_bytes());
                        b.extend_from_slice(&(1000 + j * 3).to_be_bytes());
                    }),
                    decode,
                )
                .map(|(id, px)| (id, 1usize, (u64::from(id), px)))
                .sink(Sink::channel(&sides)),
            );
            let (ek, dk) = u32_codec();
            t.add(
                Pipeline::from_channel("join", &sides)
                    .key_by(|(id, _, _)| *id)
                    .join_window(
                        2,
                        Duration::from_millis(10),
                        Duration::from_secs(3600),
                        false,
                        |(at, _): &(u64, u64)| at * 1_000_000,
                    )
                    .checkpointed(
                        ek,
                        dk,
                        |(at, v): &(u64, u64), b: &mut Vec<u8>| {
                            b.extend_from_slice(&at.to_le_bytes());
                            b.extend_from_slice(&v.to_le_bytes());
                        },
                        |b: &[u8]| {
                            let w = |i: usize| b.get(i..i + 8)?.try_into().ok();
                            Some((u64::from_le_bytes(w(0)?), u64::from_le_bytes(w(8)?)))
                        },
                    )
                    .map(|(id, span, row)| {
                        (
                            id,
                            span.start,
                            row.into_iter().map(|r| r.map(|x| x.1)).collect(),
                        )
                    })
                    .sink(Sink::collect(&got)),
            );
            t
        });
        assert!(first.is_empty(), "rows before the end: {}", first.len());
        assert_eq!(sorted(second), want, "{workers} workers");
    }
}

/// Time and session windows with codecs keep their open windows across a stop in the middle of
/// the input: after the restart every window of every key holds exactly its events (a window
/// closed after the last checkpoint may come again, equal).
#[test]
fn time_windows_checkpoint_with_codecs() {
    use canter_stream::pipeline::{Aggregate, Span};
    use std::sync::atomic::Ordering;
    const N: u64 = 20_000;
    const MS: u64 = 1_000_000;
    // Tumbling windows of 100 ms (tag 0) and sessions (tag 1: a key's events of one burst),
    // each (count, sum), by start.
    let mut want: BTreeMap<(u8, u32, u64), (u64, u64)> = BTreeMap::new();
    let mut first: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for (i, (k, t, v)) in events(N).into_iter().enumerate() {
        let w = want.entry((0, k, t / (100 * MS) * 100 * MS)).or_default();
        (w.0, w.1) = (w.0 + 1, w.1 + v);
        let f = first.entry((k, i as u64 / 50)).or_insert(t);
        *f = (*f).min(t);
    }
    for (i, (k, _, v)) in events(N).into_iter().enumerate() {
        let w = want.entry((1, k, first[&(k, i as u64 / 50)])).or_default();
        (w.0, w.1) = (w.0 + 1, w.1 + v);
    }
    for workers in [1, 2] {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-windows-ckpt-{}-{workers}",
            std::process::id()
        ));
        let got = Collector::new();
        let (before, after) = stopped_and_finished(&dir, workers, 50, &SLOW_CODECS, &got, || {
            let (ek, dk) = u32_codec();
            let (ek2, dk2) = u32_codec();
            let (pair, unpair) = pair_codec();
            let count_sum = |tag: u8| {
                Aggregate::new(
                    || (0u64, 0u64),
                    |a: &mut (u64, u64), (_, _, v): (u32, u64, u64)| {
                        (a.0, a.1) = (a.0 + 1, a.1 + v)
                    },
                    move |k: &u32, a, span: Span| (tag, *k, span.start, a),
                )
            };
            let mut t = Topology::new();
            t.add(
                Pipeline::new("sessions", Source::generate(N, event), decode_event)
                    .map(|e: (u32, u64, u64)| {
                        if SLOW_CODECS.load(Ordering::Relaxed) && e.2.is_multiple_of(4) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        e
                    })
                    .key_by(|(k, ..)| *k)
                    .session_window(Duration::from_millis(100), |(_, t, _)| *t, count_sum(1))
                    .checkpointed(ek2, dk2, pair, unpair)
                    .sink(Sink::collect(&got)),
            );
            t.add(
                Pipeline::new("windows", Source::generate(N, event), decode_event)
                    .map(|e: (u32, u64, u64)| {
                        if SLOW_CODECS.load(Ordering::Relaxed) && e.2.is_multiple_of(4) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        e
                    })
                    .key_by(|(k, ..)| *k)
                    .time_window(
                        Duration::from_millis(100),
                        Duration::from_millis(100),
                        Duration::from_millis(60),
                        |(_, t, _)| *t,
                        count_sum(0),
                    )
                    .checkpointed(ek, dk, pair, unpair)
                    .sink(Sink::collect(&got)),
            );
            t
        });
        let mut windows: BTreeMap<(u8, u32, u64), (u64, u64)> = BTreeMap::new();
        for (tag, k, start, a) in before.into_iter().chain(after) {
            if let Some(old) = windows.insert((tag, k, start), a) {
                assert_eq!(
                    old, a,
                    "window ({tag}, {k}, {start}) came twice, differently"
                );
            }
        }
        assert_eq!(windows, want, "{workers} workers");
    }
}

/// Slows the group checkpoint test's first run.
static SLOW_GROUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A group of two processes (two topologies of this test process, linked by the group's
/// sockets as separate processes are) checkpoints as one: the first process's coordinator
/// triggers both, each process's workers send their barriers across the links, and the one
/// file holds every worker's keys. Stopped in the middle of the input after checkpoints, and
/// started again: each key's count and sum (final aggregations, held by the worker of the
/// group that owns the key) come once, at the end, equal to a plain loop's; both processes
/// emit some.
#[test]
fn a_group_of_processes_checkpoints_as_one_and_a_restart_counts_every_record_once() {
    use canter_stream::pipeline::{CheckpointOptions, Group};
    use std::sync::atomic::Ordering;
    const N: u64 = 40_000;
    let mut want: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (k, v) in records(N) {
        let w = want.entry(k).or_default();
        (w.0, w.1) = (w.0 + 1, w.1 + v);
    }
    for workers in [1, 2] {
        let base = std::env::temp_dir().join(format!(
            "canter-lib-group-ckpt-{}-{workers}",
            std::process::id()
        ));
        let (ckpt, sockets) = (base.join("ckpt"), base.join("group"));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&sockets).expect("group dir");
        let outs = [Collector::new(), Collector::new()];
        let topology = |out: &Collector<(u32, (u64, u64))>| {
            let (ek, dk) = u32_codec();
            let (ev, dv) = pair_codec();
            let mut t = Topology::new();
            t.add(
                Pipeline::new("in", Source::generate(N, make), decode)
                    .map(|x: (u32, u64)| {
                        if SLOW_GROUP.load(Ordering::Relaxed) && x.1.is_multiple_of(8) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        x
                    })
                    .key_by(|(k, _)| *k)
                    .wire(PairWire)
                    .fold_final(
                        || (0u64, 0u64),
                        |a: &mut (u64, u64), (_, v): (u32, u64)| (a.0, a.1) = (a.0 + 1, a.1 + v),
                    )
                    .checkpointed(ek, dk, ev, dv)
                    .sink(Sink::collect(out)),
            );
            t
        };
        let start = |p: usize| {
            let opts = RunOptions::default()
                .workers(workers)
                .group(Group::new(p, 2, &sockets))
                .checkpoint(CheckpointOptions::new(&ckpt).interval(Duration::from_millis(20)));
            topology(&outs[p]).start(opts).expect("start")
        };
        SLOW_GROUP.store(true, Ordering::Relaxed);
        let running = [start(0), start(1)];
        let deadline = Instant::now() + Duration::from_secs(120);
        while running[0].metrics().checkpoints().completed < 3 {
            assert!(Instant::now() < deadline, "no checkpoints of the group");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Stopped in the middle of the input (the generated source is the group's first
        // worker's).
        let read = running[0]
            .metrics()
            .totals("in")
            .expect("in")
            .source_records;
        assert!(read < N, "the input ended before the stop: {read}");
        SLOW_GROUP.store(false, Ordering::Relaxed);
        for r in &running {
            r.shutdown_handle().shutdown();
        }
        for r in running {
            r.wait().expect("workers");
        }
        for o in &outs {
            assert!(o.take().is_empty(), "finals at a shutdown");
        }
        let running = [start(0), start(1)];
        let restored: Vec<u64> = running
            .iter()
            .map(|r| r.metrics().checkpoints().restored_epoch)
            .collect();
        assert!(
            restored[0] > 0 && restored[0] == restored[1],
            "{restored:?}"
        );
        for r in &running {
            while !r.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the restarted group did not finish"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for r in running {
            r.wait().expect("workers");
        }
        let _ = std::fs::remove_dir_all(&base);
        let mut got: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for o in &outs {
            let mine = o.take();
            assert!(!mine.is_empty(), "both processes own keys");
            for (k, a) in mine {
                assert!(got.insert(k, a).is_none(), "key {k} came twice");
            }
        }
        assert_eq!(got, want, "{workers} workers in each process");
    }
}

/// Slows the shutdown-during-alignment test's lagging pipeline.
static SLOW_ALIGN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A shutdown that comes while a checkpoint is being aligned: one pipeline of the worker is
/// aligned and holds what came after its barriers, the other still works through a backlog
/// ahead of its own. The shutdown lets the held batches run (so that the drains end), and the
/// worker's state is then no longer the checkpoint's: that checkpoint must not be written.
/// After a restart, every key's count and sum in both pipelines equal a plain loop's (a record
/// counted before the stop and read again after it would show here).
#[test]
fn a_shutdown_during_alignment_writes_no_checkpoint_of_what_came_after_the_barriers() {
    use canter_stream::pipeline::CheckpointOptions;
    use std::sync::atomic::Ordering;
    const N: u64 = 60_000;
    let mut want: BTreeMap<(u8, u32), (u64, u64)> = BTreeMap::new();
    for (k, v) in records(N) {
        for tag in [0, 1] {
            let w = want.entry((tag, k)).or_default();
            (w.0, w.1) = (w.0 + 1, w.1 + v);
        }
    }
    let workers = 2;
    for round in 0..4 {
        let dir = std::env::temp_dir().join(format!(
            "canter-lib-align-stop-{}-{round}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let got = Collector::new();
        let topology = || {
            let mut t = Topology::new();
            for (tag, name) in [(0u8, "quick"), (1u8, "lagging")] {
                let (ek, dk) = u32_codec();
                let (pair, unpair) = pair_codec();
                t.add(
                    Pipeline::new(name, Source::generate(N, make), decode)
                        .key_by(|(k, _)| *k)
                        .fold_final(
                            || (0u64, 0u64),
                            move |a: &mut (u64, u64), (_, v): (u32, u64)| {
                                if tag == 1 && SLOW_ALIGN.load(Ordering::Relaxed) && v % 16 == 0 {
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                                (a.0, a.1) = (a.0 + 1, a.1 + v);
                            },
                        )
                        .checkpointed(ek, dk, pair, unpair)
                        .map(move |(k, a)| (tag, k, a))
                        .sink(Sink::collect(&got)),
                );
            }
            t
        };
        let options = || {
            RunOptions::default()
                .workers(workers)
                .checkpoint(CheckpointOptions::new(&dir).interval(Duration::from_millis(20)))
        };
        SLOW_ALIGN.store(true, Ordering::Relaxed);
        let running = topology().start(options()).expect("start");
        let deadline = Instant::now() + Duration::from_secs(120);
        while running.metrics().checkpoints().completed < 2 {
            assert!(Instant::now() < deadline, "no checkpoints");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Into the next checkpoint's alignment, which the lagging pipeline's backlog draws out.
        std::thread::sleep(Duration::from_millis(40 + 15 * round));
        running.shutdown_handle().shutdown();
        running.wait().expect("workers");
        assert!(got.is_empty(), "finals before the end: {}", got.len());
        SLOW_ALIGN.store(false, Ordering::Relaxed);
        restart_to_end(topology(), options(), deadline);
        let _ = std::fs::remove_dir_all(&dir);
        let mut finals: BTreeMap<(u8, u32), (u64, u64)> = BTreeMap::new();
        for (tag, k, a) in got.take() {
            assert!(
                finals.insert((tag, k), a).is_none(),
                "({tag}, {k}) came twice"
            );
        }
        let wrong: Vec<_> = want
            .iter()
            .filter(|(k, v)| finals.get(k) != Some(v))
            .map(|(k, v)| (*k, *v, finals.get(k).copied()))
            .collect();
        assert!(
            wrong.is_empty(),
            "round {round}: {} keys wrong, first {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(3)]
        );
    }
}
