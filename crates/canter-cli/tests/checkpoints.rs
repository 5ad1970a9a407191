//! Checkpoints of a TCP pipeline, end to end with real processes: `canter pipeline market-spread
//! --checkpoint-dir` fed by `canter send market-spread --resend` and read by `canter receive
//! --dedupe`. The pipeline is killed (SIGKILL, or an abort at a failpoint inside a checkpoint)
//! mid-stream and started again on the same ports and directory: the senders reconnect and send
//! again what the restored checkpoint lacks, the pipeline makes again the results since that
//! checkpoint with the same sequence numbers, and the receiver, dropping the repeats, holds
//! exactly the results the independent reference computes.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::market_spread::{reference, unframe};
use common::receive;

/// A child process killed when dropped (a failing test leaves nothing running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("canter-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running `canter pipeline market-spread`: its process, source addresses, metrics address
/// and the log lines so far.
struct Pipeline {
    child: Killed,
    nbbo: SocketAddr,
    orders: SocketAddr,
    metrics: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

fn pipeline(nbbo: &str, orders: &str, args: &[&str], env: &[(&str, &str)]) -> Pipeline {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canter"));
    cmd.args([
        "pipeline",
        "market-spread",
        "--nbbo",
        nbbo,
        "--orders",
        orders,
    ])
    .envs(env.iter().copied());
    spawn_pipeline(cmd, args)
}

/// The pipeline run by `program` with `head` (a shell that sets limits, say), then `args`.
fn pipeline_with(program: &str, head: &[&str], args: &[&str]) -> Pipeline {
    let mut cmd = Command::new(program);
    cmd.args(head);
    spawn_pipeline(cmd, args)
}

fn spawn_pipeline(mut cmd: Command, args: &[&str]) -> Pipeline {
    let mut child = cmd
        .args(["--metrics", "127.0.0.1:0", "--workers", "2"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    {
        let log = log.clone();
        thread::spawn(move || {
            let mut metrics = None;
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("pipeline: {line}");
                if let Some(rest) = line.split("metrics on http://").nth(1) {
                    metrics = rest.trim_end_matches('/').parse::<SocketAddr>().ok();
                }
                if let Some(rest) = line.split("NBBO on ").nth(1) {
                    let addr = |s: &str| s.split(',').next().unwrap().parse().unwrap();
                    let orders = rest.split("orders on ").nth(1).unwrap();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send((addr(rest), addr(orders), metrics.unwrap()));
                    }
                }
                log.lock().unwrap().push(line);
            }
        });
    }
    let (nbbo, orders, metrics) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    Pipeline {
        child: Killed(child),
        nbbo,
        orders,
        metrics,
        log,
    }
}

/// A GET's body.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    all.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn checkpoint_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.'))
        })
        .count()
    })
}

/// The Market Spread streams and their reference results (timestamps zeroed, sorted).
fn data(dir: &Path, count: u64) -> Vec<Vec<u8>> {
    let written = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--write-dir",
            dir.to_str().unwrap(),
        ])
        .args(["--symbols", "1000", "--count", &count.to_string()])
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    sorted_results(&reference(&nbbo, &orders))
}

fn sorted_results(framed: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = unframe(framed)
        .into_iter()
        .map(|r| {
            assert_eq!(r.len(), 55, "a result record");
            let mut r = r.to_vec();
            r[47..55].fill(0);
            r
        })
        .collect();
    v.sort();
    v
}

