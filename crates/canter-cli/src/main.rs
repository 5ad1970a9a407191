//! The `canter` command: `canter serve` runs the demo app, `canter load` generates load.

use std::fmt;
use std::io::{self, IsTerminal};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use canter::middleware::{AccessLog, Metrics, RequestId};
use clap::{Parser, Subcommand};

mod args;
mod demo;
mod techempower;

use args::{micros, millis, Generate, LoadArgs, ReceiveArgs, SendArgs};
use canter_cli::market_spread;
use canter_load::parse_duration;

#[derive(Parser)]
#[command(name = "canter", version, about = "Fast, strict HTTP server toolkit")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the built-in demo app.
    Serve(ServeArgs),
    /// Generate HTTP load against a server and report throughput and latency.
    Load(LoadArgs),
    /// Send framed records from a file to a stream pipeline's source, paced.
    Send(SendArgs),
    /// Accept a stream pipeline's sink connection and report count, throughput and latency.
    Receive(ReceiveArgs),
    /// Run a stream pipeline application.
    Pipeline {
        /// The application.
        #[command(subcommand)]
        app: PipelineApp,
    },
    /// Create and fill the TechEmpower tables (world: 10,000 rows; fortune; and their copies
    /// "World" and "Fortune", as TechEmpower's own database has them) in a database.
    DbSetup(DbSetupArgs),
}

/// The stream pipeline applications.
#[derive(Subcommand)]
enum PipelineApp {
    /// Market Spread: NBBO quotes and orders in (framed TCP listeners, or Kafka topics with
    /// --kafka), a result record for every order rejected by its symbol's spread out (a TCP
    /// connection to --out, or a Kafka topic).
    MarketSpread(MarketSpreadPipelineArgs),
}

#[derive(clap::Args)]
struct MarketSpreadPipelineArgs {
    /// Where the NBBO source listens.
    #[arg(long, value_name = "ADDR", required_unless_present = "kafka")]
    nbbo: Option<SocketAddr>,
    /// Where the orders source listens.
    #[arg(long, value_name = "ADDR", required_unless_present = "kafka")]
    orders: Option<SocketAddr>,
    /// The receiver the results sink connects to (one connection per worker).
    #[arg(long, value_name = "ADDR", required_unless_present = "kafka")]
    out: Option<SocketAddr>,
    /// Read and write Kafka topics instead (brokers `host:port,...`): each worker is a member
    /// of the consumer group --group, and processes that share the group share the partitions.
    #[arg(long, value_name = "BOOTSTRAP", conflicts_with_all = ["nbbo", "orders", "out"], requires = "group")]
    kafka: Option<String>,
    /// The consumer group (with --kafka); also names the state's changelog topic
    /// (`GROUP-symbols-changelog`).
    #[arg(long, value_name = "ID")]
    group: Option<String>,
    /// The NBBO topic (with --kafka).
    #[arg(long, default_value = "nbbo")]
    nbbo_topic: String,
    /// The orders topic (with --kafka; as many partitions as the NBBO topic).
    #[arg(long, default_value = "orders")]
    orders_topic: String,
    /// The results topic (with --kafka).
    #[arg(long, default_value = "results")]
    results_topic: String,
    /// How often state, results and input offsets are committed (with --kafka).
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "100ms")]
    commit_interval: std::time::Duration,
    /// How long a result may wait for more to fill its batch (with --kafka).
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "5ms")]
    linger: std::time::Duration,
    /// Compression of the results and changelog batches (with --kafka): none, gzip, snappy,
    /// lz4, zstd.
    #[arg(long, default_value = "none")]
    compression: canter_kafka::Compression,
    /// The largest result record the output takes, key and value (with --kafka); a bigger
    /// one is refused, counted (`sink_refused`) and logged.
    #[arg(long, default_value_t = 1_000_000, value_name = "BYTES")]
    max_record: usize,
    /// The group's session timeout (with --kafka): how long after a process dies its
    /// partitions move to the others (set on the group at start, within the brokers'
    /// group.consumer.min/max.session.timeout.ms; default: the brokers' own).
    #[arg(long, value_parser = canter_load::parse_duration)]
    session_timeout: Option<std::time::Duration>,
    /// How long the brokers may be unreachable at start before the pipeline gives up (with
    /// --kafka).
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "30s")]
    bootstrap_timeout: std::time::Duration,
    /// Exactly-once output (with --kafka): results, changelog and input offsets of each commit
    /// interval committed in one Kafka transaction; readers with `read_committed` see every
    /// result once, whatever crashes.
    #[arg(long, requires = "kafka")]
    exactly_once: bool,
    /// This process's name among the job's processes (with --exactly-once; default: its
    /// pid): a process restarted with the same name aborts its predecessor's open
    /// transactions at once instead of after --transaction-timeout.
    #[arg(long, value_name = "NAME")]
    instance_id: Option<String>,
    /// How long a transaction may stay open before the brokers abort it (with
    /// --exactly-once): also how long the tasks of a process that died and was not restarted
    /// with its --instance-id wait.
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "10s")]
    transaction_timeout: std::time::Duration,
    /// After SIGINT or SIGTERM, how long the workers may take to commit and leave the group
    /// (with --kafka); past it they give up, saying what was not committed (its next owner
    /// repeats it), so brokers that do not answer cannot hold the process.
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "10s")]
    shutdown_timeout: std::time::Duration,
    /// Kafka client settings (with --kafka).
    #[command(flatten)]
    kafka_config: canter_cli::kafka_args::KafkaConfigArgs,
    /// Serve the live metrics page (/), /metrics (Prometheus) and /metrics.json here (with
    /// --kafka: /metrics and /metrics.json of the Kafka job's counters).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Worker threads (symbols are spread over them by a hash).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Pin worker i to CPU i.
    #[arg(long)]
    pin: bool,
    /// Source connections each worker holds at most (each may hold a frame's input); one over
    /// it is closed at once, with a warning.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    max_source_connections: usize,
    /// Bytes read from one source connection before the worker turns to its others and its
    /// sinks: smaller gives results sooner at high rates, larger fewer turns.
    #[arg(long, default_value_t = 1024 * 1024, value_name = "BYTES")]
    read_budget: usize,
    /// Checkpoint the symbols' state and the sources' positions into DIR (TCP pipelines),
    /// and restore the latest complete checkpoint there at start. Senders that speak the
    /// resend protocol (`canter send --resend`) then lose nothing in a crash, and results carry
    /// sequence numbers (`canter receive --dedupe` drops the repeats).
    #[arg(long, value_name = "DIR", conflicts_with = "kafka")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Time between checkpoints (with --checkpoint-dir).
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "1s")]
    checkpoint_interval: std::time::Duration,
    /// Checkpoints kept restorable (with --checkpoint-dir).
    #[arg(long, default_value_t = 3, value_name = "N")]
    checkpoint_keep: usize,
}

