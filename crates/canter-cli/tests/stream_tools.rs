//! `canter send` and `canter receive` against each other over loopback: every record arrives
//! once and in order, `--out` keeps the frames as received, latency is measured from each
//! record's timestamp, `--rate` paces, `--repeat` runs until `--duration`, and a broken frame
//! closes only its own connection.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

mod common;
use common::market_spread::{reference, unframe};
use common::{receive, TempFile};

/// `n` framed records of 8..=200 bytes, each ending with the current time in ns (big-endian).
fn records(n: usize) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut out = Vec::new();
    for i in 0..n {
        let mut record = vec![(i % 251) as u8; i % 193];
        record.extend_from_slice(&now.to_be_bytes());
        out.extend_from_slice(&(record.len() as u32).to_be_bytes());
        out.extend_from_slice(&record);
    }
    out
}

fn send(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_canter"))
        .arg("send")
        .args(args)
        .output()
        .unwrap()
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn finish(child: Child) -> (Output, Value) {
    let out = child.wait_with_output().unwrap();
    let report = report(&out);
    (out, report)
}

#[test]
fn every_record_arrives_once_in_order_with_its_latency() {
    let data = records(5_000);
    let file = TempFile::new("records.bin", &data);
    let out = TempFile::new("received.bin", b"");
    let out_path = out.path().to_str().unwrap().to_owned();
    let (child, addr) = receive(&["--expect", "5000", "--out", &out_path, "--duration", "30s"]);
    let addr = addr.to_string();
    let sent = send(&[
        "--to",
        &addr,
        "--file",
        file.path().to_str().unwrap(),
        "--batch",
        "64",
        "--json",
    ]);
    assert!(sent.status.success(), "{sent:?}");
    assert_eq!(report(&sent)["records"], 5_000);
    let (done, r) = finish(child);
    assert!(done.status.success(), "{done:?}");
    assert_eq!(r["records"], 5_000, "{r}");
    assert_eq!(r["complete"], true);
    assert_eq!(r["connections"], 1);
    assert_eq!(r["no_timestamp"], 0);
    assert_eq!(r["latency_us"]["count"], 5_000);
    let p50 = r["latency_us"]["p50"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 < 60e6, "{r}");
    let bytes: u64 = (0..5_000u64).map(|i| i % 193 + 8).sum();
    assert_eq!(r["bytes"], bytes);
    let per_second: u64 = r["per_second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 5_000);
    // --out holds the frames exactly as sent.
    assert!(std::fs::read(out.path()).unwrap() == data);
}

/// `--out` is written while `canter receive` runs (a reader of the file sees the records once
/// the senders pause), and what arrived is in the file after SIGTERM or SIGINT too.
#[test]
fn out_is_written_as_records_come_and_kept_on_a_signal() {
    let data = records(3_000);
    let file = TempFile::new("signalled.bin", &data);
    for signal in ["TERM", "INT"] {
        let out = TempFile::new(&format!("received-{signal}.bin"), b"");
        let out_path = out.path().to_str().unwrap().to_owned();
        let (child, addr) = receive(&["--out", &out_path]);
        let send_all = || {
            let to = addr.to_string();
            let sent = send(&["--to", &to, "--file", file.path().to_str().unwrap()]);
            assert!(sent.status.success(), "{sent:?}");
        };
        send_all();
        // Without --expect or --duration the receiver runs on: the file fills meanwhile.
        let start = std::time::Instant::now();
        while std::fs::metadata(out.path()).unwrap().len() < data.len() as u64 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "--out holds {} of {} bytes while receiving",
                std::fs::metadata(out.path()).unwrap().len(),
                data.len()
            );
            thread::sleep(Duration::from_millis(20));
        }
        // More records, then the signal at once: they are in the file too.
        send_all();
        let killed = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let (_, r) = finish(child);
        assert_eq!(r["records"], 6_000, "{signal}: {r}");
        let written = std::fs::read(out.path()).unwrap();
        assert!(
            written == [&data[..], &data[..]].concat(),
            "{signal}: {} bytes",
            written.len()
        );
    }
}

