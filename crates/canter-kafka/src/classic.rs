//! The classic consumer-group protocol (Kafka before 4.0, Redpanda, managed services):
//! JoinGroup, then the leader's assignment through SyncGroup, then Heartbeat until the
//! coordinator asks for a new round. Eager: before it joins a new round a member gives up
//! everything it owns (committing it), so no partition ever has two owners. The assignment is
//! made here, by range over each topic (Kafka's `range` assignor): with members sorted by id,
//! member i gets the same slice of partition numbers of every topic with the same partition
//! count — what co-partitioned inputs need.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTp;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, GroupId, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::error::Error;
use crate::group::{Change, Member, Tp};

/// The assignor's name, as Kafka's clients call it.
const RANGE: &str = "range";

impl Member {
    fn session(&self) -> Duration {
        self.classic
            .as_ref()
            .map_or(Duration::from_secs(45), |c| c.session_timeout)
    }

    fn set_rejoin(&mut self, rejoin: bool) {
        if let Some(c) = &mut self.classic {
            c.rejoin = rejoin;
        }
    }

    /// Everything owned given up, as a change: handed over (committed by the caller) unless
    /// `lost` (the group already gave it to others).
    fn give_up_all(&mut self, lost: bool) -> Change {
        Change {
            assigned: Vec::new(),
            revoked: std::mem::take(&mut self.owned).into_iter().collect(),
            lost,
        }
    }

    pub(crate) async fn heartbeat_classic(
        &mut self,
        cluster: &mut Cluster,
    ) -> Result<Change, Error> {
        let rejoin = self.classic.as_ref().is_some_and(|c| c.rejoin);
        if rejoin {
            if !self.owned.is_empty() {
                // Eager: hand everything over before joining; join at the next call.
                self.next = Instant::now();
                return Ok(self.give_up_all(false));
            }
            return self.join(cluster).await;
        }
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id(self.epoch)
            .with_member_id(StrBytes::from_string(self.member_id.clone()));
        let r = {
            let conn = self.coordinator(cluster).await?;
            conn.call(req, 1, 4).await
        };
        self.next = Instant::now() + self.interval;
        let resp = match r {
            Ok(r) => r,
            Err(e) => {
                self.coordinator = None;
                return Err(e);
            }
        };
        match resp.error_code {
            0 => Ok(Change::default()),
            // REBALANCE_IN_PROGRESS: a member came or went; a new round.
            27 => {
                self.set_rejoin(true);
                self.next = Instant::now();
                Ok(Change::default())
            }
            // ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID: the session is gone,
            // and what was owned with it.
            22 | 25 | 82 => {
                if resp.error_code == 25 {
                    self.member_id.clear();
                }
                self.set_rejoin(true);
                self.epoch = 0;
                self.next = Instant::now();
                Ok(self.give_up_all(true))
            }
            14..=16 => {
                self.coordinator = None;
                Ok(Change::default())
            }
            c => Err(Error::broker("Heartbeat", c, None)),
        }
    }

