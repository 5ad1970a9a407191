//! The same bare consume / produce loops as canter-kafka's `bare` example, on librdkafka:
//! `peer-kafka-rdkafka consume|produce BOOTSTRAP TOPIC N` prints wall time and the process's
//! CPU time per record.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::Message;
use std::time::{Duration, Instant};

fn cpu() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it for this process.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to the struct above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    (ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6)
        + (ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6)
}

/// The settings of the properties file `$KAFKA_CONFIG` (key=value lines), if set: the same
/// file canter's bare client takes.
fn with_file(mut c: ClientConfig) -> ClientConfig {
    if let Some(f) = std::env::var_os("KAFKA_CONFIG") {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').unwrap();
            c.set(k.trim(), v.trim());
        }
    }
    c
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, bootstrap, topic, n): (&str, &str, &str, u64) = (&args[1], &args[2], &args[3], args[4].parse().unwrap());
    let c0 = cpu();
    let t0 = Instant::now();
    let mut bytes = 0u64;
    if mode == "consume" {
        let c: BaseConsumer = with_file(ClientConfig::new())
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("rdk-{}", std::process::id()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.max.bytes", "52428800")
            .create().unwrap();
        c.subscribe(&[topic]).unwrap();
        let mut got = 0u64;
        while got < n {
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                bytes += m.payload().map(|p| p.len()).unwrap_or(0) as u64;
                got += 1;
            }
        }
    } else {
        let p: BaseProducer = with_file(ClientConfig::new())
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("enable.idempotence", "true")
            .create().unwrap();
        let payload = [7u8; 50];
        for i in 0..n {
            let key = format!("{}", i % 1000);
            loop {
                match p.send(BaseRecord::to(topic).key(&key).payload(&payload[..])) {
                    Ok(()) => break,
                    Err((_, _)) => { p.poll(Duration::from_millis(1)); }
                }
            }
            if i % 1024 == 0 { p.poll(Duration::ZERO); }
            bytes += 50;
        }
        p.flush(Duration::from_secs(30)).unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let c = cpu() - c0;
    println!("{mode} {n} records {bytes} bytes: wall {wall:.2}s ({:.0} rec/s), cpu {c:.2}s = {:.0} ns/record", n as f64 / wall, c * 1e9 / n as f64);
}
