//! The pipeline library on real threads and sockets: fusion, keyed routing across workers,
//! shared state, windows, sources and sinks, bad input, and backpressure with a stalled sink.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::PairWire;

use canter_stream::pipeline::{
    Aggregate, Collector, KeyedState, Local, Pipeline, RunOptions, Sink, Source, Span, Topology,
};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// Record `i` of the generated streams: (key, value), 12 bytes big-endian.
fn make(i: u64, buf: &mut Vec<u8>) {
    buf.extend_from_slice(&((i * 7919) % 101).to_be_bytes()[4..]);
    buf.extend_from_slice(&i.to_be_bytes());
}

fn decode(b: &[u8]) -> Result<(u32, u64), String> {
    if b.len() != 12 {
        return Err(format!("{} bytes, not 12", b.len()));
    }
    let mut k = [0u8; 4];
    let mut v = [0u8; 8];
    k.copy_from_slice(&b[..4]);
    v.copy_from_slice(&b[4..]);
    Ok((u32::from_be_bytes(k), u64::from_be_bytes(v)))
}

/// Records `range` of the generated stream, framed.
fn framed(range: std::ops::Range<u64>) -> Vec<u8> {
    let mut data = Vec::new();
    for i in range {
        let mut rec = Vec::new();
        make(i, &mut rec);
        canter_stream::frame::encode(&rec, &mut data);
    }
    data
}