#[test]
fn rate_paces_the_sender_and_repeat_runs_until_the_duration() {
    let file = TempFile::new("paced.bin", &records(100));
    let path = file.path().to_str().unwrap().to_owned();
    let (child, addr) = receive(&["--duration", "3s"]);
    let addr = addr.to_string();
    // 100 records at 2,000/s, 10 a write: the last batch is due at 0.045 s.
    let once = send(&[
        "--to", &addr, "--file", &path, "--rate", "2000", "--batch", "10", "--json",
    ]);
    assert!(once.status.success(), "{once:?}");
    let r = report(&once);
    assert_eq!(r["records"], 100);
    let t = r["seconds"].as_f64().unwrap();
    assert!(t >= 0.045, "100 records at 2,000/s took {t} s");
    // --repeat until --duration: at 1,000/s for 1 s, no more than the schedule allows.
    let repeated = send(&[
        "--to",
        &addr,
        "--file",
        &path,
        "--rate",
        "1000",
        "--repeat",
        "--duration",
        "1s",
        "--json",
    ]);
    assert!(repeated.status.success(), "{repeated:?}");
    let r = report(&repeated);
    let n = r["records"].as_u64().unwrap();
    assert!((500..=1_001).contains(&n), "{r}");
    let (_, received) = finish(child);
    assert_eq!(received["records"].as_u64().unwrap(), 100 + n);
    assert_eq!(received["connections"], 2);
}

#[test]
fn a_broken_frame_closes_only_its_connection() {
    let (child, addr) = receive(&["--max-frame", "100", "--expect", "10", "--duration", "20s"]);
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    bad.write_all(&1_000u32.to_be_bytes()).unwrap();
    bad.write_all(&[0u8; 16]).unwrap();
    // The receiver closes it: end of stream (or a reset), not silence.
    let mut buf = [0u8; 1];
    match bad.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("read {n} bytes from the receiver"),
    }
    let file = TempFile::new("ok.bin", &records(10));
    let sent = send(&[
        "--to",
        &addr.to_string(),
        "--file",
        file.path().to_str().unwrap(),
    ]);
    assert!(sent.status.success(), "{sent:?}");
    let (done, r) = finish(child);
    assert!(done.status.success(), "{done:?}");
    assert_eq!(r["records"], 10);
    assert_eq!(r["frame_errors"], 1);
}

