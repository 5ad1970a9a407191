//! The bare client's ceiling: consume or produce N records with no processing, and report
//! wall time and the process's CPU time per record (user + system, from getrusage).
//!
//! ```text
//! cargo run --release -p canter-kafka --example bare -- consume 127.0.0.1:9092 TOPIC N
//! cargo run --release -p canter-kafka --example bare -- produce 127.0.0.1:9092 TOPIC N [SIZE]
//! cargo run --release -p canter-kafka --example bare -- end 127.0.0.1:9092 TOPIC
//!
//! cargo run --release -p canter-kafka --example bare -- pipe 127.0.0.1:9092 IN,IN2 N OUT
//! ```
//!
//! `end` prints the sum of the topic's latest offsets (how many records it holds), `ends`
//! each partition's; `committed` reads the topic `read_committed` up to its last stable
//! offsets and prints how many records committed transactions (and plain producers) put
//! there (transaction markers take offsets too, so `end` overcounts such a topic); `latency BOOTSTRAP TOPIC SECONDS` reads what arrives for that long and
//! prints the percentiles of arrival time less record timestamp (JSON, ms); `pipe`
//! consumes N records from the input topics and produces each, key and value unchanged, to
//! OUT's partition for its key: a pipeline that does nothing, the ceiling of one that does.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use canter_kafka::{
    partition_for, Cluster, Config, FetchConfig, Fetcher, Producer, ProducerConfig,
};

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // utime and stime are fields 14 and 15, after the command in parentheses.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let one_topic = ["end", "ends", "committed"].contains(&args.get(1).map_or("", String::as_str));
    if args.len() < 4 || (!one_topic && args.len() < 5) {
        eprintln!(
            "usage: bare consume|produce BOOTSTRAP TOPIC N [SIZE] | end|ends|committed BOOTSTRAP \
             TOPIC | pipe BOOTSTRAP IN[,IN2] N OUT"
        );
        std::process::exit(2);
    }
    let (mode, bootstrap, topic) = (&args[1], &args[2], &args[3]);
    let n: u64 = args.get(4).map_or(0, |s| s.parse().unwrap());
    let size: usize = match mode.as_str() {
        "produce" => args.get(5).map_or(50, |s| s.parse().unwrap()),
        _ => 50,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut cluster = Cluster::connect(config(bootstrap)).await.unwrap();
        let topics: Vec<&str> = topic.split(',').collect();
        cluster.refresh(&topics).await.unwrap();
        let parts = cluster.topic(topics[0]).unwrap().partitions.len() as i32;
        if mode == "ends" {
            let all: Vec<i32> = (0..parts).collect();
            let ends = cluster
                .list_offsets(topic, &all, canter_kafka::OffsetSpec::Latest)
                .await
                .unwrap();
            let line: Vec<String> = ends.iter().map(|(_, o)| o.to_string()).collect();
            println!("{}", line.join(" "));
            return;
        }
        if mode == "latency" {
            // Reads what arrives from now on for N seconds; each record's latency is its
            // arrival time less its timestamp (the producer's, carried through the pipeline).
            let all: Vec<i32> = (0..parts).collect();
            let ends = cluster
                .list_offsets(topic, &all, canter_kafka::OffsetSpec::Latest)
                .await
                .unwrap();
            let read_committed = args.get(5).is_some_and(|a| a == "committed");
            let mut f = Fetcher::new(
                cluster,
                FetchConfig {
                    max_wait: std::time::Duration::from_millis(10),
                    read_committed,
                    ..FetchConfig::default()
                },
            );
            for (p, o) in ends {
                f.assign(topic, p, Some(o)).await.unwrap();
            }
            let stop = Instant::now() + std::time::Duration::from_secs(n);
            let (mut lat, mut scratch) = (Vec::new(), Vec::new());
            while Instant::now() < stop {
                for batch in f.fetch().await.unwrap() {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_micros() as i64;
                    batch
                        .for_each(&mut scratch, |r| lat.push(now - r.timestamp * 1000))
                        .unwrap();
                }
            }
            lat.sort_unstable();
            let q = |x: f64| lat.get(((lat.len() as f64 - 1.0) * x) as usize).copied().unwrap_or(0) as f64 / 1000.0;
            println!(
                "{{\"records\": {}, \"p50_ms\": {:.1}, \"p99_ms\": {:.1}, \"p999_ms\": {:.1}, \"max_ms\": {:.1}}}",
                lat.len(), q(0.5), q(0.99), q(0.999), q(1.0)
            );
            return;
        }
        if mode == "first" {
            // `first BOOTSTRAP TOPIC SECONDS P,P,...`: from the partitions' end offsets now,
            // read_committed, the arrival time (Unix seconds) of the first data record on
            // any of them; `none` if nothing came within SECONDS.
            let wanted: Vec<i32> = args
                .get(5)
                .map(|s| s.split(',').filter_map(|p| p.parse().ok()).collect())
                .unwrap_or_default();
            let ends = cluster
                .list_offsets(topic, &wanted, canter_kafka::OffsetSpec::Latest)
                .await
                .unwrap();
            let config = FetchConfig {
                max_wait: std::time::Duration::from_millis(10),
                read_committed: true,
                ..FetchConfig::default()
            };
            let mut f = Fetcher::new(cluster, config);
            for (p, o) in ends {
                f.assign(topic, p, Some(o)).await.unwrap();
            }
            let stop = Instant::now() + std::time::Duration::from_secs(n);
            let mut scratch = Vec::new();
            while Instant::now() < stop {
                for batch in f.fetch().await.unwrap() {
                    if batch.for_each(&mut scratch, |_| {}).unwrap() > 0 {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap();
                        println!("{:.3}", now.as_secs_f64());
                        return;
                    }
                }
            }
            println!("none");
            return;
        }
        if mode == "committed" {
            let all: Vec<i32> = (0..parts).collect();
            let ends = cluster
                .list_offsets(topic, &all, canter_kafka::OffsetSpec::LastStable)
                .await
                .unwrap();
            let config = FetchConfig {
                read_committed: true,
                ..FetchConfig::default()
            };
            let mut f = Fetcher::new(cluster, config);
            for p in 0..parts {
                f.assign(topic, p, None).await.unwrap();
            }
            let (mut got, mut scratch) = (0u64, Vec::new());
            while ends
                .iter()
                .any(|(p, end)| f.position(topic, *p).is_some_and(|pos| pos < *end))
            {
                for batch in f.fetch().await.unwrap() {
                    got += batch.for_each(&mut scratch, |_| {}).unwrap();
                }
            }
            println!("{got}");
            return;
        }
        if mode == "end" {
            let all: Vec<i32> = (0..parts).collect();
            let ends = cluster
                .list_offsets(topic, &all, canter_kafka::OffsetSpec::Latest)
                .await
                .unwrap();
            println!("{}", ends.iter().map(|(_, o)| o).sum::<i64>());
            return;
        }
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let mut bytes = 0u64;
        if mode == "pipe" {
            let out_topic = args.get(5).expect("pipe needs OUT").clone();
            let mut pc = Cluster::connect(config(bootstrap)).await.unwrap();
            pc.refresh(&[&out_topic]).await.unwrap();
            let mut p = Producer::new(pc, ProducerConfig::default()).await.unwrap();
            let (ot, on) = p.topic(&out_topic).await.unwrap();
            let mut f = Fetcher::new(cluster, FetchConfig::default());
            for t in &topics {
                for part in 0..parts {
                    f.assign(t, part, None).await.unwrap();
                }
            }
            let (mut got, mut scratch) = (0u64, Vec::new());
            while got < n {
                for batch in f.fetch().await.unwrap() {
                    got += batch
                        .for_each(&mut scratch, |r| {
                            let key = r.key.unwrap_or_default();
                            let value = r.value.unwrap_or_default();
                            bytes += value.len() as u64;
                            p.send(ot, partition_for(key, on), Some(key), value, r.timestamp)
                                .unwrap();
                        })
                        .unwrap();
                }
                if p.due() {
                    p.flush().await.unwrap();
                }
            }
            p.flush().await.unwrap();
        } else if mode == "consume" {
            let mut f = Fetcher::new(cluster, FetchConfig::default());
            for p in 0..parts {
                f.assign(topic, p, None).await.unwrap();
            }
            let (mut got, mut scratch) = (0u64, Vec::new());
            while got < n {
                for batch in f.fetch().await.unwrap() {
                    got += batch
                        .for_each(&mut scratch, |r| bytes += r.value.map_or(0, <[u8]>::len) as u64)
                        .unwrap();
                }
            }
        } else {
            let mut p = Producer::new(cluster, ProducerConfig::default()).await.unwrap();
            let (t, parts) = p.topic(topic).await.unwrap();
            let value = vec![7u8; size];
            let mut key = itoa_buf();
            for i in 0..n {
                let k = key.format(i % 1000);
                let part = partition_for(k.as_bytes(), parts);
                p.send(t, part, Some(k.as_bytes()), &value, 0).unwrap();
                bytes += size as u64;
                if p.due() {
                    p.flush().await.unwrap();
                }
            }
            p.flush().await.unwrap();
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - c0;
        println!(
            "{mode} {n} records {bytes} bytes: wall {wall:.2}s ({:.0} rec/s), cpu {cpu:.2}s = {:.0} ns/record",
            n as f64 / wall,
            cpu * 1e9 / n as f64
        );
    });
}

struct KeyBuf(String);
fn itoa_buf() -> KeyBuf {
    KeyBuf(String::with_capacity(8))
}
impl KeyBuf {
    fn format(&mut self, v: u64) -> &str {
        use std::fmt::Write;
        self.0.clear();
        let _ = write!(self.0, "{v}");
        &self.0
    }
}

/// The cluster settings: `bootstrap`, with the librdkafka-named settings of the properties
/// file `$KAFKA_CONFIG` if set (a secured listener's, say).
fn config(bootstrap: &str) -> Config {
    let mut s = canter_kafka::ClientSettings::new();
    if let Some(f) = std::env::var_os("KAFKA_CONFIG") {
        s.load_file(std::path::Path::new(&f)).unwrap();
    }
    s.cluster_config(bootstrap)
}
