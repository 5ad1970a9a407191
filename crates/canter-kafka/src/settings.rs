//! Client settings under librdkafka's names (`security.protocol`, `sasl.mechanism`,
//! `ssl.ca.location`, `linger.ms`, …), so a configuration written for confluent-kafka, rdkafka
//! or Bytewax works here unchanged. An unknown key is an error naming it, as in librdkafka.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster::Config;
use crate::error::Error;
use crate::records::Compression;
use crate::security::{Mechanism, Protocol, Secret, Security};

/// Which consumer-group protocol a pipeline's members speak (`group.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// KIP-848 where the group coordinator accepts it, else the classic protocol.
    #[default]
    Auto,
    /// JoinGroup/SyncGroup/Heartbeat with a client-side assignor (Kafka 2.8–3.9, Redpanda).
    Classic,
    /// KIP-848 (`ConsumerGroupHeartbeat`, the broker assigns).
    Consumer,
}

/// Settings a user gives by librdkafka's names; `None` leaves the program's own default.
#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: Option<String>,
    /// `group.id`.
    pub group_id: Option<String>,
    /// `client.id`.
    pub client_id: Option<String>,
    /// `security.protocol`, `ssl.*`, `sasl.*`.
    pub security: Security,
    /// `group.protocol`.
    pub group_protocol: GroupProtocol,
    /// `compression.type` (alias `compression.codec`).
    pub compression: Option<Compression>,
    /// `linger.ms` (alias `queue.buffering.max.ms`).
    pub linger: Option<Duration>,
    /// `delivery.timeout.ms` (alias `message.timeout.ms`).
    pub delivery_timeout: Option<Duration>,
    /// `session.timeout.ms`.
    pub session_timeout: Option<Duration>,
    /// `request.timeout.ms` (alias `socket.timeout.ms`).
    pub request_timeout: Option<Duration>,
    /// `socket.connection.setup.timeout.ms`.
    pub connect_timeout: Option<Duration>,
    /// `fetch.max.bytes`.
    pub fetch_max_bytes: Option<i32>,
    /// `max.partition.fetch.bytes`.
    pub max_partition_fetch_bytes: Option<i32>,
    /// `message.max.bytes`: the largest record produced.
    pub message_max_bytes: Option<usize>,
    /// `replication.factor` of the topics the program creates.
    pub replication_factor: Option<i16>,
    /// `transaction.timeout.ms`.
    pub transaction_timeout: Option<Duration>,
}

/// The keys [`ClientSettings::set`] knows.
pub const KEYS: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.endpoint.identification.algorithm",
    "group.protocol",
    "compression.type",
    "compression.codec",
    "linger.ms",
    "queue.buffering.max.ms",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "session.timeout.ms",
    "request.timeout.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "message.max.bytes",
    "replication.factor",
    "transaction.timeout.ms",
    "acks",
    "enable.idempotence",
];

impl ClientSettings {
    /// No settings: every default.
    pub fn new() -> ClientSettings {
        ClientSettings::default()
    }

