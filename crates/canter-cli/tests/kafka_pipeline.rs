//! `canter pipeline market-spread --kafka` against a real Kafka broker (tools/kafka/kafka.sh,
//! one for this test binary) on its plaintext listener: results compared with the independent
//! reference record by record; two processes sharing a group, one killed with SIGKILL
//! mid-stream; state restored from the changelog after a restart; bad records counted and
//! skipped; exactly once under kills, freezes and deaths inside commits. The scenarios are in
//! common/kafka_scenarios.rs; kafka_sasl_ssl.rs runs them over SASL_SSL.

#![allow(clippy::unwrap_used)]

mod common;

use canter_testkit::KafkaCluster;

fn bootstrap() -> String {
    KafkaCluster::shared().bootstrap().to_owned()
}

include!("common/kafka_scenarios.rs");

#[test]
fn an_unreachable_broker_at_start_is_a_clear_error_after_the_bootstrap_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let (ok, err, took) = run_pipeline(&[
        "--kafka",
        &addr,
        "--group",
        "g",
        "--bootstrap-timeout",
        "2s",
    ]);
    assert!(!ok);
    assert!(
        err.contains("no broker reachable") && err.contains(&addr),
        "{err}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn an_address_without_a_port_is_refused_at_once_and_send_says_it_is_send() {
    let (ok, err, took) = run_pipeline(&["--kafka", "kafka.example.com", "--group", "g"]);
    assert!(!ok);
    assert!(err.contains("\"kafka.example.com\": no port"), "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // `canter send --kafka`: its own bootstrap timeout, its own prefix, the same settings.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread", "--count", "10", "--kafka"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--bootstrap-timeout", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("canter: send market-spread --kafka: kafka: no broker reachable"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread", "--count", "10", "--kafka", "x:1"])
        .args(["--kafka-config", "sasl.jaas.config=x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown setting \"sasl.jaas.config\""),
        "{err}"
    );
}
