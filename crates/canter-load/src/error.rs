//! Why a load run could not start.

use std::fmt;
use std::io;
use std::net::SocketAddr;

/// Why `canter load` could not run; the measurement itself never fails (errors during the run
/// are counted in the report).
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The options or the URL are not usable; the message says which and why.
    Usage(String),
    /// The target resolves only to addresses outside 127.0.0.0/8 and ::1.
    NotLoopback {
        /// The host as given.
        host: String,
        /// What it resolved to.
        addrs: Vec<SocketAddr>,
    },
    /// Nothing answered at any of the target's addresses.
    Unreachable {
        /// The last address tried.
        addr: SocketAddr,
        /// Why the connection failed.
        source: io::Error,
    },
    /// The open-files limit is below what the connections need.
    FileLimit {
        /// Descriptors needed (connections plus a margin).
        need: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The TLS settings could not be loaded (`--cacert`).
    Tls(canter_rt::TlsError),
    /// A local operation failed: reading `--body-file`, resolving the host, starting a worker
    /// thread or runtime, writing the JSON report.
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: io::Error,
    },
    /// A worker thread panicked.
    WorkerPanicked,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Usage(message) => f.write_str(message),
            LoadError::NotLoopback { host, addrs } => write!(
                f,
                "refusing non-loopback target {host} ({addrs:?}): only 127.0.0.0/8 and ::1 are allowed"
            ),
            LoadError::Unreachable { addr, source } => write!(f, "cannot connect to {addr}: {source}"),
            LoadError::FileLimit { need, limit } => write!(
                f,
                "the connections need about {need} file descriptors but RLIMIT_NOFILE is {limit}"
            ),
            LoadError::Tls(e) => write!(f, "--cacert: {e}"),
            LoadError::Io { what, source } => write!(f, "{what}: {source}"),
            LoadError::WorkerPanicked => f.write_str("a worker thread panicked"),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Unreachable { source, .. } | LoadError::Io { source, .. } => Some(source),
            LoadError::Tls(e) => Some(e),
            _ => None,
        }
    }
}

/// `Err(LoadError::Usage(...))` from a format string.
macro_rules! usage {
    ($($arg:tt)*) => {
        Err($crate::error::LoadError::Usage(format!($($arg)*)))
    };
}
pub(crate) use usage;
