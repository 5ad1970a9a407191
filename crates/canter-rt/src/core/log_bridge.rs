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

/// Log lines that could not be written (standard error closed, a pipe whose reader left, a
/// full disk), since the process started.
static DROPPED_LINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The standard error as a log writer that never fails: a line it cannot write is dropped and
/// counted ([`log_lines_dropped`]), never an error. Give it to a `tracing` subscriber
/// (`tracing_subscriber::fmt().with_writer(LogStderr::default)`, and
/// `.log_internal_errors(false)`): a subscriber that meets a write error otherwise reports it
/// with `eprintln!`, which panics when the standard error is gone, and that panic would end the
/// worker that logged (a flow whose step raised, run as `... 2>&1 | head -1`, then never ends).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogStderr;

impl std::io::Write for LogStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A line is written whole or dropped whole (`write_all` of `Stderr` retries the rest).
        if std::io::Write::write_all(&mut std::io::stderr().lock(), buf).is_err() {
            DROPPED_LINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// How many log lines [`LogStderr`] dropped.
pub fn log_lines_dropped() -> u64 {
    DROPPED_LINES.load(std::sync::atomic::Ordering::Relaxed)
}
