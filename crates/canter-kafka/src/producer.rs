//! The producer: records appended to one open batch per partition, sent per leader in one
//! Produce request when the caller flushes (size or linger reached), idempotent by default
//! (KIP-98: a producer id and a sequence per partition, so a batch resent after a lost answer
//! is written once). With a transactional id it is transactional (KIP-98's transactions, as
//! Kafka Streams' `exactly_once_v2` uses them): what it writes between two
//! [`Producer::commit_transaction`]s, and the consumer offsets given to the same transaction,
//! become visible to `read_committed` readers together or not at all.

use std::collections::HashMap;
use std::time::Duration;

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, GroupId,
    InitProducerIdRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::conn::Conn;
use crate::error::{retriable_code, Error};
use crate::records::{BatchBuilder, Compression};

/// How the producer batches and sends.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How long the first record of a batch may wait for more ([`Producer::due`]).
    pub linger: Duration,
    /// Bytes of records buffered (all partitions) that make a flush due.
    pub batch_bytes: usize,
    /// The largest record (key and value); a bigger one is refused with [`Error::TooLarge`].
    pub max_record: usize,
    /// Bytes of records in one partition's batch before it is closed and a new one opened
    /// (a broker refuses a batch over its `message.max.bytes`, 1 MiB by default).
    pub max_batch: usize,
    /// Compression of each batch.
    pub compression: Compression,
    /// KIP-98 idempotence (acks must then be all).
    pub idempotent: bool,
    /// How long a flush retries retriable errors before it fails.
    pub delivery_timeout: Duration,
    /// Makes the producer transactional under this id (implies idempotence). A new producer
    /// with the same id fences the old one and aborts its open transaction.
    pub transactional_id: Option<String>,
    /// How long a transaction may stay open before its coordinator aborts it (also how long
    /// a crashed producer's open transaction holds back `read_committed` readers, unless a
    /// producer with its id starts again).
    pub transaction_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::from_millis(5),
            batch_bytes: 1 << 20,
            max_record: 1_000_000,
            max_batch: 256 << 10,
            compression: Compression::None,
            idempotent: true,
            delivery_timeout: Duration::from_secs(120),
            transactional_id: None,
            transaction_timeout: Duration::from_secs(10),
        }
    }
}

/// A topic the producer writes, by index (see [`Producer::topic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicHandle(usize);

struct PartState {
    open: BatchBuilder,
    /// Batches closed at `max_batch` and not sent yet, oldest first (a Produce request takes
    /// one batch per partition, so they go one per round).
    sealed: std::collections::VecDeque<(bytes::Bytes, u32)>,
    sequence: i32,
}

impl PartState {
    /// Closes the open batch (its sequence assigned) into `sealed`.
    fn seal(&mut self, config: &ProducerConfig, id: (i64, i16)) -> Result<(), Error> {
        if self.open.is_empty() {
            return Ok(());
        }
        let n = self.open.len();
        let seq = if id.0 >= 0 { self.sequence } else { -1 };
        let mut bytes = Vec::with_capacity(self.open.bytes() + 64);
        let transactional = config.transactional_id.is_some();
        self.open
            .finish(&mut bytes, config.compression, id, seq, transactional)?;
        self.sequence = self.sequence.wrapping_add(n as i32) & i32::MAX;
        self.sealed.push_back((bytes.into(), n));
        Ok(())
    }
}

struct TopicState {
    name: String,
    parts: Vec<PartState>,
}

/// A batch on its way: encoded once (its sequence inside), resent as is until acknowledged.
struct Outgoing {
    topic: usize,
    partition: i32,
    bytes: bytes::Bytes,
    records: u32,
}

/// Counts since the producer started.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProducerStats {
    /// Records acknowledged.
    pub records: u64,
    /// Produce requests sent (retries included).
    pub requests: u64,
    /// Batches sent again after a retriable error.
    pub retries: u64,
    /// Transactions committed.
    pub transactions: u64,
}

/// An idempotent producer; one per worker.
pub struct Producer {
    cluster: Cluster,
    config: ProducerConfig,
    conns: HashMap<i32, Conn>,
    id: (i64, i16),
    topics: Vec<TopicState>,
    buffered: usize,
    oldest: Option<Instant>,
    stats: ProducerStats,
    needs_new_id: bool,
    txn: Option<Txn>,
}

