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
        matches!(self, Error::Broker { code: 25 | 110, .. })
    }

    pub(crate) fn broker(api: &'static str, code: i16, message: Option<&str>) -> Error {
        Error::Broker {
            api,
            code,
            message: message
                .filter(|m| !m.is_empty())
                .map_or_else(|| code_name(code).to_owned(), str::to_owned),
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

fn code_name(code: i16) -> &'static str {
    match code {
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        10 => "MESSAGE_TOO_LARGE",
        14 => "COORDINATOR_LOAD_IN_PROGRESS",
        15 => "COORDINATOR_NOT_AVAILABLE",
        16 => "NOT_COORDINATOR",
        19 => "NOT_ENOUGH_REPLICAS",
        22 => "ILLEGAL_GENERATION",
        25 => "UNKNOWN_MEMBER_ID",
        27 => "REBALANCE_IN_PROGRESS",
        35 => "UNSUPPORTED_VERSION",
        45 => "OUT_OF_ORDER_SEQUENCE_NUMBER",
        46 => "DUPLICATE_SEQUENCE_NUMBER",
        47 => "INVALID_PRODUCER_EPOCH",
        59 => "UNKNOWN_PRODUCER_ID",
        110 => "FENCED_MEMBER_EPOCH",
        111 => "UNRELEASED_INSTANCE_ID",
        112 => "UNSUPPORTED_ASSIGNOR",
        113 => "STALE_MEMBER_EPOCH",
        _ => "kafka error",
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
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}
