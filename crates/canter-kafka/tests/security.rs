//! The client against a real broker's secured listeners (tools/kafka/kafka.sh --secure, one
//! per test binary): SASL_SSL with PLAIN and SCRAM-SHA-256/512, SSL requiring a client
//! certificate, SASL_PLAINTEXT; and the errors a wrong setting gives, at once and by name.

#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use canter_kafka::{
    ClientSettings, Cluster, Error, FetchConfig, Fetcher, Producer, ProducerConfig,
};
use canter_testkit::{KafkaCluster, Pki, Secured};

/// SASL sessions of this broker last 4 s, so a test can watch a connection renew its own.
const REAUTH_MS: u64 = 4000;

fn broker() -> &'static KafkaCluster {
    static B: OnceLock<KafkaCluster> = OnceLock::new();
    B.get_or_init(|| KafkaCluster::start_secure(Some(REAUTH_MS)))
}

fn secured() -> &'static Secured {
    broker().secured().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn settings(pairs: &[(&str, &str)]) -> ClientSettings {
    let mut s = ClientSettings::new();
    for (k, v) in pairs {
        s.set(k, v).unwrap();
    }
    s
}

fn sasl_ssl(mechanism: &str, user: &str, password: &str) -> ClientSettings {
    let ca = secured().pki.ca().display().to_string();
    settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", mechanism),
        ("sasl.username", user),
        ("sasl.password", password),
        ("ssl.ca.location", &ca),
    ])
}

fn mtls() -> ClientSettings {
    let s = secured();
    settings(&[
        ("security.protocol", "SSL"),
        ("ssl.ca.location", &s.pki.ca().display().to_string()),
        (
            "ssl.certificate.location",
            &s.client.cert.display().to_string(),
        ),
        ("ssl.key.location", &s.client.key.display().to_string()),
    ])
}

async fn connect(bootstrap: &str, s: &ClientSettings) -> Result<Cluster, Error> {
    let mut c = s.cluster_config(bootstrap);
    c.bootstrap_timeout = Duration::from_secs(60);
    Cluster::connect(c).await
}

/// Creates `topic`, produces `n` records through a cluster connected with `s`, reads them
/// back through another; returns what was read.
async fn round_trip(bootstrap: &str, s: &ClientSettings, topic: &str, n: usize) -> usize {
    let mut c = connect(bootstrap, s).await.unwrap();
    c.create_topic(topic, 2, 1, &[]).await.unwrap();
    let mut p = Producer::new(c, ProducerConfig::default()).await.unwrap();
    let (t, parts) = p.topic(topic).await.unwrap();
    for i in 0..n {
        let v = format!("record {i}");
        p.send(
            t,
            (i % parts as usize) as i32,
            None,
            v.as_bytes(),
            1_700_000_000_000,
        )
        .unwrap();
    }
    assert_eq!(p.flush().await.unwrap(), n as u64);
    let c = connect(bootstrap, s).await.unwrap();
    let mut f = Fetcher::new(c, FetchConfig::default());
    for part in 0..parts {
        f.assign(topic, part, None).await.unwrap();
    }
    let (mut got, mut scratch) = (0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < n && Instant::now() < deadline {
        for batch in f.fetch().await.unwrap() {
            batch.for_each(&mut scratch, |_| got += 1).unwrap();
        }
    }
    got
}

#[test]
fn records_go_round_over_sasl_ssl_with_every_mechanism() {
    rt().block_on(async {
        for (i, (mech, user, password)) in [
            ("PLAIN", "alice", "alice-secret"),
            ("SCRAM-SHA-256", "alice", "alice-secret"),
            ("SCRAM-SHA-512", "bob", "bob-secret"),
        ]
        .into_iter()
        .enumerate()
        {
            let s = sasl_ssl(mech, user, password);
            let got = round_trip(&secured().sasl_ssl, &s, &format!("sasl-ssl-{i}"), 500).await;
            assert_eq!(got, 500, "{mech}");
        }
    });
}

#[test]
fn records_go_round_over_sasl_plaintext_and_over_mutual_tls() {
    rt().block_on(async {
        let s = settings(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "bob"),
            ("sasl.password", "bob-secret"),
        ]);
        assert_eq!(
            round_trip(&secured().sasl_plaintext, &s, "sasl-plain", 300).await,
            300
        );
        // The SSL listener's certificate names the address 127.0.0.1: verified as an IP.
        assert_eq!(round_trip(&secured().ssl, &mtls(), "mtls", 300).await, 300);
    });
}

