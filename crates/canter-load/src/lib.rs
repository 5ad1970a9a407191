//! HTTP load generator behind `canter load`.
//!
//! A wrk/wrk2-style closed- and open-loop HTTP/1.1 and HTTP/2 load generator
//! (h2load's `-m`: concurrent streams per connection). Each
//! worker thread runs its own single-threaded tokio runtime that owns a
//! share of the connections; every connection is one task that writes
//! prebuilt request bytes (optionally pipelined) and parses responses
//! incrementally from a reused buffer, without per-request allocation.
//! Latencies go into a per-thread HDR histogram (microseconds, 3
//! significant figures) merged at the end.
//!
//! Use [`run`] with [`LoadOptions`] to run a test.
//!
//! # What is measured
//!
//! * **Closed loop** (default): each connection writes `--pipeline`
//!   requests in one write and waits for all responses before the next
//!   batch. A response's latency runs from the batch write to the read that
//!   completed it (one clock read per socket read).
//! * **Open loop** (`--rate R`): each of the `C` connections sends one
//!   request every `C / R` seconds on a fixed, phase-shifted schedule
//!   ([`schedule::RateSchedule`]), one request in flight per connection.
//!   When the previous response arrives after the next slot, the request is
//!   sent at once and its latency counts from the slot
//!   (coordinated-omission correction, [`schedule::corrected_latency`]).
//! * `requests` counts completed responses of any status; `status` splits
//!   them by code. Errors are counted per event (`connect`, `read`, `write`,
//!   `parse`) or per request (`timeout`); the connection is re-established
//!   after any error. A keep-alive connection the server closed while idle
//!   (EOF before any byte of the next response) is silently re-established
//!   and the batch retried.
//! * HTTP/2 (`-m N`): each connection keeps `N` streams in flight (fewer if
//!   the server's SETTINGS_MAX_CONCURRENT_STREAMS says so), starting one as
//!   another completes; a stream's latency runs from the write of its
//!   HEADERS to the read that ended it. With `--rate`, each connection's
//!   slots go out as streams, up to `N` at once; a slot that finds all `N`
//!   busy counts from its intended time. A stream the server refuses
//!   (REFUSED_STREAM, or above a GOAWAY's last id) is sent again; other
//!   resets count as `reset` errors.
//! * `--warmup` traffic is excluded from every statistic; with `-n`, warm-up
//!   requests are part of the `n`.
//! * Only loopback targets are accepted.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod duration;
mod error;
mod explain;
mod h1;
mod h2;
mod http3;
pub mod parse;
pub mod schedule;
pub mod stats;
pub mod target;
mod ws;

pub use duration::{parse_duration, DurationError};
pub use error::LoadError;
pub use stats::{Errors, Latency, Report};
pub use target::Protocol;

use error::usage;
use h1::{ConnConfig, ThreadShared};
use stats::{RunInfo, ThreadStats};
use target::Target;

/// Default test duration when neither `-d` nor `-n` is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Largest accepted `--pipeline`.
const MAX_PIPELINE: usize = 4096;
/// Largest accepted `--streams`.
const MAX_STREAMS: usize = 65_536;

