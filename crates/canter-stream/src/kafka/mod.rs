//! Pipelines on Kafka: input topics in, an output topic out, keyed state that lives with its
//! partition and moves with it.
//!
//! A topic partition is the unit of work, as in Kafka Streams: partition `p` of every input
//! topic (they must have the same partition count: co-partitioned, checked at start) is one
//! *task*, with the state of the keys whose records come from it. Each worker thread is a
//! member of the consumer group (KIP-848 with the broker's `range` assignor where the group
//! coordinator takes it, else the classic protocol with the same range assignment made by the
//! members: either gives a member the same partitions of every topic): processes that run the
//! same job with the same group id share the tasks; one that joins takes some, one that leaves
//! or dies loses them to the rest. Connections are secured as [`KafkaJob::client`] says (TLS,
//! SASL), with librdkafka's setting names ([`KafkaJob::configure`]).
//!
//! - **On the worker's loop.** A worker owns its fetcher, producer and group membership
//!   (`canter-kafka`): records are read in place from the fetched bytes, processed, and their
//!   results appended to the producer's batch for their partition, with no thread hop.
//! - **Order across inputs.** Within a task, the record with the lowest timestamp across its
//!   inputs goes first; an input with nothing buffered holds the others back unless it is
//!   caught up with its log (as Kafka Streams does with `max.task.idle.ms` = 0), and caught
//!   up as of a fetch answer no older than the record's: the two partitions may have their
//!   leaders on different brokers, and an answer that left one broker before the record came
//!   from the other may miss what was written before it (a quote its producer had acknowledged
//!   before sending the order). Such an input is asked again at once (`max_wait` 0); one
//!   broker leading both partitions answers about both at once and adds no wait.
//! - **State.** Every change is marked; at each commit the changed keys' latest values go to
//!   the task's partition of a compacted changelog topic (`<group>-<state>-changelog`), one
//!   record per changed key per commit, not one per change. A task given to a worker is
//!   restored from its changelog partition before it reads its inputs.
//! - **At least once.** Every `commit_interval`: changelog records written, the producer
//!   flushed (results and changelog acknowledged by the brokers), then the input offsets
//!   committed. A crash repeats at most what was processed since the last commit.
//! - **Exactly once** ([`KafkaJob::exactly_once`]). Each worker's producer is transactional
//!   (Kafka Streams' `exactly_once_v2`: one transactional id per worker,
//!   `<group>-<instance>-<worker>`): results, changelog records and input offsets of one
//!   commit interval go into one transaction, committed at the interval's end; inputs and
//!   changelogs are read `read_committed`. Any failure inside a transaction aborts it and sends
//!   every task of the worker back to the last commit (state restored from the changelog,
//!   inputs from the committed offsets), so `read_committed` readers of the output see each
//!   result once. A group member fenced while its transaction is open (a zombie) cannot commit
//!   it (its offsets carry its member epoch, KIP-447). A process restarted with the same
//!   [`KafkaJob::instance_id`] aborts its predecessor's open transactions at once; otherwise
//!   the brokers abort them after [`KafkaJob::transaction_timeout`], and the tasks they touched
//!   wait for that (their committed offsets are not stable until then).
//! - **Bad input.** A record the task refuses is counted and skipped (a log line at most once
//!   a second per worker); a broker that goes away is said at once (its connections report it
//!   to [`Stats::health`]), pauses the worker (its requests retry with backoff,
//!   [`Stats::broker_errors`] counts) and it resumes where it was.
//! - **Stopping.** The workers commit and leave within [`KafkaJob::shutdown_timeout`] of a
//!   stop, whatever the brokers do; past it, or when the last commit fails, one line says what
//!   was processed and not committed.

mod state;
mod task;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use canter_kafka::{ClientSettings, Compression, Error as KafkaError, GroupProtocol, Health};
pub use state::Keyed;
pub use task::{KeyedTask, Out, Refused};