/// A transactional producer's side of its transaction.
struct Txn {
    id: String,
    coordinator: Option<Conn>,
    /// Partitions added to the open transaction (topic index, partition).
    added: std::collections::HashSet<(usize, i32)>,
    /// Groups whose offsets were added to it.
    groups: Vec<String>,
}

impl Txn {
    fn is_open(&self) -> bool {
        !self.added.is_empty() || !self.groups.is_empty()
    }
}

/// What a group coordinator needs to take offsets into a transaction
/// ([`crate::Member::commit_in_transaction`]).
#[derive(Debug, Clone)]
pub struct TxnId {
    /// The transactional id.
    pub transactional_id: String,
    /// The producer id and epoch.
    pub producer: (i64, i16),
}

impl Producer {
    /// A producer on `cluster` (its own connections); asks for a producer id when idempotent.
    pub async fn new(mut cluster: Cluster, config: ProducerConfig) -> Result<Producer, Error> {
        let mut txn = config.transactional_id.as_ref().map(|id| Txn {
            id: id.clone(),
            coordinator: None,
            added: Default::default(),
            groups: Vec::new(),
        });
        let id = if let Some(t) = txn.as_mut() {
            init_transactional(&mut cluster, t, config.transaction_timeout).await?
        } else if config.idempotent {
            init_producer_id(&mut cluster).await?
        } else {
            (-1, -1)
        };
        Ok(Producer {
            txn,
            cluster,
            config,
            conns: HashMap::new(),
            id,
            topics: Vec::new(),
            buffered: 0,
            oldest: None,
            stats: ProducerStats::default(),
            needs_new_id: false,
        })
    }

    /// The producer's id and epoch ((-1, -1) if not idempotent, or after [`Producer::abort`]
    /// until the next flush).
    pub fn producer_id(&self) -> (i64, i16) {
        self.id
    }