/// What [`run`] does: the target, the load and the report (`canter load`'s flags, which
/// build it, document each field too). [`LoadOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Target URL, e.g. `http://127.0.0.1:8080/plaintext` (loopback only).
    pub url: String,

    /// Number of open connections.
    pub connections: usize,

    /// Number of worker threads (each runs its own event loop).
    pub threads: usize,

    /// Test duration after warm-up (`10s`, `500ms`, `1m`). Defaults to 10s,
    /// or unbounded when `-n` is given.
    pub duration: Option<Duration>,

    /// Total number of requests to send; the run stops when they are done
    /// or the duration elapses, whichever comes first.
    pub requests: Option<u64>,

    /// Requests written per batch on each connection (HTTP/1.1 pipelining).
    pub pipeline: usize,

    /// Speak HTTP/2 with this many concurrent streams per connection (h2c with prior
    /// knowledge on http://, ALPN h2 on https://).
    pub streams: Option<usize>,

    /// Open-loop mode: total requests per second across all connections,
    /// with coordinated-omission correction (wrk2 style).
    pub rate: Option<f64>,

    /// Speak HTTP/3 over QUIC to the `https://` URL's port over UDP (with `-m` requests in
    /// flight per connection, 1 by default).
    pub h3: bool,

    /// Request method.
    pub method: String,

    /// Extra request header `Name: value` (repeatable).
    pub headers: Vec<String>,

    /// Request body.
    pub body: Option<String>,

    /// Read the request body from a file.
    pub body_file: Option<PathBuf>,

    /// Per-request timeout; a timed-out request counts as a timeout error
    /// and its connection is re-established.
    pub timeout: Duration,

    /// Warm-up period excluded from the statistics.
    pub warmup: Option<Duration>,

    /// Print the report as one JSON object instead of the table.
    pub json: bool,

    /// https: accept any server certificate (a development certificate), verifying nothing.
    pub insecure: bool,

    /// https: verify the server against the CA certificates in this PEM file instead of the
    /// Mozilla root store.
    pub cacert: Option<PathBuf>,

    /// https: never resume a TLS session, so each new connection runs a full handshake (by
    /// default sessions are resumed, as browsers do).
    pub tls_no_resume: bool,

    /// A new connection for every request (`Connection: close`; HTTP/1.1 only): measures
    /// connection set-up and tear-down, as `ab` without `-k` does.
    pub no_keepalive: bool,

    /// Do not print the once-per-second progress line on stderr.
    pub no_progress: bool,

    /// WebSocket (`ws://`, `wss://`): bytes per message.
    pub ws_size: usize,

    /// WebSocket: binary messages instead of text.
    pub ws_binary: bool,

    /// WebSocket: offer permessage-deflate.
    pub ws_deflate: bool,

    /// WebSocket: broadcast mode. Every connection only listens, except the first, which also
    /// publishes `--rate` messages a second (1,000 by default) carrying their send time; each
    /// delivery to each connection is a "request", its latency from the publish. The server's
    /// route must send every message it receives to every connection.
    pub ws_broadcast: bool,
}

impl LoadOptions {
    /// `url` with the defaults of `canter load`: 50 connections on 1 thread for 10 s, one
    /// request at a time per connection, GET, a 5 s request timeout.
    pub fn new(url: impl Into<String>) -> LoadOptions {
        LoadOptions {
            url: url.into(),
            connections: 50,
            threads: 1,
            duration: None,
            requests: None,
            pipeline: 1,
            streams: None,
            rate: None,
            h3: false,
            method: "GET".to_owned(),
            headers: Vec::new(),
            body: None,
            body_file: None,
            timeout: Duration::from_secs(5),
            warmup: None,
            json: false,
            insecure: false,
            cacert: None,
            tls_no_resume: false,
            no_keepalive: false,
            no_progress: false,
            ws_size: 32,
            ws_binary: false,
            ws_deflate: false,
            ws_broadcast: false,
        }
    }
}

/// Validated, resolved plan for a run.
struct Plan {
    addrs: Vec<std::net::SocketAddr>,
    /// TLS settings and the server name to verify, for https.
    tls: Option<(canter_rt::ClientTls, String)>,
    /// With `--h3`: the QUIC client settings and the server name.
    quic: Option<(quinn::ClientConfig, String)>,
    protocol: Protocol,
    request: Vec<u8>,
    /// The request's HTTP/2 form, with `-m`.
    h2: Option<target::H2Request>,
    /// What a WebSocket run sends.
    ws: Option<target::WsPlan>,
    streams: usize,
    head_only: bool,
    connections: usize,
    threads: usize,
    pipeline: usize,
    duration: Option<Duration>,
    warmup: Duration,
}

