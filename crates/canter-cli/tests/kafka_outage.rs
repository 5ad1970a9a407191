//! A broker that goes away while records flow (a paced `canter send --kafka` into a running
//! pipeline): the pipeline says so at once (a WARN line naming the broker, `/metrics`
//! `canter_kafka_paused 1` and `canter_kafka_brokers_reachable 0`), says when it is back, and
//! loses no result; SIGTERM while the broker is away ends the process within its shutdown
//! timeout, with a line saying what was not committed.

#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::kafka::{check, expected, read_values, KafkaPipeline, Topics};

use canter_testkit::KafkaCluster;

/// The value of the Prometheus line `name` of the pipeline's `/metrics`.
fn metric(p: &KafkaPipeline, name: &str) -> Option<f64> {
    let r = common::fetch(p.metrics_addr(), "GET", "/metrics", "");
    let text = r.text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (up to `limit`) until `/metrics` shows `name` at `want`.
fn wait_metric(p: &KafkaPipeline, name: &str, want: f64, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if metric(p, name) == Some(want) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{name} is {:?}, not {want}, after {limit:?}",
            metric(p, name)
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_outage_under_load_is_seen_at_once_and_sigterm_during_one_is_honoured() {
    let cluster = KafkaCluster::start(1);
    let bootstrap = cluster.bootstrap().to_owned();
    let t = Topics::new("ms-outage");
    t.create(&bootstrap, 2, 1);
    let dir = std::env::temp_dir().join(format!("canter-kafka-outage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let flags = [
        t.flags(),
        vec![
            "--metrics".into(),
            "127.0.0.1:0".into(),
            "--shutdown-timeout".into(),
            "5s".into(),
        ],
    ]
    .concat();
    let p = KafkaPipeline::start(&bootstrap, "ms-outage", &flags);
    let sender = {
        let (dir, t, bootstrap) = (dir.clone(), t.clone(), bootstrap.clone());
        thread::spawn(move || {
            let args = ["--symbols", "200", "--count", "60000", "--rate", "3000"];
            common::kafka::send_market_spread(&bootstrap, &t, &dir, &args)
        })
    };
    // Records flow; then the broker dies.
    p.wait_counter("records_in", 2_000, Duration::from_secs(60));
    assert_eq!(metric(&p, "canter_kafka_paused"), Some(0.0));
    assert_eq!(metric(&p, "canter_kafka_brokers_reachable"), Some(1.0));
    let killed = Instant::now();
    cluster.signal(1, "KILL");
    p.wait_for("kafka: broker unreachable", Duration::from_secs(30));
    let said = killed.elapsed();
    let log = p.log();
    let line = log
        .iter()
        .find(|l| l.contains("kafka: broker unreachable"))
        .unwrap();
    assert!(line.contains(&bootstrap), "the broker is named: {line}");
    assert!(line.contains("WARN"), "{line}");
    let paused_after =
        killed.elapsed() + wait_metric(&p, "canter_kafka_paused", 1.0, Duration::from_secs(30));
    assert_eq!(metric(&p, "canter_kafka_brokers_reachable"), Some(0.0));
    assert!(
        metric(&p, "canter_kafka_broker_errors_total").unwrap() > 0.0,
        "failed requests are counted"
    );
    eprintln!("outage said after {said:?}, paused 1 after {paused_after:?}");
    assert!(said < Duration::from_secs(10), "said after {said:?}");
    // Back: said too, and the pipeline carries on to the last result.
    cluster.restart(1);
    p.wait_for("answers again after", Duration::from_secs(60));
    wait_metric(&p, "canter_kafka_paused", 0.0, Duration::from_secs(60));
    sender.join().unwrap();
    let want = expected(&dir);
    let got = read_values(
        &bootstrap,
        &t.results,
        want.len(),
        Duration::from_secs(2),
        Duration::from_secs(120),
    );
    check(&got, &want);
    // A commit's age and the inputs' lag are in /metrics.
    let r = common::fetch(p.metrics_addr(), "GET", "/metrics", "");
    let text = r.text();
    assert!(
        text.contains("canter_kafka_last_commit_age_seconds "),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "canter_kafka_consumer_lag{{topic=\"{}\",partition=\"0\"}}",
            t.orders
        )),
        "{text}"
    );
    // The broker away again: SIGTERM ends the process within its 5 s shutdown timeout.
    cluster.signal(1, "KILL");
    let mut p = p;
    let n = p.log().len();
    let t0 = Instant::now();
    while !p.log()[n..]
        .iter()
        .any(|l| l.contains("kafka: broker unreachable"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the second outage is not said"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (status, took) = p.signal_and_wait(libc::SIGTERM, Duration::from_secs(60));
    eprintln!("SIGTERM with the broker away: exit {status} after {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let log = p.log();
    assert!(
        log.iter()
            .any(|l| l.contains("kafka: shutdown could not commit") && l.contains("not committed:")),
        "{log:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