#[derive(clap::Args)]
struct DbSetupArgs {
    /// The database, as a connection string (postgres://user:password@host:port/dbname).
    #[arg(long)]
    db: String,
}

/// The application `canter serve` runs.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AppKind {
    /// The demo app (routes listed at /).
    Demo,
    /// The TechEmpower benchmark app: /plaintext, /json, /db, /queries, /fortunes, /updates,
    /// /cached-queries over PostgreSQL (needs --db).
    Techempower,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The application to serve.
    #[arg(long, value_enum, default_value = "demo")]
    app: AppKind,
    /// PostgreSQL connection string for --app techempower
    /// (postgres://user:password@host:port/dbname).
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// Database connections each worker opens.
    #[arg(long, value_name = "N", default_value_t = 2)]
    db_connections: usize,
    /// How long a database query may take before the request is answered 503 (`5s`, `500ms`;
    /// a bare number is milliseconds).
    #[arg(long, value_name = "TIME", value_parser = millis, default_value = "5000")]
    db_query_timeout: Duration,
    /// How long connecting to the database may take (a bare number is milliseconds).
    #[arg(long, value_name = "TIME", value_parser = millis, default_value = "3000")]
    db_connect_timeout: Duration,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Worker threads (event loops); default: one per core.
    #[arg(long)]
    workers: Option<usize>,
    /// Pin worker i to CPU i.
    #[arg(long)]
    pin: bool,
    /// How long a keep-alive connection may stay idle (`60s`, `2m`; a bare number is seconds,
    /// as in every flag that is a time unless its help says otherwise).
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "60s")]
    idle_timeout: Duration,
    /// Expect a PROXY protocol header (v1 or v2, from HAProxy or a cloud load balancer) at the
    /// start of every connection; the client it names is the peer for handlers and logs.
    #[arg(long)]
    proxy_protocol: bool,
    /// With --proxy-protocol: accept headers only from this source (an address or a block such as
    /// 10.0.0.0/8; repeat for several). Without it, any source may send one.
    #[arg(long, value_name = "CIDR", requires = "proxy_protocol")]
    proxy_from: Vec<canter_rt::proxy::Cidr>,
    /// Client faults (bad requests, timeouts, resets, failed handshakes) are logged one by one at
    /// debug; at info, one line every TIME counts them by kind (0: no summary).
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "10s")]
    fault_log_interval: Duration,
    /// How long a client may take to send a request head.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "10s")]
    head_timeout: Duration,
    /// How long a request body may go without progress.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "30s")]
    body_timeout: Duration,
    /// Maximum size of the request header section, in bytes.
    #[arg(long, default_value_t = 16 * 1024)]
    max_head: usize,
    /// Maximum number of request header fields.
    #[arg(long, default_value_t = 100)]
    max_headers: usize,
    /// Maximum request target length, in bytes.
    #[arg(long, default_value_t = 8 * 1024)]
    max_target: usize,
    /// Pipelined requests answered per connection turn before flushing and yielding.
    #[arg(long, default_value_t = 64)]
    max_pipeline: usize,
    /// Event coalescing: a busy worker that runs out of work sleeps this long (`50us`; a bare
    /// number is microseconds) before it waits for events, so that what arrives meanwhile is
    /// taken in one turn, without a wake-up from the process that sent it (a database above
    /// all). Adds up to that, plus the kernel's timer slack, to each turn's latency. 0: off.
    #[arg(long, value_name = "TIME", value_parser = micros, default_value = "0")]
    coalesce: Duration,
    /// How long a handler may run before the request is answered 503.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "60s")]
    handler_timeout: Duration,
    /// How long a response may wait for the client to read before the connection is closed.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "30s")]
    write_timeout: Duration,
    /// Minimum request body data rate in bytes/s, after a 5 s grace (0: off).
    #[arg(long, default_value_t = 240)]
    min_body_rate: u64,
    /// Maximum request body size, in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    max_body: u64,
    /// Connections per worker before new ones wait in the backlog.
    #[arg(long, default_value_t = 65_536)]
    max_connections: usize,
    /// Let a client that half-closes while its handler is pending still get the answer (by
    /// default the handler is cancelled and the connection closed).
    #[arg(long)]
    half_close: bool,
    /// Accept a connection as soon as it is made, instead of once its first bytes have arrived
    /// (TCP_DEFER_ACCEPT, on by default: a client silent for about a second is handed over
    /// then).
    #[arg(long)]
    no_defer_accept: bool,
    /// Share the port with another process already listening on it (SO_REUSEPORT), for a
    /// deliberate hand-over from an old server to a new one. Without it a port in use is
    /// refused at start ("address in use"), as nginx refuses it.
    #[arg(long)]
    reuse_port: bool,
    /// Log every request (target `canter::access`) and give each one an `x-request-id`.
    #[arg(long)]
    access_log: bool,
    /// Record request metrics and serve them for Prometheus at `/metrics`.
    #[arg(long)]
    metrics: bool,
    /// Serve the files under DIR at /static/ (ETag, ranges, precompressed .br/.gz siblings).
    #[arg(long = "static", value_name = "DIR")]
    static_dir: Option<PathBuf>,
    /// How long caches may use a --static file without asking again (Cache-Control max-age);
    /// 0 sends no-cache (revalidate each time, a 304 by ETag). Names with a content hash
    /// (app.3f9a2c1e.js) get a year and immutable either way.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "0")]
    static_max_age: Duration,
    /// Compress responses (zstd, br or gzip, as the client accepts) of text types from 1 KiB;
    /// --static files too, from a cache of compressed copies, when they have no .zst, .br or .gz
    /// sibling.
    #[arg(long)]
    compress: bool,
    /// Also serve over TLS (HTTPS) on this address; needs --tls-cert/--tls-key or
    /// --tls-self-signed.
    #[arg(long, value_name = "ADDR")]
    tls_addr: Option<SocketAddr>,
    /// Certificate chain (PEM, leaf first); repeat with --tls-key for several names (SNI picks
    /// one; the first is the default).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Vec<PathBuf>,
    /// Private key (PEM) of the --tls-cert at the same position.
    #[arg(long, value_name = "FILE")]
    tls_key: Vec<PathBuf>,
    /// Generate a development certificate for localhost and 127.0.0.1 at start (its SHA-256
    /// fingerprint is logged).
    #[arg(long, conflicts_with = "tls_cert")]
    tls_self_signed: bool,
    /// Also serve HTTP/3 (QUIC) on the --tls-addr port number over UDP, and advertise it to
    /// HTTP/1.1 and HTTP/2 clients over TLS with `Alt-Svc: h3=":PORT"; ma=86400`.
    #[arg(long, requires = "tls_addr")]
    h3: bool,
    /// HTTP/3: take 0-RTT data from clients resuming a session; requests in it are served only
    /// for safe methods (GET, HEAD, OPTIONS), others answered 425 Too Early (replays).
    #[arg(long, requires = "h3")]
    h3_early_data: bool,
    /// How long a client may take to complete the TLS handshake.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "10s")]
    tls_handshake_timeout: Duration,
    /// Require client certificates signed by a CA in this PEM bundle.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// WebSocket: the largest message, all its fragments (and, compressed, what it inflates
    /// to) together, in bytes; larger ones close with 1009.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    ws_max_message: usize,
    /// WebSocket: the largest frame payload, in bytes (1009 above it).
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    ws_max_frame: u64,
    /// WebSocket: bytes all connections of a worker may hold at once in messages still being
    /// assembled; a message that would go past it closes its connection with 1013.
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    ws_worker_budget: usize,
    /// WebSocket: bytes of received messages held for a handler before reading pauses.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    ws_read_buffer: usize,
    /// WebSocket: output bytes queued per connection at which a handler's send waits.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    ws_high_water: usize,
    /// WebSocket: a ping goes out after this long without input (0: no pings).
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "30s")]
    ws_ping_interval: Duration,
    /// WebSocket: input must arrive within this long after a ping, or the connection closes.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "20s")]
    ws_ping_timeout: Duration,
    /// WebSocket: how long the peer has to answer this end's close.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, default_value = "5s")]
    ws_close_timeout: Duration,
    /// WebSocket: decline permessage-deflate (compression) when a client offers it.
    #[arg(long)]
    ws_no_deflate: bool,
}

