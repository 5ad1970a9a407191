//! Market Spread on Kafka, driven from the tests: the `canter pipeline market-spread --kafka`
//! process ([`KafkaPipeline`]), topics filled from generated files ([`produce_file`]) and the
//! results read back ([`read_values`]).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use canter_kafka::{
    partition_for, ClientSettings, Cluster, Config, FetchConfig, Fetcher, Producer, ProducerConfig,
};

use super::market_spread::{reference, unframe};

/// Client settings (librdkafka's names) of the clusters a test binary uses, by bootstrap
/// address: a secured listener's. Every helper here, and the processes it starts, use them.
static SECURITY: Mutex<Vec<(String, Pairs)>> = Mutex::new(Vec::new());

type Pairs = Vec<(String, String)>;

/// Makes every helper connect to `bootstrap` with `pairs` (`security.protocol`, …).
pub fn register_settings(bootstrap: &str, pairs: &[(&str, &str)]) {
    SECURITY.lock().unwrap().push((
        bootstrap.to_owned(),
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    ));
}

fn pairs_for(bootstrap: &str) -> Vec<(String, String)> {
    SECURITY
        .lock()
        .unwrap()
        .iter()
        .find(|(b, _)| b == bootstrap)
        .map(|(_, p)| p.clone())
        .unwrap_or_default()
}

/// The cluster settings for `bootstrap`, with what [`register_settings`] gave it.
pub fn cluster_config(bootstrap: &str) -> Config {
    let mut s = ClientSettings::new();
    for (k, v) in pairs_for(bootstrap) {
        s.set(&k, &v).unwrap();
    }
    s.cluster_config(bootstrap)
}

/// The `--kafka-config KEY=VALUE` flags of `bootstrap`'s settings, for the CLI.
pub fn config_flags(bootstrap: &str) -> Vec<String> {
    pairs_for(bootstrap)
        .into_iter()
        .flat_map(|(k, v)| ["--kafka-config".to_owned(), format!("{k}={v}")])
        .collect()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Three topics of one test: `<prefix>-nbbo`, `<prefix>-orders`, `<prefix>-results`.
#[derive(Debug, Clone)]
pub struct Topics {
    pub nbbo: String,
    pub orders: String,
    pub results: String,
}

impl Topics {
    pub fn new(prefix: &str) -> Topics {
        Topics {
            nbbo: format!("{prefix}-nbbo"),
            orders: format!("{prefix}-orders"),
            results: format!("{prefix}-results"),
        }
    }

    /// Creates the three with `partitions` each.
    pub fn create(&self, bootstrap: &str, partitions: i32, replication: i16) {
        rt().block_on(async {
            let mut c = Cluster::connect(cluster_config(bootstrap)).await.unwrap();
            for t in [&self.nbbo, &self.orders, &self.results] {
                c.create_topic(t, partitions, replication, &[])
                    .await
                    .unwrap();
            }
        });
    }

    /// The `--nbbo-topic`, `--orders-topic` and `--results-topic` flags.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--nbbo-topic".into(),
            self.nbbo.clone(),
            "--orders-topic".into(),
            self.orders.clone(),
            "--results-topic".into(),
            self.results.clone(),
        ]
    }
}

/// Creates one topic with `partitions`.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    rt().block_on(async {
        let mut c = Cluster::connect(cluster_config(bootstrap)).await.unwrap();
        c.create_topic(name, partitions, 1, &[]).await.unwrap();
    });
}

/// Produces the framed records of `file` to `topic`, keyed by the 4 bytes at `key_at` (the
/// symbol), each value the record without its length prefix.
pub fn produce_file(bootstrap: &str, topic: &str, file: &Path, key_at: usize) -> u64 {
    let data = std::fs::read(file).unwrap();
    produce(
        bootstrap,
        topic,
        unframe(&data)
            .into_iter()
            .map(|r| (r[key_at..key_at + 4].to_vec(), r.to_vec())),
    )
}

