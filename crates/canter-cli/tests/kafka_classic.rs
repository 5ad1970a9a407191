//! The Market Spread on Kafka scenarios of kafka_pipeline.rs (common/kafka_scenarios.rs), every
//! one, on Apache Kafka 3.9.1 as shipped (its jars from Maven Central): a broker whose group
//! coordinator refuses KIP-848's protocol, so the pipeline's members speak the classic one
//! (JoinGroup, SyncGroup, Heartbeat, this client's range assignment), found by asking, not
//! configured.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use canter_testkit::KafkaCluster;

fn bootstrap() -> String {
    static B: OnceLock<KafkaCluster> = OnceLock::new();
    B.get_or_init(|| KafkaCluster::start_release(1, "3.9.1"))
        .bootstrap()
        .to_owned()
}

include!("common/kafka_scenarios.rs");

#[test]
fn the_protocol_is_found_by_asking_and_a_forced_one_the_broker_refuses_is_said_at_start() {
    let t = Topics::new("ms-proto");
    t.create(&bootstrap(), 2, 1);
    let p = KafkaPipeline::start(&bootstrap(), "ms-proto", &t.flags());
    p.wait_for(
        "does not take KIP-848's protocol; the group speaks the classic one",
        Duration::from_secs(30),
    );
    p.stop();
    let b = bootstrap();
    let mut args = vec!["--kafka", b.as_str(), "--group", "ms-proto"];
    let flags = t.flags();
    args.extend(flags.iter().map(String::as_str));
    args.extend(["--kafka-config", "group.protocol=consumer"]);
    let (ok, err, took) = run_pipeline(&args);
    assert!(!ok);
    assert!(
        err.contains("group.protocol=consumer") && err.contains("UNSUPPORTED_VERSION"),
        "{err}"
    );
    assert!(!err.contains("pipeline stopped"), "{err}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}