/// The demo's WebSocket settings from `canter serve`'s `--ws-*` flags.
fn ws_config(args: &ServeArgs) -> canter_rt::ws::WsConfig {
    let mut ws = canter_rt::ws::WsConfig::default();
    ws.limits.max_message = args.ws_max_message;
    ws.limits.max_frame = args.ws_max_frame;
    ws.worker_budget = args.ws_worker_budget;
    ws.read_buffer = args.ws_read_buffer;
    ws.high_water = args.ws_high_water;
    ws.ping_interval = (!args.ws_ping_interval.is_zero()).then_some(args.ws_ping_interval);
    ws.ping_timeout = args.ws_ping_timeout;
    ws.close_timeout = args.ws_close_timeout;
    if args.ws_no_deflate {
        ws.deflate = None;
    }
    ws
}

/// Log lines are coloured on a terminal only, and not where `NO_COLOR` is set (no-color.org).
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(canter::rt::LogStderr::default)
        .log_internal_errors(false)
        .with_ansi(colour())
        .finish();
    // Nothing else set either yet: neither can fail here.
    let _ = tracing::subscriber::set_global_default(subscriber);
    let _ = canter::rt::route_log_records();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args).map_err(CliError::Serve),
        Command::Load(args) => canter_load::run(args.options())
            .map(|_| ())
            .map_err(CliError::Load),
        Command::DbSetup(args) => db_setup(&args).map_err(CliError::DbSetup),
        Command::Send(args) => send(&args),
        Command::Receive(args) => receive(&args),
        Command::Pipeline {
            app: PipelineApp::MarketSpread(args),
        } => market_spread(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("canter: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why a command failed.
#[derive(Debug)]
enum CliError {
    Serve(ServeError),
    Load(canter_load::LoadError),
    DbSetup(DbSetupError),
    /// `canter send` (or `send market-spread`, the first field says which) failed.
    Send(&'static str, canter_stream::send::SendError),
    /// `canter receive` failed.
    Receive(io::Error),
    /// `canter receive --expect N` saw fewer records than N.
    ReceivedTooFew(u64),
    /// `canter pipeline market-spread`: what failed, and why.
    Pipeline(&'static str, io::Error),
    /// `canter send market-spread --kafka`: what failed.
    SendKafka(canter_kafka::Error),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Serve(e) => e.fmt(f),
            CliError::Load(e) => e.fmt(f),
            CliError::DbSetup(e) => write!(f, "db-setup: {e}"),
            CliError::Send(what, e) => write!(f, "{what}: {e}"),
            CliError::Receive(e) => write!(f, "receive: {e}"),
            CliError::ReceivedTooFew(n) => {
                write!(f, "receive: {n} records arrived, fewer than --expect")
            }
            CliError::Pipeline(what, e) => write!(f, "pipeline market-spread: {what}: {e}"),
            CliError::SendKafka(e) => write!(f, "send market-spread --kafka: {e}"),
        }
    }
}

/// Why `canter db-setup` failed.
#[derive(Debug)]
enum DbSetupError {
    /// The URL does not parse.
    Url(canter::db::DbError),
    /// The event loop could not be built.
    Runtime(io::Error),
    /// Connecting, creating or filling the tables failed.
    Setup(tokio_postgres::Error),
}

impl fmt::Display for DbSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbSetupError::Url(e) => e.fmt(f),
            DbSetupError::Runtime(e) => e.fmt(f),
            DbSetupError::Setup(e) => e.fmt(f),
        }
    }
}