fn plan(args: &LoadOptions) -> Result<Plan, LoadError> {
    if let Some(m) = args.streams {
        if m == 0 || m > MAX_STREAMS {
            return usage!("--streams must be in 1..={MAX_STREAMS}");
        }
        if args.pipeline > 1 {
            return usage!("--pipeline is HTTP/1.1; with -m, streams are the concurrency");
        }
    }
    if args.connections == 0 {
        return usage!("--connections must be at least 1");
    }
    if args.threads == 0 {
        return usage!("--threads must be at least 1");
    }
    if args.pipeline == 0 || args.pipeline > MAX_PIPELINE {
        return usage!("--pipeline must be in 1..={MAX_PIPELINE}");
    }
    if args.requests == Some(0) {
        return usage!("--requests must be at least 1");
    }
    if args.duration == Some(Duration::ZERO) {
        return usage!("--duration must be positive");
    }
    if args.timeout.is_zero() {
        return usage!("--timeout must be positive");
    }
    if let Some(r) = args.rate {
        if !(r.is_finite() && r > 0.0) {
            return usage!("--rate must be a positive number");
        }
        if args.pipeline > 1 {
            return usage!("--rate cannot be combined with --pipeline > 1");
        }
    }
    let target = Target::parse(&args.url)?;
    let addrs = target.resolve_loopback()?;
    let body = match (&args.body, &args.body_file) {
        (Some(b), _) => b.as_bytes().to_vec(),
        (None, Some(p)) => std::fs::read(p).map_err(|source| LoadError::Io {
            what: "cannot read --body-file",
            source,
        })?,
        (None, None) => Vec::new(),
    };
    if args.no_keepalive && args.streams.is_some() && !args.h3 {
        return usage!("--no-keepalive is for HTTP/1.1; -m speaks HTTP/2");
    }
    let mut headers = args.headers.clone();
    if args.no_keepalive && !args.h3 {
        headers.push("Connection: close".to_owned());
    }
    let ws = if target.websocket {
        if args.streams.is_some() || args.no_keepalive || !body.is_empty() {
            return usage!("ws:// and wss:// take none of -m, --no-keepalive, --body");
        }
        if !args.method.eq_ignore_ascii_case("GET") {
            return usage!("a WebSocket upgrade is a GET");
        }
        if args.ws_size > 16 << 20 {
            return usage!("--ws-size must be at most 16 MiB");
        }
        headers.extend([
            "Upgrade: websocket".to_owned(),
            "Connection: Upgrade".to_owned(),
            // The key need not be secret or fresh for a load test: the server only hashes it.
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==".to_owned(),
            "Sec-WebSocket-Version: 13".to_owned(),
        ]);
        if args.ws_deflate {
            headers.push(format!(
                "Sec-WebSocket-Extensions: {}",
                canter_ws::deflate::client_offer(canter_ws::deflate::DeflateConfig::default())
            ));
        }
        let payload = if args.ws_binary {
            (0..args.ws_size).map(|i| (i % 251) as u8).collect()
        } else {
            // Text that compresses as JSON does, about 4:1.
            let pattern = b"{\"symbol\":\"ACME\",\"bid\":101.25,\"offer\":101.5,\"qty\":100}";
            pattern.iter().copied().cycle().take(args.ws_size).collect()
        };
        if args.ws_broadcast && args.pipeline > 1 {
            return usage!("--ws-broadcast publishes at --rate; --pipeline does not apply");
        }
        Some(target::WsPlan {
            request: target::build_request("GET", &target, &headers, &[])?,
            payload,
            binary: args.ws_binary || args.ws_broadcast,
            deflate: args.ws_deflate,
            broadcast: args.ws_broadcast,
        })
    } else {
        None
    };
    if args.h3 {
        if !target.tls || target.websocket {
            return usage!("--h3 needs an https:// URL (HTTP/3 runs over QUIC, which is TLS)");
        }
        if args.pipeline > 1 {
            return usage!("--h3 takes no --pipeline: -m is the concurrency");
        }
        if args.no_keepalive && args.streams.is_some_and(|m| m > 1) {
            return usage!("--h3 --no-keepalive sends one request per connection: no -m");
        }
    }
    let request = target::build_request(&args.method, &target, &headers, &body)?;
    let h2 = match args.streams.or(args.h3.then_some(1)) {
        Some(_) => Some(target::build_h2_request(
            &args.method,
            &target,
            &args.headers,
            &body,
        )?),
        None => None,
    };
    let tls = if target.tls {
        let alpn: &[&[u8]] = if h2.is_some() {
            &[b"h2"]
        } else {
            &[b"http/1.1"]
        };
        let client = match (&args.cacert, args.insecure) {
            (Some(ca), _) => canter_rt::ClientTls::ca_file(ca, alpn).map_err(LoadError::Tls)?,
            (None, true) => canter_rt::ClientTls::insecure(alpn),
            (None, false) => canter_rt::ClientTls::webpki_roots(alpn),
        };
        let client = if args.tls_no_resume {
            client.without_resumption()
        } else {
            client
        };
        Some((client, target.host.clone()))
    } else {
        None
    };
    let quic = match (&tls, args.h3) {
        (Some((client, name)), true) => Some((
            http3::client_config(client).map_err(LoadError::Usage)?,
            name.clone(),
        )),
        _ => None,
    };
    let duration = match (args.duration, args.requests) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_DURATION),
    };
    Ok(Plan {
        addrs,
        tls,
        quic,
        protocol: if ws.is_some() {
            Protocol::WebSocket
        } else if args.h3 {
            Protocol::Http3
        } else if h2.is_some() {
            Protocol::Http2
        } else {
            Protocol::Http1
        },
        request,
        h2,
        ws,
        streams: args.streams.unwrap_or(1),
        head_only: args.method.eq_ignore_ascii_case("HEAD"),
        connections: args.connections,
        threads: args.threads.min(args.connections),
        pipeline: args.pipeline,
        duration,
        warmup: args.warmup.unwrap_or(Duration::ZERO),
    })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the new soft
