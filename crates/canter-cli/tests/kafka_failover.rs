//! Market Spread on a three-broker Kafka cluster (replication factor 3) while a broker dies
//! and comes back: the pipeline carries on (leaders move, the coordinator moves, requests are
//! retried) and every result arrives.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::thread;
use std::time::Duration;

mod common;
use common::kafka::{counter, normalized, read_values, KafkaPipeline, Topics};
use common::market_spread::{reference, unframe};

use canter_testkit::KafkaCluster;

#[test]
fn a_broker_killed_and_restarted_mid_stream_loses_no_result() {
    let cluster = KafkaCluster::start(3);
    let bootstrap = cluster.bootstrap().to_owned();
    let t = Topics::new("ms-failover");
    t.create(&bootstrap, 4, 3);
    let dir = std::env::temp_dir().join(format!("canter-kafka-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let p = KafkaPipeline::start(&bootstrap, "ms-failover", &t.flags());
    p.wait_for("task started", Duration::from_secs(30));
    let sender = {
        let (dir, t, bootstrap) = (dir.clone(), t.clone(), bootstrap.clone());
        thread::spawn(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_canter"))
                .args([
                    "send",
                    "market-spread",
                    "--symbols",
                    "500",
                    "--count",
                    "120000",
                ])
                .args(["--rate", "30000", "--write-dir", dir.to_str().unwrap()])
                .args(["--kafka", &bootstrap])
                .args(t.flags())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
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
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    let mut want: Vec<Vec<u8>> = unframe(&reference(&nbbo, &orders))
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    want.sort();
    let got = read_values(
        &bootstrap,
        &t.results,
        want.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    );
    let counters = p.stop();
    let got = normalized(&got);
    let mut distinct = got.clone();
    distinct.dedup();
    let missing = want
        .iter()
        .filter(|w| distinct.binary_search(w).is_err())
        .count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} results missing ({counters:?})",
        want.len()
    );
    assert!(
        distinct.iter().all(|g| want.binary_search(g).is_ok()),
        "results not in the reference"
    );
    eprintln!(
        "broker 1 killed and restarted: {} results, {} repeated, {} broker errors retried",
        want.len(),
        got.len() - distinct.len(),
        counter(&counters, "broker_errors")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