/// Why `canter serve` could not start or stopped with an error.
#[derive(Debug)]
enum ServeError {
    /// Flags that do not go together.
    Usage(&'static str),
    /// `--static` names something that is not a directory.
    NotADirectory(PathBuf),
    /// The TLS settings could not be loaded.
    Tls(SocketAddr, canter_rt::TlsError),
    /// The database settings do not parse.
    Db(canter::db::DbError),
    /// A setting is out of its range.
    Config(canter_rt::ConfigError),
    /// Binding the listeners failed.
    Listen(SocketAddr, io::Error),
    /// Installing the signal handlers or running the workers failed.
    Runtime(io::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Usage(message) => f.write_str(message),
            ServeError::NotADirectory(dir) => {
                write!(f, "--static {}: not a directory", dir.display())
            }
            ServeError::Db(e) => write!(f, "--db: {e}"),
            ServeError::Tls(addr, e) => write!(f, "--tls-addr {addr}: {e}"),
            ServeError::Config(e) => e.fmt(f),
            ServeError::Listen(addr, e) => write!(f, "cannot listen on {addr}: {e}"),
            ServeError::Runtime(e) => e.fmt(f),
        }
    }
}

/// `canter send`: the report on stdout (JSON with --json).
fn send(args: &SendArgs) -> Result<(), CliError> {
    if let Some(Generate::MarketSpread(ms)) = &args.generate {
        if let Some(bootstrap) = &ms.kafka {
            if ms.write_dir.is_some() {
                market_spread::send(ms).map_err(|e| CliError::Send("send market-spread", e))?;
            }
            return send_market_spread_kafka(ms, bootstrap);
        }
        let report =
            market_spread::send(ms).map_err(|e| CliError::Send("send market-spread", e))?;
        match ms.json {
            true => println!("{}", serde_json::json!(report)),
            false => {
                for (name, r) in [("NBBO", &report.nbbo), ("order", &report.orders)] {
                    if let Some(r) = r {
                        println!(
                            "sent {} {name} records in {:.2} s ({:.0}/s), furthest behind \
                             schedule {:.1} ms",
                            r.records, r.seconds, r.rate, r.max_lag_ms
                        );
                    }
                }
                println!("{} results expected", report.expected_results);
            }
        }
        return Ok(());
    }
    let Some(options) = args.options() else {
        let usage = canter_stream::send::SendError::Usage("give --to and --file");
        return Err(CliError::Send("send", usage));
    };
    let report = canter_stream::send::run(&options).map_err(|e| CliError::Send("send", e))?;
    match args.json {
        true => println!("{}", serde_json::json!(report)),
        false => println!(
            "sent {} records in {:.2} s ({:.0}/s), furthest behind schedule {:.1} ms; {} \
             reconnects, {} records resent, {} acknowledged",
            report.records,
            report.seconds,
            report.rate,
            report.max_lag_ms,
            report.reconnects,
            report.resent,
            report.acked
        ),
    }
    Ok(())
}

