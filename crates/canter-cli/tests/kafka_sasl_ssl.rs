//! The Market Spread on Kafka scenarios of kafka_pipeline.rs (common/kafka_scenarios.rs), every
//! one, over a SASL_SSL listener with SCRAM-SHA-512 (a broker started by this binary with
//! tools/kafka/kafka.sh --secure): the CLI's processes get the settings by --kafka-config, the
//! tests' own clients by the same librdkafka names.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use canter_testkit::KafkaCluster;

fn bootstrap() -> String {
    static B: OnceLock<(KafkaCluster, String)> = OnceLock::new();
    let (_, addr) = B.get_or_init(|| {
        let cluster = KafkaCluster::start_secure(None);
        let s = cluster.secured().unwrap();
        let ca = s.pki.ca().display().to_string();
        common::kafka::register_settings(
            &s.sasl_ssl,
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "alice"),
                ("sasl.password", "alice-secret"),
                ("ssl.ca.location", &ca),
            ],
        );
        let addr = s.sasl_ssl.clone();
        (cluster, addr)
    });
    addr.clone()
}

include!("common/kafka_scenarios.rs");