    /// Sets `key` to `value`. An unknown key, or a value the key cannot take, is an
    /// [`Error::Config`] naming the key (never a secret's value).
    pub fn set(&mut self, key: &str, value: &str) -> Result<&mut ClientSettings, Error> {
        let key = key.trim();
        let v = value.trim();
        let bad = |why: &str| Error::Config(format!("{key}={v}: {why}"));
        match key {
            "bootstrap.servers" => {
                crate::addr::BrokerAddr::parse_list(v)?;
                self.bootstrap_servers = Some(v.to_owned());
            }
            "group.id" => self.group_id = Some(nonempty(key, v)?),
            "client.id" => self.client_id = Some(nonempty(key, v)?),
            "security.protocol" => {
                self.security.protocol = match v.to_ascii_lowercase().as_str() {
                    "plaintext" => Protocol::Plaintext,
                    "ssl" => Protocol::Ssl,
                    "sasl_plaintext" => Protocol::SaslPlaintext,
                    "sasl_ssl" => Protocol::SaslSsl,
                    _ => return Err(bad("one of plaintext, ssl, sasl_plaintext, sasl_ssl")),
                }
            }
            "sasl.mechanism" | "sasl.mechanisms" => {
                self.security.mechanism = match v.to_ascii_uppercase().as_str() {
                    "PLAIN" => Mechanism::Plain,
                    "SCRAM-SHA-256" => Mechanism::ScramSha256,
                    "SCRAM-SHA-512" => Mechanism::ScramSha512,
                    "OAUTHBEARER" | "GSSAPI" => {
                        return Err(bad(
                            "not supported; PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 are",
                        ))
                    }
                    _ => return Err(bad("one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")),
                }
            }
            "sasl.username" => self.security.username = Some(nonempty(key, v)?),
            "sasl.password" => {
                // The value itself is never echoed.
                if value.is_empty() {
                    return Err(Error::Config("sasl.password is empty".into()));
                }
                self.security.password = Some(Secret::new(value));
            }
            "ssl.ca.location" => {
                self.security.ca_location = match v {
                    // librdkafka's word for the system's store.
                    "probe" => None,
                    _ => Some(PathBuf::from(nonempty(key, v)?)),
                }
            }
            "ssl.certificate.location" => {
                self.security.certificate_location = Some(PathBuf::from(nonempty(key, v)?))
            }
            "ssl.key.location" => {
                self.security.key_location = Some(PathBuf::from(nonempty(key, v)?))
            }
            "ssl.endpoint.identification.algorithm" => {
                self.security.skip_name_check = match v.to_ascii_lowercase().as_str() {
                    "https" => false,
                    "none" | "" => true,
                    _ => return Err(bad("https or none")),
                }
            }
            "group.protocol" => {
                self.group_protocol = match v.to_ascii_lowercase().as_str() {
                    "classic" => GroupProtocol::Classic,
                    "consumer" => GroupProtocol::Consumer,
                    _ => return Err(bad("classic or consumer")),
                }
            }
            "compression.type" | "compression.codec" => {
                self.compression = Some(match v.to_ascii_lowercase().as_str() {
                    "none" => Compression::None,
                    "gzip" => Compression::Gzip,
                    "lz4" => Compression::Lz4,
                    "zstd" => Compression::Zstd,
                    "snappy" => Compression::Snappy,
                    _ => return Err(bad("one of none, gzip, snappy, lz4, zstd")),
                })
            }
            "linger.ms" | "queue.buffering.max.ms" => self.linger = Some(millis(key, v)?),
            "delivery.timeout.ms" | "message.timeout.ms" => {
                self.delivery_timeout = Some(positive_millis(key, v)?)
            }
            "session.timeout.ms" => self.session_timeout = Some(positive_millis(key, v)?),
            "request.timeout.ms" | "socket.timeout.ms" => {
                self.request_timeout = Some(positive_millis(key, v)?)
            }
            "socket.connection.setup.timeout.ms" => {
                self.connect_timeout = Some(positive_millis(key, v)?)
            }
            "transaction.timeout.ms" => self.transaction_timeout = Some(positive_millis(key, v)?),
            "fetch.max.bytes" => self.fetch_max_bytes = Some(positive(key, v)?),
            "max.partition.fetch.bytes" => self.max_partition_fetch_bytes = Some(positive(key, v)?),
            "message.max.bytes" => self.message_max_bytes = Some(positive(key, v)? as usize),
            "replication.factor" => {
                let n = positive(key, v)?;
                self.replication_factor = Some(i16::try_from(n).map_err(|_| bad("at most 32767"))?);
            }
            // Records are always written with acks=all and idempotence (KIP-98): accepted
            // where a configuration says so, refused where it asks for less.
            "acks" => {
                if !matches!(v, "all" | "-1") {
                    return Err(bad(
                        "only all (-1): the producer is idempotent, which needs acks=all",
                    ));
                }
            }
            "enable.idempotence" => {
                if v != "true" {
                    return Err(bad("only true: the producer is always idempotent"));
                }
            }
            _ => {
                return Err(Error::Config(format!(
                    "unknown setting {key:?} (known: {})",
                    KEYS.join(", ")
                )))
            }
        }
        Ok(self)
    }

    /// Sets `KEY=VALUE` (the command line's `--kafka-config`).
    pub fn set_pair(&mut self, pair: &str) -> Result<&mut ClientSettings, Error> {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("{pair:?} is not KEY=VALUE")))?;
        self.set(k, v)
    }

    /// Reads a properties file (`key=value` or `key: value` lines, `#` and `!` comments), as
    /// confluent-kafka's and Kafka's own tools take.
    pub fn load_file(&mut self, path: &Path) -> Result<&mut ClientSettings, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (k, v) = line.split_once(['=', ':']).ok_or_else(|| {
                Error::Config(format!("{} line {}: not key=value", path.display(), n + 1))
            })?;
            self.set(k, v).map_err(|e| match e {
                Error::Config(what) => {
                    Error::Config(format!("{} line {}: {what}", path.display(), n + 1))
                }
                other => other,
            })?;
        }
        Ok(self)
    }

    /// Checks that `bootstrap.servers` and `group.id`, where set, agree with the program's own
    /// (`--kafka`, `--group`): a file for another cluster is a mistake to say, not to pick from.
    pub fn check_agrees(&self, bootstrap: &str, group: Option<&str>) -> Result<(), Error> {
        if let Some(b) = &self.bootstrap_servers {
            if b.replace(' ', "") != bootstrap.replace(' ', "") {
                return Err(Error::Config(format!(
                    "bootstrap.servers={b} disagrees with the brokers given ({bootstrap})"
                )));
            }
        }
        if let (Some(g), Some(group)) = (&self.group_id, group) {
            if g != group {
                return Err(Error::Config(format!(
                    "group.id={g} disagrees with the group given ({group})"
                )));
            }
        }
        Ok(())
    }

    /// The cluster settings for `bootstrap` with these applied.
    pub fn cluster_config(&self, bootstrap: &str) -> Config {
        let mut c = Config::new(bootstrap);
        self.apply(&mut c);
        c
    }

    /// Applies the connection settings (client id, timeouts, security) to `config`.
    pub fn apply(&self, config: &mut Config) {
        if let Some(id) = &self.client_id {
            config.client_id = id.clone();
        }
        if let Some(t) = self.request_timeout {
            config.request_timeout = t;
        }
        if let Some(t) = self.connect_timeout {
            config.connect_timeout = t;
        }
        config.security = self.security.clone();
    }
}