/// `canter receive`: the report on stdout (JSON with --json); fails when --expect was not met.
fn receive(args: &ReceiveArgs) -> Result<(), CliError> {
    let r = canter_stream::receive::run(&args.options()).map_err(CliError::Receive)?;
    match args.json {
        true => println!("{}", serde_json::json!(r)),
        false => println!(
            "received {} records ({} bytes) in {:.2} s ({:.0}/s) on {} connections; latency \
             p50 {:.1} us, p99 {:.1} us, p99.99 {:.1} us, max {:.1} us ({} records without a \
             timestamp); {} frame errors; {} repeats dropped",
            r.records,
            r.bytes,
            r.seconds,
            r.rate,
            r.connections,
            r.latency_us.p50,
            r.latency_us.p99,
            r.latency_us.p9999,
            r.latency_us.max,
            r.no_timestamp,
            r.frame_errors,
            r.repeats
        ),
    }
    match r.complete {
        true => Ok(()),
        false => Err(CliError::ReceivedTooFew(r.records)),
    }
}

/// Serves a pipeline's metrics on `addr` from a thread of its own: `/metrics` (Prometheus
/// text), `/metrics.json`, and the live page at `/` if given. Returns the server's shutdown
/// handle and its thread.
fn serve_metrics(
    addr: SocketAddr,
    page: Option<&'static str>,
    text: impl Fn() -> String + Clone + Send + Sync + 'static,
    json: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> Result<
    (
        canter_rt::ShutdownHandle,
        std::thread::JoinHandle<io::Result<()>>,
    ),
    CliError,
> {
    use canter_rt::http::{header::CONTENT_TYPE, HeaderValue, StatusCode};
    let fail = CliError::Pipeline;
    let config = canter_rt::Config::builder()
        .addr(addr)
        .workers(1)
        .build()
        .map_err(|e| fail("metrics listener", e.into()))?;
    let server = canter_rt::Server::bind(config).map_err(|e| fail("metrics listener", e))?;
    tracing::info!("pipeline metrics on http://{}/", server.local_addr());
    let handle = server.shutdown_handle();
    let reply = |kind: &'static str, body: String| {
        canter_rt::Response::new(StatusCode::OK)
            .with_header(CONTENT_TYPE, HeaderValue::from_static(kind))
            .with_body(body)
    };
    let thread = std::thread::Builder::new()
        .name("canter-metrics-http".into())
        .spawn(move || {
            server.serve(move |_worker| {
                let (text, json) = (text.clone(), json.clone());
                let mut router = canter::Router::new()
                    .route(
                        "/metrics",
                        canter::get(move || reply("text/plain; version=0.0.4", text())),
                    )
                    .route(
                        "/metrics.json",
                        canter::get(move || reply("application/json", json())),
                    );
                if let Some(page) = page {
                    router = router.route(
                        "/",
                        canter::get(move || reply("text/html; charset=utf-8", page.to_owned())),
                    );
                }
                router
            })
        })
        .map_err(|e| fail("metrics thread", e))?;
    Ok((handle, thread))
}

