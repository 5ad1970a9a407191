//! One worker of a Kafka job: a group member with its own fetcher and producer, the tasks
//! (partitions) it owns, their state and the commit cycle.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use canter_kafka::records::Compression as Codec;
use canter_kafka::{
    Answer, Change, Cluster, Config, Error, FetchConfig, Fetched, Fetcher, Member, OffsetSpec,
    Producer, ProducerConfig, TopicHandle, Tp,
};
use tokio::time::Instant;

use super::state::Keyed;
use super::task::{KeyedTask, Out};
use super::{GroupProtocol, KafkaJob, Stats};
use crate::failpoint::Failpoint;

fn config(job: &KafkaJob) -> Config {
    let mut c = Config::new(job.bootstrap.clone());
    c.client_id = format!("canter-{}", job.group);
    c.bootstrap_timeout = job.bootstrap_timeout;
    job.client.apply(&mut c);
    c.health = job.health.clone();
    c
}

/// Checks the topics (inputs and output exist, inputs co-partitioned), creates the changelog
/// topic if it is missing (as many partitions as the inputs), and settles the group protocol
/// (`Auto`: KIP-848 where the coordinator takes it, else classic), which it returns.
pub(super) fn prepare(job: &KafkaJob) -> Result<GroupProtocol, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut cluster = Cluster::connect(config(job)).await?;
        let protocol = match job.group_protocol {
            GroupProtocol::Auto => {
                match canter_kafka::accepts_consumer_protocol(&mut cluster, &job.group).await? {
                    true => GroupProtocol::Consumer,
                    false => {
                        tracing::info!(group = %job.group,
                            "kafka: the group coordinator does not take KIP-848's protocol; the group speaks the classic one");
                        GroupProtocol::Classic
                    }
                }
            }
            GroupProtocol::Consumer => {
                if !canter_kafka::accepts_consumer_protocol(&mut cluster, &job.group).await? {
                    return Err(Error::Config(format!(
                        "group.protocol=consumer, but the coordinator of group {} refuses \
                         KIP-848's protocol (UNSUPPORTED_VERSION): a broker before Kafka 4.0 \
                         or one limited to classic; set group.protocol=classic or leave it unset",
                        job.group
                    )));
                }
                GroupProtocol::Consumer
            }
            GroupProtocol::Classic => GroupProtocol::Classic,
        };
        let mut names: Vec<&str> = job.inputs.iter().map(String::as_str).collect();
        names.push(&job.output);
        wait_for_topics(&mut cluster, &names, job).await?;
        let mut counts = Vec::new();
        for t in &names {
            let info = cluster
                .topic(t)
                .ok_or_else(|| Error::UnknownTopic((*t).to_owned()))?;
            counts.push((*t, info.partitions.len() as i32));
        }
        let n = counts[0].1;
        if let Some((t, m)) = counts[..job.inputs.len()].iter().find(|(_, m)| *m != n) {
            return Err(Error::Corrupt(format!(
                "input topics are not co-partitioned: {} has {n} partitions, {t} has {m}",
                counts[0].0
            )));
        }
        // A KIP-848 group's session is the group's setting; a classic member asks for its
        // own when it joins.
        if let (Some(t), GroupProtocol::Consumer) = (job.session_timeout, protocol) {
            let session = t.as_millis().to_string();
            let heartbeat = (t.as_millis() / 3).max(1).to_string();
            cluster
                .set_group_config(
                    &job.group,
                    &[
                        ("consumer.session.timeout.ms", &session),
                        ("consumer.heartbeat.interval.ms", &heartbeat),
                    ],
                )
                .await?;
        }
        let replication = (job.changelog_replication as usize)
            .min(cluster.broker_count())
            .max(1) as i16;
        let changelog = job.changelog();
        cluster
            .create_topic(
                &changelog,
                n,
                replication,
                &[
                    ("cleanup.policy", "compact"),
                    ("min.compaction.lag.ms", "0"),
                ],
            )
            .await?;
        let have = cluster
            .topic(&changelog)
            .map_or(0, |t| t.partitions.len() as i32);
        if have != n {
            return Err(Error::Corrupt(format!(
                "changelog topic {changelog} has {have} partitions, the inputs {n}"
            )));
        }
        Ok(protocol)
    })
}