fn nonempty(key: &str, v: &str) -> Result<String, Error> {
    match v.is_empty() {
        true => Err(Error::Config(format!("{key} is empty"))),
        false => Ok(v.to_owned()),
    }
}

fn number(key: &str, v: &str) -> Result<i64, Error> {
    v.parse::<i64>()
        .map_err(|_| Error::Config(format!("{key}={v}: not a whole number")))
}

fn positive(key: &str, v: &str) -> Result<i32, Error> {
    let n = number(key, v)?;
    i32::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::Config(format!("{key}={v}: a number from 1 to 2147483647")))
}

fn millis(key: &str, v: &str) -> Result<Duration, Error> {
    let n = number(key, v)?;
    u64::try_from(n)
        .map(Duration::from_millis)
        .map_err(|_| Error::Config(format!("{key}={v}: milliseconds, 0 or more")))
}

fn positive_millis(key: &str, v: &str) -> Result<Duration, Error> {
    let d = millis(key, v)?;
    match d.is_zero() {
        true => Err(Error::Config(format!(
            "{key}={v}: milliseconds, more than 0"
        ))),
        false => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn librdkafka_keys_set_their_fields() {
        let mut s = ClientSettings::new();
        for (k, v) in [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "alice"),
            ("sasl.password", "s3cret"),
            ("ssl.ca.location", "/tmp/ca.pem"),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("linger.ms", "20"),
            ("compression.type", "zstd"),
            ("session.timeout.ms", "6000"),
            ("fetch.max.bytes", "1048576"),
            ("replication.factor", "1"),
            ("group.protocol", "classic"),
        ] {
            s.set(k, v).unwrap();
        }
        assert_eq!(s.security.protocol, Protocol::SaslSsl);
        assert_eq!(s.security.mechanism, Mechanism::ScramSha512);
        assert_eq!(s.security.password.as_ref().unwrap().expose(), "s3cret");
        assert!(s.security.skip_name_check);
        assert_eq!(s.linger, Some(Duration::from_millis(20)));
        assert_eq!(s.compression, Some(Compression::Zstd));
        assert_eq!(s.session_timeout, Some(Duration::from_secs(6)));
        assert_eq!(s.fetch_max_bytes, Some(1 << 20));
        assert_eq!(s.replication_factor, Some(1));
        assert_eq!(s.group_protocol, GroupProtocol::Classic);
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it() {
        let e = ClientSettings::new()
            .set("sasl.jaas.config", "x")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown setting \"sasl.jaas.config\""),
            "{e}"
        );
        let e = ClientSettings::new().set("linger.ms", "soon").unwrap_err();
        assert!(e.to_string().contains("linger.ms=soon"), "{e}");
        let e = ClientSettings::new().set_pair("linger.ms").unwrap_err();
        assert!(e.to_string().contains("KEY=VALUE"), "{e}");
    }

    #[test]
    fn a_password_never_shows() {
        let mut s = ClientSettings::new();
        s.set("sasl.password", "hunter2-secret").unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        let e = s.set("sasl.password", "").unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
    }

    #[test]
    fn a_properties_file_is_read_with_its_line_numbers_in_errors() {
        let dir = std::env::temp_dir().join(format!("canter-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("client.properties");
        std::fs::write(
            &f,
            "# Confluent Cloud\nbootstrap.servers=b1:9092,b2:9092\nsecurity.protocol=SASL_SSL\n\
             sasl.mechanisms = PLAIN\n! comment\nsasl.username: key\nsasl.password=a=b\n",
        )
        .unwrap();
        let mut s = ClientSettings::new();
        s.load_file(&f).unwrap();
        assert_eq!(s.security.username.as_deref(), Some("key"));
        assert_eq!(s.security.password.as_ref().unwrap().expose(), "a=b");
        assert!(s.check_agrees("b1:9092,b2:9092", None).is_ok());
        assert!(s.check_agrees("b3:9092", None).is_err());
        std::fs::write(&f, "linger.ms=1\nbogus.key=1\n").unwrap();
        let e = ClientSettings::new().load_file(&f).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("bogus.key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn addresses_need_a_port() {
        assert!(ClientSettings::new()
            .set("bootstrap.servers", "kafka.example.com")
            .is_err());
        let a = crate::addr::BrokerAddr::parse("[::1]:9092").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 9092));
        assert_eq!(a.to_string(), "[::1]:9092");
    }

    #[test]
    fn tls_files_without_tls_are_refused() {
        let mut s = ClientSettings::new();
        s.set("ssl.ca.location", "/tmp/ca.pem").unwrap();
        let e = s
            .security
            .build(Default::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("uses no TLS"), "{e}");
        let mut s = ClientSettings::new();
        s.set("security.protocol", "sasl_plaintext").unwrap();
        let e = s
            .security
            .build(Default::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sasl.username"), "{e}");
    }
}