/// A pipeline named `name` passing every record of a TCP source, unchanged and keyed by its
/// key, to a TCP sink at `out`.
fn pass_to_tcp(name: &str, out: SocketAddr) -> canter_stream::pipeline::Built {
    let state = KeyedState::new("none", |_k: &u32| ());
    Pipeline::new(name, Source::tcp(any_port()), decode)
        .key_by(|(k, _)| *k)
        .update(&state, |_: &mut (), x: (u32, u64), out| out.emit(x))
        .sink(Sink::tcp(out, |(k, v): &(u32, u64), b: &mut Vec<u8>| {
            b.extend_from_slice(&k.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
        }))
}

/// Runs `topology` to its end, failing after 60 s.
fn run_to_end(t: Topology, opts: RunOptions) -> Arc<canter_stream::pipeline::Metrics> {
    let running = t.start(opts).expect("start");
    let metrics = running.metrics();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "the pipeline did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait().expect("workers");
    metrics
}

/// Waits (up to 30 s) until pipeline `name` has handed `n` records to its sink, then stops
/// `running` and waits for its workers.
fn stop_once_delivered(running: canter_stream::pipeline::Running, name: &str, n: u64) {
    let metrics = running.metrics();
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics.totals(name).expect("metrics").sink_records < n {
        assert!(Instant::now() < deadline, "{:?}", metrics.totals(name));
        std::thread::sleep(Duration::from_millis(20));
    }
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
}

/// The generated stream through map, filter, key_by and a running sum per key gives, for every
/// key, the same sequence of sums as a plain loop, whichever worker owns the key, and each key
/// is only ever touched by one worker.
#[test]
fn keyed_state_matches_a_plain_loop_on_one_worker_and_on_three() {
    const N: u64 = 200_000;
    // The plain loop.
    let mut expected: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut sums: HashMap<u32, u64> = HashMap::new();
    for i in 0..N {
        let mut b = Vec::new();
        make(i, &mut b);
        let (k, v) = decode(&b).expect("decodes");
        let v = v * 2;
        if v % 3 == 0 {
            continue;
        }
        let s = sums.entry(k).or_default();
        *s += v;
        expected.entry(k).or_default().push(*s);
    }
    for workers in [1, 3] {
        let threads: Arc<Mutex<HashMap<u32, HashSet<String>>>> = Arc::default();
        let seen = threads.clone();
        let state = KeyedState::new("sums", |_k: &u32| 0u64);
        let out = Collector::new();
        let p = Pipeline::new("sums", Source::generate(N, make), decode)
            .map(|(k, v)| (k, v * 2))
            .filter(|(_, v)| v % 3 != 0)
            .key_by(|(k, _)| *k)
            .update(&state, move |sum: &mut u64, (k, v): (u32, u64), out| {
                *sum += v;
                let name = std::thread::current().name().unwrap_or("?").to_owned();
                seen.lock()
                    .expect("lock")
                    .entry(k)
                    .or_default()
                    .insert(name);
                out.emit((k, *sum));
            })
            .sink(Sink::collect(&out));
        let mut t = Topology::new();
        t.add(p);
        let metrics = run_to_end(t, RunOptions::default().workers(workers));
        let mut got: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (k, s) in out.take() {
            got.entry(k).or_default().push(s);
        }
        assert_eq!(got, expected, "{workers} workers");
        let threads = threads.lock().expect("lock");
        assert!(
            threads.values().all(|t| t.len() == 1),
            "a key touched by two workers"
        );
        let used: HashSet<&String> = threads.values().flatten().collect();
        assert_eq!(used.len(), workers, "keys spread over every worker");
        let totals = metrics.totals("sums").expect("metrics");
        assert_eq!(totals.source_records, N);
        assert_eq!(
            totals.sink_records,
            expected.values().map(|v| v.len() as u64).sum::<u64>()
        );
        let text = metrics.prometheus();
        assert!(
            text.contains("canter_source_records_total{pipeline=\"sums\",worker=\"0\"} 200000"),
            "{text}"
        );
        assert!(
            text.contains("canter_step_records_total{pipeline=\"sums\",step=\"2:filter\""),
            "{text}"
        );
    }
}

/// Two pipelines share a keyed state: one sets a value per key, the other reads it.
#[test]
fn two_pipelines_share_one_keyed_state() {
    let limits = KeyedState::new("limits", |_k: &u32| None::<u64>);
    let out = Collector::new();
    // The first pipeline is a file, so that it is read completely before the second starts.
    let dir = tempdir();
    let path = dir.join("limits.bin");
    let mut data = Vec::new();
    for k in 0..10u32 {
        let mut rec = Vec::new();
        rec.extend_from_slice(&k.to_be_bytes());
        rec.extend_from_slice(&(k as u64 * 100).to_be_bytes());
        canter_stream::frame::encode(&rec, &mut data);
    }
    std::fs::write(&path, &data).expect("write");
    let set = Pipeline::new("set", Source::file(&path), decode)
        .key_by(|(k, _)| *k)
        .update(
            &limits,
            |limit: &mut Option<u64>,
             (_, v): (u32, u64),
             _out: &mut canter_stream::pipeline::Emit<'_, ()>| { *limit = Some(v) },
        )
        .sink(Sink::discard());
    let mut t = Topology::new();
    t.add(set);
    // Run the first alone to fill the state? No: both share workers; run them together with the
    // reader's records made so that the reader sees a key's limit once it is set, and check
    // what it saw is consistent: either no limit yet or the one set.
    let check = Pipeline::new(
        "check",
        Source::generate(1_000, |i, b| {
            b.extend_from_slice(&((i % 10) as u32).to_be_bytes());
            b.extend_from_slice(&i.to_be_bytes());
        }),
        decode,
    )
    .key_by(|(k, _)| *k)
    .update(
        &limits,
        |limit: &mut Option<u64>, (k, _): (u32, u64), out| out.emit((k, *limit)),
    )
    .sink(Sink::collect(&out));
    t.add(check);
    run_to_end(t, RunOptions::default().workers(2));
    let got = out.take();
    assert_eq!(got.len(), 1_000);
    for (k, limit) in &got {
        assert!(
            limit.is_none() || *limit == Some(*k as u64 * 100),
            "{k} {limit:?}"
        );
    }
}

/// Count and event-time tumbling windows over the pipeline, against direct computation: count
/// windows emit a key's short last window at the end (with the end it reached), or, keeping
/// only full ones, drop and count it.
#[test]
fn windows_aggregate_per_key() {
    const N: u64 = 10_000;
    let counts = Collector::new();
    let full = Collector::new();
    let sums = Collector::new();
    let sum = || {
        Aggregate::new(
            || 0u64,
            |a: &mut u64, (_, v): (u32, u64)| *a += v,
            |k: &u32, a, s: Span| (*k, a, s),
        )
    };
    let p = Pipeline::new("count", Source::generate(N, make), decode)
        .key_by(|(k, _)| *k)
        .count_window(10, sum())
        .sink(Sink::collect(&counts));
    let f = Pipeline::new("full", Source::generate(N, make), decode)
        .key_by(|(k, _)| *k)
        .count_window_full(10, sum())
        .sink(Sink::collect(&full));
    // Event time: the value, in ms.
    let q = Pipeline::new("tumbling", Source::generate(N, make), decode)
        .key_by(|(k, _)| *k)
        .tumbling_window(
            Duration::from_millis(1_000),
            |(_, v): &(u32, u64)| v * 1_000_000,
            Aggregate::new(
                || 0u64,
                |a: &mut u64, _item: (u32, u64)| *a += 1,
                |k: &u32, a, s: Span| (*k, a, s),
            ),
        )
        .sink(Sink::collect(&sums));
    let mut t = Topology::new();
    t.add(p).add(f).add(q);
    let metrics = run_to_end(t, RunOptions::default().workers(2));
    // Count windows: per key, every 10 consecutive values summed.
    let mut per_key: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for i in 0..N {
        let mut b = Vec::new();
        make(i, &mut b);
        let (k, v) = decode(&b).expect("decodes");
        per_key.entry(k).or_default().push(v);
    }
    let mut expected: Vec<(u32, u64, Span)> = Vec::new();
    let mut short = 0;
    for (k, vs) in &per_key {
        for (j, c) in vs.chunks(10).enumerate() {
            let j = j as u64;
            expected.push((
                *k,
                c.iter().sum(),
                Span {
                    start: j * 10,
                    end: j * 10 + c.len() as u64,
                },
            ));
        }
        short += u64::from(vs.len() % 10 != 0);
    }
    assert!(short > 0, "some key's last window is short");
    let mut got = counts.take();
    got.sort_by_key(|(k, _, s)| (*k, s.start));
    assert_eq!(got, expected);
    let mut got = full.take();
    got.sort_by_key(|(k, _, s)| (*k, s.start));
    expected.retain(|(_, _, s)| s.end - s.start == 10);
    assert_eq!(got, expected, "full windows only");
    let totals = |p: &str| metrics.totals(p).expect("pipeline");
    assert_eq!(totals("full").dropped_windows, short);
    assert_eq!(totals("count").dropped_windows, 0);
    // Tumbling windows of 1,000 ms over times 0..N ms: per key, items per second.
    let mut expected: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for (k, vs) in &per_key {
        for v in vs {
            *expected.entry((*k, v / 1_000)).or_default() += 1;
        }
    }
    let got: BTreeMap<(u32, u64), u64> = sums
        .take()
        .into_iter()
        .map(|(k, n, s)| {
            assert_eq!(s.end - s.start, 1_000_000_000);
            ((k, s.start / 1_000_000_000), n)
        })
        .collect();
    assert_eq!(got, expected);
}

/// A directory of its own under the system's temporary one, removed with everything in it
/// when the test ends, failed or not.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "canter-pipeline-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}

/// A file source into a file sink: every record, framed, in order (one worker).
#[test]
fn file_source_to_file_sink() {
    let dir = tempdir();
    let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
    let mut data = Vec::new();
    let mut expected = Vec::new();
    for i in 0..50_000u64 {
        let mut rec = Vec::new();
        make(i, &mut rec);
        canter_stream::frame::encode(&rec, &mut data);
        let (k, v) = decode(&rec).expect("decodes");
        canter_stream::frame::encode(format!("{k}:{v}").as_bytes(), &mut expected);
    }
    std::fs::write(&input, &data).expect("write");
    let state = KeyedState::new("none", |_k: &u32| ());
    let p = Pipeline::new("copy", Source::file(&input), decode)
        .key_by(|(k, _)| *k)
        .update(&state, |_: &mut (), x: (u32, u64), out| out.emit(x))
        .map(|(k, v)| format!("{k}:{v}"))
        .sink(Sink::file(&output, |s: &String, b: &mut Vec<u8>| {
            b.extend_from_slice(s.as_bytes())
        }));
    let mut t = Topology::new();
    t.add(p);
    run_to_end(t, RunOptions::default());
    assert_eq!(std::fs::read(&output).expect("read"), expected);
}

/// A receiver that accepts every connection (one per worker) and, once unstalled, reads each
/// to its end; returns what each connection brought.
type Receiver = (
    SocketAddr,
    std::thread::JoinHandle<Vec<Vec<u8>>>,
    Arc<Mutex<bool>>,
);

fn receiver() -> Receiver {
    let listener = TcpListener::bind(any_port()).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let stalled = Arc::new(Mutex::new(true));
    let go = stalled.clone();
    let t = std::thread::spawn(move || {
        let mut readers = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        // Accept until the connections have been read to their ends (the pipeline has stopped).
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    let go = go.clone();
                    readers.push(std::thread::spawn(move || {
                        while *go.lock().expect("lock") {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let mut s = s;
                        s.set_nonblocking(false).expect("blocking");
                        let mut all = Vec::new();
                        let _ = s.read_to_end(&mut all);
                        all
                    }));
                }
                Err(_) if readers.iter().all(|r| r.is_finished()) && !readers.is_empty() => break,
                Err(_) if Instant::now() > deadline => break,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        readers
            .into_iter()
            .map(|r| r.join().expect("reader"))
            .collect()
    });
    (addr, t, stalled)
}

/// A stalled sink stops the source from reading: the sender blocks with most of its data
/// unread, the pipeline holds no more than its bounds, and when the receiver reads again every
/// record arrives.
#[test]
fn a_stalled_sink_stops_the_source_and_nothing_is_lost() {
    // 32 MB: well over what the kernel's socket buffers on both sides can hold.
    const N: u64 = 2_000_000;
    let (out_addr, reader, stalled) = receiver();
    let p = pass_to_tcp("pass", out_addr);
    let mut t = Topology::new();
    t.add(p);
    let running = t
        .start(RunOptions::default().workers(2).sink_high_water(64 * 1024))
        .expect("start");
    let src = running.source_addr("pass").expect("source address");
    let metrics = running.metrics();
    let data = framed(0..N);
    let sent = Arc::new(Mutex::new(0usize));
    let progress = sent.clone();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(src).expect("connect");
        for chunk in data.chunks(64 * 1024) {
            s.write_all(chunk).expect("write");
            *progress.lock().expect("lock") += chunk.len();
        }
    });
    // Let the pipeline fill up against the stalled receiver.
    std::thread::sleep(Duration::from_secs(2));
    let read = metrics.totals("pass").expect("metrics").source_records;
    let written = *sent.lock().expect("lock");
    assert!(
        written < (N as usize) * 16 * 3 / 4,
        "the sender was not held back: {written} bytes written"
    );
    assert!(read < N * 3 / 4, "the source kept reading: {read} records");
    eprintln!("stalled after {read} records, {written} bytes written");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        metrics.totals("pass").expect("metrics").source_records,
        read,
        "reading stopped"
    );
    // Unstall: everything arrives.
    *stalled.lock().expect("lock") = false;
    sender.join().expect("sender");
    stop_once_delivered(running, "pass", N);
    let mut per_key: HashMap<u32, u64> = HashMap::new();
    let mut delivered = 0;
    for got in reader.join().expect("reader") {
        let records = canter_stream::frame::frames(&got, 64).expect("frames");
        delivered += records.len() as u64;
        for r in &records {
            let (k, v) = decode(&got[r.start + 4..r.end]).expect("decodes");
            let last = per_key.insert(k, v);
            assert!(last.is_none_or(|l| l < v), "per key in order");
        }
    }
    assert_eq!(delivered, N, "every record delivered once");
}