/// Waits until every topic of `names` exists: a pipeline may start before its topics are
/// made. Said once at once, then every 30 s; [`KafkaJob::interrupted`] ends the wait.
async fn wait_for_topics(
    cluster: &mut Cluster,
    names: &[&str],
    job: &KafkaJob,
) -> Result<(), Error> {
    let started = Instant::now();
    let mut said: Option<Instant> = None;
    loop {
        cluster.refresh(names).await?;
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|t| cluster.topic(t).is_none())
            .collect();
        if missing.is_empty() {
            if said.is_some() {
                tracing::info!(group = %job.group, "kafka: every topic exists now; starting");
            }
            return Ok(());
        }
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
            tracing::warn!(group = %job.group, waited_s = started.elapsed().as_secs(),
                "kafka: waiting for topic{} {} to exist", if missing.len() > 1 { "s" } else { "" }, missing.join(", "));
            said = Some(Instant::now());
        }
        for _ in 0..10 {
            if job.interrupted.as_ref().is_some_and(|i| (i.0)()) {
                return Err(Error::Config(format!(
                    "interrupted while waiting for topic {}",
                    missing.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A record waiting in a task's input queue: where its key and value lie in `buf`.
struct Entry {
    timestamp: i64,
    offset: i64,
    key: Option<(u32, u32)>,
    value: (u32, u32),
}

struct Chunk {
    buf: Bytes,
    entries: Vec<Entry>,
    next: usize,
    read_ns: u64,
    /// The fetch answer it came in.
    answer: Answer,
}

struct Input {
    chunks: VecDeque<Chunk>,
    /// The offset after the last record processed (`None`: nothing yet).
    processed: Option<i64>,
}

impl Input {
    fn head(&self) -> Option<&Entry> {
        self.chunks.front().map(|c| &c.entries[c.next])
    }
}

struct TaskState<K, S> {
    state: Keyed<K, S>,
    inputs: Vec<Input>,
    /// A bounded read ([`KafkaJob::bounded`]): where each input's partition ends.
    ends: Option<Vec<i64>>,
    /// A bounded read's task that has read its inputs to their ends and run its end.
    finished: bool,
}

struct Worker<T: KeyedTask> {
    /// The offsets of the last commit, per input partition.
    last_committed: HashMap<Tp, i64>,
    me: usize,
    job: KafkaJob,
    task: Arc<T>,
    stats: Arc<Stats>,
    fetcher: Fetcher,
    producer: Producer,
    member: Member,
    group_cluster: Cluster,
    output: (TopicHandle, i32),
    changelog: TopicHandle,
    owned: BTreeSet<Tp>,
    tasks: HashMap<i32, TaskState<T::Key, T::State>>,
    /// Tasks whose every input partition is owned but which have not started (their restore
    /// failed on a broker error): tried again at every step.
    pending: BTreeSet<i32>,
    scratch: Vec<u8>,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
    last_refusal_log: Option<Instant>,
    /// Results the output refused: counted, logged at most once a second.
    sink_log: SinkLog,
    /// Every task went back to its last commit since the main loop last looked.
    rolled_back: bool,
    failpoint: Failpoint,
    /// A bounded read: every input partition's end, as this worker first asked (its last
    /// stable offset under exactly-once, its high watermark otherwise).
    ends: Option<HashMap<Tp, i64>>,
    /// When a bounded read next asks whether the group has read every partition to its end.
    next_done_check: Instant,
}

/// Inputs and changelogs are read `read_committed` under exactly-once (what an aborted
/// transaction wrote is never seen).
fn fetch_config(job: &KafkaJob) -> FetchConfig {
    FetchConfig {
        read_committed: job.exactly_once,
        max_bytes: job.fetch_max_bytes,
        partition_max_bytes: job.max_partition_fetch_bytes,
        ..FetchConfig::default()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn now_ms() -> i64 {
    (now_ns() / 1_000_000) as i64
}

/// The worker's life: join, then fetch, process, commit, heartbeat until `stop`; then commit
/// and leave.
pub(super) async fn run<T: KeyedTask>(
    me: usize,
    job: KafkaJob,
    task: Arc<T>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
) -> std::io::Result<()> {
    let io = |e: Error| std::io::Error::other(e.to_string());
    let cfg = config(&job);
    let fetch_cluster = Cluster::connect(cfg.clone()).await.map_err(io)?;
    let producer_cluster = Cluster::connect(cfg.clone()).await.map_err(io)?;
    let group_cluster = Cluster::connect(cfg).await.map_err(io)?;
    let mut producer = Producer::new(
        producer_cluster,
        ProducerConfig {
            linger: job.linger,
            compression: job.compression,
            max_record: job.max_record,
            transactional_id: job.exactly_once.then(|| job.transactional_id(me)),
            transaction_timeout: job.transaction_timeout,
            delivery_timeout: job.delivery_timeout,
            ..ProducerConfig::default()
        },
    )
    .await
    .map_err(io)?;
    let output = producer.topic(&job.output).await.map_err(io)?;
    let (changelog, _) = producer.topic(&job.changelog()).await.map_err(io)?;
    let inputs: Vec<&str> = job.inputs.iter().map(String::as_str).collect();
    let member = match job.group_protocol {
        GroupProtocol::Classic => Member::new(&job.group, &inputs)
            .classic(job.session_timeout.unwrap_or(Duration::from_secs(45))),
        _ => Member::new(&job.group, &inputs).with_assignor("range"),
    };
    let sink_stats = stats.clone();
    let mut w = Worker {
        me,
        task,
        stats,
        fetcher: Fetcher::new(fetch_cluster, fetch_config(&job)),
        producer,
        member,
        group_cluster,
        output,
        changelog,
        owned: BTreeSet::new(),
        tasks: HashMap::new(),
        pending: BTreeSet::new(),
        scratch: Vec::new(),
        key_buf: Vec::new(),
        value_buf: Vec::new(),
        last_refusal_log: None,
        sink_log: SinkLog {
            stats: sink_stats,
            last: None,
            me,
            topic: job.output.clone(),
        },
        rolled_back: false,
        failpoint: Failpoint::from_env(),
        ends: None,
        next_done_check: Instant::now(),
        last_committed: HashMap::new(),
        job,
    };
    // Once a stop is asked for, the worker has `shutdown_timeout` to commit and leave; brokers
    // that do not answer cannot hold it longer.
    let grace = w.job.shutdown_timeout;
    let stopping = async {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(grace).await;
    };
    let mut timed_out = false;
    let r = tokio::select! {
        r = w.main_loop(&stop) => r,
        () = stopping => {
            timed_out = true;
            Ok(())
        }
    };
    if timed_out {
        w.gave_up(&format!("it took over {grace:?}: brokers not answering"));
    }
    w.stats
        .tasks_owned
        .fetch_sub(w.tasks.len() as u64, Ordering::Relaxed);
    r.map_err(io)
}

impl<T: KeyedTask> Worker<T> {
    async fn main_loop(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        let mut next_commit = Instant::now() + self.job.commit_interval;
        let mut backoff = Duration::from_millis(100);
        let mut paused = false;
        while !stop.load(Ordering::Relaxed) {
            if self.job.bounded && matches!(self.input_done().await, Ok(true)) {
                tracing::info!(
                    worker = self.me,
                    "kafka pipeline: every input partition is read to its end (a bounded read)"
                );
                break;
            }
            let step = self.step(&mut next_commit).await;
            let rolled_back = std::mem::take(&mut self.rolled_back) && self.job.exactly_once;
            match step {
                Ok(()) => {
                    if paused {
                        paused = false;
                        self.stats.paused.fetch_sub(1, Ordering::Relaxed);
                        tracing::info!(
                            worker = self.me,
                            "kafka: brokers reachable again; resuming"
                        );
                    }
                    backoff = Duration::from_millis(100);
                }
                Err(e) if e.is_fenced() => {
                    tracing::warn!(worker = self.me, error = %e, exactly_once = self.job.exactly_once,
                        "kafka pipeline: the group dropped this member; its tasks are lost (their next owner repeats the uncommitted records, or under exactly-once their aborted transaction); joining again");
                    self.lose_all();
                }
                // Under exactly-once, a failed transaction was aborted and every task went
                // back to its last commit: whatever the error (a coordinator that fenced this
                // producer's epoch after the transaction timeout included), start again from
                // there, after a pause.
                Err(e) if e.is_retriable() || rolled_back => {
                    Stats::add(&self.stats.broker_errors, 1);
                    if !paused {
                        paused = true;
                        self.stats.paused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(worker = self.me, error = %e, "kafka: pausing until the brokers answer");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
        // Finish: commit what was processed, then leave so the others take over at once. A
        // commit the brokers refuse now is said, not retried: the process is asked to end.
        if let Err(e) = self.commit().await {
            self.gave_up(&format!("the last commit failed: {e}"));
            return Ok(());
        }
        if let Err(e) = self.member.leave(&mut self.group_cluster).await {
            tracing::debug!(worker = self.me, error = %e, "kafka: leaving the group failed");
        }
        if paused {
            self.stats.paused.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn step(&mut self, next_commit: &mut Instant) -> Result<(), Error> {
        // A producer that aborted (a failure, a fenced member) takes its new epoch at once:
        // that aborts its open transaction at the coordinator, whose offsets would otherwise
        // hold the tasks' next owners until the transaction timeout.
        self.producer.ready().await?;
        if Instant::now() >= self.member.next_heartbeat() {
            let change = self.member.heartbeat(&mut self.group_cluster).await?;
            self.apply(change).await?;
        }
        self.start_pending().await?;
        let got = self.fetcher.fetch().await?;
        if !got.is_empty() {
            let read_ns = now_ns();
            for f in got {
                self.enqueue(f, read_ns)?;
            }
        }
        if self.process_ready() && self.job.exactly_once {
            // The record that halted the task may have changed its key's state and sent
            // results before it failed: the open transaction holds them, and its offset is not
            // committed. Nothing of it may commit: the transaction aborts, and the next run
            // starts from the last commit (the records since then are processed once, then).
            self.back_to_last_commit(&"a record stopped the flow (errors=\"stop\")");
        }
        if self.producer.due() {
            self.flush().await?;
        }
        if Instant::now() >= *next_commit {
            self.commit().await?;
            *next_commit = Instant::now() + self.job.commit_interval;
        }
        Ok(())
    }

    fn input_index(&self, topic: &str) -> Option<usize> {
        self.job.inputs.iter().position(|t| t == topic)
    }

    /// Cuts a fetch into queue entries (keys and values stay in the fetched bytes, or in the
    /// batch's inflated bytes).
    fn enqueue(&mut self, f: Fetched, read_ns: u64) -> Result<(), Error> {
        let Some(input) = self.input_index(&f.topic) else {
            return Ok(());
        };
        let Some(task) = self.tasks.get_mut(&f.partition) else {
            return Ok(());
        };
        // A bounded read takes nothing at or past its input's end.
        let end = task
            .ends
            .as_ref()
            .and_then(|e| e.get(input).copied())
            .unwrap_or(i64::MAX);
        // Chunks in offset order: runs of plain batches point into the fetched bytes; each
        // compressed batch is inflated into a buffer of its own.
        let queue = &mut task.inputs[input].chunks;
        let mut plain = Vec::new();
        let base = f.records.as_ptr() as usize;
        for b in f.batches() {
            let b = b?;
            if b.compression == Codec::None {
                for r in b.records(&mut self.scratch)? {
                    let r = r?;
                    if r.offset >= f.from && r.offset < end {
                        plain.push(entry(&r, base));
                    }
                }
                continue;
            }
            if !plain.is_empty() {
                queue.push_back(Chunk {
                    buf: f.records.clone(),
                    entries: std::mem::take(&mut plain),
                    next: 0,
                    read_ns,
                    answer: f.answer,
                });
            }
            let mut buf = Vec::new();
            b.inflate(&mut buf)?;
            let inflated = buf.as_ptr() as usize;
            let mut entries = Vec::with_capacity(b.count as usize);
            for r in b.records_in(&buf) {
                let r = r?;
                if r.offset >= f.from && r.offset < end {
                    entries.push(entry(&r, inflated));
                }
            }
            if !entries.is_empty() {
                queue.push_back(Chunk {
                    buf: buf.into(),
                    entries,
                    next: 0,
                    read_ns,
                    answer: f.answer,
                });
            }
        }
        if !plain.is_empty() {
            queue.push_back(Chunk {
                buf: f.records.clone(),
                entries: plain,
                next: 0,
                read_ns,
                answer: f.answer,
            });
        }
        Ok(())
    }

    /// Processes what every task can: per task, the lowest timestamp first across its inputs;
    /// an input with nothing queued holds the others back unless it has caught up with its log
    /// as of an answer no older than the record's own. (Its partition may be led by another
    /// broker: an answer from there that left before the record's came may predate records
    /// written before it, such as a quote its producer had acknowledged before the order.)
    /// Returns whether a record processed here halted the task.
    fn process_ready(&mut self) -> bool {
        let mut halted_here = false;
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for p in partitions {
            let caught: Vec<Option<Answer>> = self
                .job
                .inputs
                .iter()
                .map(|t| self.fetcher.caught_up_as_of(t, p))
                .collect();
            let Some(task) = self.tasks.get_mut(&p) else {
                continue;
            };
            let mut out = Out {
                producer: &mut self.producer,
                topic: self.output.0,
                partitions: self.output.1,
                timestamp: 0,
                read_ns: 0,
                emitted: 0,
                refused: None,
                scratch: &mut self.value_buf,
            };
            let (mut n, mut refused) = (0u64, 0u64);
            loop {
                let mut pick: Option<(usize, i64)> = None;
                for (i, input) in task.inputs.iter().enumerate() {
                    if let Some(e) = input.head() {
                        if pick.is_none_or(|(_, ts)| e.timestamp < ts) {
                            pick = Some((i, e.timestamp));
                        }
                    }
                }
                let Some((i, _)) = pick else { break };
                let Some(chunk) = task.inputs[i].chunks.front() else {
                    break;
                };
                let since = chunk.answer;
                let mut blocked = false;
                for (j, (input, c)) in task.inputs.iter().zip(&caught).enumerate() {
                    if input.chunks.is_empty() && !c.is_some_and(|c| c.no_older_than(&since)) {
                        blocked = true;
                        if c.is_some() {
                            // Caught up, but as of an answer that may predate the record:
                            // ask again, and have the broker answer at once.
                            self.fetcher.hurry(&self.job.inputs[j], p);
                        }
                    }
                }
                if blocked {
                    break;
                }
                let input = &mut task.inputs[i];
                let Some(chunk) = input.chunks.front_mut() else {
                    break;
                };
                let e = &chunk.entries[chunk.next];
                let key = e.key.map(|(a, l)| &chunk.buf[a as usize..(a + l) as usize]);
                let value = &chunk.buf[e.value.0 as usize..(e.value.0 + e.value.1) as usize];
                out.timestamp = e.timestamp;
                out.read_ns = chunk.read_ns;
                let offset = e.offset;
                if self.task.halted() {
                    break;
                }
                let result = self.task.process(i, key, value, &mut task.state, &mut out);
                if self.task.halted() {
                    // This record halted the task: not committed, nor anything after it.
                    halted_here = true;
                    break;
                }
                if let Err(why) = result {
                    refused += 1;
                    let now = Instant::now();
                    if self
                        .last_refusal_log
                        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
                    {
                        self.last_refusal_log = Some(now);
                        tracing::warn!(worker = self.me, topic = %self.job.inputs[i], partition = p,
                            offset, reason = %why.0, "kafka pipeline: record refused (skipped; more are counted, not logged, for a second)");
                    }
                }
                self.sink_log.refused(&mut out);
                n += 1;
                input.processed = Some(offset + 1);
                chunk.next += 1;
                if chunk.next == chunk.entries.len() {
                    input.chunks.pop_front();
                }
            }
            // Keys' wake-ups that are due, after the records before them.
            if !halted_here && task.state.has_wakes() && !self.task.halted() {
                let now = now_ns();
                out.stamp(now);
                for k in task.state.due(now) {
                    self.task.wake(&k, &mut task.state, &mut out);
                    self.sink_log.refused(&mut out);
                    if self.task.halted() {
                        halted_here = true;
                        break;
                    }
                }
            }
            // A bounded read whose every input is read to its end: the task's end (final
            // aggregations, windows flushed), and its offsets are the ends.
            if let (Some(ends), false) = (&task.ends, task.finished || halted_here) {
                let fetcher = &self.fetcher;
                let at_end = task
                    .inputs
                    .iter()
                    .zip(ends)
                    .enumerate()
                    .all(|(i, (input, end))| {
                        input.chunks.is_empty()
                            && fetcher
                                .position(&self.job.inputs[i], p)
                                .is_some_and(|pos| pos >= *end)
                    });
                if at_end && !self.task.halted() {
                    out.stamp(now_ns());
                    self.task.end(&mut task.state, &mut out);
                    self.sink_log.refused(&mut out);
                    for (input, end) in task.inputs.iter_mut().zip(ends) {
                        input.processed = Some(input.processed.map_or(*end, |o| o.max(*end)));
                    }
                    task.finished = true;
                    for t in &self.job.inputs {
                        self.fetcher.unassign(t, p);
                    }
                    tracing::debug!(
                        worker = self.me,
                        task = p,
                        "kafka pipeline: task read to its end"
                    );
                }
            }
            Stats::add(&self.stats.records_in, n);
            Stats::add(&self.stats.records_out, out.emitted);
            Stats::add(&self.stats.refused, refused);
        }
        halted_here
    }

    /// A bounded read's input partitions' ends, asked of the brokers once.
    async fn ends(&mut self) -> Result<&HashMap<Tp, i64>, Error> {
        if self.ends.is_none() {
            let spec = match self.job.exactly_once {
                true => OffsetSpec::LastStable,
                false => OffsetSpec::Latest,
            };
            let mut ends = HashMap::new();
            for t in &self.job.inputs {
                let cluster = self.fetcher.cluster();
                cluster.refresh(&[t.as_str()]).await?;
                let n = cluster.topic(t).map_or(0, |i| i.partitions.len() as i32);
                let all: Vec<i32> = (0..n).collect();
                for (p, end) in cluster.list_offsets(t, &all, spec).await? {
                    ends.insert((t.clone(), p), end);
                }
            }
            tracing::info!(
                worker = self.me,
                partitions = ends.len(),
                "kafka pipeline: a bounded read ends at the partitions' ends as of now"
            );
            self.ends = Some(ends);
        }
        Ok(self.ends.get_or_insert_with(HashMap::new))
    }

    /// A bounded read: whether this worker's tasks are read to their ends and the group has
    /// committed every input partition at its end (asked at most twice a second).
    async fn input_done(&mut self) -> Result<bool, Error> {
        if !self.pending.is_empty()
            || self.tasks.values().any(|t| !t.finished)
            || Instant::now() < self.next_done_check
        {
            return Ok(false);
        }
        self.next_done_check = Instant::now() + Duration::from_millis(500);
        let ends = self.ends().await?.clone();
        let parts: Vec<Tp> = ends.keys().cloned().collect();
        let committed = self
            .member
            .committed(&mut self.group_cluster, &parts)
            .await?;
        Ok(committed
            .iter()
            .all(|(tp, c)| c.is_some_and(|c| c >= ends.get(tp).copied().unwrap_or(0))))
    }

    /// Flushes the producer. If that fails (the brokers refused for longer than the delivery
    /// timeout), the results and changelog records not acknowledged are gone: every task goes
    /// back to its last commit (state from the changelog, inputs from the committed offsets),
    /// so what they had processed since is processed again, not lost.
    async fn flush(&mut self) -> Result<(), Error> {
        match self.producer.flush().await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.back_to_last_commit(&e);
                Err(e)
            }
        }
    }

    /// Drops what the producer holds (aborting its transaction under exactly-once) and sends
    /// every task back to its last commit: pending, to be restored from the changelog and
    /// fetched from the committed offsets.
    fn back_to_last_commit(&mut self, why: &dyn std::fmt::Display) {
        self.producer.abort();
        self.rolled_back = true;
        Stats::add(&self.stats.aborts, u64::from(self.job.exactly_once));
        let tasks: Vec<i32> = self.tasks.keys().copied().collect();
        tracing::warn!(worker = self.me, reason = %why, ?tasks, exactly_once = self.job.exactly_once,
            "kafka pipeline: uncommitted work dropped (under exactly-once its transaction aborted); the tasks go back to their last commit");
        for p in tasks {
            self.tasks.remove(&p);
            self.stats.tasks_owned.fetch_sub(1, Ordering::Relaxed);
            for t in &self.job.inputs {
                self.fetcher.unassign(t, p);
            }
            self.pending.insert(p);
        }
    }

    /// Drops every task without a commit (the member was fenced) and forgets the membership.
    fn lose_all(&mut self) {
        self.member.reset();
        self.forget_lag(&self.tasks.keys().copied().collect());
        if self.job.exactly_once {
            // The open transaction holds the lost tasks' results: it must not commit.
            self.producer.abort();
            Stats::add(&self.stats.aborts, 1);
        }
        for (p, _) in self.tasks.drain() {
            Stats::add(&self.stats.tasks_revoked, 1);
            self.stats.tasks_owned.fetch_sub(1, Ordering::Relaxed);
            for t in &self.job.inputs {
                self.fetcher.unassign(t, p);
            }
        }
        self.pending.clear();
        self.owned.clear();
    }

    /// Writes changed state, flushes the producer, then commits the processed offsets.
    async fn commit(&mut self) -> Result<(), Error> {
        let mut changes = 0u64;
        let ts = now_ms();
        for (&p, t) in self.tasks.iter_mut() {
            let (task, producer, changelog) = (&self.task, &mut self.producer, self.changelog);
            let (kb, vb) = (&mut self.key_buf, &mut self.value_buf);
            let mut err = None;
            t.state.drain_changes(|k, s| {
                kb.clear();
                task.encode_key(k, kb);
                let r = match s {
                    Some(s) => {
                        vb.clear();
                        task.encode_state(s, vb);
                        producer.send(changelog, p, Some(kb), vb, ts)
                    }
                    None => producer.send_tombstone(changelog, p, kb, ts),
                };
                if let Err(e) = r {
                    err = Some(e);
                }
                changes += 1;
            });
            if let Some(e) = err {
                return Err(e);
            }
        }
        if self.job.exactly_once {
            let offsets = self.processed_offsets();
            if let Err(e) = self.commit_transaction(&offsets).await {
                self.back_to_last_commit(&e);
                return Err(e);
            }
            Stats::add(&self.stats.changelog_out, changes);
            Stats::add(&self.stats.transactions, 1);
            Stats::add(&self.stats.commits, 1);
            self.committed(&offsets);
            return Ok(());
        }
        self.flush().await?;
        Stats::add(&self.stats.changelog_out, changes);
        let offsets = self.processed_offsets();
        if !offsets.is_empty() {
            self.member
                .commit(&mut self.group_cluster, &offsets)
                .await?;
        }
        Stats::add(&self.stats.commits, 1);
        self.committed(&offsets);
        Ok(())
    }

    /// Says, in one line, what a shutdown could not commit, and why.
    fn gave_up(&self, why: &str) {
        let left: Vec<String> = self
            .processed_offsets()
            .into_iter()
            .filter(|(tp, o)| self.last_committed.get(tp).is_none_or(|c| c < o))
            .map(|((t, p), o)| {
                let from = self.last_committed.get(&(t.clone(), p)).copied();
                match from {
                    Some(c) => format!("{t}/{p} offsets {c}..{o}"),
                    None => format!("{t}/{p} up to offset {o}"),
                }
            })
            .collect();
        let after = match self.job.exactly_once {
            true => "their transaction stays open until the brokers abort it (or this instance id starts again); the next owner processes them again",
            false => "the next owner of their partitions processes them again",
        };
        match left.is_empty() {
            true => tracing::warn!(worker = self.me,
                "kafka: shutdown could not commit ({why}); not committed: nothing (everything processed was committed before)"),
            false => tracing::warn!(worker = self.me,
                "kafka: shutdown could not commit ({why}); not committed: {}; {after}", left.join(", ")),
        }
    }

    /// Drops the lag of tasks no longer owned (their next owner reports it).
    fn forget_lag(&self, tasks: &BTreeSet<i32>) {
        let mut lag = self.stats.lag.lock().unwrap_or_else(|e| e.into_inner());
        lag.retain(|(_, p), _| !tasks.contains(p));
    }

    /// After a commit: its time, and the lag of each input partition committed.
    fn committed(&mut self, offsets: &[(Tp, i64)]) {
        self.stats
            .last_commit_ms
            .store(super::now_unix_ms(), Ordering::Relaxed);
        if offsets.is_empty() {
            return;
        }
        for (tp, o) in offsets {
            self.last_committed.insert(tp.clone(), *o);
        }
        let mut lag = self.stats.lag.lock().unwrap_or_else(|e| e.into_inner());
        for ((t, p), o) in offsets {
            if let Some(hw) = self.fetcher.high_watermark(t, *p) {
                lag.insert((t.clone(), *p), (hw - o).max(0));
            }
        }
    }

    /// Results and changelog flushed, the offsets given to the transaction, the transaction
    /// committed.
    async fn commit_transaction(&mut self, offsets: &[(Tp, i64)]) -> Result<(), Error> {
        self.producer.flush().await?;
        self.failpoint.pass("commit-before-offsets");
        if !offsets.is_empty() {
            self.producer.add_offsets(&self.job.group).await?;
            let txn = self.producer.transaction().ok_or(Error::Unsupported(
                "exactly-once without a transactional id",
            ))?;
            self.member
                .commit_in_transaction(&mut self.group_cluster, &txn, offsets)
                .await?;
        }
        self.failpoint.pass("commit-before-end");
        self.producer.commit_transaction().await
    }

    fn processed_offsets(&self) -> Vec<(Tp, i64)> {
        let mut out = Vec::new();
        for (&p, t) in &self.tasks {
            for (i, input) in t.inputs.iter().enumerate() {
                if let Some(o) = input.processed {
                    out.push(((self.job.inputs[i].clone(), p), o));
                }
            }
        }
        out
    }

    /// Applies an assignment change: revoked tasks are committed and dropped (lost ones just
    /// dropped); tasks whose every input partition is now owned are restored and started.
    async fn apply(&mut self, change: Change) -> Result<(), Error> {
        if change.assigned.is_empty() && change.revoked.is_empty() {
            return Ok(());
        }
        let revoked_tasks: BTreeSet<i32> = change.revoked.iter().map(|(_, p)| *p).collect();
        if change.lost && self.job.exactly_once && !revoked_tasks.is_empty() {
            // The open transaction holds the lost tasks' results with the others': abort it,
            // and the others start again from their last commit.
            self.back_to_last_commit(&"the group took tasks from this member");
            self.rolled_back = false;
        }
        if !revoked_tasks.is_empty() {
            // Hand over what was processed. If the brokers refuse (a coordinator moving), the
            // tasks go anyway: their next owner repeats the uncommitted part (at least once;
            // under exactly-once the failed transaction was aborted).
            if !change.lost {
                self.failpoint.pass("hand-over");
                if let Err(e) = self.commit().await {
                    tracing::warn!(worker = self.me, error = %e,
                        "kafka pipeline: commit before a hand-over failed; the next owner processes the uncommitted records again");
                }
            }
            self.forget_lag(&revoked_tasks);
            for p in &revoked_tasks {
                if self.tasks.remove(p).is_some() {
                    Stats::add(&self.stats.tasks_revoked, 1);
                    self.stats.tasks_owned.fetch_sub(1, Ordering::Relaxed);
                    for t in &self.job.inputs {
                        self.fetcher.unassign(t, *p);
                    }
                }
            }
            tracing::info!(worker = self.me, tasks = ?revoked_tasks, lost = change.lost,
                "kafka pipeline: tasks given up");
        }
        for tp in &change.revoked {
            self.owned.remove(tp);
        }
        self.owned.extend(change.assigned.iter().cloned());
        for p in &revoked_tasks {
            self.pending.remove(p);
        }
        for (_, p) in &change.assigned {
            let complete = self
                .job
                .inputs
                .iter()
                .all(|t| self.owned.contains(&(t.clone(), *p)));
            if complete && !self.tasks.contains_key(p) {
                self.pending.insert(*p);
            }
        }
        Ok(())
    }

    /// Starts the pending tasks; one that fails on a broker error stays pending (with the
    /// ones after it) for the next step.
    async fn start_pending(&mut self) -> Result<(), Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        // Under exactly-once, a producer that aborted takes its new epoch first: that aborts
        // its open transaction, whose offsets would otherwise keep the committed offsets
        // unstable.
        self.producer.ready().await?;
        while let Some(&p) = self.pending.first() {
            match self.start_task(p).await {
                Ok(()) => {
                    self.pending.remove(&p);
                }
                Err(e) if e.is_retriable() => {
                    for t in &self.job.inputs {
                        self.fetcher.unassign(t, p);
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Restores task `p`'s state from its changelog partition, then starts fetching its inputs
    /// from the group's committed offsets (the earliest where none).
    async fn start_task(&mut self, p: i32) -> Result<(), Error> {
        let started = Instant::now();
        let mut state = Keyed::default();
        let parts: Vec<Tp> = self.job.inputs.iter().map(|t| (t.clone(), p)).collect();
        // Under exactly-once the committed offsets come first: they are stable only once no
        // transaction that wrote them is open; then the changelog is read to its end once no
        // transaction is open on it either.
        let early = match self.job.exactly_once {
            true => Some(
                self.member
                    .committed(&mut self.group_cluster, &parts)
                    .await?,
            ),
            false => None,
        };
        let restored = self.restore(p, &mut state).await?;
        self.task.restored(&mut state);
        let committed = match early {
            Some(c) => c,
            None => {
                self.member
                    .committed(&mut self.group_cluster, &parts)
                    .await?
            }
        };
        for ((t, part), off) in &committed {
            self.fetcher.assign(t, *part, *off).await?;
        }
        let inputs = self
            .job
            .inputs
            .iter()
            .map(|_| Input {
                chunks: VecDeque::new(),
                processed: None,
            })
            .collect();
        let ends = match self.job.bounded {
            true => {
                let ends = self.ends().await?;
                Some(
                    parts
                        .iter()
                        .map(|tp| ends.get(tp).copied().unwrap_or(0))
                        .collect(),
                )
            }
            false => None,
        };
        self.tasks.insert(
            p,
            TaskState {
                state,
                inputs,
                ends,
                finished: false,
            },
        );
        Stats::add(&self.stats.tasks_assigned, 1);
        self.stats.tasks_owned.fetch_add(1, Ordering::Relaxed);
        tracing::info!(worker = self.me, task = p, restored, took_ms = started.elapsed().as_millis() as u64,
            committed = ?committed, "kafka pipeline: task started");
        Ok(())
    }

    async fn restore(&mut self, p: i32, state: &mut Keyed<T::Key, T::State>) -> Result<u64, Error> {
        let topic = self.job.changelog();
        let mut cluster = Cluster::connect(config(&self.job)).await?;
        cluster.refresh(&[&topic]).await?;
        let end = cluster
            .list_offsets(&topic, &[p], OffsetSpec::Latest)
            .await?
            .first()
            .map_or(0, |(_, o)| *o);
        if self.job.exactly_once {
            // A transaction still open on the changelog (a dead or frozen former owner's,
            // until its coordinator aborts it) hides every committed record after it from a
            // read_committed reader: restoring up to it would miss them. The task waits,
            // pending, until it ends (the transaction timeout at most).
            let stable = cluster
                .list_offsets(&topic, &[p], OffsetSpec::LastStable)
                .await?
                .first()
                .map_or(0, |(_, o)| *o);
            if stable < end {
                return Err(Error::Timeout(
                    "waiting for a transaction on the changelog to end",
                ));
            }
        }
        let mut f = Fetcher::new(cluster, fetch_config(&self.job));
        f.assign(&topic, p, None).await?;
        let mut n = 0u64;
        let mut scratch = Vec::new();
        while f.position(&topic, p).is_some_and(|pos| pos < end) {
            for got in f.fetch().await? {
                got.for_each(&mut scratch, |r| {
                    let Some(k) = r.key.and_then(|k| self.task.decode_key(k)) else {
                        return;
                    };
                    let s = r.value.and_then(|v| self.task.decode_state(v));
                    state.restore(k, s);
                    n += 1;
                })?;
            }
        }
        Stats::add(&self.stats.restored, n);
        Ok(n)
    }
}

fn entry(r: &canter_kafka::records::Record<'_>, base: usize) -> Entry {
    let at = |s: &[u8]| ((s.as_ptr() as usize - base) as u32, s.len() as u32);
    Entry {
        timestamp: r.timestamp,
        offset: r.offset,
        key: r.key.map(at),
        value: r.value.map_or((0, 0), at),
    }
}

/// Results the output refused (over the producer's maximum size).
struct SinkLog {
    stats: Arc<Stats>,
    last: Option<Instant>,
    me: usize,
    topic: String,
}

impl SinkLog {
    /// If `out` refused its last result: counted, and logged at most once a second.
    fn refused(&mut self, out: &mut Out<'_>) {
        let Some(e) = out.refused.take() else { return };
        Stats::add(&self.stats.sink_refused, 1);
        let now = Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.last = Some(now);
            tracing::error!(worker = self.me, topic = %self.topic, error = %e,
                "kafka pipeline: the output refused a result (more are counted, not logged, for a second)");
        }
    }
}
