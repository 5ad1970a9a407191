//! The black-box fault harness for TCP pipelines: Market Spread with `--checkpoint-dir` on two
//! workers, fed by `canter send market-spread --resend` at a steady rate and read by `canter
//! receive --dedupe`, with proxies on every connection (both sources and the sink), and faults
//! at random points chosen by a seed: the pipeline killed (SIGKILL) and restarted, sometimes
//! set to abort inside one of its next checkpoints (a failpoint); the pipeline frozen
//! (SIGSTOP, then SIGCONT); the source connections dropped; the sink connections dropped.
//! When every record is acknowledged, the receiver's output (repeats dropped by their sequence
//! numbers) is compared with the independent reference: every expected result, each once.
//!
//! The test suite runs a short version (about 15 s of faults). Knobs, for replaying a seed or
//! a long run (`bench/tcp_chaos.py`): `CANTER_CHAOS_SEED` (default 1; always printed),
//! `CANTER_CHAOS_SECONDS` (how long input flows and faults happen, default 15),
//! `CANTER_CHAOS_RATE` (input records a second, default 20000).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::market_spread::{reference, unframe};
use common::receive;

/// splitmix64: the schedule from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process this test started and has not reaped.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A TCP proxy to `upstream`: every accepted connection is joined to a new one upstream (or
/// closed when upstream is down); [`Proxy::drop_all`] cuts every connection it carries.
struct Proxy {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    carried: Arc<AtomicU64>,
}

