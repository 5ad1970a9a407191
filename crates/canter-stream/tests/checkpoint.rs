//! Checkpoints through the library, on real sockets: a topology restarted on its checkpoint
//! directory has its keyed state back and tells a resending sender where to go on; a sink
//! whose connection is lost before the receiver acknowledged sends those results again.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use canter_stream::pipeline::{
    CheckpointOptions, Collector, KeyedState, Pipeline, RunOptions, Sink, Source, Topology,
};
use canter_stream::resend::{Dedupe, Seq};
use canter_stream::send::Session;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("canter-lib-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Record `i`: key `i % 13`, value `i`, 12 bytes.
fn records(n: u64) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    let mut data = Vec::new();
    let mut frames = Vec::new();
    for i in 0..n {
        let start = data.len();
        let mut rec = ((i % 13) as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(&i.to_be_bytes());
        canter_stream::frame::encode(&rec, &mut data);
        frames.push(start..data.len());
    }
    (data, frames)
}

fn decode(b: &[u8]) -> Result<(u32, u64), String> {
    if b.len() != 12 {
        return Err("not 12 bytes".into());
    }
    Ok((
        u32::from_be_bytes(b[..4].try_into().unwrap()),
        u64::from_be_bytes(b[4..].try_into().unwrap()),
    ))
}

/// Running sums per key, checkpointed; each record emits (key, sum so far).
fn sums(source: Source, sink: Sink<(u32, u64)>) -> Topology {
    let state = KeyedState::new("sums", |_k: &u32| 0u64).checkpointed(
        |k, b| b.extend_from_slice(&k.to_be_bytes()),
        |b| Some(u32::from_be_bytes(b.try_into().ok()?)),
        |s, b| b.extend_from_slice(&s.to_be_bytes()),
        |b| Some(u64::from_be_bytes(b.try_into().ok()?)),
    );
    let p = Pipeline::new("sums", source, decode)
        .key_by(|(k, _)| *k)
        .update(&state, |sum: &mut u64, (k, v): (u32, u64), out| {
            *sum += v;
            out.emit((k, *sum));
        })
        .sink(sink);
    let mut t = Topology::new();
    t.add(p);
    t
}

fn options(dir: &PathBuf) -> RunOptions {
    RunOptions::default()
        .workers(2)
        .checkpoint(CheckpointOptions::new(dir).interval(Duration::from_millis(20)))
}

#[test]
fn a_restarted_topology_has_its_state_back_and_the_sender_goes_on_from_its_position() {
    let dir = temp_dir("restart");
    let (data, frames) = records(3000);
    let mut want = BTreeMap::new();
    for i in 0..3000u64 {
        *want.entry((i % 13) as u32).or_insert(0u64) += i;
    }
    let mut last = BTreeMap::new();
    for round in 0..2 {
        let got = Collector::new();
        let running = sums(
            Source::tcp("127.0.0.1:0".parse().unwrap()),
            Sink::collect(&got),
        )
        .start(options(&dir))
        .unwrap();
        let to = running.source_addr("sums").unwrap();
        if round == 1 {
            assert!(running.metrics().checkpoints().restored_epoch > 0);
        }
        // A fresh session each round (the sender's own state is gone too): the pipeline says
        // where to resume.
        let mut s = Session::new(to, 7, &data, &frames, Duration::from_secs(10)).unwrap();
        let (from, to_send) = if round == 0 { (0, 1000) } else { (1000, 2000) };
        let mut report = canter_stream::send::Report {
            records: 0,
            seconds: 0.0,
            rate: 0.0,
            max_lag_ms: 0.0,
            reconnects: 0,
            resent: 0,
            acked: 0,
        };
        s.report(&mut report);
        // The second session starts where the first one's records end: what the restored
        // checkpoint holds is not sent again.
        assert_eq!(report.acked, from, "the resume position of round {round}");
        assert_eq!(s.position(), from);
        for _ in 0..to_send / 100 {
            s.write(100).unwrap();
        }
        s.finish().unwrap();
        running.shutdown_handle().shutdown();
        running.wait().unwrap();
        for (k, sum) in got.take() {
            last.insert(k, sum);
        }
    }
    assert_eq!(
        last, want,
        "each key's sum over all 3000 records, each counted once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receiver that acknowledges: on the first connection it reads at least `2 * ack_first`
/// frames, acknowledges only `ack_first` and closes; on the second it reads to the end,
/// acknowledging every read. Returns the frames of the first connection, the distinct results
/// and the repeats.
fn receive_acking(listener: TcpListener, ack_first: u64) -> (u64, BTreeSet<(u32, u64)>, u64) {
    let mut dedupe = Dedupe::default();
    let mut seen = BTreeSet::new();
    let mut first = 0;
    for connection in 0..2 {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = Vec::new();
        let mut frames = 0u64;
        let mut chunk = [0u8; 65536];
        loop {
            let n = s.read(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let used = canter_stream::frame::split(&buf, 1 << 20, |rec| {
                frames += 1;
                let (seq, rest) = Seq::split(rec).unwrap();
                if dedupe.keep(&seq) {
                    seen.insert(decode(rest).unwrap());
                }
            })
            .unwrap();
            buf.drain(..used);
            if connection == 0 && frames >= 2 * ack_first {
                // Acknowledge part of what came, then drop the connection.
                s.write_all(&ack_first.to_be_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                first = frames;
                break;
            }
            if connection == 1 {
                s.write_all(&frames.to_be_bytes()).unwrap();
            }
        }
    }
    (first, seen, dedupe.repeats)
}

#[test]
fn results_a_lost_sink_connection_did_not_acknowledge_are_sent_again() {
    let dir = temp_dir("sink");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let out: SocketAddr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || receive_acking(listener, 300));
    let (data, _) = records(2000);
    let data = std::sync::Arc::new(data);
    let source = Source::generate(2000, move |i, buf| {
        let at = i as usize * 16;
        buf.extend_from_slice(&data[at + 4..at + 16]);
    });
    let sink = Sink::tcp(out, |(k, sum): &(u32, u64), b: &mut Vec<u8>| {
        b.extend_from_slice(&k.to_be_bytes());
        b.extend_from_slice(&sum.to_be_bytes());
    });
    // One worker: one sink connection, in order.
    let running = sums(source, sink).start(options(&dir).workers(1)).unwrap();
    let (first, seen, repeats) = receiver.join().unwrap();
    assert!(first >= 600, "{first}");
    assert_eq!(seen.len(), 2000, "every result arrived");
    assert_eq!(
        repeats,
        first - 300,
        "what the first connection carried beyond its acknowledgement came again, and only that"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running.is_finished() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_sink_numbers_each_result_by_its_input_record() {
    let dir = temp_dir("file");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.bin");
    let (data, _) = records(500);
    let data = std::sync::Arc::new(data);
    let source = Source::generate(500, move |i, buf| {
        let at = i as usize * 16;
        buf.extend_from_slice(&data[at + 4..at + 16]);
    });
    let sink = Sink::file(&out, |(k, sum): &(u32, u64), b: &mut Vec<u8>| {
        b.extend_from_slice(&k.to_be_bytes());
        b.extend_from_slice(&sum.to_be_bytes());
    });
    let running = sums(source, sink)
        .start(options(&dir.join("checkpoints")))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !running.is_finished() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    running.wait().unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let mut seen = BTreeSet::new();
    canter_stream::frame::split(&bytes, 1 << 20, |rec| {
        let (seq, rest) = Seq::split(rec).unwrap();
        // The generator is stream 1; record i made one result, index 0, on its key's worker.
        assert_eq!((seq.stream, seq.index), (1, 0));
        let (k, _) = decode(rest).unwrap();
        assert_eq!(k, (seq.position % 13) as u32, "{seq:?}");
        assert!(seq.worker < 2);
        seen.insert(seq.position);
    })
    .unwrap();
    assert_eq!(seen, (0..500).collect::<BTreeSet<u64>>());
    let _ = std::fs::remove_dir_all(&dir);
}
