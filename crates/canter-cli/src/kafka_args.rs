//! The Kafka client settings every Kafka command takes, by librdkafka's names.

use std::path::PathBuf;

use canter_kafka::{ClientSettings, Error};

/// The Kafka client settings every Kafka command takes, by librdkafka's names.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KafkaConfigArgs {
    /// A Kafka client setting by librdkafka's name (repeatable), as confluent-kafka takes it:
    /// `security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`, `sasl.username=…`,
    /// `ssl.ca.location=ca.pem`, `linger.ms=10`, … Wins over --kafka-config-file and over
    /// this command's own flags for the same thing.
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", requires = "kafka")]
    pub pairs: Vec<String>,
    /// A properties file of such settings (`key=value` lines, `#` comments), e.g. the
    /// client.properties a managed cluster's console gives.
    #[arg(long = "kafka-config-file", value_name = "FILE", requires = "kafka")]
    pub file: Option<PathBuf>,
}

impl KafkaConfigArgs {
    /// The settings: the file's, then the pairs'.
    pub fn settings(&self) -> Result<ClientSettings, Error> {
        let mut s = ClientSettings::new();
        if let Some(f) = &self.file {
            s.load_file(f)?;
        }
        for p in &self.pairs {
            s.set_pair(p)?;
        }
        Ok(s)
    }
}