/// Asserts `r` failed with an error of the kind `kind` whose text holds `words`, within
/// `limit` of `started`: settings errors are said at once, never after a bootstrap timeout.
fn refused(r: Result<Cluster, Error>, started: Instant, kind: &str, words: &[&str]) {
    let elapsed = started.elapsed();
    let e = match r {
        Ok(_) => panic!("connected, where {kind} was due"),
        Err(e) => e,
    };
    let text = e.to_string();
    let matches_kind = match kind {
        "auth" => matches!(e, Error::Auth(_)),
        "tls" => matches!(e, Error::Tls(_)),
        _ => unreachable!(),
    };
    assert!(matches_kind, "{kind} expected: {text}");
    for w in words {
        assert!(text.contains(w), "{w:?} missing from: {text}");
    }
    assert!(
        elapsed < Duration::from_secs(20),
        "said after {elapsed:?} (the bootstrap timeout is 60 s): {text}"
    );
    assert!(!text.contains("secret"), "a password in an error: {text}");
}

#[test]
fn a_wrong_password_is_said_at_once_by_name() {
    rt().block_on(async {
        for mech in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let t = Instant::now();
            let r = connect(&secured().sasl_ssl, &sasl_ssl(mech, "alice", "wrong-one")).await;
            refused(r, t, "auth", &[mech, "alice", "error 58"]);
        }
        // A user SCRAM does not know.
        let t = Instant::now();
        let r = connect(
            &secured().sasl_ssl,
            &sasl_ssl("SCRAM-SHA-256", "mallory", "x"),
        )
        .await;
        refused(r, t, "auth", &["mallory"]);
    });
}

#[test]
fn tls_refusals_name_the_setting_that_fixes_them() {
    rt().block_on(async {
        // A CA that did not sign the broker.
        let other = Pki::new();
        let mut s = sasl_ssl("PLAIN", "alice", "alice-secret");
        s.set("ssl.ca.location", &other.ca().display().to_string())
            .unwrap();
        let t = Instant::now();
        refused(
            connect(&secured().sasl_ssl, &s).await,
            t,
            "tls",
            &["not signed by a CA", "ssl.ca.location"],
        );
        // The SASL_SSL certificate names "localhost"; 127.0.0.1 is another name.
        let port = secured().sasl_ssl.rsplit(':').next().unwrap();
        let by_ip = format!("127.0.0.1:{port}");
        let s = sasl_ssl("PLAIN", "alice", "alice-secret");
        let t = Instant::now();
        refused(
            connect(&by_ip, &s).await,
            t,
            "tls",
            &[
                "not valid for \"127.0.0.1\"",
                "ssl.endpoint.identification.algorithm",
            ],
        );
        // ... which the user may accept, as librdkafka's `none` does. The brokers it then
        // learns of are named "localhost" in the metadata, and are checked the same way.
        let mut s = sasl_ssl("PLAIN", "alice", "alice-secret");
        s.set("ssl.endpoint.identification.algorithm", "none")
            .unwrap();
        assert_eq!(round_trip(&by_ip, &s, "no-name-check", 50).await, 50);
        // No client certificate where the listener requires one.
        let ca = secured().pki.ca().display().to_string();
        let s = settings(&[("security.protocol", "SSL"), ("ssl.ca.location", &ca)]);
        let t = Instant::now();
        refused(
            connect(&secured().ssl, &s).await,
            t,
            "tls",
            &["client certificate", "ssl.certificate.location"],
        );
    });
}

#[test]
fn a_client_without_the_listeners_security_is_told_what_to_set() {
    rt().block_on(async {
        // Plaintext to the TLS listener: the broker's TLS alert is recognised, not read as a
        // frame length.
        let t = Instant::now();
        refused(
            connect(&secured().ssl, &ClientSettings::new()).await,
            t,
            "tls",
            &["answered with TLS", "security.protocol"],
        );
        // Plaintext to a SASL listener: the broker closes after ApiVersions.
        let mut c = ClientSettings::new().cluster_config(&secured().sasl_plaintext);
        c.bootstrap_timeout = Duration::from_secs(3);
        let e = Cluster::connect(c).await.err().unwrap().to_string();
        assert!(
            e.contains("SASL listener") && e.contains("security.protocol"),
            "{e}"
        );
    });
}

#[test]
fn a_sasl_session_is_renewed_before_the_broker_ends_it() {
    rt().block_on(async {
        let s = sasl_ssl("SCRAM-SHA-512", "alice", "alice-secret");
        let mut c = connect(&secured().sasl_ssl, &s).await.unwrap();
        let addr = c.broker(1).unwrap();
        let mut conn = c.open(&addr).await.unwrap();
        // Requests keep coming on the one connection; it must still serve after several of
        // the broker's 4 s sessions, having renewed its own each time.
        let deadline = Instant::now() + Duration::from_secs(90);
        while conn.reauthentications() < 3 {
            assert!(Instant::now() < deadline, "no re-authentication in 90 s");
            let req = kafka_protocol::messages::MetadataRequest::default();
            conn.call(req, 12, 12).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        c.refresh(&[]).await.unwrap();
    });
}