/// How the first pipeline process ends.
enum Crash {
    /// SIGKILL once this many checkpoint files exist.
    KillAfterCheckpoints(usize),
    /// `CANTER_FAILPOINT` (the process aborts there by itself).
    Failpoint(&'static str),
}

/// Runs Market Spread with checkpoints through one crash and a restart; returns the receiver's
/// report, the sender's, and the restarted pipeline's log.
fn through_a_crash(name: &str, crash: Crash) -> (Value, Value, Vec<String>) {
    let dir = temp_dir(name);
    let count = 160_000u64;
    let expected = data(&dir.join("data"), count);
    let ck = dir.join("checkpoints");
    let ck_arg = ck.to_str().unwrap().to_owned();
    let out = dir.join("out.bin");
    let n = expected.len().to_string();
    let (rx, rx_addr) = receive(&[
        "--dedupe",
        "--expect",
        &n,
        "--out",
        out.to_str().unwrap(),
        "--duration",
        "90s",
    ]);
    let rx_addr = rx_addr.to_string();
    let ck_args = [
        "--out",
        rx_addr.as_str(),
        "--checkpoint-dir",
        ck_arg.as_str(),
        "--checkpoint-interval",
        "100ms",
    ];
    let env: Vec<(&str, &str)> = match &crash {
        Crash::Failpoint(f) => vec![("CANTER_FAILPOINT", *f)],
        Crash::KillAfterCheckpoints(_) => vec![],
    };
    let mut first = pipeline("127.0.0.1:0", "127.0.0.1:0", &ck_args, &env);
    let (nbbo, orders) = (first.nbbo.to_string(), first.orders.to_string());
    let sender = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread", "--resend", "--json"])
        .args(["--symbols", "1000", "--count", &count.to_string()])
        .args(["--rate", "40000", "--nbbo", &nbbo, "--orders", &orders])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // (A failing test leaves the sender to give up by itself: --reconnect-for.)
    let deadline = Instant::now() + Duration::from_secs(30);
    match crash {
        Crash::KillAfterCheckpoints(files) => {
            while checkpoint_files(&ck) < files {
                assert!(
                    Instant::now() < deadline,
                    "no checkpoints in {}",
                    ck.display()
                );
                thread::sleep(Duration::from_millis(10));
            }
            first.child.0.kill().unwrap();
        }
        Crash::Failpoint(_) => {}
    }
    let status = loop {
        if let Some(s) = first.child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the first pipeline did not end");
        thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success(), "{status:?}");
    let before = first.log.lock().unwrap().clone();
    assert!(
        before
            .iter()
            .all(|l| !l.contains("ERROR") || l.contains("CANTER_FAILPOINT")),
        "{before:#?}"
    );
    let second = pipeline(&nbbo, &orders, &ck_args, &[]);
    let sent = sender.wait_with_output().unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let got = rx.wait_with_output().unwrap();
    assert!(got.status.success(), "{got:?}");
    let report: Value = serde_json::from_slice(&got.stdout).unwrap();
    let results = sorted_results(&std::fs::read(&out).unwrap());
    assert_eq!(results.len(), expected.len(), "{report}");
    for (i, (a, b)) in results.iter().zip(&expected).enumerate() {
        assert_eq!(a, b, "result {i} (sorted)");
    }
    // What the restarted pipeline's metrics say of its checkpoints.
    let json: Value = serde_json::from_str(&get(second.metrics, "/metrics.json")).unwrap();
    assert!(
        json["checkpoints"]["completed"].as_u64().unwrap() > 0,
        "{json}"
    );
    let log = second.log.lock().unwrap().clone();
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
    (report, sent, log)
}

fn restored_epoch(log: &[String]) -> u64 {
    let line = log
        .iter()
        .find(|l| l.contains("restoring the latest checkpoint"))
        .unwrap_or_else(|| panic!("no restore in {log:#?}"));
    let at = line.split("epoch=").nth(1).unwrap();
    at.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn a_pipeline_killed_mid_stream_restores_its_checkpoint_and_every_result_arrives_once() {
    let (report, sent, log) = through_a_crash("kill", Crash::KillAfterCheckpoints(5));
    assert!(restored_epoch(&log) >= 4, "{log:#?}");
    for stream in ["nbbo", "orders"] {
        assert!(sent[stream]["reconnects"].as_u64().unwrap() >= 1, "{sent}");
        assert_eq!(sent[stream]["acked"], sent[stream]["records"], "{sent}");
    }
    // Results made again after the restart are dropped as repeats: a SIGKILL between
    // checkpoints makes some.
    assert!(report["connections"].as_u64().unwrap() >= 3, "{report}");
    eprintln!("repeats dropped: {}", report["repeats"]);
}

#[test]
fn a_crash_while_a_checkpoint_is_written_leaves_the_one_before() {
    // Half the file of checkpoint 6 written, not renamed: the restart takes checkpoint 5.
    let (_, sent, log) = through_a_crash("write", Crash::Failpoint("checkpoint-write:6"));
    assert_eq!(restored_epoch(&log), 5, "{log:#?}");
    assert!(
        sent["orders"]["reconnects"].as_u64().unwrap() >= 1,
        "{sent}"
    );
}

#[test]
fn a_crash_after_every_worker_snapshotted_leaves_the_one_before() {
    // The workers' parts of checkpoint 4 taken (their lists of changed keys cleared), the
    // file never written: the restart takes checkpoint 3, and nothing is missing.
    let (_, _, log) = through_a_crash("parts", Crash::Failpoint("checkpoint-parts:4"));
    assert_eq!(restored_epoch(&log), 3, "{log:#?}");
}

/// A checkpoint directory that cannot be written: a clear error, the pipeline keeps running
/// (every result arrives), and its metrics count the failed checkpoints. `blocked` makes the
/// directory unusable; `wrap` runs the pipeline under a shell (for a file size limit).
fn checkpoints_fail_and_the_pipeline_keeps_running(name: &str, full_disk: bool) {
    let dir = temp_dir(name);
    let expected = data(&dir.join("data"), 20_000);
    let ck = if full_disk {
        dir.join("checkpoints")
    } else {
        // A regular file where a directory should be: nothing can be created under it.
        let blocker = dir.join("blocker");
        std::fs::write(&blocker, b"a file").unwrap();
        blocker.join("checkpoints")
    };
    let n = expected.len().to_string();
    let out = dir.join("out.bin");
    let (rx, rx_addr) = receive(&["--dedupe", "--expect", &n, "--out", out.to_str().unwrap()]);
    let rx_addr = rx_addr.to_string();
    let args = [
        "--out",
        &rx_addr,
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--checkpoint-interval",
        "50ms",
    ];
    let p = if full_disk {
        // Files of at most 8 KiB (the disk is full past that: EFBIG, as ENOSPC would come),
        // SIGXFSZ ignored as a server's would be; the first checkpoint, with every symbol,
        // is bigger.
        let canter = env!("CARGO_BIN_EXE_canter");
        let script = format!("trap '' XFSZ; ulimit -f 8; exec {canter} \"$@\"");
        let mut full = vec!["-c", script.as_str(), "sh", "pipeline", "market-spread"];
        full.extend(["--nbbo", "127.0.0.1:0", "--orders", "127.0.0.1:0"]);
        pipeline_with("bash", &full, &args)
    } else {
        pipeline("127.0.0.1:0", "127.0.0.1:0", &args, &[])
    };
    let sent = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--symbols",
            "1000",
            "--count",
            "20000",
        ])
        .args([
            "--nbbo",
            &p.nbbo.to_string(),
            "--orders",
            &p.orders.to_string(),
        ])
        .output()
        .unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let got = rx.wait_with_output().unwrap();
    assert!(got.status.success(), "{got:?}");
    assert_eq!(
        sorted_results(&std::fs::read(&out).unwrap()),
        expected,
        "every result, once"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = get(p.metrics, "/metrics");
        if text.contains("canter_checkpoints_total{result=\"failed\"} ")
            && !text.contains("canter_checkpoints_total{result=\"failed\"} 0")
        {
            // An unwritable directory takes no checkpoint; on a full disk, one taken before
            // the records came (the sender slow to start on a busy machine) is small enough
            // to be written.
            if !full_disk {
                assert!(text.contains("canter_checkpoints_total{result=\"completed\"} 0"));
            }
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        thread::sleep(Duration::from_millis(20));
    }
    let log = p.log.lock().unwrap().clone();
    let why = if full_disk {
        "File too large"
    } else {
        "Not a directory"
    };
    assert!(
        log.iter().any(|l| l.contains("ERROR")
            && l.contains("checkpoint cannot be written")
            && l.contains("keeps running")
            && l.contains(why)),
        "{log:#?}"
    );
    if full_disk {
        // Nothing half-written is left to be taken for a checkpoint: a file is written as
        // `.NAME.tmp` and renamed only once whole, so the `.full` and `.delta` files there are
        // the completed checkpoints (one taken before the records came, on a busy machine),
        // and no more of them than the metrics count as completed.
        let text = get(p.metrics, "/metrics");
        let completed: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("canter_checkpoints_total{result=\"completed\"} "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let mut kept = 0;
        for e in std::fs::read_dir(&ck).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            kept += usize::from(name.ends_with(".full") || name.ends_with(".delta"));
        }
        assert!(
            kept <= completed,
            "{kept} checkpoint files, {completed} completed:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_checkpoint_directory_is_reported_and_the_pipeline_keeps_running() {
    checkpoints_fail_and_the_pipeline_keeps_running("unwritable", false);
}

#[test]
fn a_full_disk_fails_checkpoints_with_a_clear_error_and_the_pipeline_keeps_running() {
    checkpoints_fail_and_the_pipeline_keeps_running("full", true);
}
