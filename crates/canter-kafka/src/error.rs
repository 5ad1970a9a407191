//! What can go wrong talking to Kafka.

use std::fmt;

/// An error from the client.
#[derive(Debug)]
pub enum Error {
    /// A socket error (connect, read, write).
    Io(std::io::Error),
    /// No broker of the bootstrap list answered within the connect timeout.
    Unreachable(String),
    /// A request got no answer in time.
    Timeout(&'static str),
    /// The broker answered with an error code for a request (`api`), with Kafka's name for it.
    Broker {
        /// The request.
        api: &'static str,
        /// Kafka's error code.
        code: i16,
        /// What the broker said, or the code's name.
        message: String,
    },
    /// The broker doesn't speak a version of a request this client needs.
    Version(&'static str),
    /// Bytes that don't parse: a response, or a record batch.
    Corrupt(String),
    /// A feature of the data this client doesn't implement (snappy).
    Unsupported(&'static str),
    /// A record over the producer's maximum size.
    TooLarge {
        /// The record's size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Topic or partition unknown to the cluster.
    UnknownTopic(String),
    /// Settings that cannot work: an unknown key, a bad value, a certificate file that does
    /// not load, settings that contradict each other.
    Config(String),
    /// TLS failed for a reason the settings decide (a CA that did not sign the broker, a
    /// certificate for another name, a client certificate missing or refused).
    Tls(String),
    /// SASL authentication was refused (a wrong password, a mechanism the broker does not
    /// enable).
    Auth(String),
    /// The consumer group went on without this member (classic protocol: its generation or
    /// id is no longer the coordinator's): what it owned is lost.
    Fenced(String),
}

impl Error {
    /// A broker error that goes away by itself: leadership moving, a coordinator loading,
    /// a broker restarting. The caller refreshes metadata and tries again.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Io(_) | Error::Timeout(_) | Error::Unreachable(_) => true,
            Error::Broker { code, .. } => retriable_code(*code),
            _ => false,
        }
    }

    /// The group no longer knows this member (its session expired, or the coordinator lost
    /// it): what it owned is lost, and it must join again ([`crate::Member::reset`]).
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            Error::Broker { code: 25 | 110, .. } | Error::Fenced(_)
        )
    }

    pub(crate) fn broker(api: &'static str, code: i16, message: Option<&str>) -> Error {
        Error::Broker {
            api,
            code,
            message: match message.filter(|m| !m.is_empty()) {
                Some(m) => format!("{}: {m}", code_name(code)),
                None => code_name(code),
            },
        }
    }
}

/// Kafka's retriable error codes (the `RetriableException` subclasses) this client meets.
pub(crate) fn retriable_code(code: i16) -> bool {
    matches!(
        code,
        // corrupt message, unknown topic/partition, leader not available, not leader,
        // request timed out, network exception, coordinator load in progress,
        // coordinator not available, not coordinator, not enough replicas (after append too),
        // kafka storage error, fenced leader epoch, unknown leader epoch, offset not available,
        // rebalance in progress, unstable offset commit, concurrent transactions,
        // stale member epoch (a heartbeat brings the new one)
        2 | 3 | 5 | 6 | 7 | 13 | 14 | 15 | 16 | 19 | 20 | 56 | 74 | 75 | 78 | 27 | 88 | 51 | 113
    )
}

/// Kafka's name for an error code (`PRODUCER_FENCED`, `SASL_AUTHENTICATION_FAILED`), from the
/// protocol crate's table of every code.
pub(crate) fn code_name(code: i16) -> String {
    use kafka_protocol::error::ResponseError;
    match ResponseError::try_from_code(code) {
        None => "NONE".to_owned(),
        Some(ResponseError::Unknown(c)) => format!("UNKNOWN_ERROR_CODE_{c}"),
        Some(e) => {
            // The variants are Kafka's names in camel case.
            let camel = format!("{e:?}");
            let mut out = String::with_capacity(camel.len() + 8);
            for (i, ch) in camel.chars().enumerate() {
                if ch.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(ch.to_ascii_uppercase());
            }
            out
        }
    }
}

impl Error {
    /// Kafka's name for an error code, e.g. 90 is `PRODUCER_FENCED`.
    pub fn code_name(code: i16) -> String {
        code_name(code)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "kafka: {e}"),
            Error::Unreachable(what) => write!(f, "kafka: no broker reachable ({what})"),
            Error::Timeout(what) => write!(f, "kafka: {what} timed out"),
            Error::Broker { api, code, message } => {
                write!(f, "kafka: {api} failed: {message} (error {code})")
            }
            Error::Version(api) => write!(f, "kafka: the broker has no usable version of {api}"),
            Error::Corrupt(what) => write!(f, "kafka: malformed data: {what}"),
            Error::Unsupported(what) => write!(f, "kafka: {what} are not supported"),
            Error::TooLarge { size, max } => {
                write!(
                    f,
                    "kafka: a record of {size} bytes is over the maximum of {max}"
                )
            }
            Error::UnknownTopic(t) => write!(f, "kafka: unknown topic {t}"),
            Error::Config(what) => write!(f, "kafka: settings: {what}"),
            Error::Tls(what) => write!(f, "kafka: TLS: {what}"),
            Error::Auth(what) => write!(f, "kafka: authentication: {what}"),
            Error::Fenced(what) => write!(f, "kafka: fenced from the group: {what}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_code_has_kafkas_name() {
        assert_eq!(code_name(90), "PRODUCER_FENCED");
        assert_eq!(code_name(58), "SASL_AUTHENTICATION_FAILED");
        assert_eq!(code_name(29), "TOPIC_AUTHORIZATION_FAILED");
        assert_eq!(code_name(30), "GROUP_AUTHORIZATION_FAILED");
        assert_eq!(code_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(code_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(code_name(9999), "UNKNOWN_ERROR_CODE_9999");
        let e = Error::broker("Produce", 90, None);
        assert_eq!(
            e.to_string(),
            "kafka: Produce failed: PRODUCER_FENCED (error 90)"
        );
    }
}
