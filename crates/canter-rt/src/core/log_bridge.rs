//! The libraries' `log` records (rustls, tokio-postgres) into `tracing`, as `tracing-log` sends
//! them, with one change: what the TLS library says at WARN or above on a worker is about the
//! peer's messages (an IP address or an invalid name as SNI, a renegotiation it refused), so it
//! is a client fault like the others: counted ([`ClientFault::TlsWarning`]) and logged at
//! DEBUG, never a line per peer at the default level.

use log::{Level, LevelFilter, Log, Metadata, Record};
use tracing_log::LogTracer;

use crate::core::stats::ClientFault;
use crate::core::worker::fault_on_this_thread;

struct Bridge(LogTracer);

impl Log for Bridge {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // A TLS warning is counted whatever the filter lets through.
        from_tls(metadata) || self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !from_tls(record.metadata()) {
            return self.0.log(record);
        }
        fault_on_this_thread(ClientFault::TlsWarning);
        let demoted = Record::builder()
            .args(*record.args())
            .level(Level::Debug)
            .target(record.target())
            .module_path(record.module_path())
            .file(record.file())
            .line(record.line())
            .build();
        self.0.log(&demoted);
    }

    fn flush(&self) {}
}

/// A record of the TLS library at WARN or above.
fn from_tls(metadata: &Metadata<'_>) -> bool {
    metadata.level() <= Level::Warn
        && (metadata.target() == "rustls" || metadata.target().starts_with("rustls::"))
}

/// Routes the `log` records of the libraries canter uses into `tracing` (call it once, after
/// the `tracing` subscriber is set, in place of `tracing-log`'s `LogTracer`, which
/// `tracing_subscriber`'s `init` would install): records pass at the level the subscriber asks
/// for, and the TLS library's warnings about a peer become client faults
/// ([`ClientFault::TlsWarning`]: counted for the metrics and the interval summary, logged at
/// DEBUG). Fails if a `log` logger is already set.
pub fn route_log_records() -> Result<(), log::SetLoggerError> {
    let wanted = match tracing::level_filters::LevelFilter::current().into_level() {
        None => LevelFilter::Off,
        Some(tracing::Level::ERROR) => LevelFilter::Error,
        Some(tracing::Level::WARN) => LevelFilter::Warn,
        Some(tracing::Level::INFO) => LevelFilter::Info,
        Some(tracing::Level::DEBUG) => LevelFilter::Debug,
        Some(_) => LevelFilter::Trace,
    };
    log::set_boxed_logger(Box::new(Bridge(LogTracer::new())))?;
    // Warnings reach the bridge (to be counted) whatever the subscriber shows.
    log::set_max_level(wanted.max(LevelFilter::Warn));
    Ok(())
}