    /// The cluster view.
    pub fn cluster(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// Counts so far.
    pub fn stats(&self) -> ProducerStats {
        self.stats
    }

    /// A handle for `topic` and its partition count; an unknown topic is an error.
    pub async fn topic(&mut self, name: &str) -> Result<(TopicHandle, i32), Error> {
        if let Some(i) = self.topics.iter().position(|t| t.name == name) {
            return Ok((TopicHandle(i), self.topics[i].parts.len() as i32));
        }
        if self.cluster.topic(name).is_none() {
            self.cluster.refresh(&[name]).await?;
        }
        let n = self
            .cluster
            .topic(name)
            .ok_or_else(|| Error::UnknownTopic(name.to_owned()))?
            .partitions
            .len();
        self.topics.push(TopicState {
            name: name.to_owned(),
            parts: (0..n)
                .map(|_| PartState {
                    open: BatchBuilder::new(),
                    sealed: std::collections::VecDeque::new(),
                    sequence: 0,
                })
                .collect(),
        });
        Ok((TopicHandle(self.topics.len() - 1), n as i32))
    }

    /// Appends a record to `partition`'s open batch (sent by the next [`Producer::flush`]).
    pub fn send(
        &mut self,
        topic: TopicHandle,
        partition: i32,
        key: Option<&[u8]>,
        value: &[u8],
        timestamp: i64,
    ) -> Result<(), Error> {
        let size = key.map_or(0, <[u8]>::len) + value.len();
        if size > self.config.max_record {
            return Err(Error::TooLarge {
                size,
                max: self.config.max_record,
            });
        }
        self.push(topic, partition, key, Some(value), timestamp)
    }

    /// Appends a tombstone (a null value: the key's end in a compacted topic).
    pub fn send_tombstone(
        &mut self,
        topic: TopicHandle,
        partition: i32,
        key: &[u8],
        timestamp: i64,
    ) -> Result<(), Error> {
        self.push(topic, partition, Some(key), None, timestamp)
    }

    fn push(
        &mut self,
        topic: TopicHandle,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), Error> {
        let size = key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
        let part = self
            .topics
            .get_mut(topic.0)
            .and_then(|t| {
                usize::try_from(partition)
                    .ok()
                    .and_then(|p| t.parts.get_mut(p))
            })
            .ok_or_else(|| Error::UnknownTopic(format!("partition {partition}")))?;
        if part.open.bytes() + size > self.config.max_batch {
            part.seal(&self.config, self.id)?;
        }
        part.open.push(timestamp, key, value);
        self.buffered += size + 8;
        if self.oldest.is_none() {
            self.oldest = Some(Instant::now());
        }
        Ok(())
    }

    /// Bytes waiting for a flush.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// A flush is due: the batches are full or the oldest record has lingered long enough.
    pub fn due(&self) -> bool {
        self.buffered >= self.config.batch_bytes
            || self
                .oldest
                .is_some_and(|t| t.elapsed() >= self.config.linger)
    }

    /// When the oldest waiting record's linger ends (`None`: nothing waits).
    pub fn linger_deadline(&self) -> Option<Instant> {
        self.oldest.map(|t| t + self.config.linger)
    }

    /// Sends every open batch and waits until each is acknowledged by all in-sync replicas,
    /// retrying retriable errors (a leader moved, a broker restarting) with backoff up to the
    /// delivery timeout. Returns the records acknowledged.
    ///
    /// On an error, every record not yet acknowledged is dropped and the producer takes a new
    /// id at its next flush (its sequence numbers start again): the caller decides what to
    /// send again (a pipeline goes back to its last commit).
    pub async fn flush(&mut self) -> Result<u64, Error> {
        self.ready().await?;
        match self.flush_inner().await {
            Ok(n) => Ok(n),
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }

    /// Takes the new producer id an [`Producer::abort`] asked for, if it has not yet; for a
    /// transactional producer that also aborts the open transaction at its coordinator (and
    /// fences any other producer with its id).
    pub async fn ready(&mut self) -> Result<(), Error> {
        if !self.needs_new_id {
            return Ok(());
        }
        self.id = match self.txn.as_mut() {
            Some(t) => {
                init_transactional(&mut self.cluster, t, self.config.transaction_timeout).await?
            }
            None => init_producer_id(&mut self.cluster).await?,
        };
        self.needs_new_id = false;
        for t in self.topics.iter_mut() {
            for p in t.parts.iter_mut() {
                // The new id's sequences start at 0 (batches sealed since `abort` carry no id
                // and no sequence).
                p.sequence = 0;
            }
        }
        Ok(())
    }

    /// The transactional id and the producer's current id and epoch (`None`: not
    /// transactional).
    pub fn transaction(&self) -> Option<TxnId> {
        self.txn.as_ref().map(|t| TxnId {
            transactional_id: t.id.clone(),
            producer: self.id,
        })
    }

    /// Adds `group`'s offsets to the open transaction (KIP-98's AddOffsetsToTxn); the group
    /// coordinator then takes them with [`crate::Member::commit_in_transaction`].
    pub async fn add_offsets(&mut self, group: &str) -> Result<(), Error> {
        self.ready().await?;
        let id = self.id;
        let Some(t) = self.txn.as_mut() else {
            return Err(Error::Unsupported(
                "offsets in a transaction without a transactional id",
            ));
        };
        if t.groups.iter().any(|g| g == group) {
            return Ok(());
        }
        let req = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(t.id.clone())))
            .with_producer_id(ProducerId(id.0))
            .with_producer_epoch(id.1)
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())));
        let deadline = Instant::now() + self.config.delivery_timeout;
        txn_request(
            &mut self.cluster,
            t,
            req,
            (0, 3),
            deadline,
            "AddOffsetsToTxn",
            |r| r.error_code,
        )
        .await?;
        t.groups.push(group.to_owned());
        Ok(())
    }

    /// Flushes, then commits the open transaction: its records and offsets become visible to
    /// `read_committed` readers. Nothing open: nothing is sent. On an error the transaction's
    /// fate is the coordinator's (it aborts it unless the commit was recorded): call
    /// [`Producer::abort`] and go back to the last commit.
    pub async fn commit_transaction(&mut self) -> Result<(), Error> {
        self.flush().await?;
        self.end_transaction(true).await
    }

    async fn end_transaction(&mut self, commit: bool) -> Result<(), Error> {
        let id = self.id;
        let Some(t) = self.txn.as_mut() else {
            return Ok(());
        };
        if !t.is_open() {
            return Ok(());
        }
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(t.id.clone())))
            .with_producer_id(ProducerId(id.0))
            .with_producer_epoch(id.1)
            .with_committed(commit);
        let deadline = Instant::now() + self.config.delivery_timeout;
        // A retry after a lost answer is safe: the coordinator answers a repeated EndTxn of a
        // transaction it already ended that way with success.
        txn_request(&mut self.cluster, t, req, (0, 4), deadline, "EndTxn", |r| {
            r.error_code
        })
        .await?;
        t.added.clear();
        t.groups.clear();
        self.stats.transactions += 1;
        Ok(())
    }

    /// Adds the partitions of `out` not yet in the open transaction to it.
    async fn add_partitions(&mut self, out: &[Outgoing]) -> Result<(), Error> {
        let id = self.id;
        let Some(t) = self.txn.as_mut() else {
            return Ok(());
        };
        let new: Vec<(usize, i32)> = out
            .iter()
            .map(|o| (o.topic, o.partition))
            .filter(|k| !t.added.contains(k))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
        for &(ti, p) in &new {
            let name = &self.topics[ti].name;
            match topics.iter_mut().find(|x| x.name.0.as_str() == name) {
                Some(x) => x.partitions.push(p),
                None => topics.push(
                    AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(StrBytes::from_string(name.clone())))
                        .with_partitions(vec![p]),
                ),
            }
        }
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                t.id.clone(),
            )))
            .with_v3_and_below_producer_id(ProducerId(id.0))
            .with_v3_and_below_producer_epoch(id.1)
            .with_v3_and_below_topics(topics);
        let deadline = Instant::now() + self.config.delivery_timeout;
        txn_request(
            &mut self.cluster,
            t,
            req,
            (0, 3),
            deadline,
            "AddPartitionsToTxn",
            |r| {
                let mut worst = r.error_code;
                for tr in &r.results_by_topic_v3_and_below {
                    for pr in &tr.results_by_partition {
                        // OPERATION_NOT_ATTEMPTED (55) stands beside the partition that failed.
                        if pr.partition_error_code != 0 && pr.partition_error_code != 55 {
                            worst = pr.partition_error_code;
                        }
                    }
                }
                worst
            },
        )
        .await?;
        t.added.extend(new);
        Ok(())
    }

    /// Drops every record not yet acknowledged; the next flush takes a new producer id. A
    /// transactional producer's open transaction is aborted when the new id is taken
    /// ([`Producer::ready`]; the coordinator aborts it, and fences this id's older epoch).
    pub fn abort(&mut self) {
        if let Some(t) = self.txn.as_mut() {
            t.added.clear();
            t.groups.clear();
        }
        for t in self.topics.iter_mut() {
            for p in t.parts.iter_mut() {
                p.open = BatchBuilder::new();
                p.sealed.clear();
            }
        }
        self.buffered = 0;
        self.oldest = None;
        self.needs_new_id = self.config.idempotent || self.txn.is_some();
        // Until the next flush takes the new id, a batch closed by `send` (over `max_batch`)
        // carries no producer id rather than the old one with a sequence the brokers would
        // refuse as out of order.
        self.id = (-1, -1);
    }

    async fn flush_inner(&mut self) -> Result<u64, Error> {
        for t in self.topics.iter_mut() {
            for p in t.parts.iter_mut() {
                p.seal(&self.config, self.id)?;
            }
        }
        self.buffered = 0;
        self.oldest = None;
        let mut total = 0u64;
        // One batch per partition per round, oldest first, each round acknowledged before
        // the next (so a partition's sequence numbers reach the broker in order).
        loop {
            let mut out = Vec::new();
            for (ti, t) in self.topics.iter_mut().enumerate() {
                for (pi, p) in t.parts.iter_mut().enumerate() {
                    if let Some((bytes, records)) = p.sealed.pop_front() {
                        out.push(Outgoing {
                            topic: ti,
                            partition: pi as i32,
                            bytes,
                            records,
                        });
                    }
                }
            }
            if out.is_empty() {
                break;
            }
            self.add_partitions(&out).await?;
            total += self.deliver(out).await?;
        }
        self.stats.records += total;
        Ok(total)
    }

    /// Sends `out` until every batch is acknowledged, retrying retriable errors with backoff
    /// up to the delivery timeout.
    async fn deliver(&mut self, mut out: Vec<Outgoing>) -> Result<u64, Error> {
        let total: u64 = out.iter().map(|o| u64::from(o.records)).sum();
        let deadline = Instant::now() + self.config.delivery_timeout;
        let mut backoff = Duration::from_millis(50);
        while !out.is_empty() {
            let before = out.len();
            let failed = self.send_round(&mut out).await;
            if out.is_empty() {
                break;
            }
            let err = match failed {
                Some(e) if !e.is_retriable() => return Err(e),
                Some(e) => e,
                None => Error::Timeout("produce"),
            };
            if Instant::now() + backoff > deadline {
                return Err(err);
            }
            tracing::debug!(waiting = out.len(), of = before, error = %err, "kafka produce: retrying");
            self.stats.retries += out.len() as u64;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            let names: Vec<String> = self.topics.iter().map(|t| t.name.clone()).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            if let Err(e) = self.cluster.refresh(&names).await {
                tracing::debug!(error = %e, "kafka metadata refresh failed");
            }
        }
        Ok(total)
    }

    /// One Produce request per leader; batches acknowledged leave `out`. Returns the last
    /// error seen (the batches it concerned stay in `out`).
    async fn send_round(&mut self, out: &mut Vec<Outgoing>) -> Option<Error> {
        let mut by_leader: HashMap<i32, Vec<usize>> = HashMap::new();
        for (i, o) in out.iter().enumerate() {
            let leader = self
                .cluster
                .topic(&self.topics[o.topic].name)
                .and_then(|t| t.partitions.get(o.partition as usize))
                .map_or(-1, |p| p.leader);
            by_leader.entry(leader).or_default().push(i);
        }
        let mut done = vec![false; out.len()];
        let mut last = None;
        for (leader, idx) in by_leader {
            if leader < 0 {
                last = Some(Error::broker("Produce", 5, None));
                continue;
            }
            match self.produce_to(leader, out, &idx).await {
                Ok(results) => {
                    for (i, code, msg) in results {
                        match code {
                            // 46: DUPLICATE_SEQUENCE_NUMBER: written before, by an attempt
                            // whose answer was lost.
                            0 | 46 => done[i] = true,
                            c if retriable_code(c) => {
                                last = Some(Error::broker("Produce", c, msg.as_deref()))
                            }
                            // MESSAGE_TOO_LARGE: the batch is over the broker's limit.
                            10 => {
                                return Some(Error::TooLarge {
                                    size: out[i].bytes.len(),
                                    max: self.config.max_batch,
                                })
                            }
                            c => return Some(Error::broker("Produce", c, msg.as_deref())),
                        }
                    }
                }
                Err(e) => {
                    self.conns.remove(&leader);
                    last = Some(e);
                }
            }
        }
        let mut i = 0;
        out.retain(|_| {
            let keep = !done[i];
            i += 1;
            keep
        });
        last
    }

    async fn produce_to(
        &mut self,
        leader: i32,
        out: &[Outgoing],
        idx: &[usize],
    ) -> Result<Vec<(usize, i16, Option<String>)>, Error> {
        if !self.conns.contains_key(&leader) {
            let addr = self
                .cluster
                .broker(leader)
                .ok_or(Error::broker("Produce", 5, None))?;
            let c = self.cluster.open(&addr).await?;
            self.conns.insert(leader, c);
        }
        let conn = self
            .conns
            .get_mut(&leader)
            .ok_or(Error::Unreachable(String::new()))?;
        let mut topics: Vec<TopicProduceData> = Vec::new();
        let mut order: Vec<(usize, i32, usize)> = Vec::new(); // (topic, partition, out index)
        for &i in idx {
            let o = &out[i];
            let name = &self.topics[o.topic].name;
            let data = PartitionProduceData::default()
                .with_index(o.partition)
                .with_records(Some(o.bytes.clone()));
            match topics.iter_mut().find(|t| t.name.0.as_str() == name) {
                Some(t) => t.partition_data.push(data),
                None => topics.push(
                    TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_string(name.clone())))
                        .with_partition_data(vec![data]),
                ),
            }
            order.push((o.topic, o.partition, i));
        }
        let req = ProduceRequest::default()
            .with_transactional_id(
                self.txn
                    .as_ref()
                    .map(|t| TransactionalId(StrBytes::from_string(t.id.clone()))),
            )
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(topics);
        self.stats.requests += 1;
        let resp = conn.call(req, 9, 11).await?;
        let mut results = Vec::new();
        for t in resp.responses {
            for p in t.partition_responses {
                let found = order.iter().find(|(ti, pi, _)| {
                    *pi == p.index && self.topics[*ti].name == t.name.0.as_str()
                });
                if let Some(&(_, _, i)) = found {
                    results.push((i, p.error_code, p.error_message.map(|m| m.to_string())));
                }
            }
        }
        Ok(results)
    }
}