    /// One round: JoinGroup (twice for a new member, which learns its id from the first),
    /// the assignment if this member leads, SyncGroup.
    async fn join(&mut self, cluster: &mut Cluster) -> Result<Change, Error> {
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        cluster.refresh(&names).await?;
        let mut subscription = BytesMut::new();
        subscription.put_i16(0);
        ConsumerProtocolSubscription::default()
            .with_topics(
                self.topics
                    .iter()
                    .map(|t| StrBytes::from_string(t.clone()))
                    .collect(),
            )
            .encode(&mut subscription, 0)
            .map_err(|e| Error::Corrupt(format!("subscription: {e}")))?;
        let subscription = subscription.freeze();
        let session = self.session();
        let rebalance = self.rebalance_timeout;
        let joined = loop {
            let req = JoinGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
                .with_session_timeout_ms(session.as_millis() as i32)
                .with_rebalance_timeout_ms(rebalance.as_millis() as i32)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str(RANGE))
                    .with_metadata(subscription.clone())]);
            // The coordinator answers when every member has joined.
            let resp = self.round_call(cluster, req, (4, 7), |r, _| r).await?;
            match resp.error_code {
                0 => break resp,
                // MEMBER_ID_REQUIRED: join again with the id the coordinator gave.
                79 => self.member_id = resp.member_id.to_string(),
                // UNKNOWN_MEMBER_ID: join as new.
                25 => self.member_id.clear(),
                14..=16 => {
                    self.coordinator = None;
                    self.next = Instant::now() + self.interval;
                    return Err(Error::broker("JoinGroup", resp.error_code, None));
                }
                c => {
                    self.next = Instant::now() + self.interval;
                    return Err(Error::broker("JoinGroup", c, None));
                }
            }
        };
        self.member_id = joined.member_id.to_string();
        let generation = joined.generation_id;
        let assignments = if joined.leader == joined.member_id {
            if joined.protocol_name.as_deref().is_some_and(|p| p != RANGE) {
                return Err(Error::Corrupt(format!(
                    "JoinGroup chose assignor {:?}, not {RANGE}",
                    joined.protocol_name
                )));
            }
            let mut subscribed: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for m in &joined.members {
                let mut meta = m.metadata.clone();
                let topics = decode_subscription(&mut meta)?;
                subscribed.insert(m.member_id.to_string(), topics);
            }
            let all: BTreeSet<&String> = subscribed.values().flatten().collect();
            let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
            cluster.refresh(&names).await?;
            let counts: BTreeMap<String, i32> = all
                .iter()
                .filter_map(|t| {
                    cluster
                        .topic(t)
                        .map(|i| ((*t).clone(), i.partitions.len() as i32))
                })
                .collect();
            let plan = range_assign(&subscribed, &counts);
            let mut out = Vec::new();
            for (member, parts) in plan {
                out.push(
                    SyncGroupRequestAssignment::default()
                        .with_member_id(StrBytes::from_string(member))
                        .with_assignment(encode_assignment(&parts)?),
                );
            }
            out
        } else {
            Vec::new()
        };
        let req = SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_assignments(assignments);
        // v5 names the protocol (earlier versions have no such fields).
        let resp = self
            .round_call(cluster, req, (3, 5), |r, v| match v >= 5 {
                true => r
                    .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
                    .with_protocol_name(Some(StrBytes::from_static_str(RANGE))),
                false => r,
            })
            .await?;
        match resp.error_code {
            0 => {}
            // REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION: another round started meanwhile.
            27 | 22 => {
                self.next = Instant::now();
                return Ok(Change::default());
            }
            25 => {
                self.member_id.clear();
                self.next = Instant::now();
                return Ok(Change::default());
            }
            c => {
                self.next = Instant::now() + self.interval;
                return Err(Error::broker("SyncGroup", c, None));
            }
        }
        let mut bytes = resp.assignment;
        let target = decode_assignment(&mut bytes)?;
        self.epoch = generation;
        self.set_rejoin(false);
        self.interval = (self.session() / 3).min(Duration::from_secs(3));
        self.next = Instant::now() + self.interval;
        let assigned: Vec<Tp> = target.iter().cloned().collect();
        self.owned = target;
        Ok(Change {
            assigned,
            revoked: Vec::new(),
            lost: false,
        })
    }

    /// A request of a rebalance round to the coordinator, at the highest version in `range`
    /// (`fit` completes it for that version), answered within the rebalance timeout beyond the
    /// request timeout; a failure drops the connection and puts the next try an interval away.
    async fn round_call<R: Request>(
        &mut self,
        cluster: &mut Cluster,
        req: R,
        (lo, hi): (i16, i16),
        fit: impl FnOnce(R, i16) -> R,
    ) -> Result<R::Response, Error> {
        let wait = self.rebalance_timeout;
        let r = async {
            let conn = self.coordinator(cluster).await?;
            let v = conn.version::<R>(lo, hi)?;
            conn.send(&fit(req, v), v)?;
            conn.flush().await?;
            conn.recv_within::<R>(v, wait).await
        }
        .await;
        if r.is_err() {
            self.coordinator = None;
            self.next = Instant::now() + self.interval;
        }
        r
    }

    pub(crate) async fn leave_classic(&mut self, cluster: &mut Cluster) -> Result<(), Error> {
        if self.member_id.is_empty() {
            return Ok(());
        }
        let req = LeaveGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(self.group.clone())))
            .with_members(vec![MemberIdentity::default()
                .with_member_id(StrBytes::from_string(self.member_id.clone()))]);
        let conn = self.coordinator(cluster).await?;
        let resp = conn.call(req, 3, 5).await?;
        self.owned.clear();
        self.epoch = 0;
        self.set_rejoin(true);
        let code = resp
            .members
            .iter()
            .map(|m| m.error_code)
            .find(|c| *c != 0)
            .unwrap_or(resp.error_code);
        if code != 0 && code != 25 {
            return Err(Error::broker("LeaveGroup", code, None));
        }
        Ok(())
    }
}