impl Proxy {
    fn new(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let carried = Arc::new(AtomicU64::new(0));
        {
            let (conns, carried) = (conns.clone(), carried.clone());
            thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(1))
                    else {
                        continue;
                    };
                    let _ = (client.set_nodelay(true), up.set_nodelay(true));
                    carried.fetch_add(1, Ordering::Relaxed);
                    let mut c = conns.lock().unwrap();
                    c.retain(|s| s.peer_addr().is_ok());
                    c.push(client.try_clone().unwrap());
                    c.push(up.try_clone().unwrap());
                    drop(c);
                    for (mut from, mut to) in [
                        (client.try_clone().unwrap(), up.try_clone().unwrap()),
                        (up, client),
                    ] {
                        thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(Shutdown::Both);
                            let _ = from.shutdown(Shutdown::Both);
                        });
                    }
                }
            });
        }
        Proxy {
            addr,
            conns,
            carried,
        }
    }

    fn drop_all(&self) -> usize {
        let mut c = self.conns.lock().unwrap();
        let n = c.len() / 2;
        for s in c.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        n
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The pipeline process, started on fixed ports (so that the proxies find it again).
fn start_pipeline(
    nbbo: SocketAddr,
    orders: SocketAddr,
    out: SocketAddr,
    dir: &Path,
    failpoint: Option<String>,
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canter"));
    cmd.args(["pipeline", "market-spread", "--workers", "2"])
        .args(["--nbbo", &nbbo.to_string(), "--orders", &orders.to_string()])
        .args(["--out", &out.to_string()])
        .args(["--checkpoint-dir", dir.to_str().unwrap()])
        .args(["--checkpoint-interval", "200ms"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = failpoint {
        cmd.env("CANTER_FAILPOINT", f);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("pipeline: {line}");
        }
    });
    child
}

#[derive(Default, Debug)]
struct Counts {
    kills: u32,
    failpoints: u32,
    stops: u32,
    source_drops: u32,
    sink_drops: u32,
}

#[test]
fn checkpointed_tcp_pipeline_survives_random_kills_freezes_and_dropped_connections() {
    let seed = env_u64("CANTER_CHAOS_SEED", 1);
    let seconds = env_u64("CANTER_CHAOS_SECONDS", 15);
    let rate = env_u64("CANTER_CHAOS_RATE", 20_000);
    eprintln!(
        "tcp chaos: seed={seed} seconds={seconds} rate={rate} (replay: CANTER_CHAOS_SEED={seed})"
    );
    let mut rng = Rng(seed);
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("canter-tcp-chaos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let count = seconds * rate;
    let common = [
        "--symbols".to_owned(),
        "500".to_owned(),
        "--count".to_owned(),
        count.to_string(),
    ];
    let written = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--write-dir",
            dir.to_str().unwrap(),
        ])
        .args(&common)
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let expected = {
        let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
        let orders = std::fs::read(dir.join("orders.bin")).unwrap();
        let mut v: Vec<Vec<u8>> = unframe(&reference(&nbbo, &orders))
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        v.sort();
        v
    };

    // The receiver, behind the sink's proxy.
    let out = dir.join("out.bin");
    let expect = expected.len().to_string();
    let duration = (seconds * 4 + 60).to_string();
    let (rx, rx_addr) = receive(&[
        "--dedupe",
        "--out",
        out.to_str().unwrap(),
        "--expect",
        &expect,
        "--duration",
        &duration,
    ]);
    let (nbbo, orders) = (free_port(), free_port());
    let sink_proxy = Proxy::new(rx_addr);
    let nbbo_proxy = Proxy::new(nbbo);
    let orders_proxy = Proxy::new(orders);
    let ck = dir.join("checkpoints");
    let mut pipe = start_pipeline(nbbo, orders, sink_proxy.addr, &ck, None);

    let sender = {
        let (np, op, common) = (nbbo_proxy.addr, orders_proxy.addr, common.clone());
        thread::spawn(move || {
            Command::new(env!("CARGO_BIN_EXE_canter"))
                .args(["send", "market-spread", "--resend", "--json"])
                .args(&common)
                .args(["--rate", &rate.to_string(), "--reconnect-for", "60s"])
                .args(["--nbbo", &np.to_string(), "--orders", &op.to_string()])
                .output()
                .unwrap()
        })
    };

    let mut counts = Counts::default();
    let at = || format!("{:.1}s", started.elapsed().as_secs_f64());
    while !sender.is_finished() && started.elapsed() < Duration::from_secs(seconds + 5) {
        thread::sleep(rng.millis(300, 1_500));
        if sender.is_finished() {
            break;
        }
        match rng.below(100) {
            // Killed and restarted; one restart in four aborts inside one of its next
            // checkpoints (after every worker's part, or halfway through the file).
            0..=34 => {
                eprintln!("tcp chaos {}: SIGKILL the pipeline", at());
                let _ = pipe.kill();
                let _ = pipe.wait();
                counts.kills += 1;
                thread::sleep(rng.millis(0, 500));
                let failpoint = (rng.below(4) == 0).then(|| {
                    counts.failpoints += 1;
                    let point = ["checkpoint-parts", "checkpoint-write"][rng.below(2) as usize];
                    format!("{point}:{}", 1 + rng.below(5))
                });
                if let Some(f) = &failpoint {
                    eprintln!("tcp chaos {}: restart with CANTER_FAILPOINT={f}", at());
                }
                pipe = start_pipeline(nbbo, orders, sink_proxy.addr, &ck, failpoint);
            }
            // Frozen, then let go.
            35..=54 => {
                let pause = rng.millis(200, 2_000);
                eprintln!("tcp chaos {}: SIGSTOP the pipeline for {pause:?}", at());
                signal(pipe.id(), libc::SIGSTOP);
                thread::sleep(pause);
                signal(pipe.id(), libc::SIGCONT);
                counts.stops += 1;
            }
            // The senders' connections cut.
            55..=79 => {
                let n = nbbo_proxy.drop_all() + orders_proxy.drop_all();
                eprintln!("tcp chaos {}: {n} source connections dropped", at());
                counts.source_drops += 1;
            }
            // The sink's connections cut (what the receiver did not acknowledge comes again).
            _ => {
                let n = sink_proxy.drop_all();
                eprintln!("tcp chaos {}: {n} sink connections dropped", at());
                counts.sink_drops += 1;
            }
        }
        // A pipeline that aborted at its failpoint is started again (without one).
        if let Ok(Some(status)) = pipe.try_wait() {
            eprintln!(
                "tcp chaos {}: the pipeline ended ({status}); restarting",
                at()
            );
            pipe = start_pipeline(nbbo, orders, sink_proxy.addr, &ck, None);
        }
    }
    eprintln!("tcp chaos: faults {counts:?}; waiting for the senders");
    // The faults are over: a pipeline that aborted at a failpoint is started again.
    let deadline = Instant::now() + Duration::from_secs(seconds * 2 + 60);
    while !sender.is_finished() {
        if let Ok(Some(_)) = pipe.try_wait() {
            pipe = start_pipeline(nbbo, orders, sink_proxy.addr, &ck, None);
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the senders did not finish"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let sent = sender.join().unwrap();
    assert!(
        sent.status.success(),
        "seed {seed}: the sender failed: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let got = rx.wait_with_output().unwrap();
    let _ = pipe.kill();
    let _ = pipe.wait();
    let report: Value = serde_json::from_slice(&got.stdout).unwrap();
    let mut results: Vec<Vec<u8>> = unframe(&std::fs::read(&out).unwrap())
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    results.sort();
    // Timestamps are the reads' times: only the rest is compared.
    let strip = |v: &[Vec<u8>]| -> Vec<Vec<u8>> {
        v.iter()
            .map(|r| {
                let mut r = r.clone();
                let n = r.len();
                r[n.saturating_sub(8)..].fill(0);
                r
            })
            .collect()
    };
    let (mut results, mut expected) = (strip(&results), strip(&expected));
    results.sort();
    expected.sort();
    let missing = expected
        .iter()
        .filter(|e| results.binary_search(e).is_err())
        .count();
    let mut dups = 0;
    for w in results.windows(2) {
        dups += usize::from(w[0] == w[1]);
    }
    eprintln!(
        "tcp chaos: seed {seed}: {} results, {} repeats dropped, {missing} missing, {dups} \
         unmarked repeats; faults {counts:?}; sender {sent}; connections carried: sources {}, \
         sink {}",
        results.len(),
        report["repeats"],
        nbbo_proxy.carried.load(Ordering::Relaxed) + orders_proxy.carried.load(Ordering::Relaxed),
        sink_proxy.carried.load(Ordering::Relaxed),
    );
    // One line for bench/tcp_chaos.py.
    eprintln!(
        "tcp chaos: seed={seed} faults={} kills={} failpoints={} stops={} source_drops={} \
         sink_drops={} expected={} got={} repeats={} missing={missing} unmarked={dups} \
         resent={}",
        counts.kills + counts.stops + counts.source_drops + counts.sink_drops,
        counts.kills,
        counts.failpoints,
        counts.stops,
        counts.source_drops,
        counts.sink_drops,
        expected.len(),
        results.len(),
        report["repeats"].as_u64().unwrap_or(0),
        sent["nbbo"]["resent"].as_u64().unwrap_or(0)
            + sent["orders"]["resent"].as_u64().unwrap_or(0),
    );
    assert!(got.status.success(), "seed {seed}: {report}");
    assert_eq!(missing, 0, "seed {seed}: results missing");
    assert_eq!(dups, 0, "seed {seed}: repeats not dropped");
    assert_eq!(results.len(), expected.len(), "seed {seed}");
    assert!(counts.kills + counts.stops + counts.source_drops + counts.sink_drops > 0);
    let _ = std::fs::remove_dir_all(&dir);
}
