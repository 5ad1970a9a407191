//! How a connection to a broker is secured: TLS (rustls, the runtime's outbound TLS) and SASL,
//! as librdkafka's `security.protocol`, `ssl.*` and `sasl.*` settings describe them.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use canter_rt::ClientTls;

use crate::error::Error;

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// No TLS, no SASL.
    #[default]
    Plaintext,
    /// TLS (with a client certificate if one is set).
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl Protocol {
    /// Whether connections run TLS.
    pub fn tls(self) -> bool {
        matches!(self, Protocol::Ssl | Protocol::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(self, Protocol::SaslPlaintext | Protocol::SaslSsl)
    }

    /// librdkafka's name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Plaintext => "plaintext",
            Protocol::Ssl => "ssl",
            Protocol::SaslPlaintext => "sasl_plaintext",
            Protocol::SaslSsl => "sasl_ssl",
        }
    }
}

/// A SASL mechanism (`sasl.mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mechanism {
    /// User name and password in the clear (over TLS, please).
    #[default]
    Plain,
    /// SCRAM with SHA-256 (RFC 7677).
    ScramSha256,
    /// SCRAM with SHA-512.
    ScramSha512,
}

impl Mechanism {
    /// The name brokers use.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// A password: never printed (`Debug` and `Display` show `[redacted]`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// How connections are secured.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS, SASL, both or neither.
    pub protocol: Protocol,
    /// CA certificates (PEM) that sign the brokers' certificates (`ssl.ca.location`); `None`:
    /// the system's CA store.
    pub ca_location: Option<PathBuf>,
    /// This client's certificate chain (PEM), for brokers that require one (mTLS).
    pub certificate_location: Option<PathBuf>,
    /// This client's private key (PEM, unencrypted).
    pub key_location: Option<PathBuf>,
    /// Skip the check that a broker's certificate names the host connected to
    /// (`ssl.endpoint.identification.algorithm=none`); on by default, as in librdkafka.
    pub skip_name_check: bool,
    /// The SASL mechanism.
    pub mechanism: Mechanism,
    /// The SASL user.
    pub username: Option<String>,
    /// The SASL password.
    pub password: Option<Secret>,
}

/// What every connection of a cluster needs to secure itself, built once from [`Security`]
/// (files read and checked at start, not per connection).
pub(crate) struct Transport {
    pub(crate) tls: Option<ClientTls>,
    pub(crate) sasl: Option<Sasl>,
    /// Where connections report brokers that stop or start answering.
    pub(crate) health: Arc<crate::health::Health>,
}

/// SASL credentials.
pub(crate) struct Sasl {
    pub(crate) mechanism: Mechanism,
    pub(crate) username: String,
    pub(crate) password: Secret,
}

impl Security {
    /// Reads the certificate files and checks the settings fit together.
    pub(crate) fn build(
        &self,
        health: Arc<crate::health::Health>,
    ) -> Result<Arc<Transport>, Error> {
        let config = |what: String| Error::Config(what);
        let tls = if self.protocol.tls() {
            let base = match &self.ca_location {
                Some(ca) => ClientTls::ca_file(ca, &[])
                    .map_err(|e| config(format!("ssl.ca.location: {e}")))?,
                None => ClientTls::system_roots(&[])
                    .map_err(|e| config(format!("the system's CA certificates: {e}")))?,
            };
            let base = match (&self.certificate_location, &self.key_location) {
                (Some(cert), Some(key)) => base
                    .with_client_cert(cert, key)
                    .map_err(|e| config(format!("ssl.certificate.location: {e}")))?,
                (None, None) => base,
                (Some(_), None) => {
                    return Err(config(
                        "ssl.certificate.location is set but ssl.key.location is not".into(),
                    ))
                }
                (None, Some(_)) => {
                    return Err(config(
                        "ssl.key.location is set but ssl.certificate.location is not".into(),
                    ))
                }
            };
            Some(match self.skip_name_check {
                true => base.without_name_check(),
                false => base,
            })
        } else {
            if let Some(key) = [
                ("ssl.ca.location", self.ca_location.is_some()),
                (
                    "ssl.certificate.location",
                    self.certificate_location.is_some(),
                ),
                ("ssl.key.location", self.key_location.is_some()),
            ]
            .iter()
            .find_map(|(k, set)| set.then_some(k))
            {
                return Err(config(format!(
                    "{key} is set but security.protocol={} uses no TLS (ssl or sasl_ssl)",
                    self.protocol.name()
                )));
            }
            None
        };
        let sasl = if self.protocol.sasl() {
            let (Some(username), Some(password)) = (&self.username, &self.password) else {
                return Err(config(format!(
                    "security.protocol={} needs sasl.username and sasl.password",
                    self.protocol.name()
                )));
            };
            Some(Sasl {
                mechanism: self.mechanism,
                username: username.clone(),
                password: password.clone(),
            })
        } else {
            if self.username.is_some() || self.password.is_some() {
                return Err(config(format!(
                    "sasl.username or sasl.password is set but security.protocol={} uses no \
                     SASL (sasl_plaintext or sasl_ssl)",
                    self.protocol.name()
                )));
            }
            None
        };
        Ok(Arc::new(Transport { tls, sasl, health }))
    }
}
