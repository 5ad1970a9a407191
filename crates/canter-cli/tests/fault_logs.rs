//! Logs under attack: what a client does wrong is a DEBUG line each, a periodic INFO summary
//! with counts by kind, and Prometheus counters, so no peer controls the INFO log's volume.

#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::Server;

const MALFORMED: usize = 10_000;
const THREADS: usize = 4;

/// Sends one malformed request on a new connection and reads the answer to the end.
fn one_bad_request(server: &Server) {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 400 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

/// The counts by kind in the INFO summary lines of `log`, added up.
fn summed(log: &str, kind: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("client faults in the last"))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.strip_prefix(&format!("{kind}=")))
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

fn metric(text: &str, kind: &str) -> Option<u64> {
    let key = format!("canter_client_errors_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|n| n.parse().unwrap())
}

#[test]
fn ten_thousand_malformed_requests_make_a_few_info_lines_and_counters() {
    let server = Server::start_with(&[
        "--metrics",
        "--fault-log-interval",
        "1",
        "--head-timeout",
        "1",
    ]);
    let started = Instant::now();
    thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..MALFORMED / THREADS {
                    one_bad_request(&server);
                }
            });
        }
    });
    // A head that never ends (408), and a connection the client resets mid-head.
    let mut slow = TcpStream::connect(server.addr()).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost:").unwrap();
    let reset = TcpStream::connect(server.addr()).unwrap();
    (&reset).write_all(b"GET / HT").unwrap();
    thread::sleep(Duration::from_millis(100));
    socket2::SockRef::from(&reset)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(reset);
    let mut answer = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = slow.read_to_end(&mut answer);
    assert!(answer.starts_with(b"HTTP/1.1 408 "), "{answer:?}");

    // Counters first (they are exact at once), then the summaries, which come once a second.
    let metrics = common::curl(&[&server.url("/metrics")]);
    let text = String::from_utf8(metrics.stdout).unwrap();
    assert_eq!(
        metric(&text, "bad_request"),
        Some(MALFORMED as u64),
        "{text}"
    );
    assert_eq!(metric(&text, "head_timeout"), Some(1), "{text}");
    assert_eq!(metric(&text, "reset"), Some(1), "{text}");
    assert_eq!(metric(&text, "bad_body"), Some(0), "{text}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = server.log();
        if summed(&log, "bad_request") == MALFORMED as u64
            && summed(&log, "head_timeout") == 1
            && summed(&log, "reset") == 1
        {
            break log;
        }
        assert!(Instant::now() < deadline, "summaries incomplete:\n{log}");
        thread::sleep(Duration::from_millis(100));
    };
    let info: Vec<&str> = log.lines().filter(|l| l.contains(" INFO ")).collect();
    let summaries = info
        .iter()
        .filter(|l| l.contains("client faults in the last"))
        .count();
    // One a second at most while the faults came, plus one for the timeout and the reset.
    let seconds = started.elapsed().as_secs() as usize + 1;
    assert!(
        (1..=seconds + 1).contains(&summaries),
        "{summaries} summaries in {seconds} s:\n{log}"
    );
    // Nothing else at INFO besides the start-up lines: not one line per bad request.
    assert!(
        info.len() <= summaries + 5,
        "{} INFO lines:\n{log}",
        info.len()
    );
    assert!(!log.contains("bad request"), "{log}");
}