/// `canter send market-spread --kafka`: produces the generated inputs to their topics.
fn send_market_spread_kafka(
    ms: &canter_cli::market_spread::SendArgs,
    bootstrap: &str,
) -> Result<(), CliError> {
    use canter_cli::market_spread_kafka::{send, KafkaSend};
    let job = KafkaSend {
        bootstrap: bootstrap.to_owned(),
        nbbo_topic: ms.nbbo_topic.clone(),
        orders_topic: ms.orders_topic.clone(),
        results_topic: ms.results_topic.clone(),
        partitions: ms.create_topics,
        replication: ms.replication,
        symbols: ms.symbols,
        reject_share: ms.reject_share,
        count: ms.count,
        rate: ms.rate,
        seed: ms.seed,
        settings: ms.kafka_config.settings().map_err(CliError::SendKafka)?,
        bootstrap_timeout: ms.bootstrap_timeout,
        delivery_timeout: ms.delivery_timeout,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::SendKafka(canter_kafka::Error::Io(e)))?;
    let report = rt.block_on(send(&job)).map_err(CliError::SendKafka)?;
    match ms.json {
        true => println!("{}", serde_json::json!(report)),
        false => println!(
            "produced {} NBBO and {} order records in {:.2} s; {} results expected",
            report.nbbo, report.orders, report.seconds, report.expected_results
        ),
    }
    Ok(())
}

/// `canter pipeline market-spread --kafka`: runs Market Spread on Kafka topics until SIGINT or
/// SIGTERM.
fn market_spread_kafka(args: &MarketSpreadPipelineArgs, bootstrap: &str) -> Result<(), CliError> {
    use canter_stream::kafka::{start, KafkaJob, Stats};
    let fail =
        |what, e: canter_kafka::Error| CliError::Pipeline(what, io::Error::other(e.to_string()));
    let Some(group) = args.group.as_deref() else {
        return Err(CliError::Pipeline(
            "usage",
            io::Error::other("--kafka needs --group"),
        ));
    };
    let mut job = KafkaJob::new(
        bootstrap,
        group,
        &[&args.nbbo_topic, &args.orders_topic],
        &args.results_topic,
    );
    job.state_name = "symbols".into();
    job.workers = args.workers;
    job.pin = args.pin;
    job.commit_interval = args.commit_interval;
    job.linger = args.linger;
    job.compression = args.compression;
    job.bootstrap_timeout = args.bootstrap_timeout;
    job.session_timeout = args.session_timeout;
    job.max_record = args.max_record;
    job.exactly_once = args.exactly_once;
    if let Some(id) = &args.instance_id {
        job.instance_id = id.clone();
    }
    job.transaction_timeout = args.transaction_timeout;
    job.shutdown_timeout = args.shutdown_timeout;
    let settings = args
        .kafka_config
        .settings()
        .map_err(|e| fail("settings", e))?;
    job.configure(&settings).map_err(|e| fail("settings", e))?;
    let running = start(job, canter_cli::market_spread_kafka::MarketSpreadTask)
        .map_err(|e| fail("start", e))?;
    let stats = running.stats();
    let stop = running.stopper();
    let http = match args.metrics {
        Some(addr) => {
            let (text, json) = (stats.clone(), stats.clone());
            Some(serve_metrics(
                addr,
                None,
                move || text.prometheus(),
                move || json.json(),
            )?)
        }
        None => None,
    };
    let http_stop = http.as_ref().map(|(h, _)| h.clone());
    canter_rt::on_signals(move || {
        tracing::info!("shutting down: committing and leaving the group");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = http_stop {
            h.shutdown();
        }
    })
    .map_err(|e| CliError::Pipeline("signals", e))?;
    // Tests wait for this line.
    tracing::info!(
        workers = args.workers,
        group,
        "canter pipeline market-spread: Kafka {bootstrap}, {} and {} in, {} out",
        args.nbbo_topic,
        args.orders_topic,
        args.results_topic
    );
    let result = running.wait();
    if let Some((handle, thread)) = http {
        handle.shutdown();
        let _ = thread.join();
    }
    tracing::info!(
        records_in = Stats::get(&stats.records_in),
        records_out = Stats::get(&stats.records_out),
        refused = Stats::get(&stats.refused),
        sink_refused = Stats::get(&stats.sink_refused),
        commits = Stats::get(&stats.commits),
        changelog_out = Stats::get(&stats.changelog_out),
        restored = Stats::get(&stats.restored),
        broker_errors = Stats::get(&stats.broker_errors),
        transactions = Stats::get(&stats.transactions),
        aborts = Stats::get(&stats.aborts),
        "pipeline stopped"
    );
    result.map_err(|e| CliError::Pipeline("workers", e))
}

