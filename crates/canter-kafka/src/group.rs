//! Consumer-group membership. By KIP-848's protocol the member heartbeats its subscription
//! and the partitions it owns; the group coordinator (a broker) computes the assignment and
//! hands each member its share, giving a partition to a new owner only after the old owner
//! said it let it go. By the classic protocol (classic.rs: Kafka before 4.0, Redpanda) the
//! members join, one of them assigns, and all sync. Offsets are committed to the coordinator
//! under the member's epoch or generation.

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, GroupId, OffsetCommitRequest, OffsetFetchRequest, ProducerId,
    TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::conn::Conn;
use crate::error::{retriable_code, Error};

/// A topic and partition.
pub type Tp = (String, i32);

/// How the assignment changed at a heartbeat.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Change {
    /// Partitions this member now owns: restore their state, fetch from their committed
    /// offsets.
    pub assigned: Vec<Tp>,
    /// Partitions to give up: finish what was read, commit, stop fetching. The member tells
    /// the coordinator at its next heartbeat.
    pub revoked: Vec<Tp>,
    /// The member was fenced (its session expired): `revoked` were lost, not handed over;
    /// their uncommitted work will be redone by their next owner.
    pub lost: bool,
}

/// What the classic protocol adds to a member.
#[derive(Debug, Clone)]
pub(crate) struct Classic {
    pub(crate) session_timeout: Duration,
    /// A new round is due: give up what is owned, then join.
    pub(crate) rejoin: bool,
}

impl Classic {
    pub(crate) fn new(session_timeout: Duration) -> Classic {
        Classic {
            session_timeout,
            rejoin: true,
        }
    }
}

/// One member of a consumer group.
pub struct Member {
    pub(crate) group: String,
    pub(crate) member_id: String,
    /// The member epoch (KIP-848) or the generation (classic).
    pub(crate) epoch: i32,
    pub(crate) topics: Vec<String>,
    pub(crate) owned: BTreeSet<Tp>,
    pub(crate) coordinator: Option<Conn>,
    pub(crate) interval: Duration,
    pub(crate) next: Instant,
    pub(crate) rebalance_timeout: Duration,
    assignor: Option<String>,
    /// `Some` under the classic protocol.
    pub(crate) classic: Option<Classic>,
}

impl Member {
    /// A member of `group` subscribed to `topics`; it joins at its first
    /// [`Member::heartbeat`].
    pub fn new(group: &str, topics: &[&str]) -> Member {
        Member {
            group: group.to_owned(),
            member_id: random_id(),
            epoch: 0,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            owned: BTreeSet::new(),
            coordinator: None,
            interval: Duration::from_millis(500),
            next: Instant::now(),
            rebalance_timeout: Duration::from_secs(30),
            assignor: None,
            classic: None,
        }
    }

    /// Speaks the classic group protocol (JoinGroup, SyncGroup, Heartbeat) instead of
    /// KIP-848's, with this session timeout; this client's members assign partitions by
    /// range, which gives a member the same partitions of every topic of equal partition count.
    pub fn classic(mut self, session_timeout: Duration) -> Member {
        self.classic = Some(Classic::new(session_timeout));
        self.member_id = String::new();
        self
    }

    /// Whether the member speaks the classic protocol.
    pub fn is_classic(&self) -> bool {
        self.classic.is_some()
    }

    /// Asks the coordinator for one of its assignors: `range` gives every member the same
    /// partitions of each topic with the same partition count (what co-partitioned inputs
    /// need), `uniform` (the broker's default) spreads partitions evenly.
    pub fn with_assignor(mut self, name: &str) -> Member {
        self.assignor = Some(name.to_owned());
        self
    }

    /// The member's id (made here, as KIP-1082 asks).
    pub fn id(&self) -> &str {
        &self.member_id
    }

    /// The member's epoch (0 before it joined).
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// The partitions it owns.
    pub fn owned(&self) -> impl Iterator<Item = &Tp> {
        self.owned.iter()
    }

    /// Forgets the membership after the group fenced it ([`Error::is_fenced`]): what it owned
    /// is dropped, and the next heartbeat (due now) joins again as new.
    pub fn reset(&mut self) {
        self.owned.clear();
        self.epoch = 0;
        self.next = Instant::now();
        if let Some(c) = &mut self.classic {
            c.rejoin = true;
        }
    }

    /// When the next heartbeat is due.
    pub fn next_heartbeat(&self) -> Instant {
        self.next
    }

