//! The fetcher: the partitions a worker owns, their positions, and one Fetch in flight per
//! leader. What a fetch returns is the broker's record bytes as they came off the socket;
//! [`crate::records::Batches`] reads them in place.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::{Cluster, OffsetSpec};
use crate::conn::Conn;
use crate::error::{retriable_code, Error};
use crate::records::{Batch, Batches, Record};

/// How the fetcher asks.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// How long a broker may hold a fetch that has less than `min_bytes`.
    pub max_wait: Duration,
    /// Bytes a broker waits for before it answers (up to `max_wait`).
    pub min_bytes: i32,
    /// Bytes per response.
    pub max_bytes: i32,
    /// Bytes per partition per response.
    pub partition_max_bytes: i32,
    /// Read only committed transactions' records (`read_committed`).
    pub read_committed: bool,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            max_wait: Duration::from_millis(100),
            min_bytes: 1,
            max_bytes: 50 << 20,
            partition_max_bytes: 4 << 20,
            read_committed: false,
        }
    }
}

/// One fetch answer: the request it answers, when that request was sent and when the answer
/// came. What a reader of several partitions compares to know whether what it knows of one
/// partition is as recent as records it holds from another ([`Fetcher::caught_up_as_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    request: u64,
    asked: Instant,
    received: Instant,
}

impl Answer {
    /// Whether this answer saw its broker at or after the moment `other` was received: it is
    /// `other` itself, or it answers a request sent after `other` came. Whatever was written
    /// before `other`'s records were read is then visible in this one. (A broker reads the
    /// partitions of one answer one after the other within microseconds: one answer counts
    /// as one moment.)
    pub fn no_older_than(&self, other: &Answer) -> bool {
        self.request == other.request || self.asked >= other.received
    }
}

/// A partition's records from one fetch.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record batches, as the broker sent them (walk them with [`Batches`]).
    pub records: Bytes,
    /// The position before these records.
    pub from: i64,
    /// The position after them (the next fetch's offset).
    pub to: i64,
    /// The partition's high watermark.
    pub high_watermark: i64,
    /// Transactions aborted within these records (`read_committed` only): producer id and
    /// first offset, by first offset. [`Fetched::batches`] leaves their batches out.
    pub aborted: Vec<(i64, i64)>,
    /// The answer these records came in.
    pub answer: Answer,
}