/// Bad input: a record of the wrong size is counted and skipped; an oversized frame closes its
/// connection only; the other connection's records all arrive.
#[test]
fn bad_records_are_counted_and_a_broken_frame_closes_only_its_connection() {
    let state = KeyedState::new("none", |_k: &u32| ());
    let out = Collector::new();
    let p = Pipeline::new("strict", Source::tcp(any_port()), decode)
        .key_by(|(k, _)| *k)
        .update(&state, |_: &mut (), x: (u32, u64), out| out.emit(x))
        .sink(Sink::collect(&out));
    let mut t = Topology::new();
    t.add(p);
    let running = t.start(RunOptions::default().workers(2)).expect("start");
    let src = running.source_addr("strict").expect("source");
    let metrics = running.metrics();
    let mut good = TcpStream::connect(src).expect("connect");
    let mut bad = TcpStream::connect(src).expect("connect");
    let mut data = Vec::new();
    for i in 0..1_000 {
        let mut rec = Vec::new();
        make(i, &mut rec);
        canter_stream::frame::encode(&rec, &mut data);
        if i == 500 {
            canter_stream::frame::encode(b"short", &mut data);
        }
    }
    good.write_all(&data).expect("write");
    // 2 MiB announced: over the 1 MiB limit.
    bad.write_all(&(2u32 << 20).to_be_bytes()).expect("write");
    bad.write_all(&[0; 1000]).expect("write");
    bad.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 1];
    assert!(
        matches!(bad.read(&mut buf), Ok(0) | Err(_)),
        "the broken connection is closed"
    );
    good.write_all(&data[..16])
        .expect("the good connection still takes data");
    // The collector receives a turn's records before the worker stores that turn's counts, so
    // both are waited for; the counts are then checked exactly.
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < 1_001
        || metrics
            .totals("strict")
            .is_none_or(|t| t.source_records < 1_002)
    {
        assert!(Instant::now() < deadline, "{:?}", metrics.totals("strict"));
        std::thread::sleep(Duration::from_millis(10));
    }
    let totals = metrics.totals("strict").expect("metrics");
    assert_eq!((totals.rejected_input, totals.frame_errors), (1, 1));
    assert_eq!(totals.source_records, 1_002);
    assert_eq!(out.len(), 1_001);
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
}

