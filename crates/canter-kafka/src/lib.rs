//! A Kafka client made for canter's thread-per-core workers: every piece is owned by one
//! worker and driven by its event loop (no threads of its own, no locks, no channel per
//! record), and records are read in place from the fetched bytes.
//!
//! - [`Cluster`]: brokers, topics, leaders; metadata, topic creation, offsets by time.
//! - [`Producer`]: one open batch per partition, a Produce per leader per flush, idempotent
//!   (KIP-98) by default, gzip, lz4 or zstd if asked; [`partition_for`] is Kafka's own
//!   partitioner (murmur2), so keys land where Java producers put them; transactional with a
//!   transactional id (records and consumer offsets committed together, KIP-98 and KIP-447).
//! - [`Fetcher`]: the partitions a worker owns and their positions, one fetch in flight per
//!   leader; [`Fetched::batches`] walks what a fetch returned without copying (with
//!   `read_committed`, aborted transactions left out).
//! - [`Member`]: consumer-group membership by KIP-848 (the broker assigns partitions),
//!   committed offsets under the member's epoch.
//!
//! Request and response messages are encoded by the `kafka-protocol` crate (generated from
//! Kafka's schemas); the record batch format, the connection and everything above are here.
//!
//! `tools/kafka/kafka.sh` starts a real broker (or three) for tests and for your own use.

mod addr;
mod classic;
mod cluster;
mod conn;
mod error;
mod fetch;
mod group;
mod health;
mod producer;
pub mod records;
mod sasl;
mod security;
mod settings;

pub use addr::BrokerAddr;
pub use cluster::{Cluster, Config, OffsetSpec, PartitionInfo, TopicInfo};
pub use conn::Conn;
pub use error::Error;
pub use fetch::{Answer, DataBatches, FetchConfig, Fetched, Fetcher};
pub use group::{accepts_consumer_protocol, Change, Member, Tp};
pub use health::Health;
pub use producer::{
    murmur2, partition_for, Producer, ProducerConfig, ProducerStats, TopicHandle, TxnId,
};
pub use records::Compression;
pub use sasl::SaslError;
pub use security::{Mechanism, Protocol, Secret, Security};
pub use settings::{ClientSettings, GroupProtocol};