    pub(crate) async fn coordinator(&mut self, cluster: &mut Cluster) -> Result<&mut Conn, Error> {
        if self.coordinator.is_none() {
            let addr = cluster.find_coordinator(&self.group).await?;
            self.coordinator = Some(cluster.open(&addr).await?);
        }
        self.coordinator
            .as_mut()
            .ok_or(Error::Unreachable("group coordinator".into()))
    }

    /// Sends a heartbeat (the full state: subscription and owned partitions) and applies the
    /// assignment it brings. Errors that go away (coordinator moving) leave the member as it
    /// was; the caller heartbeats again at [`Member::next_heartbeat`].
    pub async fn heartbeat(&mut self, cluster: &mut Cluster) -> Result<Change, Error> {
        if self.classic.is_some() {
            return self.heartbeat_classic(cluster).await;
        }
        for t in &self.topics {
            if cluster.topic(t).is_none() {
                let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
                cluster.refresh(&names).await?;
                break;
            }
        }
        let owned = self.owned_by_id(cluster);
        let req = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_member_epoch(self.epoch)
            .with_rebalance_timeout_ms(self.rebalance_timeout.as_millis() as i32)
            .with_subscribed_topic_names(Some(
                self.topics
                    .iter()
                    .map(|t| TopicName(StrBytes::from_string(t.clone())))
                    .collect(),
            ))
            .with_server_assignor(self.assignor.clone().map(StrBytes::from_string))
            .with_topic_partitions(Some(owned));
        let r = {
            let conn = self.coordinator(cluster).await?;
            conn.call(req, 0, 1).await
        };
        let resp = match r {
            Ok(r) => r,
            Err(e) => {
                self.coordinator = None;
                self.next = Instant::now() + self.interval;
                return Err(e);
            }
        };
        self.next = Instant::now() + self.interval;
        match resp.error_code {
            0 => {}
            // FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: the session is gone; everything owned
            // is lost and the member joins again as new.
            110 | 25 => {
                let lost: Vec<Tp> = std::mem::take(&mut self.owned).into_iter().collect();
                self.epoch = 0;
                self.next = Instant::now();
                return Ok(Change {
                    assigned: Vec::new(),
                    revoked: lost,
                    lost: true,
                });
            }
            // NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS.
            14..=16 => {
                self.coordinator = None;
                return Ok(Change::default());
            }
            c => {
                return Err(Error::broker(
                    "ConsumerGroupHeartbeat",
                    c,
                    resp.error_message.as_deref(),
                ))
            }
        }
        if let Some(id) = resp.member_id {
            self.member_id = id.to_string();
        }
        self.epoch = resp.member_epoch;
        if resp.heartbeat_interval_ms > 0 {
            self.interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
            self.next = Instant::now() + self.interval;
        }
        let Some(assignment) = resp.assignment else {
            return Ok(Change::default());
        };
        let mut target = BTreeSet::new();
        let mut unknown = false;
        for tp in assignment.topic_partitions {
            match cluster.topic_by_id(tp.topic_id) {
                Some(t) => {
                    for p in tp.partitions {
                        target.insert((t.name.clone(), p));
                    }
                }
                None => unknown = true,
            }
        }
        if unknown {
            // A topic id the metadata doesn't know yet: learn it, and take the assignment at
            // the next heartbeat (which must then carry it again: send it as unacknowledged).
            cluster.refresh(&[]).await?;
            self.next = Instant::now();
        }
        let change = Change {
            assigned: target.difference(&self.owned).cloned().collect(),
            revoked: self.owned.difference(&target).cloned().collect(),
            lost: false,
        };
        self.owned = target;
        // The change is acknowledged by the next heartbeat: make it soon.
        if !change.assigned.is_empty() || !change.revoked.is_empty() {
            self.next = Instant::now();
        }
        Ok(change)
    }

    fn owned_by_id(&self, cluster: &Cluster) -> Vec<TopicPartitions> {
        let mut out: Vec<TopicPartitions> = Vec::new();
        for (t, p) in &self.owned {
            let Some(info) = cluster.topic(t) else {
                continue;
            };
            match out.iter_mut().find(|x| x.topic_id == info.id) {
                Some(x) => x.partitions.push(*p),
                None => out.push(
                    TopicPartitions::default()
                        .with_topic_id(info.id)
                        .with_partitions(vec![*p]),
                ),
            }
        }
        out
    }