impl Fetched {
    /// Calls `f` for each data record from `from` on: records before it (the first batch may
    /// start earlier) and transaction markers are skipped. A compressed batch is inflated into
    /// `scratch`. Returns how many records `f` saw.
    pub fn for_each(
        &self,
        scratch: &mut Vec<u8>,
        mut f: impl FnMut(Record<'_>),
    ) -> Result<u64, Error> {
        let mut n = 0;
        for b in self.batches() {
            let b = b?;
            for r in b.records(scratch)? {
                let r = r?;
                if r.offset >= self.from {
                    f(r);
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The data batches that reach `from` or beyond, in order: transaction markers and the
    /// batches of aborted transactions are left out (the way Java's consumer does it: a
    /// producer's transactional batches are dropped from its aborted transaction's first
    /// offset until its abort marker).
    pub fn batches(&self) -> DataBatches<'_> {
        DataBatches {
            inner: Batches::new(&self.records),
            from: self.from,
            aborted: &self.aborted,
            next: 0,
            active: Vec::new(),
        }
    }
}

/// The iterator of [`Fetched::batches`].
pub struct DataBatches<'a> {
    inner: Batches<'a>,
    from: i64,
    aborted: &'a [(i64, i64)],
    next: usize,
    /// Producers inside an aborted transaction at this point.
    active: Vec<i64>,
}

impl<'a> Iterator for DataBatches<'a> {
    type Item = Result<Batch<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let b = match self.inner.next()? {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            while let Some(&(pid, first)) = self.aborted.get(self.next) {
                if first >= b.next_offset {
                    break;
                }
                self.active.push(pid);
                self.next += 1;
            }
            if b.control {
                if self.active.contains(&b.producer_id) && is_abort_marker(&b) {
                    self.active.retain(|p| *p != b.producer_id);
                }
                continue;
            }
            if b.next_offset <= self.from
                || (b.transactional && self.active.contains(&b.producer_id))
            {
                continue;
            }
            return Some(Ok(b));
        }
    }
}

/// A control batch's record key is its version (int16) and type (int16: 0 abort, 1 commit).
fn is_abort_marker(b: &Batch<'_>) -> bool {
    let mut scratch = Vec::new();
    let Ok(mut records) = b.records(&mut scratch) else {
        return false;
    };
    matches!(records.next(), Some(Ok(r)) if r.key.is_some_and(|k| k.len() >= 4 && k[2..4] == [0, 0]))
}

struct Owned {
    position: i64,
    leader_epoch: i32,
    /// The partition's high watermark at the last answer (-1: none yet).
    high_watermark: i64,
    /// The last answer about it.
    seen: Option<Answer>,
    /// A reader waits for a newer answer about it: the next request that asks for it is not
    /// held by its broker ([`Fetcher::hurry`]).
    hurried: bool,
}

/// A fetch in flight to one broker.
struct Asked {
    /// The partitions asked for, with their positions.
    parts: Vec<(String, i32, i64)>,
    request: u64,
    at: Instant,
}

/// Fetches the partitions it is given.
pub struct Fetcher {
    cluster: Cluster,
    config: FetchConfig,
    conns: HashMap<i32, Conn>,
    /// Fetches in flight, by broker.
    in_flight: HashMap<i32, Asked>,
    owned: HashMap<(String, i32), Owned>,
    version: i16,
    /// Fetch requests sent so far.
    requests: u64,
}

impl Fetcher {
    /// A fetcher with its own connections.
    pub fn new(cluster: Cluster, config: FetchConfig) -> Fetcher {
        Fetcher {
            cluster,
            config,
            conns: HashMap::new(),
            in_flight: HashMap::new(),
            owned: HashMap::new(),
            version: 12,
            requests: 0,
        }
    }

    /// The cluster view.
    pub fn cluster(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// Starts fetching `topic`/`partition` at `offset` (`None`: the earliest offset).
    pub async fn assign(
        &mut self,
        topic: &str,
        partition: i32,
        offset: Option<i64>,
    ) -> Result<(), Error> {
        if self.cluster.topic(topic).is_none() {
            self.cluster.refresh(&[topic]).await?;
        }
        let position = match offset {
            Some(o) => o,
            None => self.earliest(topic, partition).await?,
        };
        self.owned.insert(
            (topic.to_owned(), partition),
            Owned {
                position,
                leader_epoch: -1,
                high_watermark: -1,
                seen: None,
                hurried: false,
            },
        );
        Ok(())
    }

    async fn earliest(&mut self, topic: &str, partition: i32) -> Result<i64, Error> {
        let got = self
            .cluster
            .list_offsets(topic, &[partition], OffsetSpec::Earliest)
            .await?;
        got.first()
            .map(|(_, o)| *o)
            .ok_or(Error::broker("ListOffsets", 3, None))
    }

    /// Stops fetching a partition; records of a fetch already in flight for it are dropped.
    pub fn unassign(&mut self, topic: &str, partition: i32) -> Option<i64> {
        self.owned
            .remove(&(topic.to_owned(), partition))
            .map(|o| o.position)
    }

    /// The partitions fetched and their positions.
    pub fn positions(&self) -> Vec<(String, i32, i64)> {
        let mut v: Vec<_> = self
            .owned
            .iter()
            .map(|((t, p), o)| (t.clone(), *p, o.position))
            .collect();
        v.sort();
        v
    }

    /// The partition's position has reached its high watermark as of the last answer: every
    /// record written to it so far has been returned. `false` before any answer.
    pub fn caught_up(&self, topic: &str, partition: i32) -> bool {
        self.owned
            .get(&(topic.to_owned(), partition))
            .is_some_and(|o| o.high_watermark >= 0 && o.position >= o.high_watermark)
    }

    /// Asks for the partition's next answer without the broker's wait (`max_wait`): a reader
    /// holds records back until it hears of this partition again, so the broker should say at
    /// once that it has nothing new rather than wait for something to arrive. (A request
    /// already in flight is not hurried.)
    pub fn hurry(&mut self, topic: &str, partition: i32) {
        if let Some(o) = self.owned.get_mut(&(topic.to_owned(), partition)) {
            o.hurried = true;
        }
    }

    /// The answer that showed the partition caught up ([`Fetcher::caught_up`]), if it is.
    /// Records of another partition are known to have nothing before them left unread in this
    /// one when that answer is [no older](Answer::no_older_than) than theirs: an answer read
    /// before theirs, from another broker, may predate what was written in between.
    pub fn caught_up_as_of(&self, topic: &str, partition: i32) -> Option<Answer> {
        self.owned
            .get(&(topic.to_owned(), partition))
            .filter(|o| o.high_watermark >= 0 && o.position >= o.high_watermark)
            .and_then(|o| o.seen)
    }

    /// A partition's high watermark (its last stable offset under `read_committed`) as of the
    /// last answer.
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.owned
            .get(&(topic.to_owned(), partition))
            .map(|o| o.high_watermark)
            .filter(|h| *h >= 0)
    }

    /// A partition's position.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.owned
            .get(&(topic.to_owned(), partition))
            .map(|o| o.position)
    }

    /// Moves a partition's position (a rewind after recovery).
    pub fn seek(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(o) = self.owned.get_mut(&(topic.to_owned(), partition)) {
            o.position = offset;
        }
    }

    /// The next records: sends a Fetch to every leader of an owned partition that has none in
    /// flight, then waits for the first answer. An answer with no records for any partition
    /// is an empty vector (the broker's `max_wait` passed). A partition whose leader moved is
    /// retried after a metadata refresh; an offset out of range restarts at the earliest.
    pub async fn fetch(&mut self) -> Result<Vec<Fetched>, Error> {
        self.send_fetches().await?;
        if self.in_flight.is_empty() {
            // Nothing owned, or no leader known: wait as a fetch would, then look again.
            tokio::time::sleep(self.config.max_wait).await;
            let names = self.topic_names();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            if !names.is_empty() {
                self.cluster.refresh(&names).await?;
            }
            return Ok(Vec::new());
        }
        let extra = self.config.max_wait;
        let version = self.version;
        let (broker, result) = {
            let mut futs: Vec<(i32, Pin<Box<dyn Future<Output = _> + '_>>)> = Vec::new();
            for (id, conn) in self.conns.iter_mut() {
                if conn.in_flight() > 0 {
                    futs.push((
                        *id,
                        Box::pin(conn.recv_within::<FetchRequest>(version, extra)),
                    ));
                }
            }
            // The first answer; the others stay in flight (a connection's read keeps what it
            // has read in its buffer, so dropping its future loses nothing).
            std::future::poll_fn(|cx| {
                for (id, f) in futs.iter_mut() {
                    if let Poll::Ready(r) = f.as_mut().poll(cx) {
                        return Poll::Ready((*id, r));
                    }
                }
                Poll::Pending
            })
            .await
        };
        let received = Instant::now();
        let asked = self.in_flight.remove(&broker).unwrap_or(Asked {
            parts: Vec::new(),
            request: 0,
            at: received,
        });
        match result {
            Ok(resp) => self.take(resp, asked, received).await,
            Err(e) => {
                self.conns.remove(&broker);
                if e.is_retriable() {
                    tracing::debug!(broker, error = %e, "kafka fetch failed; refreshing metadata");
                    self.refresh_soon().await;
                    Ok(Vec::new())
                } else {
                    Err(e)
                }
            }
        }
    }

    fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.owned.keys().map(|(t, _)| t.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    async fn refresh_soon(&mut self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let names = self.topic_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if let Err(e) = self.cluster.refresh(&names).await {
            tracing::debug!(error = %e, "kafka metadata refresh failed");
        }
    }

    async fn send_fetches(&mut self) -> Result<(), Error> {
        let mut by_leader: HashMap<i32, Vec<(String, i32, i64, i32)>> = HashMap::new();
        let busy: Vec<(String, i32)> = self
            .in_flight
            .values()
            .flat_map(|a| &a.parts)
            .map(|(t, p, _)| (t.clone(), *p))
            .collect();
        let mut hurried: Vec<i32> = Vec::new();
        for ((topic, p), o) in &mut self.owned {
            if busy.iter().any(|(t, q)| t == topic && q == p) {
                continue;
            }
            let leader = self
                .cluster
                .topic(topic)
                .and_then(|t| t.partitions.get(*p as usize))
                .map_or(-1, |i| i.leader);
            if leader < 0 || self.in_flight.contains_key(&leader) {
                continue;
            }
            if std::mem::take(&mut o.hurried) {
                hurried.push(leader);
            }
            by_leader.entry(leader).or_default().push((
                topic.clone(),
                *p,
                o.position,
                o.leader_epoch,
            ));
        }
        for (leader, parts) in by_leader {
            if !self.conns.contains_key(&leader) {
                let Some(addr) = self.cluster.broker(leader) else {
                    continue;
                };
                match self.cluster.open(&addr).await {
                    Ok(c) => {
                        self.version = c.version::<FetchRequest>(12, 12)?;
                        self.conns.insert(leader, c);
                    }
                    Err(e) => {
                        tracing::debug!(leader, error = %e, "kafka: cannot reach a leader");
                        continue;
                    }
                }
            }
            let Some(conn) = self.conns.get_mut(&leader) else {
                continue;
            };
            let mut topics: Vec<FetchTopic> = Vec::new();
            for (t, p, pos, epoch) in &parts {
                let fp = FetchPartition::default()
                    .with_partition(*p)
                    .with_current_leader_epoch(*epoch)
                    .with_fetch_offset(*pos)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(self.config.partition_max_bytes);
                match topics.iter_mut().find(|x| x.topic.0.as_str() == t) {
                    Some(x) => x.partitions.push(fp),
                    None => topics.push(
                        FetchTopic::default()
                            .with_topic(TopicName(StrBytes::from_string(t.clone())))
                            .with_partitions(vec![fp]),
                    ),
                }
            }
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(match hurried.contains(&leader) {
                    true => 0,
                    false => self.config.max_wait.as_millis() as i32,
                })
                .with_min_bytes(self.config.min_bytes)
                .with_max_bytes(self.config.max_bytes)
                .with_isolation_level(i8::from(self.config.read_committed))
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_topics(topics);
            let sent = conn.send(&req, self.version).is_ok() && conn.flush().await.is_ok();
            if sent {
                self.requests += 1;
                self.in_flight.insert(
                    leader,
                    Asked {
                        parts: parts
                            .into_iter()
                            .map(|(t, p, pos, _)| (t, p, pos))
                            .collect(),
                        request: self.requests,
                        at: Instant::now(),
                    },
                );
            } else {
                self.conns.remove(&leader);
            }
        }
        Ok(())
    }

    async fn take(
        &mut self,
        resp: FetchResponse,
        asked: Asked,
        received: Instant,
    ) -> Result<Vec<Fetched>, Error> {
        let answer = Answer {
            request: asked.request,
            asked: asked.at,
            received,
        };
        let asked = asked.parts;
        if resp.error_code != 0 {
            return Err(Error::broker("Fetch", resp.error_code, None));
        }
        let mut out = Vec::new();
        let mut refresh = false;
        for t in resp.responses {
            let topic = t.topic.0.to_string();
            for p in t.partitions {
                let key = (topic.clone(), p.partition_index);
                let Some(from) = asked
                    .iter()
                    .find(|(at, ap, _)| *at == topic && *ap == p.partition_index)
                    .map(|a| a.2)
                else {
                    continue;
                };
                // Unassigned, or moved by `seek`, while the fetch was out: drop its records.
                let Some(owned) = self.owned.get_mut(&key) else {
                    continue;
                };
                if owned.position != from {
                    continue;
                }
                match p.error_code {
                    0 => {}
                    1 => {
                        // OFFSET_OUT_OF_RANGE: the log was truncated under us; start again
                        // at its beginning (what `auto.offset.reset=earliest` does).
                        tracing::warn!(
                            topic,
                            partition = p.partition_index,
                            from,
                            "kafka: offset out of range; restarting at the earliest offset"
                        );
                        let e = self.earliest(&topic, p.partition_index).await?;
                        if let Some(o) = self.owned.get_mut(&key) {
                            o.position = e;
                        }
                        continue;
                    }
                    c if retriable_code(c) => {
                        refresh = true;
                        continue;
                    }
                    c => return Err(Error::broker("Fetch", c, None)),
                }
                // Reading committed records only, the reachable end is the last stable offset.
                owned.high_watermark = if self.config.read_committed && p.last_stable_offset >= 0 {
                    p.last_stable_offset
                } else {
                    p.high_watermark
                };
                owned.seen = Some(answer);
                let Some(records) = p.records else { continue };
                let mut to = from;
                for b in Batches::new(&records) {
                    let b = b?;
                    to = to.max(b.next_offset);
                }
                if to == from {
                    continue;
                }
                owned.position = to;
                if p.current_leader.leader_epoch >= 0 {
                    owned.leader_epoch = p.current_leader.leader_epoch;
                }
                let mut aborted: Vec<(i64, i64)> = p
                    .aborted_transactions
                    .unwrap_or_default()
                    .iter()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect();
                aborted.sort_unstable_by_key(|a| a.1);
                out.push(Fetched {
                    topic: topic.clone(),
                    partition: p.partition_index,
                    records,
                    from,
                    to,
                    high_watermark: p.high_watermark,
                    aborted,
                    answer,
                });
            }
        }
        if refresh {
            self.refresh_soon().await;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::records::{BatchBuilder, Compression};

    /// A batch of `n` records at `base` by producer `pid`; a control batch (its one record's
    /// key: version 0, `marker` 0 abort or 1 commit) if `marker` is given.
    fn batch(base: i64, pid: i64, transactional: bool, marker: Option<i16>, n: u32) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        match marker {
            Some(kind) => {
                let mut key = 0i16.to_be_bytes().to_vec();
                key.extend_from_slice(&kind.to_be_bytes());
                b.push(0, Some(&key), Some(&[0, 0, 0, 0, 0, 0]));
            }
            None => {
                for i in 0..n {
                    b.push(0, None, Some(format!("{}", base + i64::from(i)).as_bytes()));
                }
            }
        }
        let mut out = Vec::new();
        b.finish(&mut out, Compression::None, (pid, 0), 0, transactional)
            .unwrap();
        out[0..8].copy_from_slice(&base.to_be_bytes());
        if marker.is_some() {
            let attrs = i16::from_be_bytes([out[21], out[22]]) | 0x20;
            out[21..23].copy_from_slice(&attrs.to_be_bytes());
            let crc = crc32c::crc32c(&out[21..]);
            out[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        out
    }

    fn values(f: &Fetched) -> Vec<String> {
        let mut out = Vec::new();
        f.for_each(&mut Vec::new(), |r| {
            out.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap())
        })
        .unwrap();
        out
    }

    fn fetched(parts: &[Vec<u8>], from: i64, aborted: Vec<(i64, i64)>) -> Fetched {
        Fetched {
            topic: "t".into(),
            partition: 0,
            records: Bytes::from(parts.concat()),
            from,
            to: 0,
            high_watermark: 0,
            aborted,
            answer: Answer {
                request: 0,
                asked: Instant::now(),
                received: Instant::now(),
            },
        }
    }

    /// A fetcher that owns `nbbo`/0 and `orders`/0 at offset 0, never connected.
    fn offline_fetcher() -> Fetcher {
        let cluster = Cluster::offline(crate::Config::new("127.0.0.1:9")).unwrap();
        let mut f = Fetcher::new(cluster, FetchConfig::default());
        for t in ["nbbo", "orders"] {
            f.owned.insert(
                (t.to_owned(), 0),
                Owned {
                    position: 0,
                    leader_epoch: -1,
                    high_watermark: -1,
                    seen: None,
                    hurried: false,
                },
            );
        }
        f
    }

    /// A fetch answer for `topic`/0: its high watermark and records.
    fn answer_for(topic: &str, high_watermark: i64, records: Option<Vec<u8>>) -> FetchResponse {
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partitions(vec![PartitionData::default()
                .with_partition_index(0)
                .with_high_watermark(high_watermark)
                .with_last_stable_offset(high_watermark)
                .with_records(records.map(Bytes::from))])])
    }

    fn asked(topic: &str, position: i64, request: u64, at: Instant) -> Asked {
        Asked {
            parts: vec![(topic.to_owned(), 0, position)],
            request,
            at,
        }
    }

    /// Two partitions led by two brokers: an empty answer about one that left before the other's
    /// records came does not vouch for it (a record written in between, before them, may not
    /// be in it); an answer to a request sent after they came does, and so does the answer they
    /// came in.
    #[test]
    fn a_partition_is_caught_up_for_records_only_as_of_an_answer_no_older_than_theirs() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = offline_fetcher();
        assert_eq!(f.caught_up_as_of("nbbo", 0), None, "no answer yet");
        // Broker A answers about nbbo at 10 ms (empty); broker B's answer about orders, asked
        // at the same moment, comes at 20 ms with a record.
        let a1 = rt.block_on(f.take(
            answer_for("nbbo", 0, None),
            asked("nbbo", 0, 1, at(0)),
            at(10),
        ));
        assert!(a1.unwrap().is_empty());
        let got = rt
            .block_on(f.take(
                answer_for("orders", 1, Some(batch(0, -1, false, None, 1))),
                asked("orders", 0, 2, at(0)),
                at(20),
            ))
            .unwrap();
        assert_eq!(got.len(), 1);
        let order = got[0].answer;
        let nbbo = f
            .caught_up_as_of("nbbo", 0)
            .expect("caught up as of its answer");
        assert!(f.caught_up("nbbo", 0));
        assert!(
            !nbbo.no_older_than(&order),
            "an answer that predates the order's"
        );
        assert!(f.caught_up_as_of("orders", 0).is_some_and(|a| a == order));
        // A request to A sent at 25 ms, after the order came: its empty answer vouches for nbbo.
        rt.block_on(f.take(
            answer_for("nbbo", 0, None),
            asked("nbbo", 0, 3, at(25)),
            at(30),
        ))
        .unwrap();
        assert!(f.caught_up_as_of("nbbo", 0).unwrap().no_older_than(&order));
        // ... unless it holds records: then nbbo is not caught up until they are read, and its
        // records come first by timestamp.
        let got = rt
            .block_on(f.take(
                answer_for("nbbo", 2, Some(batch(0, -1, false, None, 1))),
                asked("nbbo", 0, 4, at(40)),
                at(45),
            ))
            .unwrap();
        assert_eq!((got.len(), got[0].to), (1, 1));
        assert_eq!(
            f.caught_up_as_of("nbbo", 0),
            None,
            "one of two records read"
        );
        // One answer about both partitions (one broker leads both) counts as one moment.
        let both = Answer {
            request: 9,
            asked: at(50),
            received: at(60),
        };
        assert!(both.no_older_than(&both));
        let earlier = Answer {
            request: 8,
            asked: at(50),
            received: at(55),
        };
        assert!(!earlier.no_older_than(&both));
        assert!(both.no_older_than(&Answer {
            request: 7,
            asked: at(0),
            received: at(50),
        }));
    }

    #[test]
    fn aborted_transactions_and_markers_are_left_out() {
        let log = [
            batch(0, 1, true, None, 3),    // producer 1's transaction: committed below
            batch(3, 2, true, None, 2),    // producer 2's: aborted below
            batch(5, 1, true, Some(1), 1), // commit marker of 1
            batch(6, 2, true, Some(0), 1), // abort marker of 2
            batch(7, 2, true, None, 2),    // producer 2 again: committed
            batch(9, 2, true, Some(1), 1), // its commit marker
            batch(10, -1, false, None, 1), // a plain producer
        ];
        let f = fetched(&log, 0, vec![(2, 3)]);
        assert_eq!(values(&f), ["0", "1", "2", "7", "8", "10"]);
        // The same bytes read from offset 8: the batches before it are walked, not returned.
        let f = fetched(&log, 8, vec![(2, 3)]);
        assert_eq!(values(&f), ["8", "10"]);
        // Without the aborted list (read_uncommitted) every data record is there.
        let f = fetched(&log, 0, Vec::new());
        assert_eq!(values(&f), ["0", "1", "2", "3", "4", "7", "8", "10"]);
    }

    #[test]
    fn a_fetch_that_starts_inside_an_aborted_transaction_drops_its_rest() {
        // Producer 2's aborted transaction began at 1, before this fetch's first batch.
        let log = [
            batch(3, 2, true, None, 2),
            batch(5, 3, false, None, 1),
            batch(6, 2, true, Some(0), 1),
            batch(7, 2, true, None, 1),
        ];
        let f = fetched(&log, 3, vec![(2, 1)]);
        assert_eq!(values(&f), ["5", "7"]);
    }
}
