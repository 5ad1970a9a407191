//! The flags of `canter load`, `canter send` and `canter receive`, and the options of the
//! libraries they build: the libraries know no command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use canter_load::{parse_duration, LoadOptions};
use canter_stream::frame::DEFAULT_MAX_FRAME;
use canter_stream::receive::ReceiveOptions;
use canter_stream::send::SendOptions;

/// The flags of `canter load`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct LoadArgs {
    /// Target URL, e.g. `http://127.0.0.1:8080/plaintext` (loopback only).
    pub(crate) url: String,

    /// Number of open connections.
    #[arg(short = 'c', long, default_value_t = 50)]
    pub(crate) connections: usize,

    /// Number of worker threads (each runs its own event loop).
    #[arg(short = 't', long, default_value_t = 1)]
    pub(crate) threads: usize,

    /// Test duration after warm-up (`10s`, `500ms`, `1m`). Defaults to 10s,
    /// or unbounded when `-n` is given.
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,

    /// Total number of requests to send; the run stops when they are done
    /// or the duration elapses, whichever comes first.
    #[arg(short = 'n', long)]
    pub(crate) requests: Option<u64>,

    /// Requests written per batch on each connection (HTTP/1.1 pipelining).
    #[arg(long, default_value_t = 1)]
    pub(crate) pipeline: usize,

    /// Speak HTTP/2 with this many concurrent streams per connection (h2c with prior
    /// knowledge on http://, ALPN h2 on https://).
    #[arg(short = 'm', long)]
    pub(crate) streams: Option<usize>,

    /// Open-loop mode: total requests per second across all connections,
    /// with coordinated-omission correction (wrk2 style).
    #[arg(long)]
    pub(crate) rate: Option<f64>,

    /// Speak HTTP/3 over QUIC to the https:// URL's port over UDP (-m requests in flight per
    /// connection, 1 by default).
    #[arg(long)]
    pub(crate) h3: bool,

    /// Request method.
    #[arg(short = 'X', long, default_value = "GET")]
    pub(crate) method: String,

    /// Extra request header `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    pub(crate) headers: Vec<String>,

    /// Request body.
    #[arg(long, conflicts_with = "body_file")]
    pub(crate) body: Option<String>,

    /// Read the request body from a file.
    #[arg(long)]
    pub(crate) body_file: Option<PathBuf>,

    /// Per-request timeout; a timed-out request counts as a timeout error
    /// and its connection is re-established.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub(crate) timeout: Duration,

    /// Warm-up period excluded from the statistics.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) warmup: Option<Duration>,

    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,

    /// https: accept any server certificate (a development certificate), verifying nothing.
    #[arg(short = 'k', long)]
    pub(crate) insecure: bool,

    /// https: verify the server against the CA certificates in this PEM file instead of the
    /// Mozilla root store.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub(crate) cacert: Option<PathBuf>,

    /// https: never resume a TLS session, so each new connection runs a full handshake (by
    /// default sessions are resumed, as browsers do).
    #[arg(long)]
    pub(crate) tls_no_resume: bool,

    /// A new connection for every request (`Connection: close`; HTTP/1.1 only): measures
    /// connection set-up and tear-down, as `ab` without `-k` does.
    #[arg(long)]
    pub(crate) no_keepalive: bool,

    /// Do not print the once-per-second progress line on stderr.
    #[arg(long)]
    pub(crate) no_progress: bool,

    /// ws:// and wss://: bytes per message (echoed by the server; --pipeline in flight).
    #[arg(long, value_name = "BYTES", default_value_t = 32)]
    pub(crate) ws_size: usize,

    /// ws:// and wss://: binary messages instead of text.
    #[arg(long)]
    pub(crate) ws_binary: bool,

    /// ws:// and wss://: offer permessage-deflate.
    #[arg(long)]
    pub(crate) ws_deflate: bool,

    /// ws:// and wss://: broadcast mode: every connection listens; the first also publishes
    /// --rate messages a second (1,000 by default) stamped with their send time, which the
    /// server's route must send to every connection. Each delivery counts, with its latency.
    #[arg(long)]
    pub(crate) ws_broadcast: bool,
}

impl LoadArgs {
    pub(crate) fn options(self) -> LoadOptions {
        let mut o = LoadOptions::new(self.url);
        o.connections = self.connections;
        o.threads = self.threads;
        o.duration = self.duration;
        o.requests = self.requests;
        o.pipeline = self.pipeline;
        o.streams = self.streams;
        o.rate = self.rate;
        o.h3 = self.h3;
        o.method = self.method;
        o.headers = self.headers;
        o.body = self.body;
        o.body_file = self.body_file;
        o.timeout = self.timeout;
        o.warmup = self.warmup;
        o.json = self.json;
        o.insecure = self.insecure;
        o.cacert = self.cacert;
        o.tls_no_resume = self.tls_no_resume;
        o.no_keepalive = self.no_keepalive;
        o.no_progress = self.no_progress;
        o.ws_size = self.ws_size;
        o.ws_binary = self.ws_binary;
        o.ws_deflate = self.ws_deflate;
        o.ws_broadcast = self.ws_broadcast;
        o
    }
}