/// `canter pipeline market-spread`: runs the Market Spread topology until SIGINT or SIGTERM.
fn market_spread(args: &MarketSpreadPipelineArgs) -> Result<(), CliError> {
    use canter_stream::pipeline::{RunOptions, Source, METRICS_PAGE};
    if let Some(bootstrap) = &args.kafka {
        return market_spread_kafka(args, bootstrap);
    }
    let fail = CliError::Pipeline;
    let (Some(nbbo), Some(orders), Some(out)) = (args.nbbo, args.orders, args.out) else {
        return Err(fail(
            "usage",
            io::Error::other("give --nbbo, --orders and --out, or --kafka"),
        ));
    };
    let topology = market_spread::topology(
        Source::tcp(nbbo),
        Source::tcp(orders),
        market_spread::tcp_results(out),
    );
    let mut options = RunOptions::default()
        .workers(args.workers)
        .pin(args.pin)
        .max_source_connections(args.max_source_connections)
        .read_budget(args.read_budget);
    if let Some(dir) = &args.checkpoint_dir {
        options = options.checkpoint(
            canter_stream::pipeline::CheckpointOptions::new(dir)
                .interval(args.checkpoint_interval)
                .keep(args.checkpoint_keep),
        );
    }
    let running = topology.start(options).map_err(|e| fail("start", e))?;
    let metrics = running.metrics();
    let mut http = None;
    if let Some(addr) = args.metrics {
        let (text, json) = (metrics.clone(), metrics.clone());
        http = Some(serve_metrics(
            addr,
            Some(METRICS_PAGE),
            move || text.prometheus(),
            move || json.json(),
        )?);
    }
    let http_stop = http.as_ref().map(|(h, _)| h.clone());
    running
        .shutdown_handle()
        .on_signals(move || {
            if let Some(h) = http_stop {
                h.shutdown();
            }
        })
        .map_err(|e| fail("signals", e))?;
    // Tests wait for this line.
    tracing::info!(
        workers = args.workers,
        "canter pipeline market-spread: NBBO on {}, orders on {}, results to {}",
        running
            .source_addr("nbbo")
            .map_or("?".into(), |a| a.to_string()),
        running
            .source_addr("orders")
            .map_or("?".into(), |a| a.to_string()),
        out
    );
    let result = running.wait();
    if let Some((handle, thread)) = http {
        handle.shutdown();
        let _ = thread.join();
    }
    for name in metrics.pipelines() {
        if let Some(t) = metrics.totals(name) {
            tracing::info!(
                pipeline = name,
                records_in = t.source_records,
                records_out = t.sink_records,
                rejected_input = t.rejected_input,
                frame_errors = t.frame_errors,
                "pipeline stopped"
            );
        }
    }
    if args.checkpoint_dir.is_some() {
        let c = metrics.checkpoints();
        tracing::info!(
            completed = c.completed,
            failed = c.failed,
            last_epoch = c.last_epoch,
            restored_epoch = c.restored_epoch,
            "checkpoints"
        );
    }
    result.map_err(|e| fail("workers", e))
}

/// `canter db-setup`: creates and fills the TechEmpower tables.
fn db_setup(args: &DbSetupArgs) -> Result<(), DbSetupError> {
    let config = canter::db::DbConfig::new(&args.db).map_err(DbSetupError::Url)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DbSetupError::Runtime)?;
    rt.block_on(techempower::setup(&config))
        .map_err(DbSetupError::Setup)?;
    tracing::info!(
        db = config.dbname(),
        "created the world and fortune tables (and \"World\" and \"Fortune\")"
    );
    Ok(())
}

/// The per-worker database settings of `--app techempower`.
fn db_config(
    args: &ServeArgs,
) -> Result<
    (
        std::sync::Arc<canter::db::DbConfig>,
        techempower::Statements,
    ),
    ServeError,
> {
    let Some(url) = &args.db else {
        return Err(ServeError::Usage("--app techempower needs --db URL"));
    };
    let mut config = canter::db::DbConfig::new(url)
        .map_err(ServeError::Db)?
        .connections(args.db_connections)
        .query_timeout(args.db_query_timeout)
        .connect_timeout(args.db_connect_timeout);
    let statements = techempower::Statements::prepare(&mut config);
    Ok((std::sync::Arc::new(config), statements))
}

/// Builds the TLS settings the flags ask for (none without `--tls-addr`).
fn tls_acceptor(args: &ServeArgs) -> Result<Option<canter_rt::TlsAcceptor>, ServeError> {
    let Some(addr) = args.tls_addr else {
        if !args.tls_cert.is_empty() || args.tls_self_signed {
            return Err(ServeError::Usage(
                "--tls-cert and --tls-self-signed need --tls-addr",
            ));
        }
        return Ok(None);
    };
    if args.tls_cert.len() != args.tls_key.len() {
        return Err(ServeError::Usage("give one --tls-key for each --tls-cert"));
    }
    let mut tls = canter_rt::ServerTls::new().handshake_timeout(args.tls_handshake_timeout);
    for (cert, key) in args.tls_cert.iter().zip(&args.tls_key) {
        tls = tls.cert(cert, key);
    }
    if args.tls_self_signed {
        tls = tls.self_signed();
    }
    if let Some(ca) = &args.tls_client_ca {
        tls = tls.client_ca(ca);
    }
    tls.build().map(Some).map_err(|e| ServeError::Tls(addr, e))
}