/// Error codes a transactional request meets while the coordinator moves, loads or finishes
/// the previous transaction (CONCURRENT_TRANSACTIONS).
fn txn_retriable(code: i16) -> bool {
    retriable_code(code) || code == 51
}

/// `req` to the transaction coordinator of `t` (found first if not known; a connection that
/// fails is dropped so the next call finds it again).
async fn txn_call<R: kafka_protocol::protocol::Request>(
    cluster: &mut Cluster,
    t: &mut Txn,
    req: R,
    lo: i16,
    hi: i16,
) -> Result<R::Response, Error> {
    if t.coordinator.is_none() {
        let addr = cluster.find_transaction_coordinator(&t.id).await?;
        t.coordinator = Some(cluster.open(&addr).await?);
    }
    let conn = t
        .coordinator
        .as_mut()
        .ok_or(Error::Unreachable("transaction coordinator".into()))?;
    let r = conn.call(req, lo, hi).await;
    if r.is_err() {
        t.coordinator = None;
    }
    r
}

/// `req` to the transaction coordinator until its answer's error code (`code`) is 0, retrying
/// while the coordinator moves, loads or finishes the previous transaction (backoff from 2 ms:
/// right after a commit its markers are still being written, a matter of milliseconds), up to
/// `deadline`.
async fn txn_request<R: kafka_protocol::protocol::Request + Clone>(
    cluster: &mut Cluster,
    t: &mut Txn,
    req: R,
    versions: (i16, i16),
    deadline: Instant,
    api: &'static str,
    code: impl Fn(&R::Response) -> i16,
) -> Result<R::Response, Error> {
    let mut backoff = Duration::from_millis(2);
    loop {
        let err = match txn_call(cluster, t, req.clone(), versions.0, versions.1).await {
            Ok(r) => match code(&r) {
                0 => return Ok(r),
                c => {
                    if matches!(c, 15 | 16) {
                        t.coordinator = None;
                    }
                    Error::broker(api, c, None)
                }
            },
            Err(e) => e,
        };
        let retriable = match &err {
            Error::Broker { code, .. } => txn_retriable(*code),
            e => e.is_retriable(),
        };
        if !retriable || Instant::now() >= deadline {
            return Err(err);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(100));
    }
}