/// CLI arguments of `canter send`.
#[derive(clap::Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct SendArgs {
    /// Generate the records instead of reading them from a file.
    #[command(subcommand)]
    pub(crate) generate: Option<Generate>,
    /// Where to send (a framed TCP source).
    #[arg(long, required = true)]
    pub(crate) to: Option<SocketAddr>,
    /// Framed records to send (4-byte big-endian length, then the record; as `canter receive
    /// --out` writes them).
    #[arg(long, value_name = "FILE", required = true)]
    pub(crate) file: Option<PathBuf>,
    /// Records per second (default: as fast as the connection takes them).
    #[arg(long, value_name = "N")]
    pub(crate) rate: Option<f64>,
    /// Records per write.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) batch: usize,
    /// Start over at the end of the file (until --duration).
    #[arg(long)]
    pub(crate) repeat: bool,
    /// Stop after this long (`30s`).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Largest record accepted in the file.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME)]
    pub(crate) max_frame: usize,
    /// Speak the resend protocol as stream ID (not 0) to a checkpointing pipeline: keep what
    /// was sent until a checkpoint acknowledges it; after a lost connection (the pipeline
    /// restarted, say) connect again and send from where the pipeline says; at the end, wait
    /// for the last record's acknowledgement.
    #[arg(long, value_name = "ID")]
    pub(crate) resend: Option<u64>,
    /// With --resend: how long to keep trying to reach the pipeline again, and to wait at the
    /// end for the acknowledgement.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) reconnect_for: Duration,
}

/// Record generators of `canter send`.
#[derive(clap::Subcommand, Debug, Clone)]
pub(crate) enum Generate {
    /// Market Spread's NBBO and order streams (half each), sent to the two sources and/or
    /// written with the expected results to --write-dir.
    MarketSpread(canter_cli::market_spread::SendArgs),
}

impl SendArgs {
    /// The options of a send from a file; `None` without --to and --file (clap requires them
    /// unless a generator is named).
    pub(crate) fn options(&self) -> Option<SendOptions> {
        let (to, file) = (self.to?, self.file.clone()?);
        let mut o = SendOptions::new(to, file);
        o.rate = self.rate;
        o.batch = self.batch;
        o.repeat = self.repeat;
        o.duration = self.duration;
        o.max_frame = self.max_frame;
        o.resend = self.resend;
        o.reconnect_for = self.reconnect_for;
        Some(o)
    }
}

/// CLI arguments of `canter receive`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ReceiveArgs {
    /// Address to listen on (port 0 picks a free one; the address is printed on stderr).
    #[arg(long)]
    pub(crate) listen: SocketAddr,
    /// Exit when this many records have arrived.
    #[arg(long, value_name = "N")]
    pub(crate) expect: Option<u64>,
    /// Stop after this long (`30s`, `500ms`) even if --expect was not reached (exit status 1).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Print the final report as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Append every record to FILE as it arrives, framed as received (written whenever the
    /// connections go quiet and at least once a second, and on every way out: --expect,
    /// --duration, SIGINT, SIGTERM).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// Where each record's timestamp starts (u64 big-endian, ns since the Unix epoch); negative
    /// counts from the record's end (-8: its last 8 bytes).
    #[arg(long, default_value_t = -8, allow_hyphen_values = true)]
    pub(crate) timestamp_offset: i64,
    /// Largest record accepted; a larger frame closes its connection with an error.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME)]
    pub(crate) max_frame: usize,
    /// A line of throughput and latency on stderr this often (`1s`; `0s`: none).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) interval: Duration,
    /// The records carry a checkpointing pipeline's sequence header: drop and count repeats
    /// (results made again after a restart), acknowledge what arrives (so that the sink sends
    /// again what a lost connection dropped), and write the records to --out without their
    /// headers. --expect counts records kept.
    #[arg(long)]
    pub(crate) dedupe: bool,
}

impl ReceiveArgs {
    pub(crate) fn options(&self) -> ReceiveOptions {
        let mut o = ReceiveOptions::new(self.listen);
        o.expect = self.expect;
        o.duration = self.duration;
        o.out = self.out.clone();
        o.timestamp_offset = self.timestamp_offset;
        o.max_frame = self.max_frame;
        o.interval = self.interval;
        o.dedupe = self.dedupe;
        o
    }
}

/// A duration flag whose bare number is milliseconds (`5000`, as before units were taken);
/// with a unit, as [`parse_duration`] reads it.
pub(crate) fn millis(input: &str) -> Result<Duration, canter_load::DurationError> {
    bare_in(input, Duration::from_millis)
}

/// A duration flag whose bare number is microseconds; with a unit, as [`parse_duration`].
pub(crate) fn micros(input: &str) -> Result<Duration, canter_load::DurationError> {
    bare_in(input, Duration::from_micros)
}

fn bare_in(input: &str, unit: fn(u64) -> Duration) -> Result<Duration, canter_load::DurationError> {
    match input.trim().parse::<u64>() {
        Ok(n) => Ok(unit(n)),
        Err(_) => parse_duration(input),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_bare_number_keeps_the_flags_unit_and_a_unit_is_honoured() {
        assert_eq!(millis("5000").unwrap(), Duration::from_secs(5));
        assert_eq!(millis("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(micros("50").unwrap(), Duration::from_micros(50));
        assert_eq!(micros("1ms").unwrap(), Duration::from_millis(1));
        assert!(millis("5 parsecs").is_err());
        assert!(micros("-1").is_err());
    }
}