fn serve(args: ServeArgs) -> Result<(), ServeError> {
    if let Err(e) = canter_rt::raise_open_files_limit() {
        tracing::warn!(error = %e, "could not raise the open files limit");
    }
    let timeouts = canter_rt::Timeouts::builder()
        .idle(args.idle_timeout)
        .head(args.head_timeout)
        .body(args.body_timeout)
        .write(args.write_timeout)
        .build()
        .map_err(ServeError::Config)?;
    let limits = canter_rt::Limits::builder()
        .max_head(args.max_head)
        .max_body(args.max_body)
        .max_headers(args.max_headers)
        .max_target(args.max_target)
        .build()
        .map_err(ServeError::Config)?;
    let mut config = canter_rt::Config::builder()
        .addr(args.addr)
        .pin_workers(args.pin)
        .timeouts(timeouts)
        .limits(limits)
        .fault_log_interval(args.fault_log_interval)
        .max_pipeline(args.max_pipeline)
        .min_body_rate(args.min_body_rate)
        .handler_timeout(args.handler_timeout)
        .max_connections(args.max_connections)
        .half_close(args.half_close)
        .defer_accept(!args.no_defer_accept)
        .reuse_port(args.reuse_port);
    if let Some(n) = args.workers {
        config = config.workers(n);
    }
    if !args.coalesce.is_zero() {
        config = config.coalesce(Some(args.coalesce));
    }
    if args.proxy_protocol {
        let pp = canter_rt::proxy::ProxyProtocol::builder()
            .from(args.proxy_from.clone())
            .build()
            .map_err(ServeError::Config)?;
        config = config.proxy_protocol(Some(pp));
    }
    let acceptor = tls_acceptor(&args)?;
    if let (Some(addr), Some(acceptor)) = (args.tls_addr, &acceptor) {
        config = config.tls(Some(canter_rt::TlsListener {
            addr,
            acceptor: acceptor.clone(),
        }));
    }
    let config = config
        .http3(args.h3)
        .http3_early_data(args.h3_early_data)
        .build()
        .map_err(ServeError::Config)?;
    let workers = config.workers();
    let database = match args.app {
        AppKind::Techempower => Some(db_config(&args)?),
        AppKind::Demo => None,
    };
    let files = match &args.static_dir {
        Some(dir) if dir.is_dir() => {
            let files = canter::ServeDir::new(dir).max_age(args.static_max_age);
            Some(match args.compress {
                true => files.compress(canter::StaticCompression::new(
                    canter::middleware::Compression::new(),
                )),
                false => files,
            })
        }
        Some(dir) => return Err(ServeError::NotADirectory(dir.clone())),
        None => None,
    };
    let server = canter_rt::Server::bind(config).map_err(|e| ServeError::Listen(args.addr, e))?;
    // Big messages' and bodies' memory goes back once they are done with.
    canter_rt::map_large_blocks();
    canter_rt::shutdown_on_signals(server.shutdown_handle()).map_err(ServeError::Runtime)?;
    if let Some(acceptor) = &acceptor {
        canter_rt::reload_on_sighup(acceptor.clone()).map_err(ServeError::Runtime)?;
        if let Some(fingerprint) = acceptor.self_signed_fingerprint() {
            tracing::info!(
                sha256 = fingerprint,
                "TLS: self-signed development certificate"
            );
        }
    }
    let app_name = match args.app {
        AppKind::Demo => "demo",
        AppKind::Techempower => "TechEmpower",
    };
    // Before the address line, which tests wait for.
    if let Some(dir) = &args.static_dir {
        tracing::info!("serving the files under {} at /static/", dir.display());
    }
    if let Some(addr) = server.tls_local_addr() {
        tracing::info!("canter serving the {app_name} app over TLS on https://{addr}/");
        if args.h3 {
            tracing::info!("canter serving the {app_name} app over HTTP/3 on udp://{addr}/");
        }
    }
    tracing::info!(
        workers,
        "canter serving the {app_name} app on http://{}/",
        server.local_addr()
    );
    // One router per worker (built on that worker's thread), one item store for the process.
    let store = std::sync::Arc::new(demo::Store::new(ws_config(&args)));
    let metrics = args
        .metrics
        .then(|| Metrics::new().with_stats(server.stats()));
    let metrics_layer = metrics.clone();
    let access_log = args.access_log;
    let compress = args.compress;
    let app = move |worker: usize| {
        let app = match (&database, &files) {
            (Some((db, statements)), _) => techempower::app(db.clone(), *statements, worker),
            (None, Some(files)) => demo::app_with_static(store.clone(), files.clone()),
            (None, None) => demo::app(store.clone()),
        };
        match &metrics {
            Some(metrics) => app.route("/metrics", canter::get(metrics.endpoint())),
            None => app,
        }
    };
    let layered = compress || access_log || args.metrics;
    // Without middleware the router is served as it is: no layer to step through per request.
    if layered {
        server.serve(move |worker| {
            app(worker)
                .layer(compress.then(canter::middleware::Compression::new))
                .layer(metrics_layer.as_ref().map(Metrics::layer))
                .layer(access_log.then(AccessLog::new))
                .layer(access_log.then(RequestId::layer))
        })
    } else {
        server.serve(app)
    }
    .map_err(ServeError::Runtime)?;
    tracing::info!("canter stopped");
    Ok(())
}