/// limit (or `None` if it could not be read).
fn raise_nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct for the duration of
    // the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `want` is a valid rlimit struct; raising the soft limit up
        // to the hard limit needs no privileges.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim = want;
        }
    }
    Some(lim.rlim_cur)
}

/// Runs the load test described by `args`, printing the report to stdout.
/// Returns why on a setup failure (failures during the run are counted in the report).
pub fn run(args: LoadOptions) -> Result<Report, LoadError> {
    let p = plan(&args)?;
    if let Some(limit) = raise_nofile_limit() {
        let need = p.connections as u64 + 64;
        if limit < need {
            return Err(LoadError::FileLimit { need, limit });
        }
    }
    // Fail fast if nothing listens; use the first address that answers. (QUIC has no listener
    // to probe: an HTTP/3 run takes the first address, and a server that is not there shows
    // as connection errors.)
    let mut addr = None;
    let mut last_err = None;
    for a in &p.addrs {
        if p.protocol == Protocol::Http3 {
            addr = Some(*a);
            break;
        }
        match std::net::TcpStream::connect_timeout(a, args.timeout) {
            Ok(_) => {
                addr = Some(*a);
                break;
            }
            Err(source) => last_err = Some(LoadError::Unreachable { addr: *a, source }),
        }
    }
    let addr = match (addr, last_err) {
        (Some(addr), _) => addr,
        (None, Some(e)) => return Err(e),
        (None, None) => return usage!("{} resolves to no address", args.url),
    };

    if !args.json {
        let what = match (p.duration, args.requests) {
            (Some(d), Some(n)) => format!("{:?} / {n} requests", d),
            (Some(d), None) => format!("{:?}", d),
            (None, Some(n)) => format!("{n} requests"),
            (None, None) => String::new(),
        };
        let mode = match args.rate {
            Some(r) => format!("open loop at {r} req/s"),
            None => "closed loop".to_string(),
        };
        println!("Running {what} test @ {}", args.url);
        let depth = match p.protocol {
            Protocol::Http1 => format!("pipeline {}", p.pipeline),
            Protocol::Http2 => format!("HTTP/2, {} streams per connection", p.streams),
            Protocol::Http3 => format!("HTTP/3, {} streams per connection", p.streams),
            Protocol::WebSocket if args.ws_broadcast => format!(
                "WebSocket broadcast of {} B messages at {}/s from one connection to all",
                args.ws_size.max(8),
                args.rate.unwrap_or(1000.0)
            ),
            Protocol::WebSocket => format!(
                "WebSocket echo of {} B {} messages, {} in flight{}",
                args.ws_size,
                if args.ws_binary { "binary" } else { "text" },
                p.pipeline,
                if args.ws_deflate {
                    ", deflate offered"
                } else {
                    ""
                }
            ),
        };
        println!(
            "  {} threads and {} connections, {depth}, {mode}",
            p.threads, p.connections
        );
    }

    let start = Instant::now();
    let measure_start = start + p.warmup;
    let end = p.duration.map(|d| measure_start + d);
    let progress: Vec<Arc<AtomicU64>> = (0..p.threads)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let mut batch = Vec::with_capacity(p.request.len() * p.pipeline);
    for _ in 0..p.pipeline {
        batch.extend_from_slice(&p.request);
    }
    let batch = Arc::new(batch);

    let mut handles = Vec::with_capacity(p.threads);
    for (tid, counter) in progress.iter().enumerate() {
        let conns: Vec<usize> = (tid..p.connections).step_by(p.threads).collect();
        let budget = args.requests.map(|n| {
            let t = p.threads as u64;
            n / t + u64::from((tid as u64) < n % t)
        });
        let cfg = ConnConfig {
            addr,
            tls: p.tls.clone(),
            quic: p.quic.clone(),
            new_connection_per_request: args.no_keepalive,
            batch: batch.to_vec(),
            req_len: p.request.len(),
            pipeline: p.pipeline,
            head_only: p.head_only,
            timeout: args.timeout,
            start,
            measure_start,
            end,
            rate: args.rate.map(|r| (r, p.connections)),
            streams: p.streams,
            h2: p.h2.clone(),
            ws: p.ws.clone(),
        };
        let counter = counter.clone();
        let protocol = p.protocol;
        let h = std::thread::Builder::new()
            .name(format!("canter-load-{tid}"))
            .spawn(move || worker(protocol, cfg, conns, budget, counter))
            .map_err(|source| LoadError::Io {
                what: "cannot spawn worker thread",
                source,
            })?;
        handles.push(h);
    }

    let show_progress = !args.no_progress
        && std::io::stderr().is_terminal()
        && !matches!(p.duration, Some(d) if d + p.warmup <= Duration::from_secs(3));
    let mut next_tick = start + Duration::from_secs(1);
    let mut last_count = 0u64;
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        if show_progress && now >= next_tick {
            let count: u64 = progress.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            let secs = now.duration_since(start).as_secs();
            let phase = if now < measure_start {
                " (warm-up)"
            } else {
                ""
            };
            eprint!(
                "\r[{secs:>4}s] {count} responses, {} req/s{phase}        ",
                count - last_count
            );
            last_count = count;
            next_tick += Duration::from_secs(1);
        }
    }
    if show_progress {
        eprintln!();
    }
    let mut total = ThreadStats::new();
    let mut finished = measure_start;
    for h in handles {
        let (stats, done) = h.join().map_err(|_| LoadError::WorkerPanicked)??;
        total.merge(&stats);
        finished = finished.max(done);
    }
    if let Some(end) = end {
        // Responses arriving after the end are not counted; neither is the
        // teardown time.
        finished = finished.min(end);
    }
    let elapsed = finished.saturating_duration_since(measure_start);
    let report = Report::build(
        RunInfo {
            url: args.url.clone(),
            connections: p.connections,
            threads: p.threads,
            protocol: match p.protocol {
                Protocol::Http1 => "http/1.1",
                Protocol::Http2 => "h2",
                Protocol::Http3 => "h3",
                Protocol::WebSocket => "websocket",
            },
            pipeline: p.pipeline,
            streams: args.streams,
            rate: args.rate,
        },
        &total,
        elapsed,
    );
    if args.json {
        let s = serde_json::to_string(&report).map_err(|e| LoadError::Io {
            what: "cannot write the JSON report",
            source: e.into(),
        })?;
        println!("{s}");
    } else {
        print!("{}", report.to_human());
    }
    Ok(report)
}