#[test]
fn bad_input_files_are_refused_with_a_reason() {
    let truncated = {
        let mut data = records(3);
        data.truncate(data.len() - 2);
        data
    };
    let file = TempFile::new("truncated.bin", &truncated);
    let out = send(&[
        "--to",
        "127.0.0.1:9",
        "--file",
        file.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ends inside a frame (2 bytes missing)"),
        "{err}"
    );
    let out = send(&["--to", "127.0.0.1:9", "--file", "/nonexistent/records.bin"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/records.bin"));
    // A receiver that does not get what it expects says so in its exit status.
    let (child, _) = receive(&["--expect", "1", "--duration", "300ms"]);
    let (done, r) = finish(child);
    assert!(!done.status.success());
    assert_eq!(r["complete"], false);
}

#[test]
fn market_spread_streams_are_written_and_sent_with_their_expected_results() {
    let dir = std::env::temp_dir().join(format!("canter-ms-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().unwrap().to_owned();
    let (nbbo_rx, nbbo_addr) = receive(&[
        "--expect",
        "10000",
        "--duration",
        "30s",
        "--timestamp-offset",
        "0",
    ]);
    let (orders_rx, orders_addr) = receive(&[
        "--expect",
        "10000",
        "--duration",
        "30s",
        "--timestamp-offset",
        "0",
    ]);
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--symbols",
            "100",
            "--reject-share",
            "0.1",
        ])
        .args([
            "--count",
            "20000",
            "--rate",
            "400000",
            "--json",
            "--write-dir",
            &dir_arg,
        ])
        .args([
            "--nbbo",
            &nbbo_addr.to_string(),
            "--orders",
            &orders_addr.to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = report(&out);
    assert_eq!(r["nbbo"]["records"], 10_000, "{r}");
    assert_eq!(r["orders"]["records"], 10_000, "{r}");
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    let expected = std::fs::read(dir.join("expected.bin")).unwrap();
    let results = unframe(&expected).len() as u64;
    assert_eq!(r["expected_results"], results);
    // About 10% of the orders are rejected, and the reference agrees record by record.
    assert!(
        (500..1_500).contains(&results),
        "{results} rejected of 10,000"
    );
    assert!(
        reference(&nbbo, &orders) == expected,
        "expected.bin differs from the reference"
    );
    let ours = unframe(&expected);
    let theirs_data = reference(&nbbo, &orders);
    let theirs = unframe(&theirs_data);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "result {i}");
    }
    // Both streams arrived whole, each on its own connection.
    for rx in [nbbo_rx, orders_rx] {
        let (done, r) = finish(rx);
        assert!(done.status.success(), "{done:?}");
        assert_eq!(r["records"], 10_000);
        // Inputs carry no timestamp: none of their bytes read as one makes a latency.
        assert_eq!(r["no_timestamp"], 10_000);
        assert_eq!(r["latency_us"]["count"], 0);
    }
    // The same seed writes the same data.
    let again = dir.join("again");
    let out = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--symbols",
            "100",
            "--reject-share",
            "0.1",
        ])
        .args(["--count", "20000", "--write-dir", again.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read(again.join("orders.bin")).unwrap() == orders);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process killed when dropped (a failing test leaves nothing running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `canter pipeline market-spread ARGS` with its sources on free ports and metrics on; the
/// process, the NBBO and orders addresses, and the metrics address.
fn pipeline(args: &[&str]) -> (Killed, SocketAddr, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["pipeline", "market-spread", "--nbbo", "127.0.0.1:0"])
        .args(["--orders", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
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
                let nbbo = rest
                    .split(',')
                    .next()
                    .unwrap()
                    .parse::<SocketAddr>()
                    .unwrap();
                let orders = rest.split("orders on ").nth(1).unwrap();
                let orders = orders
                    .split(',')
                    .next()
                    .unwrap()
                    .parse::<SocketAddr>()
                    .unwrap();
                if let Some(tx) = tx.take() {
                    let _ = tx.send((nbbo, orders, metrics.unwrap()));
                }
            }
        }
    });
    let (nbbo, orders, metrics) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    (Killed(child), nbbo, orders, metrics)
}

/// A GET over a plain socket: the status line's code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let code = all[9..12].parse().unwrap();
    let body = all
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap();
    (code, body)
}