fn decode_subscription(b: &mut Bytes) -> Result<Vec<String>, Error> {
    let bad = |e: String| Error::Corrupt(format!("a member's subscription: {e}"));
    if b.remaining() < 2 {
        return Err(bad("too short".into()));
    }
    // Newer members may write a newer version; its leading fields are the same.
    let v = b.get_i16().clamp(0, 3);
    let s = ConsumerProtocolSubscription::decode(b, v).map_err(|e| bad(e.to_string()))?;
    Ok(s.topics.iter().map(|t| t.to_string()).collect())
}

fn encode_assignment(parts: &BTreeMap<String, Vec<i32>>) -> Result<Bytes, Error> {
    let mut b = BytesMut::new();
    b.put_i16(0);
    ConsumerProtocolAssignment::default()
        .with_assigned_partitions(
            parts
                .iter()
                .map(|(t, ps)| {
                    AssignedTp::default()
                        .with_topic(TopicName(StrBytes::from_string(t.clone())))
                        .with_partitions(ps.clone())
                })
                .collect(),
        )
        .encode(&mut b, 0)
        .map_err(|e| Error::Corrupt(format!("assignment: {e}")))?;
    Ok(b.freeze())
}

fn decode_assignment(b: &mut Bytes) -> Result<BTreeSet<Tp>, Error> {
    // A member given nothing may get an empty assignment.
    if b.remaining() < 2 {
        return Ok(BTreeSet::new());
    }
    let v = b.get_i16().clamp(0, 3);
    let a = ConsumerProtocolAssignment::decode(b, v)
        .map_err(|e| Error::Corrupt(format!("this member's assignment: {e}")))?;
    let mut out = BTreeSet::new();
    for t in a.assigned_partitions {
        for p in t.partitions {
            out.insert((t.topic.0.to_string(), p));
        }
    }
    Ok(out)
}

/// Kafka's range assignor: for each topic, its partitions cut into contiguous ranges over the
/// members subscribed to it, sorted by id, the first `n % m` ranges one longer.
pub(crate) fn range_assign(
    subscribed: &BTreeMap<String, Vec<String>>,
    partitions: &BTreeMap<String, i32>,
) -> BTreeMap<String, BTreeMap<String, Vec<i32>>> {
    let mut plan: BTreeMap<String, BTreeMap<String, Vec<i32>>> = subscribed
        .keys()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for (topic, &n) in partitions {
        let members: Vec<&String> = subscribed
            .iter()
            .filter(|(_, ts)| ts.contains(topic))
            .map(|(m, _)| m)
            .collect();
        if members.is_empty() {
            continue;
        }
        let m = members.len() as i32;
        let (per, extra) = (n / m, n % m);
        for (i, member) in members.iter().enumerate() {
            let i = i as i32;
            let start = i * per + i.min(extra);
            let len = per + i32::from(i < extra);
            if len > 0 {
                if let Some(mine) = plan.get_mut(*member) {
                    mine.insert(topic.clone(), (start..start + len).collect());
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn range_gives_each_member_the_same_partitions_of_every_topic() {
        let subs: BTreeMap<String, Vec<String>> = ["b", "a", "c"]
            .iter()
            .map(|m| (m.to_string(), vec!["nbbo".into(), "orders".into()]))
            .collect();
        let counts: BTreeMap<String, i32> =
            [("nbbo".to_string(), 8), ("orders".to_string(), 8)].into();
        let plan = range_assign(&subs, &counts);
        assert_eq!(plan["a"]["nbbo"], vec![0, 1, 2]);
        assert_eq!(plan["b"]["nbbo"], vec![3, 4, 5]);
        assert_eq!(plan["c"]["nbbo"], vec![6, 7]);
        for m in ["a", "b", "c"] {
            assert_eq!(plan[m]["nbbo"], plan[m]["orders"], "co-partitioned");
        }
        // More members than partitions: the last ones get nothing.
        let counts: BTreeMap<String, i32> = [("nbbo".to_string(), 2)].into();
        let plan = range_assign(&subs, &counts);
        assert_eq!(plan["a"]["nbbo"], vec![0]);
        assert_eq!(plan["b"]["nbbo"], vec![1]);
        assert!(plan["c"].is_empty());
    }

    #[test]
    fn assignments_round_trip_and_an_empty_one_is_nothing() {
        let mut parts = BTreeMap::new();
        parts.insert("t".to_string(), vec![1, 3]);
        let mut b = encode_assignment(&parts).unwrap();
        let got = decode_assignment(&mut b).unwrap();
        assert_eq!(
            got,
            [("t".to_string(), 1), ("t".to_string(), 3)]
                .into_iter()
                .collect()
        );
        assert!(decode_assignment(&mut Bytes::new()).unwrap().is_empty());
        assert!(decode_subscription(&mut Bytes::from_static(b"\x00")).is_err());
    }
}