/// One worker thread: a current-thread runtime driving `conns`.
fn worker(
    protocol: Protocol,
    cfg: ConnConfig,
    conns: Vec<usize>,
    budget: Option<u64>,
    progress: Arc<AtomicU64>,
) -> Result<(ThreadStats, Instant), LoadError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| LoadError::Io {
            what: "cannot build runtime",
            source,
        })?;
    let cfg = Rc::new(cfg);
    let shared = Rc::new(ThreadShared {
        stats: std::cell::RefCell::new(ThreadStats::new()),
        budget: budget.map(std::cell::Cell::new),
        progress,
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let mut tasks = Vec::with_capacity(conns.len());
        for idx in conns {
            let cfg = cfg.clone();
            let shared = shared.clone();
            tasks.push(tokio::task::spawn_local(async move {
                match (protocol, &cfg.ws) {
                    (Protocol::WebSocket, Some(plan)) => {
                        ws::run_connection(&cfg, plan, &shared, idx).await
                    }
                    (Protocol::Http2, _) => h2::run_connection(&cfg, &shared, idx).await,
                    (Protocol::Http3, _) => http3::run_connection(&cfg, &shared, idx).await,
                    _ => h1::run_connection(&cfg, &shared, idx).await,
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    let done = Instant::now();
    let stats = std::mem::take(&mut *shared.stats.borrow_mut());
    Ok((stats, done))
}
