//! What the client knows of the cluster (brokers, topics, partitions, leaders) and the
//! requests that are not a producer's or a consumer's: metadata, topic creation, offsets by
//! time. One `Cluster` per worker: nothing here is shared between threads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, FindCoordinatorRequest, ListOffsetsRequest, MetadataRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::addr::BrokerAddr;
use crate::conn::Conn;
use crate::error::Error;
use crate::security::{Security, Transport};

/// How to reach a cluster.
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port` of one or more brokers, comma-separated.
    pub bootstrap: String,
    /// The client id brokers log.
    pub client_id: String,
    /// How long a connection may take.
    pub connect_timeout: Duration,
    /// How long a request may wait for its answer (a fetch adds its own wait).
    pub request_timeout: Duration,
    /// How long [`Cluster::connect`] tries the bootstrap brokers before it gives up.
    pub bootstrap_timeout: Duration,
    /// TLS and SASL.
    pub security: Security,
    /// Where connections report brokers that stop or start answering; clusters made from
    /// clones of one `Config` share it.
    pub health: Arc<crate::health::Health>,
}

impl Config {
    /// Defaults for `bootstrap`: 5 s connects, 30 s requests, 30 s to find a broker at start.
    pub fn new(bootstrap: impl Into<String>) -> Config {
        Config {
            bootstrap: bootstrap.into(),
            client_id: "canter".into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            bootstrap_timeout: Duration::from_secs(30),
            security: Security::default(),
            health: Arc::default(),
        }
    }
}

/// A partition's leader as the last metadata said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The broker that leads it (-1: none right now).
    pub leader: i32,
    /// The leader's epoch.
    pub leader_epoch: i32,
}

/// A topic as the last metadata said.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    /// Its name.
    pub name: String,
    /// Its id (the consumer-group protocol names topics by id).
    pub id: uuid::Uuid,
    /// Its partitions, by index.
    pub partitions: Vec<PartitionInfo>,
}

/// Offsets [`Cluster::list_offsets`] can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first offset still in the log.
    Earliest,
    /// The offset the next record will get.
    Latest,
    /// The last stable offset: where `read_committed` reading stops (before the first record
    /// of a transaction still open).
    LastStable,
}

/// Brokers, topics and a control connection.
pub struct Cluster {
    config: Config,
    bootstrap: Vec<BrokerAddr>,
    transport: Arc<Transport>,
    brokers: HashMap<i32, BrokerAddr>,
    topics: HashMap<String, TopicInfo>,
    control: Option<Conn>,
}

impl Cluster {
    /// Connects to the first bootstrap broker that answers, retrying the list with backoff
    /// until `bootstrap_timeout`; then an [`Error::Unreachable`] names what was tried. Settings
    /// that cannot work (an address without a port, a certificate file that does not load), a
    /// TLS verdict and a refused authentication fail at once: trying again would not change
    /// them.
    pub async fn connect(config: Config) -> Result<Cluster, Error> {
        let bootstrap = BrokerAddr::parse_list(&config.bootstrap)?;
        let transport = config.security.build(config.health.clone())?;
        let mut cluster = Cluster {
            config,
            bootstrap,
            transport,
            brokers: HashMap::new(),
            topics: HashMap::new(),
            control: None,
        };
        let deadline = tokio::time::Instant::now() + cluster.config.bootstrap_timeout;
        let mut backoff = Duration::from_millis(100);
        loop {
            let last = match cluster.bootstrap_once().await {
                Ok(conn) => {
                    cluster.control = Some(conn);
                    cluster.refresh(&[]).await?;
                    return Ok(cluster);
                }
                Err(e) if !e.is_retriable() => return Err(e),
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(Error::Unreachable(format!(
                    "{} for {:?}: {last}",
                    cluster.config.bootstrap, cluster.config.bootstrap_timeout
                )));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// A cluster view that has never connected (no broker, no topic), for unit tests of what
    /// is built on it.
    #[cfg(test)]
    pub(crate) fn offline(config: Config) -> Result<Cluster, Error> {
        Ok(Cluster {
            bootstrap: BrokerAddr::parse_list(&config.bootstrap)?,
            transport: config.security.build(config.health.clone())?,
            config,
            brokers: HashMap::new(),
            topics: HashMap::new(),
            control: None,
        })
    }

    async fn bootstrap_once(&self) -> Result<Conn, Error> {
        let mut last = Error::Unreachable(self.config.bootstrap.clone());
        for addr in &self.bootstrap {
            match self.open(addr).await {
                Ok(c) => return Ok(c),
                Err(e) if !e.is_retriable() => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens a new connection to `addr` (each producer, fetcher and group member keeps its
    /// own, so a fetch waiting at the broker holds up nothing else).
    pub async fn open(&self, addr: &BrokerAddr) -> Result<Conn, Error> {
        let mut c = match Conn::connect(
            addr,
            &self.transport,
            &self.config.client_id,
            self.config.connect_timeout,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                self.transport.health.failure(addr, &e);
                return Err(e);
            }
        };
        c.set_timeout(self.config.request_timeout);
        Ok(c)
    }

    /// A broker's address.
    pub fn broker(&self, id: i32) -> Option<BrokerAddr> {
        self.brokers.get(&id).cloned()
    }

    /// How many brokers the last metadata listed.
    pub fn broker_count(&self) -> usize {
        self.brokers.len()
    }

    /// A topic, if the last metadata had it.
    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.get(name)
    }

    /// A topic's name by id.
    pub fn topic_by_id(&self, id: uuid::Uuid) -> Option<&TopicInfo> {
        self.topics.values().find(|t| t.id == id)
    }

    async fn control(&mut self) -> Result<&mut Conn, Error> {
        if self.control.is_none() {
            let any = self.brokers.values().cloned().collect::<Vec<_>>();
            let mut last = Error::Unreachable(self.config.bootstrap.clone());
            for addr in &any {
                match self.open(addr).await {
                    Ok(c) => {
                        self.control = Some(c);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            if self.control.is_none() {
                self.control = Some(self.bootstrap_once().await.map_err(|_| last)?);
            }
        }
        self.control
            .as_mut()
            .ok_or(Error::Unreachable(String::new()))
    }

    /// Runs `f` on the control connection; a connection that fails is dropped, so the next
    /// call opens another (to any broker).
    async fn on_control<T>(
        &mut self,
        f: impl AsyncFnOnce(&mut Conn) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let conn = self.control().await?;
        let r = f(conn).await;
        if matches!(r, Err(Error::Io(_) | Error::Timeout(_) | Error::Corrupt(_))) {
            self.control = None;
        }
        r
    }

    /// Sends `req` to any broker (the control connection; a broker that fails is dropped for
    /// the next one).
    pub async fn call_any<R: kafka_protocol::protocol::Request>(
        &mut self,
        req: R,
        lo: i16,
        hi: i16,
    ) -> Result<R::Response, Error> {
        self.on_control(async |c| c.call(req, lo, hi).await).await
    }

    /// The address of `group`'s coordinator, retrying while it moves or loads (up to the
    /// request timeout).
    pub async fn find_coordinator(&mut self, group: &str) -> Result<BrokerAddr, Error> {
        self.find_coordinator_of(0, group).await
    }

    /// The address of the transaction coordinator of `transactional_id`.
    pub async fn find_transaction_coordinator(
        &mut self,
        transactional_id: &str,
    ) -> Result<BrokerAddr, Error> {
        self.find_coordinator_of(1, transactional_id).await
    }

    /// A coordinator by key type (0: group, 1: transaction), retrying while it moves or loads.
    async fn find_coordinator_of(&mut self, key_type: i8, key: &str) -> Result<BrokerAddr, Error> {
        let deadline = tokio::time::Instant::now() + self.config.request_timeout;
        let mut last;
        loop {
            let req = FindCoordinatorRequest::default()
                .with_key_type(key_type)
                .with_coordinator_keys(vec![StrBytes::from_string(key.to_owned())]);
            match self.call_any(req, 4, 6).await {
                Ok(resp) => match resp.coordinators.into_iter().next() {
                    Some(c) if c.error_code == 0 => {
                        if let Some(a) = self.broker(c.node_id.0).or_else(|| {
                            u16::try_from(c.port).ok().map(|port| BrokerAddr {
                                host: c.host.to_string(),
                                port,
                            })
                        }) {
                            return Ok(a);
                        }
                        last = Error::broker("FindCoordinator", 15, None);
                    }
                    Some(c) => {
                        last = Error::broker(
                            "FindCoordinator",
                            c.error_code,
                            c.error_message.as_deref(),
                        );
                        if !last.is_retriable() {
                            return Err(last);
                        }
                    }
                    None => last = Error::Corrupt("FindCoordinator: no answer for the key".into()),
                },
                Err(e) if e.is_retriable() => last = e,
                Err(e) => return Err(e),
            }
            if tokio::time::Instant::now() > deadline {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = self.refresh(&[]).await;
        }
    }

    /// Asks for the brokers and for `topics` (all of the cluster's topics if empty) and
    /// replaces what was known of them.
    pub async fn refresh(&mut self, topics: &[&str]) -> Result<(), Error> {
        let req = MetadataRequest::default().with_topics(if topics.is_empty() {
            None
        } else {
            Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string((*t).to_owned()))))
                    })
                    .collect(),
            )
        });
        let resp = self.on_control(async |c| c.call(req, 12, 12).await).await?;
        self.brokers = resp
            .brokers
            .iter()
            .filter_map(|b| {
                let port = u16::try_from(b.port).ok()?;
                Some((
                    b.node_id.0,
                    BrokerAddr {
                        host: b.host.to_string(),
                        port,
                    },
                ))
            })
            .collect();
        self.config.health.set_known(self.brokers.len());
        for t in resp.topics {
            let Some(name) = t.name else { continue };
            let name = name.0.to_string();
            if t.error_code != 0 {
                self.topics.remove(&name);
                continue;
            }
            let mut parts = vec![
                PartitionInfo {
                    leader: -1,
                    leader_epoch: -1
                };
                t.partitions.len()
            ];
            for p in &t.partitions {
                if let Some(slot) = usize::try_from(p.partition_index)
                    .ok()
                    .and_then(|i| parts.get_mut(i))
                {
                    *slot = PartitionInfo {
                        leader: if p.error_code == 0 { p.leader_id.0 } else { -1 },
                        leader_epoch: p.leader_epoch,
                    };
                }
            }
            self.topics.insert(
                name.clone(),
                TopicInfo {
                    name,
                    id: t.topic_id,
                    partitions: parts,
                },
            );
        }
        Ok(())
    }

    /// Creates a topic (an existing one is fine). `configs` are topic settings such as
    /// `("cleanup.policy", "compact")`.
    pub async fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        replication: i16,
        configs: &[(&str, &str)],
    ) -> Result<(), Error> {
        let topic = CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_owned())))
            .with_num_partitions(partitions)
            .with_replication_factor(replication)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string((*k).to_owned()))
                            .with_value(Some(StrBytes::from_string((*v).to_owned())))
                    })
                    .collect(),
            );
        let req = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(30_000);
        let resp = self.on_control(async |c| c.call(req, 5, 7).await).await?;
        for t in resp.topics {
            // 36: TOPIC_ALREADY_EXISTS
            if t.error_code != 0 && t.error_code != 36 {
                return Err(Error::broker(
                    "CreateTopics",
                    t.error_code,
                    t.error_message.as_deref(),
                ));
            }
        }
        // The new topic's leaders take a moment to be known everywhere.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            self.refresh(&[name]).await?;
            if let Some(t) = self.topics.get(name) {
                if t.partitions.iter().all(|p| p.leader >= 0) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Timeout("topic creation"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets a consumer group's own settings (KIP-848's group configs, such as
    /// `consumer.session.timeout.ms`), within the bounds the brokers allow.
    pub async fn set_group_config(
        &mut self,
        group: &str,
        configs: &[(&str, &str)],
    ) -> Result<(), Error> {
        use kafka_protocol::messages::incremental_alter_configs_request::{
            AlterConfigsResource, AlterableConfig,
        };
        use kafka_protocol::messages::IncrementalAlterConfigsRequest;
        let resource = AlterConfigsResource::default()
            // ConfigResource.Type.GROUP
            .with_resource_type(32)
            .with_resource_name(StrBytes::from_string(group.to_owned()))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        AlterableConfig::default()
                            .with_name(StrBytes::from_string((*k).to_owned()))
                            .with_config_operation(0)
                            .with_value(Some(StrBytes::from_string((*v).to_owned())))
                    })
                    .collect(),
            );
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![resource]);
        let resp = self.call_any(req, 0, 1).await?;
        for r in resp.responses {
            if r.error_code != 0 {
                return Err(Error::broker(
                    "IncrementalAlterConfigs",
                    r.error_code,
                    r.error_message.as_deref(),
                ));
            }
        }
        Ok(())
    }

    /// The earliest or latest offset of each partition of `topic` in `partitions`, retrying
    /// while leaders move (up to the request timeout).
    pub async fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        spec: OffsetSpec,
    ) -> Result<Vec<(i32, i64)>, Error> {
        let deadline = tokio::time::Instant::now() + self.config.request_timeout;
        loop {
            match self.list_offsets_once(topic, partitions, spec).await {
                Err(e) if e.is_retriable() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let _ = self.refresh(&[topic]).await;
                }
                r => return r,
            }
        }
    }

    async fn list_offsets_once(
        &mut self,
        topic: &str,
        partitions: &[i32],
        spec: OffsetSpec,
    ) -> Result<Vec<(i32, i64)>, Error> {
        let info = self
            .topics
            .get(topic)
            .ok_or_else(|| Error::UnknownTopic(topic.to_owned()))?
            .clone();
        let mut by_leader: HashMap<i32, Vec<i32>> = HashMap::new();
        for &p in partitions {
            let leader = usize::try_from(p)
                .ok()
                .and_then(|i| info.partitions.get(i))
                .map_or(-1, |p| p.leader);
            by_leader.entry(leader).or_default().push(p);
        }
        let ts = match spec {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest | OffsetSpec::LastStable => -1,
        };
        let mut out = Vec::new();
        for (leader, parts) in by_leader {
            let addr = self
                .broker(leader)
                .ok_or(Error::broker("ListOffsets", 5, None))?;
            let mut conn = self.open(&addr).await?;
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_isolation_level(i8::from(spec == OffsetSpec::LastStable))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partitions(
                        parts
                            .iter()
                            .map(|&p| {
                                ListOffsetsPartition::default()
                                    .with_partition_index(p)
                                    .with_current_leader_epoch(-1)
                                    .with_timestamp(ts)
                            })
                            .collect(),
                    )]);
            let resp = conn.call(req, 6, 9).await?;
            for t in resp.topics {
                for p in t.partitions {
                    if p.error_code != 0 {
                        return Err(Error::broker("ListOffsets", p.error_code, None));
                    }
                    out.push((p.partition_index, p.offset));
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }
}
