//! Market Spread on a three-broker Kafka cluster (replication factor 3) while a broker dies
//! and comes back: the pipeline carries on (leaders move, the coordinator moves, requests are
//! retried) and every result arrives. On Kafka 4.x (KIP-848's group protocol), over its
//! plaintext and its SASL_SSL listeners, and on 3.9.1 (the classic protocol).

#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::Duration;

mod common;
use common::kafka::{
    check, counter, expected, read_values, send_market_spread, KafkaPipeline, Topics,
};

use canter_testkit::KafkaCluster;

/// One cluster of three JVMs at a time: two would crowd a small machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_broker_killed_and_restarted_mid_stream_loses_no_result() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    broker_restart(&KafkaCluster::start(3));
}

#[test]
fn a_broker_killed_and_restarted_under_classic_group_members_loses_no_result() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    broker_restart(&KafkaCluster::start_release(3, "3.9.1"));
}

#[test]
fn a_broker_killed_and_restarted_under_a_sasl_ssl_pipeline_loses_no_result() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = KafkaCluster::start_secure_nodes(3, None);
    let s = cluster.secured().unwrap();
    let ca = s.pki.ca().display().to_string();
    common::kafka::register_settings(
        &s.sasl_ssl,
        &[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "bob"),
            ("sasl.password", "bob-secret"),
            ("ssl.ca.location", &ca),
        ],
    );
    broker_restart_at(&cluster, &s.sasl_ssl.clone());
}

/// A pipeline started on empty topics whose partitions have their leaders on different
/// brokers, then the input: every symbol's first quote is acknowledged before any order is
/// sent, so no order may be processed before its symbol's quote, though the orders' broker may
/// answer before the quotes' broker has said it has them. Several rounds, each on new topics
/// with a new pipeline: the window is the first moments of a stream.
#[test]
fn orders_on_another_broker_than_their_quotes_wait_for_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = KafkaCluster::start(3);
    let bootstrap = cluster.bootstrap();
    for round in 0..6 {
        // Replication 1: the leaders of partition p of the two inputs are wherever the
        // brokers put them, on different brokers for most p.
        let t = Topics::new(&format!("race-{round}"));
        t.create(bootstrap, 4, 1);
        let dir =
            std::env::temp_dir().join(format!("canter-kafka-race-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = format!("race-{round}");
        let p = KafkaPipeline::start(bootstrap, &group, &t.flags());
        let t0 = std::time::Instant::now();
        while p
            .log()
            .iter()
            .filter(|l| l.contains("task started"))
            .count()
            < 4
        {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "four tasks not started"
            );
            thread::sleep(Duration::from_millis(20));
        }
        send_market_spread(
            bootstrap,
            &t,
            &dir,
            &["--symbols", "500", "--count", "20000"],
        );
        let want = expected(&dir);
        let got = read_values(
            bootstrap,
            &t.results,
            want.len(),
            Duration::from_secs(2),
            Duration::from_secs(60),
        );
        p.stop();
        check(&got, &want);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn broker_restart(cluster: &KafkaCluster) {
    broker_restart_at(cluster, cluster.bootstrap());
}

/// The scenario on `bootstrap`, one of the cluster's listeners (its settings registered).
fn broker_restart_at(cluster: &KafkaCluster, bootstrap: &str) {
    let bootstrap = bootstrap.to_owned();
    let t = Topics::new("ms-failover");
    t.create(&bootstrap, 4, 3);
    let dir = std::env::temp_dir().join(format!("canter-kafka-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let p = KafkaPipeline::start(&bootstrap, "ms-failover", &t.flags());
    p.wait_for("task started", Duration::from_secs(30));
    let sender = {
        let (dir, t, bootstrap) = (dir.clone(), t.clone(), bootstrap.clone());
        thread::spawn(move || {
            send_market_spread(
                &bootstrap,
                &t,
                &dir,
                &["--symbols", "500", "--count", "120000", "--rate", "30000"],
            )
        })
    };
    // Once results flow, broker 1 dies; two seconds later it is back.
    let first = read_values(
        &bootstrap,
        &t.results,
        200,
        Duration::ZERO,
        Duration::from_secs(60),
    );
    assert!(
        first.len() >= 200,
        "results before the kill: {}",
        first.len()
    );
    cluster.signal(1, "KILL");
    thread::sleep(Duration::from_millis(2_000));
    cluster.restart(1);
    sender.join().unwrap();
    let want = expected(&dir);
    let got = read_values(
        &bootstrap,
        &t.results,
        want.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    );
    let counters = p.stop();
    let repeated = check(&got, &want);
    eprintln!(
        "broker 1 killed and restarted: {} results, {repeated} repeated, {} broker errors retried",
        want.len(),
        counter(&counters, "broker_errors")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
