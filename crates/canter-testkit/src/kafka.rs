//! A real Apache Kafka cluster for the tests, started by `tools/kafka/kafka.sh` (Kafka's jars
//! from Maven Central, a Java runtime from Debian's packages, KRaft mode, loopback only).
//!
//! A JVM broker takes seconds to start, so a test binary starts one cluster and its tests
//! share it ([`KafkaCluster::shared`]), each on topics of its own. The script watches the
//! test process and stops the cluster when it exits, however it ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::pki::{CertFiles, Pki};

/// A running cluster; stopped when dropped (or when the test process exits).
#[derive(Debug)]
pub struct KafkaCluster {
    dir: PathBuf,
    bootstrap: String,
    brokers: usize,
    secure: Option<Secured>,
}

/// What a secured cluster's clients need: its listeners (each a node's address, or a
/// comma-separated list of every node's) and the PKI behind them.
#[derive(Debug)]
pub struct Secured {
    /// SASL over TLS (`localhost:PORT`; the certificate names `localhost` only), PLAIN and
    /// SCRAM-SHA-256/512: users `alice`/`alice-secret` (all three), `bob`/`bob-secret` (SCRAM).
    pub sasl_ssl: String,
    /// TLS requiring a client certificate signed by [`Pki::client_ca`] (`127.0.0.1:PORT`; the
    /// certificate names the address 127.0.0.1 only).
    pub ssl: String,
    /// SASL without TLS (`127.0.0.1:PORT`).
    pub sasl_plaintext: String,
    /// The CA that signed the brokers' certificates ([`Pki::ca`]) and client certificates.
    pub pki: Pki,
    /// A client certificate the SSL listener accepts.
    pub client: CertFiles,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/kafka/kafka.sh")
}

impl KafkaCluster {
    /// Starts a cluster of `brokers` nodes (each broker and controller). Panics, with the
    /// script's output, if it cannot: the tests that need Kafka fail rather than skip.
    pub fn start(brokers: usize) -> KafkaCluster {
        KafkaCluster::launch(brokers, None, &[])
    }

    /// Starts a cluster of another Kafka release than tools/kafka/pom.xml's (its jars fetched
    /// into a directory of their own): `3.9.1` speaks the classic group protocol only.
    pub fn start_release(brokers: usize, version: &str) -> KafkaCluster {
        KafkaCluster::launch(brokers, Some(version), &[])
    }

    /// Starts a cluster whose group coordinators speak the classic group protocol only
    /// (`group.coordinator.rebalance.protocols=classic`).
    pub fn start_classic_only(brokers: usize) -> KafkaCluster {
        KafkaCluster::launch(brokers, None, &["--classic-only".to_owned()])
    }

    /// Starts one node with secured listeners besides its plaintext one ([`Secured`]), SASL
    /// sessions lasting `reauth_ms` if given (KIP-368 re-authentication).
    pub fn start_secure(reauth_ms: Option<u64>) -> KafkaCluster {
        KafkaCluster::start_secure_nodes(1, reauth_ms)
    }

    /// [`KafkaCluster::start_secure`] with `brokers` nodes (each with every listener;
    /// [`Secured`]'s addresses are then comma-separated lists).
    pub fn start_secure_nodes(brokers: usize, reauth_ms: Option<u64>) -> KafkaCluster {
        let pki = Pki::new();
        let keystore = |stem: &str, names: &[&str]| {
            let files = pki.server(stem, names);
            let key = std::fs::read_to_string(&files.key).expect("the key just written");
            let chain = std::fs::read_to_string(&files.cert).expect("the chain just written");
            std::fs::write(
                pki.dir().join(format!("{stem}.keystore.pem")),
                format!("{key}{chain}"),
            )
            .expect("write a keystore");
        };
        keystore("localhost", &["localhost"]);
        keystore("ip", &["127.0.0.1"]);
        let client = pki.client("client", "canter-test-client");
        let mut extra = vec!["--secure".to_owned(), pki.dir().display().to_string()];
        if let Some(ms) = reauth_ms {
            extra.extend(["--reauth-ms".to_owned(), ms.to_string()]);
        }
        let mut cluster = KafkaCluster::launch(brokers, None, &extra);
        let listeners = std::fs::read_to_string(cluster.dir.join("listeners"))
            .expect("the cluster's listeners file");
        let get = |name: &str| {
            listeners
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} listener in {listeners}"))
                .to_owned()
        };
        cluster.secure = Some(Secured {
            sasl_ssl: get("sasl_ssl"),
            ssl: get("ssl"),
            sasl_plaintext: get("sasl_plaintext"),
            pki,
            client,
        });
        cluster
    }

    /// The secured listeners, if started by [`KafkaCluster::start_secure`].
    pub fn secured(&self) -> Option<&Secured> {
        self.secure.as_ref()
    }

    fn launch(brokers: usize, version: Option<&str>, extra: &[String]) -> KafkaCluster {
        let dir = std::env::temp_dir().join(format!(
            "canter-kafka-{}-{}",
            std::process::id(),
            crate::random_bytes(
                6,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            )
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
        ));
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg("start")
            .arg(&dir)
            .args(["--brokers", &brokers.to_string()])
            .args(["--watch", &std::process::id().to_string()])
            .args(extra);
        if let Some(v) = version {
            cmd.env("CANTER_KAFKA_VERSION", v);
        }
        let out = cmd.output().expect("run tools/kafka/kafka.sh");
        assert!(
            out.status.success(),
            "tools/kafka/kafka.sh start failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let bootstrap = std::fs::read_to_string(dir.join("bootstrap"))
            .expect("the cluster's bootstrap file")
            .trim()
            .to_owned();
        KafkaCluster {
            dir,
            bootstrap,
            brokers,
            secure: None,
        }
    }

    /// One single-broker cluster for the whole test binary, started at the first call.
    pub fn shared() -> &'static KafkaCluster {
        static SHARED: OnceLock<KafkaCluster> = OnceLock::new();
        SHARED.get_or_init(|| KafkaCluster::start(1))
    }

    /// `host:port,...` of the brokers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// How many nodes.
    pub fn brokers(&self) -> usize {
        self.brokers
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to node `node` (1-based).
    pub fn signal(&self, node: usize, signal: &str) {
        let st = Command::new("bash")
            .arg(script())
            .args(["kill"])
            .arg(&self.dir)
            .args([&node.to_string(), signal])
            .status()
            .expect("kafka.sh kill");
        assert!(st.success(), "kafka.sh kill {node} {signal} failed");
    }

    /// Starts node `node` again after [`KafkaCluster::signal`] killed it, and waits until
    /// it serves.
    pub fn restart(&self, node: usize) {
        let st = Command::new("bash")
            .arg(script())
            .args(["restart"])
            .arg(&self.dir)
            .arg(node.to_string())
            .status()
            .expect("kafka.sh restart");
        assert!(st.success(), "kafka.sh restart {node} failed");
    }

    /// Runs one of Kafka's tools (`org.apache.kafka.tools.ProducerPerformance`, …) on the
    /// cluster's jars; its output.
    pub fn run_tool(&self, class: &str, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(script())
            .arg("run")
            .arg(&self.dir)
            .arg(class)
            .args(args)
            .output()
            .expect("kafka.sh run")
    }

    /// The directory of the cluster's files (logs in `node-N/log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