/// Produces `(key, value)` records to `topic`, each to its key's partition.
pub fn produce(
    bootstrap: &str,
    topic: &str,
    records: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
) -> u64 {
    rt().block_on(async {
        let c = Cluster::connect(cluster_config(bootstrap)).await.unwrap();
        let mut p = Producer::new(c, ProducerConfig::default()).await.unwrap();
        let (t, n) = p.topic(topic).await.unwrap();
        let mut count = 0;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for (k, v) in records {
            p.send(t, partition_for(&k, n), Some(&k), &v, now).unwrap();
            count += 1;
            if p.due() {
                p.flush().await.unwrap();
            }
        }
        p.flush().await.unwrap();
        count
    })
}

/// Every value of `topic`, read from the beginning until `want` arrived and nothing more came
/// for `quiet`, or `limit` passed.
pub fn read_values(
    bootstrap: &str,
    topic: &str,
    want: usize,
    quiet: Duration,
    limit: Duration,
) -> Vec<Vec<u8>> {
    read_topic(bootstrap, topic, want, quiet, limit, false)
}

/// [`read_values`] as a `read_committed` consumer: only committed transactions' records.
pub fn read_committed_values(
    bootstrap: &str,
    topic: &str,
    want: usize,
    quiet: Duration,
    limit: Duration,
) -> Vec<Vec<u8>> {
    read_topic(bootstrap, topic, want, quiet, limit, true)
}

fn read_topic(
    bootstrap: &str,
    topic: &str,
    want: usize,
    quiet: Duration,
    limit: Duration,
    read_committed: bool,
) -> Vec<Vec<u8>> {
    rt().block_on(async {
        let mut c = Cluster::connect(cluster_config(bootstrap)).await.unwrap();
        c.refresh(&[topic]).await.unwrap();
        let n = c.topic(topic).unwrap().partitions.len() as i32;
        let config = FetchConfig {
            read_committed,
            ..FetchConfig::default()
        };
        let mut f = Fetcher::new(c, config);
        for p in 0..n {
            f.assign(topic, p, None).await.unwrap();
        }
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        let started = Instant::now();
        let mut last = Instant::now();
        loop {
            for got in f.fetch().await.unwrap() {
                got.for_each(&mut scratch, |r| {
                    out.push(r.value.unwrap_or_default().to_vec())
                })
                .unwrap();
                last = Instant::now();
            }
            if (out.len() >= want && last.elapsed() >= quiet) || started.elapsed() > limit {
                return out;
            }
        }
    })
}

/// Market Spread results as a sorted list with their timestamps zeroed, for comparing with the
/// reference.
pub fn normalized(results: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = results
        .iter()
        .map(|r| {
            let mut r = r.clone();
            let n = r.len();
            if n == 55 {
                r[n - 8..].fill(0);
            }
            r
        })
        .collect();
    v.sort();
    v
}

/// The reference results of the streams in `dir`, as sorted 55-byte records (timestamps 0).
pub fn expected(dir: &std::path::Path) -> Vec<Vec<u8>> {
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    let r = reference(&nbbo, &orders);
    let mut v: Vec<Vec<u8>> = unframe(&r).into_iter().map(<[u8]>::to_vec).collect();
    v.sort();
    v
}

/// Results against the reference: (repeated, missing, not in the reference).
pub fn compare(got: &[Vec<u8>], want: &[Vec<u8>]) -> (usize, usize, usize) {
    let got = normalized(got);
    let mut distinct = got.clone();
    distinct.dedup();
    let missing = want
        .iter()
        .filter(|w| distinct.binary_search(w).is_err())
        .count();
    let wrong = distinct
        .iter()
        .filter(|g| want.binary_search(g).is_err())
        .count();
    (got.len() - distinct.len(), missing, wrong)
}