/// Lines from a TCP source, words counted per word (the module's example, on real sockets).
#[test]
fn lines_source_counts_words() {
    let counts = KeyedState::new("counts", |_w: &String| 0u64);
    let out = Collector::new();
    let p = Pipeline::new("words", Source::tcp_lines(any_port()), |line: &[u8]| {
        std::str::from_utf8(line).map(str::to_owned)
    })
    .flat_map(|line: String| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    })
    .key_by(|w: &String| w.clone())
    .update(&counts, |n: &mut u64, w: String, out| {
        *n += 1;
        out.emit(format!("{w} {n}"));
    })
    .sink(Sink::collect(&out));
    let mut t = Topology::new();
    t.add(p);
    let running = t.start(RunOptions::default().workers(2)).expect("start");
    let mut s = TcpStream::connect(running.source_addr("words").expect("source")).expect("connect");
    s.write_all(b"a b a\r\nc a\nb").expect("write");
    s.write_all(b"\n").expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < 6 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut got = out.take();
    got.sort();
    assert_eq!(got, ["a 1", "a 2", "a 3", "b 1", "b 2", "c 1"]);
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
}

/// Source connections are bounded per worker (each may hold a frame's worth of input): one
/// over the limit is closed at once; when one closes, a new one is served.
#[test]
fn source_connections_beyond_the_limit_are_closed() {
    let state = KeyedState::new("none", |_k: &u32| ());
    let out = Collector::new();
    let p = Pipeline::new("bounded", Source::tcp(any_port()), decode)
        .key_by(|(k, _)| *k)
        .update(&state, |_: &mut (), x: (u32, u64), out| out.emit(x))
        .sink(Sink::collect(&out));
    let mut t = Topology::new();
    t.add(p);
    let running = t
        .start(RunOptions::default().max_source_connections(2))
        .expect("start");
    let src = running.source_addr("bounded").expect("source");
    let mut record = Vec::new();
    make(1, &mut record);
    let mut frame = Vec::new();
    canter_stream::frame::encode(&record, &mut frame);
    // Two connections, each holding half a frame.
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(src).expect("connect");
            s.write_all(&frame[..8]).expect("write");
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut third = TcpStream::connect(src).expect("connect");
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    // Closed (end of stream or reset), not merely silent until the read timeout.
    let closed = match third.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(closed, "the third connection is closed");
    // The held ones still work: finishing their frames delivers both records.
    for s in &mut held {
        s.write_all(&frame[8..]).expect("write");
    }
    while out.len() < 2 {
        assert!(Instant::now() < deadline, "{}", out.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    // One closes; a new connection is served.
    drop(held.pop());
    std::thread::sleep(Duration::from_millis(200));
    let mut again = TcpStream::connect(src).expect("connect");
    again.write_all(&frame).expect("write");
    while out.len() < 3 {
        assert!(Instant::now() < deadline, "{}", out.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
}

/// Accepts one connection, failing after 10 s.
fn accept_within(listener: &TcpListener, what: &str) -> TcpStream {
    listener.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).expect("blocking");
                return s;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Reads `n` framed 12-byte records from `s`, failing after 10 s.
fn read_records(s: &mut TcpStream, n: usize) -> Vec<(u32, u64)> {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = vec![0u8; n * 16];
    s.read_exact(&mut buf).expect("the records arrive");
    let records = canter_stream::frame::frames(&buf, 64).expect("frames");
    records
        .iter()
        .map(|r| decode(&buf[r.start + 4..r.end]).expect("decodes"))
        .collect()
}

/// A TCP sink with no one listening keeps what it has and connects once a receiver appears;
/// when that receiver closes the connection, the sink connects again and what comes next
/// arrives on the new connection.
#[test]
fn a_tcp_sink_connects_late_and_reconnects_after_its_peer_closes() {
    // A free port, released: the sink's first attempts are refused.
    let out_addr = TcpListener::bind(any_port())
        .expect("bind")
        .local_addr()
        .expect("addr");
    let p = pass_to_tcp("again", out_addr);
    let mut t = Topology::new();
    t.add(p);
    let running = t.start(RunOptions::default().workers(1)).expect("start");
    let src = running.source_addr("again").expect("source");
    let mut source = TcpStream::connect(src).expect("connect");
    source.write_all(&framed(0..1_000)).expect("write");
    // Refused for a while (several attempts, with backoff), then a receiver appears.
    std::thread::sleep(Duration::from_millis(400));
    let listener = TcpListener::bind(out_addr).expect("bind the sink's port again");
    let mut first = accept_within(&listener, "the sink connects");
    let got = read_records(&mut first, 1_000);
    assert_eq!(
        got.iter().map(|r| r.1).collect::<Vec<_>>(),
        (0..1_000).collect::<Vec<_>>()
    );
    // The receiver goes away; the sink comes back on its own.
    drop(first);
    let mut second = accept_within(&listener, "the sink reconnects");
    source.write_all(&framed(1_000..2_000)).expect("write");
    let got = read_records(&mut second, 1_000);
    assert_eq!(
        got.iter().map(|r| r.1).collect::<Vec<_>>(),
        (1_000..2_000).collect::<Vec<_>>()
    );
    drop(source);
    running.shutdown_handle().shutdown();
    running.wait().expect("workers");
}

/// A TCP sink whose peer stays connected but takes nothing gives up on it after the write
/// timeout and connects again; what it still held, and everything after, arrives on the new
/// connection, in order and ending with the last record.
#[test]
fn a_tcp_sink_whose_peer_takes_nothing_connects_again_after_the_write_timeout() {
    // 16 MB: more than the kernel's buffers of one connection hold.
    const N: u64 = 1_000_000;
    let listener = TcpListener::bind(any_port()).expect("bind");
    let out_addr = listener.local_addr().expect("addr");
    let p = pass_to_tcp("stuck", out_addr);
    let mut t = Topology::new();
    t.add(p);
    let running = t
        .start(
            RunOptions::default()
                .workers(1)
                .sink_write_timeout(Duration::from_secs(1)),
        )
        .expect("start");
    let src = running.source_addr("stuck").expect("source");
    let sender = std::thread::spawn(move || {
        let data = framed(0..N);
        let mut s = TcpStream::connect(src).expect("connect");
        s.write_all(&data).expect("write");
    });
    let first = accept_within(&listener, "the sink connects");
    let since = Instant::now();
    let mut second = accept_within(&listener, "the sink connects again");
    assert!(
        since.elapsed() >= Duration::from_millis(900),
        "connected again after {:?}, before the write timeout",
        since.elapsed()
    );
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        second.read_to_end(&mut all).expect("read");
        all
    });
    sender.join().expect("sender");
    stop_once_delivered(running, "stuck", N);
    let got = reader.join().expect("reader");
    let records = canter_stream::frame::frames(&got, 64).expect("frames");
    let values: Vec<u64> = records
        .iter()
        .map(|r| decode(&got[r.start + 4..r.end]).expect("decodes").1)
        .collect();
    assert!(!values.is_empty(), "nothing arrived on the new connection");
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "in order, once each"
    );
    assert_eq!(values.last(), Some(&(N - 1)), "the last record arrives");
    drop(first);
}

/// `local()`: no key, the stateful step runs on the worker that read each record (the
/// generated source is read by the first worker: every record stays there), where `key_by`
/// spreads the same records over all three workers. The worker hooks wrap each worker's run
/// on its own thread, and the park hooks run around its waits.
#[test]
fn local_pipelines_stay_on_the_reading_worker_and_hooks_wrap_the_workers() {
    use canter_stream::pipeline::{Local, WorkerHooks};
    use std::sync::atomic::{AtomicU64, Ordering};
    let threads = |local: bool| {
        let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
        let names = seen.clone();
        let note = move || {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            names.lock().expect("lock").insert(name);
        };
        let collected = Collector::new();
        // The first record takes 50 ms: the other workers wait for the source's end meanwhile
        // (their event loops park), however fast the rest goes.
        let slow_start = |i: u64, buf: &mut Vec<u8>| {
            if i == 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            make(i, buf)
        };
        let head = Pipeline::new("gen", Source::generate(3_000, slow_start), decode);
        let built = if local {
            let state = KeyedState::new("n", |_: &Local| 0u64);
            head.local()
                .update(&state, move |n: &mut u64, x: (u32, u64), out| {
                    note();
                    *n += 1;
                    out.emit(x.1)
                })
                .sink(Sink::collect(&collected))
        } else {
            let state = KeyedState::new("n", |_: &u32| 0u64);
            head.key_by(|(k, _)| *k)
                .update(&state, move |n: &mut u64, x: (u32, u64), out| {
                    note();
                    *n += 1;
                    out.emit(x.1)
                })
                .sink(Sink::collect(&collected))
        };
        let mut t = Topology::new();
        t.add(built);
        let runs = Arc::new(AtomicU64::new(0));
        let parks = Arc::new(AtomicU64::new(0));
        let (r, p1, p2) = (runs.clone(), parks.clone(), parks.clone());
        let hooks = WorkerHooks {
            run: Arc::new(move |me, run| {
                assert_eq!(
                    std::thread::current().name(),
                    Some(format!("canter-pipeline-{me}").as_str())
                );
                r.fetch_add(1, Ordering::SeqCst);
                run()
            }),
            park: canter_rt::ParkHooks {
                before_park: Arc::new(move || {
                    p1.fetch_add(1, Ordering::Relaxed);
                }),
                after_unpark: Arc::new(move || {
                    p2.fetch_add(1, Ordering::Relaxed);
                }),
            },
        };
        run_to_end(t, RunOptions::default().workers(3).hooks(hooks));
        let mut got = collected.take();
        got.sort_unstable();
        assert_eq!(got, (0..3_000).collect::<Vec<u64>>());
        assert_eq!(runs.load(Ordering::SeqCst), 3, "one run per worker");
        assert!(parks.load(Ordering::Relaxed) > 0, "the park hooks ran");
        let seen = seen.lock().expect("lock").clone();
        seen
    };
    assert_eq!(
        threads(true),
        HashSet::from(["canter-pipeline-0".to_owned()])
    );
    assert_eq!(threads(false).len(), 3);
}

/// Two topologies as the two processes of a group (one test process: the links are the same
/// Unix sockets): a generated source (read by the group's first worker only) and a TCP source
/// whose port both share; every record arrives once, each key's records all reach one worker of
/// the group (counted 1, 2, ... with none missing or repeated), and both processes own keys.
#[test]
fn a_group_of_processes_owns_each_key_once_and_records_cross_to_their_owner() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const GEN: u64 = 20_000;
    const TCP: u64 = 30_000;
    let dir = std::env::temp_dir().join(format!("canter-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    type Out = Collector<(u32, u64, u64, String)>;
    let topology = |gen_out: &Out, tcp_out: &Out| {
        let mut t = Topology::new();
        for (name, source, out) in [
            ("gen", Source::generate(GEN, make), gen_out),
            ("tcp", Source::tcp(port), tcp_out),
        ] {
            let state = KeyedState::new("n", |_: &u32| 0u64);
            t.add(
                Pipeline::new(name, source, decode)
                    .key_by(|(k, _)| *k)
                    .wire(PairWire)
                    .update(&state, |n: &mut u64, (k, v): (u32, u64), out| {
                        *n += 1;
                        let thread = std::thread::current().name().unwrap_or("").to_owned();
                        out.emit((k, v, *n, thread))
                    })
                    .sink(Sink::collect(out)),
            );
        }
        t
    };
    let outs: Vec<(Out, Out)> = (0..2)
        .map(|_| (Collector::new(), Collector::new()))
        .collect();
    let running: Vec<_> = outs
        .iter()
        .enumerate()
        .map(|(p, (g, t))| {
            let opts = RunOptions::default()
                .workers(2)
                .group(canter_stream::pipeline::Group::new(p, 2, &dir));
            topology(g, t).start(opts).expect("start")
        })
        .collect();
    // Eight connections, spread by the kernel over the four workers' listeners.
    let sent = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..8)
        .map(|c| {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(port).expect("connect");
                let per = TCP / 8;
                s.write_all(&framed(c * per..(c + 1) * per)).expect("send");
                sent.fetch_add(per, Ordering::SeqCst);
            })
        })
        .collect();
    for s in senders {
        s.join().expect("sender");
    }
    let delivered = |name: &str| {
        running
            .iter()
            .map(|r| r.metrics().totals(name).expect("metrics").sink_records)
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered("gen") < GEN || delivered("tcp") < TCP {
        assert!(
            Instant::now() < deadline,
            "delivered gen {} tcp {}",
            delivered("gen"),
            delivered("tcp")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in &running {
        r.shutdown_handle().shutdown();
    }
    for r in running {
        r.wait().expect("workers");
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (pick, n) in [(0, GEN), (1, TCP)] {
        let per_process: Vec<Vec<_>> = outs
            .iter()
            .map(|o| if pick == 0 { o.0.take() } else { o.1.take() })
            .collect();
        assert!(
            per_process.iter().all(|v| !v.is_empty()),
            "both processes own keys: {:?}",
            per_process.iter().map(Vec::len).collect::<Vec<_>>()
        );
        let mut values = Vec::new();
        let mut by_key: HashMap<u32, (Vec<u64>, HashSet<String>)> = HashMap::new();
        for got in &per_process {
            for (k, v, count, thread) in got {
                values.push(*v);
                let e = by_key.entry(*k).or_default();
                e.0.push(*count);
                e.1.insert(thread.clone());
            }
        }
        values.sort_unstable();
        assert_eq!(values, (0..n).collect::<Vec<u64>>(), "every record once");
        let mut threads = HashSet::new();
        for (k, (counts, seen)) in by_key {
            assert_eq!(seen.len(), 1, "key {k} on one worker: {seen:?}");
            let mut sorted = counts;
            sorted.sort_unstable();
            let want: Vec<u64> = (1..=sorted.len() as u64).collect();
            assert_eq!(sorted, want, "key {k}: counted once each");
            threads.extend(seen);
        }
        assert_eq!(threads.len(), 4, "keys on all four workers: {threads:?}");
    }
}

/// A text file's lines are its records, the last one too when the file does not end with a
/// newline.
#[test]
fn the_last_line_of_a_file_without_a_newline_is_a_record() {
    let dir = tempfile_dir("last-line");
    for (name, text) in [("ended", "a\nbb\nccc\n"), ("unended", "a\nbb\nccc")] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        let out = Collector::new();
        let state = KeyedState::new("none", |_k: &Local| ());
        let p = Pipeline::new("lines", Source::file_lines(&path), |b: &[u8]| {
            Ok::<_, std::str::Utf8Error>(std::str::from_utf8(b)?.to_owned())
        })
        .local()
        .update(&state, |_: &mut (), line: String, out| out.emit(line))
        .sink(Sink::collect(&out));
        let mut t = Topology::new();
        t.add(p);
        run_to_end(t, RunOptions::default());
        assert_eq!(out.take(), ["a", "bb", "ccc"], "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file source whose file cannot be opened fails the start with the file's error, naming
/// it, instead of starting a pipeline that reads nothing.
#[test]
fn a_missing_input_file_fails_the_start_naming_it() {
    let path = tempfile_dir("missing").join("no-such-input.bin");
    let state = KeyedState::new("none", |_k: &Local| ());
    let p = Pipeline::new("reader", Source::file(&path), |b: &[u8]| {
        Ok::<_, std::convert::Infallible>(b.to_vec())
    })
    .local()
    .update(&state, |_: &mut (), r: Vec<u8>, out| out.emit(r))
    .sink(Sink::discard());
    let mut t = Topology::new();
    t.add(p);
    let Err(e) = t.start(RunOptions::default()) else {
        panic!("a pipeline started on a missing file");
    };
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    let text = e.to_string();
    assert!(
        text.contains("pipeline reader") && text.contains("no-such-input.bin"),
        "{text}"
    );
}

/// A fresh directory of this test process under the system's temporary directory.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("canter-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}