/// A pipeline on Kafka.
#[derive(Debug, Clone)]
pub struct KafkaJob {
    /// `host:port,...` of the brokers.
    pub bootstrap: String,
    /// The consumer group (also the prefix of the changelog topic).
    pub group: String,
    /// The input topics, co-partitioned; [`KeyedTask::process`] is told which by its index.
    pub inputs: Vec<String>,
    /// The output topic.
    pub output: String,
    /// The name of the task's state (the changelog topic is `<group>-<name>-changelog`).
    pub state_name: String,
    /// Worker threads, each a member of the group.
    pub workers: usize,
    /// Pin worker i to CPU i.
    pub pin: bool,
    /// How often state, results and offsets are committed.
    pub commit_interval: Duration,
    /// The producer's linger.
    pub linger: Duration,
    /// Compression of the output and changelog batches.
    pub compression: Compression,
    /// The largest output record.
    pub max_record: usize,
    /// How long the brokers may be unreachable at start before the job fails.
    pub bootstrap_timeout: Duration,
    /// Replication of the changelog topic (capped by the brokers there are).
    pub changelog_replication: i16,
    /// The group's session timeout, set on the group at start (`None`: the brokers' default,
    /// 45 s unless configured): how long after a process dies its tasks move to the others.
    /// The heartbeat interval is set to a third of it.
    pub session_timeout: Option<Duration>,
    /// Results, changelog and offsets committed in one transaction per commit interval.
    pub exactly_once: bool,
    /// This process's name among the job's processes (part of its transactional ids): a
    /// process restarted with the same one aborts its predecessor's open transactions.
    pub instance_id: String,
    /// How long a transaction may stay open before the brokers abort it.
    pub transaction_timeout: Duration,
    /// Called on each worker's thread around its run and its waits (a front end holding an
    /// interpreter lock while the worker works).
    pub hooks: Option<crate::pipeline::WorkerHooks>,
    /// How long the producer retries a batch the brokers do not take before the job fails.
    pub delivery_timeout: Duration,
    /// Bytes one fetch response may hold.
    pub fetch_max_bytes: i32,
    /// Bytes of one partition one fetch response may hold.
    pub max_partition_fetch_bytes: i32,
    /// The consumer-group protocol.
    pub group_protocol: GroupProtocol,
    /// The connections' settings: security (TLS, SASL), client id, timeouts. Set with
    /// [`KafkaJob::configure`].
    pub client: ClientSettings,
    /// After a stop is asked for, how long the workers may take to commit and leave the group
    /// before they give up (brokers that do not answer cannot hold the process).
    pub shutdown_timeout: Duration,
    /// Where the job's connections report brokers that stop or start answering (the job's
    /// [`Stats::health`], set by [`start`]).
    pub health: Arc<Health>,
    /// Asked while [`start`] waits for topics: `true` ends the wait with an error (a front end
    /// whose user pressed Ctrl-C).
    pub interrupted: Option<Interrupt>,
    /// A bounded read (Bytewax's `tail=False`): each input partition is read up to its end as
    /// a worker first asks (the last stable offset under exactly-once, the high watermark
    /// otherwise); a task read to its ends runs [`KeyedTask::end`] (final aggregations,
    /// windows flushed) and commits the ends; a worker ends once its tasks have and the group
    /// has committed every input partition at its end (it stays a member until then, to take
    /// over a lost member's tasks). Meant for topics not written meanwhile: a task that moves
    /// to a worker started later reads to that worker's ends.
    pub bounded: bool,
}

/// A check [`start`] calls while it waits ([`KafkaJob::interrupted`]).
#[derive(Clone)]
pub struct Interrupt(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interrupt")
    }
}

impl KafkaJob {
    /// A job with defaults: one worker, commits every 100 ms, 5 ms linger, no compression.
    pub fn new(bootstrap: &str, group: &str, inputs: &[&str], output: &str) -> KafkaJob {
        KafkaJob {
            bootstrap: bootstrap.to_owned(),
            group: group.to_owned(),
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
            output: output.to_owned(),
            state_name: "state".into(),
            workers: 1,
            pin: false,
            commit_interval: Duration::from_millis(100),
            linger: Duration::from_millis(5),
            compression: Compression::None,
            max_record: 1 << 20,
            bootstrap_timeout: Duration::from_secs(30),
            changelog_replication: 3,
            session_timeout: None,
            exactly_once: false,
            instance_id: format!("{:x}", std::process::id()),
            transaction_timeout: Duration::from_secs(10),
            hooks: None,
            delivery_timeout: Duration::from_secs(120),
            fetch_max_bytes: 50 << 20,
            max_partition_fetch_bytes: 4 << 20,
            group_protocol: GroupProtocol::Auto,
            client: ClientSettings::new(),
            shutdown_timeout: Duration::from_secs(10),
            health: Arc::default(),
            interrupted: None,
            bounded: false,
        }
    }

    /// Applies settings given by librdkafka's names (`security.protocol`, `linger.ms`,
    /// `session.timeout.ms`, …): they win over the job's own values. `bootstrap.servers` and
    /// `group.id`, if given, must agree with the job's.
    pub fn configure(&mut self, settings: &ClientSettings) -> Result<(), KafkaError> {
        settings.check_agrees(&self.bootstrap, Some(&self.group))?;
        let s = settings;
        if let Some(v) = s.linger {
            self.linger = v;
        }
        if let Some(v) = s.compression {
            self.compression = v;
        }
        if let Some(v) = s.delivery_timeout {
            self.delivery_timeout = v;
        }
        if let Some(v) = s.session_timeout {
            self.session_timeout = Some(v);
        }
        if let Some(v) = s.fetch_max_bytes {
            self.fetch_max_bytes = v;
        }
        if let Some(v) = s.max_partition_fetch_bytes {
            self.max_partition_fetch_bytes = v;
        }
        if let Some(v) = s.message_max_bytes {
            self.max_record = v;
        }
        if let Some(v) = s.replication_factor {
            self.changelog_replication = v;
        }
        if let Some(v) = s.transaction_timeout {
            self.transaction_timeout = v;
        }
        self.group_protocol = s.group_protocol;
        self.client = s.clone();
        Ok(())
    }