/// Results against the reference: every expected one present, nothing else; returns how many
/// arrived more than once.
pub fn check(got: &[Vec<u8>], want: &[Vec<u8>]) -> usize {
    let (repeated, missing, wrong) = compare(got, want);
    assert!(
        missing == 0 && wrong == 0,
        "{missing} of {} expected results missing, {wrong} not in the reference ({repeated} \
         repeated): {}",
        want.len(),
        explain(got, want)
    );
    repeated
}

/// What the results not in the reference have in common, for a failure message: how many met
/// no quote for their symbol (bid and offer 0: the order was processed before its symbol's
/// first quote, or its task's state was lost), by input partition of 4, and a few examples.
pub fn explain(got: &[Vec<u8>], want: &[Vec<u8>]) -> String {
    let mut distinct = normalized(got);
    distinct.dedup();
    let wrong: Vec<&Vec<u8>> = distinct
        .iter()
        .filter(|g| want.binary_search(g).is_err())
        .collect();
    let quote = |r: &[u8], at: usize| {
        r.get(at..at + 8)
            .map_or(f64::NAN, |b| f64::from_be_bytes(b.try_into().unwrap()))
    };
    let no_quote: Vec<&&Vec<u8>> = wrong
        .iter()
        .filter(|r| quote(r, 31) == 0.0 && quote(r, 39) == 0.0)
        .collect();
    let mut by_partition = [0usize; 4];
    // Orders are numbered in the order they were sent (ids in base 36).
    let (mut first, mut last) = (u64::MAX, 0);
    for r in &no_quote {
        if let Some(sym) = r.get(11..15) {
            by_partition[partition_for(sym, 4) as usize] += 1;
        }
        let n = r.get(5..11).map_or(0, |id| {
            id.iter().fold(0u64, |n, c| {
                n * 36 + (*c as char).to_digit(36).unwrap_or(0) as u64
            })
        });
        (first, last) = (first.min(n), last.max(n));
    }
    let examples: Vec<String> = wrong
        .iter()
        .take(4)
        .map(|r| {
            format!(
                "order {} symbol {:?} bid {} offer {}",
                String::from_utf8_lossy(r.get(5..11).unwrap_or_default()),
                String::from_utf8_lossy(r.get(11..15).unwrap_or_default()),
                quote(r, 31),
                quote(r, 39)
            )
        })
        .collect();
    format!(
        "{} of the {} wrong met no quote (by partition of 4: {by_partition:?}; orders {first}..={last} \
         in sending order); e.g. {}",
        no_quote.len(),
        wrong.len(),
        examples.join("; ")
    )
}

