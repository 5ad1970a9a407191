//! The fetcher: the partitions a worker owns, their positions, and one Fetch in flight per
//! leader. What a fetch returns is the broker's record bytes as they came off the socket;
//! [`crate::records::Batches`] reads them in place.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

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
}

/// Fetches the partitions it is given.
pub struct Fetcher {
    cluster: Cluster,
    config: FetchConfig,
    conns: HashMap<i32, Conn>,
    /// Fetches in flight: the broker and the partitions asked for, with their positions.
    in_flight: HashMap<i32, Vec<(String, i32, i64)>>,
    owned: HashMap<(String, i32), Owned>,
    version: i16,
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
        let asked = self.in_flight.remove(&broker).unwrap_or_default();
        match result {
            Ok(resp) => self.take(resp, asked).await,
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
            .flatten()
            .map(|(t, p, _)| (t.clone(), *p))
            .collect();
        for ((topic, p), o) in &self.owned {
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
                .with_max_wait_ms(self.config.max_wait.as_millis() as i32)
                .with_min_bytes(self.config.min_bytes)
                .with_max_bytes(self.config.max_bytes)
                .with_isolation_level(i8::from(self.config.read_committed))
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_topics(topics);
            let sent = conn.send(&req, self.version).is_ok() && conn.flush().await.is_ok();
            if sent {
                self.in_flight.insert(
                    leader,
                    parts
                        .into_iter()
                        .map(|(t, p, pos, _)| (t, p, pos))
                        .collect(),
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
        asked: Vec<(String, i32, i64)>,
    ) -> Result<Vec<Fetched>, Error> {
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
        }
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