    /// Worker `me`'s transactional id.
    pub fn transactional_id(&self, me: usize) -> String {
        format!("{}-{}-{me}", self.group, self.instance_id)
    }

    /// The changelog topic's name.
    pub fn changelog(&self) -> String {
        format!("{}-{}-changelog", self.group, self.state_name)
    }
}

/// Counts across the job's workers.
#[derive(Debug, Default)]
pub struct Stats {
    /// Input records processed.
    pub records_in: AtomicU64,
    /// Output records handed to the producer.
    pub records_out: AtomicU64,
    /// Input records the task refused.
    pub refused: AtomicU64,
    /// Results the output refused (over the producer's maximum record size).
    pub sink_refused: AtomicU64,
    /// Commits done.
    pub commits: AtomicU64,
    /// Changelog records written.
    pub changelog_out: AtomicU64,
    /// State records read back from changelogs.
    pub restored: AtomicU64,
    /// Tasks (partitions) taken on, restores included.
    pub tasks_assigned: AtomicU64,
    /// Tasks given up (handed over or lost).
    pub tasks_revoked: AtomicU64,
    /// Requests that failed and were retried (a broker away, a leader moving).
    pub broker_errors: AtomicU64,
    /// Workers paused on an unreachable broker right now.
    pub paused: AtomicU64,
    /// Tasks owned right now, summed over the workers.
    pub tasks_owned: AtomicU64,
    /// Transactions committed (exactly once).
    pub transactions: AtomicU64,
    /// Transactions aborted, every task of the worker sent back to its last commit.
    pub aborts: AtomicU64,
    /// The brokers as the workers' connections find them.
    pub health: Arc<Health>,
    /// When the last commit succeeded (Unix milliseconds; 0: none yet).
    pub last_commit_ms: AtomicU64,
    /// Per input partition: records written and not yet processed (the high watermark less
    /// the position processed), as of the owner's last commit.
    pub lag: std::sync::Mutex<std::collections::BTreeMap<(String, i32), i64>>,
}

impl Stats {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn all(&self) -> [(&'static str, &'static str, u64, bool); 14] {
        let g = Stats::get;
        [
            (
                "records_in",
                "input records processed",
                g(&self.records_in),
                true,
            ),
            (
                "records_out",
                "results handed to the producer",
                g(&self.records_out),
                true,
            ),
            (
                "refused",
                "input records the task refused",
                g(&self.refused),
                true,
            ),
            (
                "sink_refused",
                "results the output refused",
                g(&self.sink_refused),
                true,
            ),
            ("commits", "commits done", g(&self.commits), true),
            (
                "changelog_out",
                "changelog records written",
                g(&self.changelog_out),
                true,
            ),
            (
                "restored",
                "state records restored",
                g(&self.restored),
                true,
            ),
            (
                "tasks_assigned",
                "tasks taken on",
                g(&self.tasks_assigned),
                true,
            ),
            (
                "tasks_revoked",
                "tasks given up or lost",
                g(&self.tasks_revoked),
                true,
            ),
            (
                "broker_errors",
                "failed connections and requests (retried)",
                g(&self.broker_errors) + self.health.errors(),
                true,
            ),
            (
                "transactions",
                "transactions committed",
                g(&self.transactions),
                true,
            ),
            (
                "aborts",
                "transactions aborted (tasks back to their last commit)",
                g(&self.aborts),
                true,
            ),
            (
                "paused",
                "workers paused on the brokers now (1 at least while a broker does not answer)",
                g(&self.paused).max(u64::from(self.health.unreachable() > 0)),
                false,
            ),
            (
                "tasks_owned",
                "tasks owned now",
                g(&self.tasks_owned),
                false,
            ),
        ]
    }