/// Runs `canter send market-spread --kafka BOOTSTRAP` with the topics' flags, the cluster's
/// settings, `--write-dir DIR` (for [`expected`]) and `args`; panics with its stderr if it fails.
pub fn send_market_spread(bootstrap: &str, t: &Topics, dir: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread"])
        .args(args)
        .args(["--write-dir", dir.to_str().unwrap(), "--kafka", bootstrap])
        .args(config_flags(bootstrap))
        .args(t.flags())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the sender failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `canter pipeline market-spread --kafka` process; killed when dropped.
pub struct KafkaPipeline {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    done: mpsc::Receiver<()>,
}

impl KafkaPipeline {
    /// Starts it with `args` after `--kafka BOOTSTRAP --group GROUP`, and waits for its start
    /// line.
    pub fn start(bootstrap: &str, group: &str, args: &[String]) -> KafkaPipeline {
        KafkaPipeline::start_with_env(bootstrap, group, args, &[])
    }

    /// [`KafkaPipeline::start`] with environment variables (`CANTER_FAILPOINT`).
    pub fn start_with_env(
        bootstrap: &str,
        group: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> KafkaPipeline {
        let p = KafkaPipeline::spawn(bootstrap, group, args, env);
        p.wait_for(
            "canter pipeline market-spread: Kafka",
            Duration::from_secs(60),
        );
        p
    }

    /// Starts the process without waiting for its start line.
    pub fn spawn(
        bootstrap: &str,
        group: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> KafkaPipeline {
        let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
            .envs(env.iter().copied())
            .args([
                "pipeline",
                "market-spread",
                "--kafka",
                bootstrap,
                "--group",
                group,
            ])
            .args(config_flags(bootstrap))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done) = mpsc::channel();
        let lines = log.clone();
        let tag = format!("{group}/{}", child.id());
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("pipeline {tag}: {line}");
                lines.lock().unwrap().push(line);
            }
            let _ = done_tx.send(());
        });
        KafkaPipeline { child, log, done }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where `--metrics` serves, from the log.
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.wait_for("pipeline metrics on http://", Duration::from_secs(10));
        let log = self.log();
        let line = log
            .iter()
            .find(|l| l.contains("pipeline metrics on http://"))
            .unwrap();
        line.split("http://")
            .nth(1)
            .unwrap()
            .trim_end_matches('/')
            .parse()
            .unwrap()
    }

    /// Waits until the counter `name` of `/metrics.json` (needs `--metrics`) reaches `want`.
    pub fn wait_counter(&self, name: &str, want: u64, limit: Duration) {
        let addr = self.metrics_addr();
        let t0 = Instant::now();
        loop {
            let r = super::fetch(addr, "GET", "/metrics.json", "");
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            if v[name].as_u64() >= Some(want) {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "{name} is {} after {limit:?}, not {want}",
                v[name]
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// A counter's value now (`/metrics.json`).
    pub fn counter_now(&self, name: &str) -> u64 {
        let r = super::fetch(self.metrics_addr(), "GET", "/metrics.json", "");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name}: {v}"))
    }

    /// Lines logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until a logged line contains `text` (or panics after `limit`).
    pub fn wait_for(&self, text: &str, limit: Duration) {
        let t0 = Instant::now();
        while !self.log().iter().any(|l| l.contains(text)) {
            assert!(
                t0.elapsed() < limit,
                "no log line with {text:?} within {limit:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGINT, then waits for it to commit, leave and exit; its final counters
    /// (`records_in=...` of the "pipeline stopped" line) by name.
    pub fn stop(mut self) -> Vec<(String, u64)> {
        // SAFETY: kill(2) on the child's pid, which this struct owns and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        let _ = self.done.recv_timeout(Duration::from_secs(10));
        assert!(
            status.success(),
            "the pipeline exited with {status}: {:#?}",
            self.log()
        );
        let log = self.log();
        // No secret of the settings in any line.
        for (_, pairs) in SECURITY.lock().unwrap().iter() {
            for (k, v) in pairs {
                if k == "sasl.password" {
                    assert!(
                        !log.iter().any(|l| l.contains(v.as_str())),
                        "the password in the log"
                    );
                }
            }
        }
        let line = log
            .iter()
            .find(|l| l.contains("pipeline stopped"))
            .expect("a 'pipeline stopped' line");
        line.split_whitespace()
            .filter_map(|w| {
                let (k, v) = w.split_once('=')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    }

    /// Waits (up to `limit`) for the process to end by itself (a failpoint); its exit status.
    /// Returns once the log reader has taken every line the process wrote (its last lines
    /// are still in the pipe when the process is reaped).
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let _ = self.done.recv_timeout(Duration::from_secs(10));
                return st;
            }
            assert!(
                t0.elapsed() < limit,
                "the pipeline did not end within {limit:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` and waits (up to `limit`) for the process to end: its status and how
    /// long it took.
    pub fn signal_and_wait(
        &mut self,
        signal: i32,
        limit: Duration,
    ) -> (std::process::ExitStatus, Duration) {
        let t0 = Instant::now();
        // SAFETY: kill(2) on the child's pid, which this struct owns and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let st = self.wait_exit(limit);
        (st, t0.elapsed())
    }

    /// SIGKILL: no commit, no leave.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for KafkaPipeline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter of a stopped pipeline's final line.
pub fn counter(counters: &[(String, u64)], name: &str) -> u64 {
    counters
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in {counters:?}"))
}
