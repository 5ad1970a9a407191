//! The Market Spread on Kafka scenarios of kafka_pipeline.rs (common/kafka_scenarios.rs), every
//! one, on Kafka 4.x limited to the classic group protocol
//! (`group.coordinator.rebalance.protocols=classic`, as many managed clusters are): the
//! members find that out and speak the classic protocol.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use canter_testkit::KafkaCluster;

fn bootstrap() -> String {
    static B: OnceLock<KafkaCluster> = OnceLock::new();
    B.get_or_init(|| KafkaCluster::start_classic_only(1))
        .bootstrap()
        .to_owned()
}

include!("common/kafka_scenarios.rs");

#[test]
fn the_members_speak_the_classic_protocol() {
    let t = Topics::new("ms-classic-only");
    t.create(&bootstrap(), 2, 1);
    let p = KafkaPipeline::start(&bootstrap(), "ms-classic-only", &t.flags());
    p.wait_for(
        "does not take KIP-848's protocol; the group speaks the classic one",
        Duration::from_secs(30),
    );
    p.stop();
}