/// The sum over workers of a Prometheus counter for one pipeline.
fn counter(text: &str, name: &str, pipeline: &str) -> u64 {
    let prefix = format!("{name}{{pipeline=\"{pipeline}\",");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// `canter pipeline market-spread` on two workers, fed by `canter send market-spread` and read by
/// `canter receive`: every result the independent reference computes arrives (timestamps aside;
/// order aside, since each worker has its own connection), with a plausible timestamp; the
/// metrics count what went in and out; bad input is counted and the pipeline keeps going; and
/// SIGTERM stops it cleanly.
#[test]
fn market_spread_pipeline_produces_the_reference_results() {
    let dir = std::env::temp_dir().join(format!("canter-ms-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.to_str().unwrap().to_owned();
    let common = [
        "--symbols",
        "1000",
        "--reject-share",
        "0.1",
        "--count",
        "200000",
    ];
    let written = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread", "--write-dir", &dir_arg])
        .args(common)
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    let nbbo = std::fs::read(dir.join("nbbo.bin")).unwrap();
    let orders = std::fs::read(dir.join("orders.bin")).unwrap();
    let expected_data = reference(&nbbo, &orders);
    let mut expected = unframe(&expected_data);
    let n = expected.len();
    assert!((5_000..15_000).contains(&n), "{n} rejected of 100,000");
    let out = TempFile::new("ms-results.bin", b"");
    let out_path = out.path().to_str().unwrap().to_owned();
    let (rx, rx_addr) = receive(&[
        "--expect",
        &n.to_string(),
        "--out",
        &out_path,
        "--duration",
        "60s",
    ]);
    let (mut pipe, nbbo_addr, orders_addr, metrics_addr) =
        // A small read budget: many turns per connection, and the results still exact.
        pipeline(&[
            "--out",
            &rx_addr.to_string(),
            "--workers",
            "2",
            "--read-budget",
            "4096",
        ]);
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let sent = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args(["send", "market-spread", "--json"])
        .args(common)
        .args(["--nbbo", &nbbo_addr.to_string()])
        .args(["--orders", &orders_addr.to_string()])
        .output()
        .unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let (done, r) = finish(rx);
    assert!(done.status.success(), "{done:?}");
    assert_eq!(r["records"], n as u64, "{r}");
    assert_eq!(r["connections"], 2, "one sink connection per worker");
    let got_data = std::fs::read(out.path()).unwrap();
    let got = unframe(&got_data);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut stripped: Vec<Vec<u8>> = got
        .iter()
        .map(|rec| {
            assert_eq!(rec.len(), 55);
            let ts = u64::from_be_bytes(rec[47..55].try_into().unwrap());
            assert!(
                (started..=now).contains(&ts),
                "timestamp {ts} outside the run"
            );
            let mut rec = rec.to_vec();
            rec[47..55].fill(0);
            rec
        })
        .collect();
    stripped.sort();
    expected.sort();
    for (i, (a, b)) in stripped.iter().zip(&expected).enumerate() {
        assert_eq!(&a[..], &b[..], "result {i} (sorted)");
    }
    // The metrics agree, as Prometheus text and as JSON (the quotes may still be arriving:
    // results need only their first quotes); the page is served.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, text) = get(metrics_addr, "/metrics");
        assert_eq!(code, 200);
        let counts = (
            counter(&text, "canter_source_records_total", "nbbo"),
            counter(&text, "canter_source_records_total", "orders"),
            counter(&text, "canter_sink_records_total", "orders"),
        );
        if counts == (100_000, 100_000, n as u64) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{counts:?}");
        thread::sleep(Duration::from_millis(50));
    }
    let (code, json) = get(metrics_addr, "/metrics.json");
    assert_eq!(code, 200);
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["pipelines"][1]["name"], "orders");
    assert_eq!(json["pipelines"][1]["latency_us"]["count"], n as u64);
    let (code, page) = get(metrics_addr, "/");
    assert_eq!(code, 200);
    assert!(page.contains("metrics.json"));
    // Bad input on a new orders connection: a short record (counted, skipped), then a good
    // order of a rejecting symbol (processed), then an oversized frame (closes that
    // connection only).
    let mut bad = TcpStream::connect(orders_addr).unwrap();
    bad.write_all(&[0, 0, 0, 3, 1, 2, 3]).unwrap();
    let order = &orders[..4 + 53];
    bad.write_all(order).unwrap();
    bad.write_all(&(2u32 << 20).to_be_bytes()).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(bad.read(&mut byte), Ok(0) | Err(_)), "closed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = get(metrics_addr, "/metrics");
        let counts = (
            counter(&text, "canter_rejected_input_total", "orders"),
            counter(&text, "canter_frame_errors_total", "orders"),
            counter(&text, "canter_source_records_total", "orders"),
        );
        if counts == (1, 1, 100_002) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{counts:?}");
        thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM: a clean stop.
    let killed = Command::new("kill")
        .args(["-TERM", &pipe.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = pipe.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after SIGTERM"
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The live metrics page in headless Chromium: it loads, fetches the metrics and draws both
/// charts of every pipeline with the seconds of history the pipeline has so far.
#[test]
fn metrics_page_draws_in_headless_chromium() {
    let (rx, rx_addr) = receive(&["--duration", "30s"]);
    let (pipe, nbbo_addr, orders_addr, metrics_addr) = pipeline(&["--out", &rx_addr.to_string()]);
    let sent = Command::new(env!("CARGO_BIN_EXE_canter"))
        .args([
            "send",
            "market-spread",
            "--symbols",
            "100",
            "--count",
            "40000",
        ])
        .args(["--rate", "10000", "--nbbo", &nbbo_addr.to_string()])
        .args(["--orders", &orders_addr.to_string()])
        .output()
        .unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let (dom, html) = common::chromium_dom(&format!("http://{metrics_addr}/"), 3000);
    assert!(dom.status.success(), "{dom:?}");
    // Four charts (throughput and latency of two pipelines), every series with points.
    let charts = html.matches("<svg").count();
    assert_eq!(charts, 4, "{html}");
    let points: Vec<usize> = html
        .split("data-points=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(points.len(), 10, "2 + 3 series per pipeline: {html}");
    assert!(points.iter().all(|&p| p >= 2), "{points:?}");
    let polyline = html.split("<polyline points=\"").nth(1).unwrap();
    assert!(polyline.split('"').next().unwrap().contains(','), "{html}");
    assert!(html.contains("<td>orders</td>"), "{html}");
    assert!(html.contains("s of history"), "{html}");
    drop(pipe);
    let _ = finish(rx);
}

/// One framed NBBO record (42 bytes) for `symbol`.
fn nbbo_record(symbol: &[u8; 4], bid: f64, offer: f64) -> Vec<u8> {
    let mut r = vec![2u8];
    r.extend_from_slice(symbol);
    r.extend_from_slice(b"20261125-12:00:00.000");
    r.extend_from_slice(&bid.to_be_bytes());
    r.extend_from_slice(&offer.to_be_bytes());
    let mut framed = (r.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&r);
    framed
}

/// One framed order record (53 bytes) for `symbol`.
fn order_record(symbol: &[u8; 4]) -> Vec<u8> {
    let mut r = vec![1u8, 1];
    r.extend_from_slice(&7u32.to_be_bytes());
    r.extend_from_slice(b"ORD001");
    r.extend_from_slice(symbol);
    r.extend_from_slice(&10f64.to_be_bytes());
    r.extend_from_slice(&100f64.to_be_bytes());
    r.extend_from_slice(b"20261125-12:00:00.000");
    let mut framed = (r.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&r);
    framed
}

/// Waits until the pipeline's metrics count `want` source records for `pipeline`.
fn wait_source_records(metrics: SocketAddr, pipeline: &str, want: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = get(metrics, "/metrics");
        let got = counter(&text, "canter_source_records_total", pipeline);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pipeline}: {got} of {want}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// `--max-source-connections 1`: while one source connection is open, the next is refused
/// (closed at once, its records unread), and once the first closes a new one is served.
#[test]
fn max_source_connections_flag_bounds_the_open_sources() {
    let (receiver, out) = receive(&[]);
    let _receiver = Killed(receiver);
    let out = out.to_string();
    let (_pipe, nbbo, orders, metrics) = pipeline(&[
        "--out",
        &out,
        "--workers",
        "1",
        "--max-source-connections",
        "1",
    ]);
    let mut first = TcpStream::connect(nbbo).unwrap();
    first.write_all(&nbbo_record(b"   A", 10.0, 20.0)).unwrap();
    wait_source_records(metrics, "nbbo", 1);
    let mut refused = TcpStream::connect(orders).unwrap();
    let _ = refused.write_all(&order_record(b"   A"));
    refused
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        matches!(refused.read(&mut byte), Ok(0) | Err(_)),
        "the connection over the limit was not closed"
    );
    let (_, text) = get(metrics, "/metrics");
    assert_eq!(counter(&text, "canter_source_records_total", "orders"), 0);
    drop(first);
    // The first connection's end frees its place (after the worker has seen it close).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut next = TcpStream::connect(orders).unwrap();
        let _ = next.write_all(&order_record(b"   A"));
        thread::sleep(Duration::from_millis(100));
        let (_, text) = get(metrics, "/metrics");
        if counter(&text, "canter_source_records_total", "orders") == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no place freed");
    }
}