    /// Gauges and counters besides [`Stats::all`]'s: the brokers' reachability, the age of
    /// the last commit.
    fn extra(&self) -> [(&'static str, &'static str, String); 3] {
        let age = match Stats::get(&self.last_commit_ms) {
            0 => "NaN".to_owned(),
            at => format!("{:.3}", (now_unix_ms().saturating_sub(at)) as f64 / 1000.0),
        };
        [
            (
                "brokers_reachable",
                "brokers that answer (of those the metadata lists)",
                self.health.reachable().to_string(),
            ),
            (
                "brokers_unreachable",
                "brokers that do not answer now",
                self.health.unreachable().to_string(),
            ),
            (
                "last_commit_age_seconds",
                "seconds since the last commit (NaN: none yet)",
                age,
            ),
        ]
    }

    fn lags(&self) -> Vec<((String, i32), i64)> {
        self.lag
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// The counters as Prometheus text (`canter_kafka_records_in_total`, ...; the gauges
    /// `canter_kafka_paused`, `canter_kafka_tasks_owned`, `canter_kafka_brokers_reachable`,
    /// `canter_kafka_brokers_unreachable`, `canter_kafka_last_commit_age_seconds`, and
    /// `canter_kafka_consumer_lag{topic,partition}`).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (name, help, kind, v) in self.extra().iter().map(|(n, h, v)| (n, h, "gauge", v)) {
            let full = format!("canter_kafka_{name}");
            out.push_str(&format!(
                "# HELP {full} {help}\n# TYPE {full} {kind}\n{full} {v}\n"
            ));
        }
        out.push_str("# HELP canter_kafka_consumer_lag records written to an input partition and not yet processed\n# TYPE canter_kafka_consumer_lag gauge\n");
        for ((topic, partition), lag) in self.lags() {
            out.push_str(&format!(
                "canter_kafka_consumer_lag{{topic=\"{topic}\",partition=\"{partition}\"}} {lag}\n"
            ));
        }
        for (name, help, v, counter) in self.all() {
            let (full, kind) = match counter {
                true => (format!("canter_kafka_{name}_total"), "counter"),
                false => (format!("canter_kafka_{name}"), "gauge"),
            };
            out.push_str(&format!(
                "# HELP {full} {help}\n# TYPE {full} {kind}\n{full} {v}\n"
            ));
        }
        out
    }

    /// The counters as one JSON object (`consumer_lag` an object `"topic/partition": lag`).
    pub fn json(&self) -> String {
        let mut fields: Vec<String> = self
            .all()
            .iter()
            .map(|(name, _, v, _)| format!("\"{name}\": {v}"))
            .collect();
        for (name, _, v) in self.extra() {
            let v = if v == "NaN" { "null".to_owned() } else { v };
            fields.push(format!("\"{name}\": {v}"));
        }
        let lags: Vec<String> = self
            .lags()
            .into_iter()
            .map(|((t, p), l)| format!("\"{}/{p}\": {l}", t.replace('"', "\\\"")))
            .collect();
        fields.push(format!("\"consumer_lag\": {{{}}}", lags.join(", ")));
        format!("{{{}}}", fields.join(", "))
    }

    /// A counter's value.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub(super) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A running job.
pub struct KafkaRunning {
    threads: Vec<JoinHandle<std::io::Result<()>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
}

impl KafkaRunning {
    /// The job's counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// A handle that stops the job: workers commit what they processed, leave the group and
    /// end.
    pub fn stopper(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Whether every worker has ended.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Waits for the workers; the first error any of them ended with.
    pub fn wait(self) -> std::io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a pipeline worker panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Starts `job` with `task` on its workers. Waits for input and output topics that do not
/// exist yet (a line says which; [`KafkaJob::interrupted`] ends the wait); fails at once if the brokers cannot be reached
/// within `bootstrap_timeout` or the inputs are not co-partitioned.
pub fn start<T: KeyedTask>(mut job: KafkaJob, task: T) -> Result<KafkaRunning, KafkaError> {
    let stats = Arc::new(Stats::default());
    job.health = stats.health.clone();
    job.group_protocol = worker::prepare(&job)?;
    let stop = Arc::new(AtomicBool::new(false));
    let task = Arc::new(task);
    let config = canter_rt::Config::builder()
        .workers(job.workers)
        .pin_workers(job.pin)
        .park_hooks(job.hooks.as_ref().map(|h| h.park.clone()))
        .build()
        .map_err(|e| KafkaError::Corrupt(format!("worker settings: {e}")))?;
    let mut threads = Vec::new();
    for me in 0..job.workers.max(1) {
        let (job, task, stop, stats) = (job.clone(), task.clone(), stop.clone(), stats.clone());
        let hooks = job.hooks.clone();
        let t = crate::pipeline::spawn_hooked(
            me,
            &config,
            format!("canter-kafka-{me}"),
            hooks,
            move || worker::run(me, job, task, stop, stats),
        )
        .map_err(KafkaError::Io)?;
        threads.push(t);
    }
    Ok(KafkaRunning {
        threads,
        stop,
        stats,
    })
}