    /// The committed offsets of `parts` (`None`: nothing committed yet).
    pub async fn committed(
        &mut self,
        cluster: &mut Cluster,
        parts: &[Tp],
    ) -> Result<Vec<(Tp, Option<i64>)>, Error> {
        let mut topics: Vec<OffsetFetchRequestTopics> = Vec::new();
        for (t, p) in parts {
            match topics.iter_mut().find(|x| x.name.0.as_str() == t) {
                Some(x) => x.partition_indexes.push(*p),
                None => topics.push(
                    OffsetFetchRequestTopics::default()
                        .with_name(TopicName(StrBytes::from_string(t.clone())))
                        .with_partition_indexes(vec![*p]),
                ),
            }
        }
        let deadline = Instant::now() + cluster.config().request_timeout;
        loop {
            let (classic, group, member, epoch) = (
                self.classic.is_some(),
                self.group.clone(),
                self.member_id.clone(),
                self.epoch,
            );
            let r = async {
                let conn = self.coordinator(cluster).await?;
                // v9 carries the KIP-848 member (checked by a consumer group); a classic
                // group's fetch needs none, and brokers before 4.0 speak v8 at most.
                let v = conn.version::<OffsetFetchRequest>(8, if classic { 8 } else { 9 })?;
                let mut g = OffsetFetchRequestGroup::default()
                    .with_group_id(GroupId(StrBytes::from_string(group)))
                    .with_topics(Some(topics.clone()));
                if v >= 9 {
                    g = g
                        .with_member_id(Some(StrBytes::from_string(member)))
                        .with_member_epoch(epoch);
                }
                let req = OffsetFetchRequest::default()
                    .with_groups(vec![g])
                    .with_require_stable(true);
                conn.send(&req, v)?;
                conn.flush().await?;
                conn.recv::<OffsetFetchRequest>(v).await
            }
            .await;
            let resp = match r {
                Ok(r) => r,
                Err(e) => {
                    self.coordinator = None;
                    return Err(e);
                }
            };
            let mut out = Vec::new();
            let mut retry = None;
            for g in resp.groups {
                if g.error_code != 0 {
                    retry = Some(g.error_code);
                    continue;
                }
                for t in g.topics {
                    for p in t.partitions {
                        if p.error_code != 0 {
                            retry = Some(p.error_code);
                        }
                        let off = (p.committed_offset >= 0).then_some(p.committed_offset);
                        out.push(((t.name.0.to_string(), p.partition_index), off));
                    }
                }
            }
            match retry {
                None => return Ok(out),
                Some(c) if retriable_code(c) && Instant::now() < deadline => {
                    if matches!(c, 15 | 16) {
                        self.coordinator = None;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(c) => return Err(Error::broker("OffsetFetch", c, None)),
            }
        }
    }

    /// Commits `offsets` (the next offset to read, per partition) under the member's epoch.
    pub async fn commit(
        &mut self,
        cluster: &mut Cluster,
        offsets: &[(Tp, i64)],
    ) -> Result<(), Error> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
        for ((t, p), o) in offsets {
            let part = OffsetCommitRequestPartition::default()
                .with_partition_index(*p)
                .with_committed_offset(*o)
                .with_committed_leader_epoch(-1);
            match topics.iter_mut().find(|x| x.name.0.as_str() == t) {
                Some(x) => x.partitions.push(part),
                None => topics.push(
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.clone())))
                        .with_partitions(vec![part]),
                ),
            }
        }
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id_or_member_epoch(self.epoch)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_retention_time_ms(-1)
            .with_topics(topics);
        let r = {
            let conn = self.coordinator(cluster).await?;
            conn.call(req, 8, 9).await
        };
        let resp = match r {
            Ok(r) => r,
            Err(e) => {
                self.coordinator = None;
                return Err(e);
            }
        };
        for t in resp.topics {
            for p in t.partitions {
                if p.error_code != 0 {
                    if matches!(p.error_code, 15 | 16) {
                        self.coordinator = None;
                    }
                    if p.error_code == 113 {
                        // STALE_MEMBER_EPOCH: heartbeat now for the current epoch.
                        self.next = Instant::now();
                    }
                    return Err(self.classic_fenced("OffsetCommit", p.error_code));
                }
            }
        }
        Ok(())
    }

    /// Gives `offsets` to the producer's open transaction (after
    /// [`crate::Producer::add_offsets`] for this group): they count as committed when the
    /// transaction commits, and are dropped if it aborts. The member's id and epoch go with
    /// them, so a member the group has fenced (a zombie) cannot commit (KIP-447).
    pub async fn commit_in_transaction(
        &mut self,
        cluster: &mut Cluster,
        txn: &crate::producer::TxnId,
        offsets: &[(Tp, i64)],
    ) -> Result<(), Error> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut topics: Vec<TxnOffsetCommitRequestTopic> = Vec::new();
        for ((t, p), o) in offsets {
            let part = TxnOffsetCommitRequestPartition::default()
                .with_partition_index(*p)
                .with_committed_offset(*o)
                .with_committed_leader_epoch(-1);
            match topics.iter_mut().find(|x| x.name.0.as_str() == t) {
                Some(x) => x.partitions.push(part),
                None => topics.push(
                    TxnOffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.clone())))
                        .with_partitions(vec![part]),
                ),
            }
        }
        let req = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                txn.transactional_id.clone(),
            )))
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_producer_id(ProducerId(txn.producer.0))
            .with_producer_epoch(txn.producer.1)
            .with_generation_id(self.epoch)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_topics(topics);
        let deadline = Instant::now() + cluster.config().request_timeout;
        loop {
            let r = {
                let conn = self.coordinator(cluster).await?;
                conn.call(req.clone(), 3, 4).await
            };
            let resp = match r {
                Ok(r) => r,
                Err(e) => {
                    self.coordinator = None;
                    return Err(e);
                }
            };
            let code = resp
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.error_code)
                .find(|c| *c != 0);
            match code {
                None => return Ok(()),
                // The coordinator moving, or still writing the previous transaction's offsets.
                Some(c) if (retriable_code(c) || c == 51) && Instant::now() < deadline => {
                    if matches!(c, 15 | 16) {
                        self.coordinator = None;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some(c) => {
                    if matches!(c, 22 | 113) {
                        // ILLEGAL_GENERATION: the epoch moved on; heartbeat for the new one.
                        self.next = Instant::now();
                    }
                    return Err(self.classic_fenced("TxnOffsetCommit", c));
                }
            }
        }
    }

    /// The error for a commit refused with `code`: under the classic protocol, a generation
    /// or member the coordinator no longer knows means the group went on without this member
    /// ([`Error::Fenced`]; it joins again as new).
    fn classic_fenced(&mut self, api: &'static str, code: i16) -> Error {
        if self.classic.is_some() && matches!(code, 22 | 25 | 82) {
            self.reset();
            if code == 25 {
                self.member_id.clear();
            }
            return Error::Fenced(format!(
                "{api}: {} (the group moved on without this member)",
                crate::error::code_name(code)
            ));
        }
        Error::broker(api, code, None)
    }

    /// Leaves the group (epoch -1): its partitions go to the others at once instead of after
    /// the session timeout.
    pub async fn leave(&mut self, cluster: &mut Cluster) -> Result<(), Error> {
        if self.classic.is_some() {
            return self.leave_classic(cluster).await;
        }
        if self.epoch <= 0 {
            return Ok(());
        }
        let req = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_member_epoch(-1);
        let conn = self.coordinator(cluster).await?;
        let resp = conn.call(req, 0, 1).await?;
        self.owned.clear();
        self.epoch = 0;
        if resp.error_code != 0 {
            return Err(Error::broker(
                "ConsumerGroupHeartbeat",
                resp.error_code,
                None,
            ));
        }
        Ok(())
    }
}

/// Whether `group`'s coordinator takes KIP-848's protocol: asked with a leave heartbeat of a
/// member that never joined (which changes nothing). A broker without the request, or one
/// that lists it and answers UNSUPPORTED_VERSION (Kafka 3.9 as shipped, a 4.x cluster limited
/// to `classic`), does not.
pub async fn accepts_consumer_protocol(cluster: &mut Cluster, group: &str) -> Result<bool, Error> {
    let addr = cluster.find_coordinator(group).await?;
    let mut conn = cluster.open(&addr).await?;
    let Ok(v) = conn.version::<ConsumerGroupHeartbeatRequest>(0, 1) else {
        return Ok(false);
    };
    let req = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
        .with_member_id(StrBytes::from_string(random_id()))
        .with_member_epoch(-1);
    conn.send(&req, v)?;
    conn.flush().await?;
    let resp = conn.recv::<ConsumerGroupHeartbeatRequest>(v).await?;
    Ok(resp.error_code != 35)
}

/// 22 characters of URL-safe base64 over 128 bits, as Kafka's own member ids look.
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}