/// InitProducerId for a transactional id at its coordinator: a new epoch, the previous
/// epoch's open transaction aborted (retried while the coordinator finishes it).
async fn init_transactional(
    cluster: &mut Cluster,
    t: &mut Txn,
    timeout: Duration,
) -> Result<(i64, i16), Error> {
    let deadline = Instant::now() + cluster.config().request_timeout.max(timeout);
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(t.id.clone()))))
        .with_transaction_timeout_ms(timeout.as_millis().min(i32::MAX as u128) as i32)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let resp = txn_request(cluster, t, req, (2, 4), deadline, "InitProducerId", |r| {
        r.error_code
    })
    .await?;
    t.added.clear();
    t.groups.clear();
    Ok((resp.producer_id.0, resp.producer_epoch))
}

async fn init_producer_id(cluster: &mut Cluster) -> Result<(i64, i16), Error> {
    let deadline = Instant::now() + cluster.config().request_timeout;
    loop {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let code = match cluster.call_any(req, 2, 4).await {
            Ok(resp) if resp.error_code == 0 => {
                return Ok((resp.producer_id.0, resp.producer_epoch))
            }
            Ok(resp) => Error::broker("InitProducerId", resp.error_code, None),
            Err(e) => e,
        };
        if !code.is_retriable() || Instant::now() > deadline {
            return Err(code);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The partition Kafka's default partitioner gives `key` among `partitions`: murmur2 of the
/// key's bytes, sign bit cleared, modulo the count. Java, librdkafka (`murmur2_random`) and
/// Kafka Streams agree on it, so topics keyed here are co-partitioned with theirs.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) as i32) % partitions.max(1)
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        if rest.len() >= 3 {
            h ^= u32::from(rest[2]) << 16;
        }
        if rest.len() >= 2 {
            h ^= u32::from(rest[1]) << 8;
        }
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_test_vectors() {
        // org.apache.kafka.common.utils.UtilsTest#testMurmur2
        let cases: [(&str, i32); 6] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ];
        for (s, want) in cases {
            assert_eq!(murmur2(s.as_bytes()) as i32, want, "{s}");
        }
    }
}
