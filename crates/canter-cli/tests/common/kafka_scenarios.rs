// The Market Spread on Kafka scenarios, included by each test binary that runs them
// (kafka_pipeline.rs on a plaintext listener, kafka_sasl_ssl.rs on SASL_SSL), which defines
// `fn bootstrap() -> String` and registers its listener's settings.

use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::kafka::{
    check, counter, expected, produce, produce_file, read_committed_values, read_values,
    KafkaPipeline, Topics,
};

/// A fresh directory for a test's generated files.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("canter-kafka-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `canter send market-spread` writing its streams to `dir` (and producing them to `topics`
/// with `--kafka` if asked, with `extra` flags).
fn send(dir: &std::path::Path, count: u64, kafka: Option<&Topics>, extra: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canter"));
    cmd.args([
        "send",
        "market-spread",
        "--symbols",
        "500",
        "--reject-share",
        "0.1",
    ])
    .args([
        "--count",
        &count.to_string(),
        "--write-dir",
        dir.to_str().unwrap(),
    ])
    .args(extra);
    if let Some(t) = kafka {
        cmd.args(["--kafka", &bootstrap()])
            .args(common::kafka::config_flags(&bootstrap()))
            .args(t.flags());
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn market_spread_from_kafka_to_kafka_matches_the_reference() {
    let t = Topics::new("ms-ref");
    let d = dir("ref");
    t.create(&bootstrap(), 4, 1);
    send(&d, 100_000, Some(&t), &[]);
    let want = expected(&d);
    let flags = [
        t.flags(),
        vec![
            "--workers".into(),
            "2".into(),
            "--metrics".into(),
            "127.0.0.1:0".into(),
        ],
    ]
    .concat();
    let p = KafkaPipeline::start(&bootstrap(), "ms-ref", &flags);
    let got = read_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    // The counters, as Prometheus text and JSON.
    // The last quotes may still be on their way when the last result is in.
    p.wait_counter("records_in", 100_000, Duration::from_secs(10));
    // A worker that joined late takes its tasks in a rebalance, which may still be under way
    // when the last result is in: wait until the four tasks are owned again.
    p.wait_counter("tasks_owned", 4, Duration::from_secs(60));
    let metrics = p.metrics_addr();
    let text = common::fetch(metrics, "GET", "/metrics", "");
    assert_eq!(text.status, 200);
    assert!(
        text.text().contains("canter_kafka_records_in_total 100000"),
        "{}",
        text.text()
    );
    assert!(
        text.text().contains("canter_kafka_tasks_owned 4"),
        "{}",
        text.text()
    );
    let json = common::fetch(metrics, "GET", "/metrics.json", "");
    let json: serde_json::Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(json["records_out"], want.len() as u64);
    let counters = p.stop();
    let dups = check(&got, &want);
    assert_eq!(dups, 0, "no failure, no repeats");
    assert_eq!(counter(&counters, "records_in"), 100_000);
    assert_eq!(counter(&counters, "records_out"), want.len() as u64);
    assert_eq!(counter(&counters, "refused"), 0);
    // Every symbol's state went to the changelog.
    assert!(counter(&counters, "changelog_out") >= 500, "{counters:?}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_records_are_counted_and_skipped() {
    let t = Topics::new("ms-bad");
    let d = dir("bad");
    t.create(&bootstrap(), 2, 1);
    // Garbage first: a short record, a wrong type byte, an order with side 9.
    let mut order = vec![1u8, 9];
    order.resize(53, b'x');
    produce(
        &bootstrap(),
        &t.nbbo,
        [
            (b"   A".to_vec(), b"short".to_vec()),
            (b"   A".to_vec(), vec![7u8; 42]),
        ],
    );
    produce(&bootstrap(), &t.orders, [(b"   A".to_vec(), order)]);
    send(&d, 20_000, Some(&t), &[]);
    let want = expected(&d);
    let p = KafkaPipeline::start(&bootstrap(), "ms-bad", &t.flags());
    let got = read_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    let counters = p.stop();
    assert_eq!(check(&got, &want), 0);
    assert_eq!(counter(&counters, "refused"), 3, "{counters:?}");
    assert_eq!(counter(&counters, "records_in"), 20_003);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn state_is_restored_from_the_changelog_after_a_restart() {
    let t = Topics::new("ms-restore");
    let d = dir("restore");
    t.create(&bootstrap(), 3, 1);
    // Quotes only, processed by a first process that then stops.
    send(&d, 20_000, None, &[]);
    let quotes = produce_file(&bootstrap(), &t.nbbo, &d.join("nbbo.bin"), 1);
    let p = KafkaPipeline::start(&bootstrap(), "ms-restore", &t.flags());
    // Wait until the quotes are processed: each commit writes the symbols changed since the
    // last one to the changelog, so once it holds every symbol and has been quiet for 1.5 s,
    // nothing is left to process.
    let changelog = read_values(
        &bootstrap(),
        "ms-restore-symbols-changelog",
        500,
        Duration::from_millis(1_500),
        Duration::from_secs(60),
    );
    assert!(changelog.len() >= 500, "changelog has {}", changelog.len());
    let counters = p.stop();
    assert_eq!(counter(&counters, "records_in"), quotes);
    assert_eq!(counter(&counters, "records_out"), 0);
    // Orders only, for a second process: without the first one's state every order would be
    // rejected (a symbol's initial state rejects).
    produce_file(&bootstrap(), &t.orders, &d.join("orders.bin"), 12);
    let want = expected(&d);
    let p = KafkaPipeline::start(&bootstrap(), "ms-restore", &t.flags());
    let got = read_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    let log = p.log();
    let counters = p.stop();
    assert_eq!(check(&got, &want), 0);
    assert!(counter(&counters, "restored") >= 500, "{counters:?}");
    // It read only the orders: the quotes' offsets were committed.
    assert_eq!(
        counter(&counters, "records_in"),
        20_000 - quotes,
        "{log:#?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn two_processes_share_the_group_and_a_killed_ones_partitions_move_with_their_state() {
    let t = Topics::new("ms-share");
    let d = dir("share");
    t.create(&bootstrap(), 4, 1);
    // A 5 s session (set on the group): A's tasks move to B 5 s after it dies; long enough
    // that neither is dropped for a late heartbeat on a busy machine.
    let flags = [
        t.flags(),
        ["--session-timeout", "5s", "--metrics", "127.0.0.1:0"]
            .map(String::from)
            .to_vec(),
    ]
    .concat();
    let a = KafkaPipeline::start(&bootstrap(), "ms-share", &flags);
    let b = KafkaPipeline::start(&bootstrap(), "ms-share", &flags);
    // Both own tasks before the data flows.
    a.wait_for("task started", Duration::from_secs(30));
    b.wait_for("task started", Duration::from_secs(30));
    // 150,000 records over about 3 s; A is killed once it has state in the changelog and
    // has committed after it (events, not a time: a busy machine may take longer).
    let sender = {
        let (d, t) = (d.clone(), t.clone());
        thread::spawn(move || send(&d, 150_000, Some(&t), &["--rate", "50000"]))
    };
    a.wait_counter("changelog_out", 1, Duration::from_secs(60));
    let commits = a.counter_now("commits");
    a.wait_counter("commits", commits + 1, Duration::from_secs(60));
    let a_pid = a.pid();
    a.kill();
    sender.join().unwrap();
    let want = expected(&d);
    let got = read_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(2),
        Duration::from_secs(90),
    );
    let b_log = b.log();
    let counters = b.stop();
    let dups = check(&got, &want);
    // B took all four tasks, restoring the ones A had from the changelog.
    let started = b_log.iter().filter(|l| l.contains("task started")).count();
    assert!(started >= 4, "B started {started} tasks: {b_log:#?}");
    assert!(counter(&counters, "restored") > 0, "{counters:?}");
    // Repeats only inside the at-least-once window: what A processed after its last commit.
    eprintln!(
        "A (pid {a_pid}) killed: {dups} results repeated of {}",
        want.len()
    );
    assert!(dups < want.len() / 4, "{dups} repeats");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn exactly_once_results_arrive_once_when_a_process_is_killed_and_restarted() {
    let t = Topics::new("ms-eos");
    let d = dir("eos");
    t.create(&bootstrap(), 4, 1);
    let flags = |instance: &str| {
        [
            t.flags(),
            vec![
                "--session-timeout".into(),
                "1s".into(),
                "--exactly-once".into(),
                "--instance-id".into(),
                instance.into(),
                "--metrics".into(),
                "127.0.0.1:0".into(),
            ],
        ]
        .concat()
    };
    let a = KafkaPipeline::start(&bootstrap(), "ms-eos", &flags("a"));
    let b = KafkaPipeline::start(&bootstrap(), "ms-eos", &flags("b"));
    a.wait_for("task started", Duration::from_secs(30));
    b.wait_for("task started", Duration::from_secs(30));
    let sender = {
        let (d, t) = (d.clone(), t.clone());
        thread::spawn(move || send(&d, 150_000, Some(&t), &["--rate", "50000"]))
    };
    // A dies mid-transaction (SIGKILL) a second in; restarted with its instance id, it
    // aborts its predecessor's open transaction at once.
    thread::sleep(Duration::from_millis(1_000));
    a.wait_counter("transactions", 1, Duration::from_secs(10));
    a.kill();
    thread::sleep(Duration::from_millis(300));
    let a = KafkaPipeline::start(&bootstrap(), "ms-eos", &flags("a"));
    sender.join().unwrap();
    let want = expected(&d);
    let got = read_committed_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(3),
        Duration::from_secs(90),
    );
    let counters = [a.stop(), b.stop()];
    let dups = check(&got, &want);
    assert_eq!(dups, 0, "exactly once: no result repeated");
    assert_eq!(got.len(), want.len());
    assert!(
        counters
            .iter()
            .map(|c| counter(c, "transactions"))
            .sum::<u64>()
            > 0,
        "{counters:?}"
    );
    // A plain (read_uncommitted) reader sees what the killed process wrote and never
    // committed: the test would catch results that were simply not repeated.
    let all = read_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(1),
        Duration::from_secs(30),
    );
    eprintln!(
        "exactly once: {} results committed, {} written in all",
        got.len(),
        all.len()
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn exactly_once_fences_a_frozen_process_that_comes_back_as_a_zombie() {
    let t = Topics::new("ms-eos-zombie");
    let d = dir("eos-zombie");
    t.create(&bootstrap(), 4, 1);
    let flags = |instance: &str| {
        [
            t.flags(),
            [
                "--exactly-once",
                // 5 s: a member is not dropped for a late heartbeat on a busy machine (with
                // 1 s both were, again and again, and nothing was committed).
                "--session-timeout",
                "5s",
                "--transaction-timeout",
                "5s",
                "--instance-id",
                instance,
                "--metrics",
                "127.0.0.1:0",
            ]
            .map(String::from)
            .to_vec(),
        ]
        .concat()
    };
    let a = KafkaPipeline::start(&bootstrap(), "ms-eos-zombie", &flags("a"));
    let b = KafkaPipeline::start(&bootstrap(), "ms-eos-zombie", &flags("b"));
    a.wait_for("task started", Duration::from_secs(30));
    b.wait_for("task started", Duration::from_secs(30));
    let sender = {
        let (d, t) = (d.clone(), t.clone());
        thread::spawn(move || send(&d, 150_000, Some(&t), &["--rate", "30000"]))
    };
    // A freezes with a transaction open, past its session (B takes all its tasks) and past
    // its transaction's timeout (the broker aborts it, and B, which waited for that, commits
    // again). Let go, A is a zombie: its member is gone and its producer's epoch is fenced; it
    // must commit nothing and join again. Every step waits for what it needs to see.
    a.wait_counter("transactions", 2, Duration::from_secs(60));
    // SAFETY: kill(2) on the child's pid, which the pipeline handle owns and has not reaped.
    unsafe { libc::kill(a.pid() as i32, libc::SIGSTOP) };
    let frozen = std::time::Instant::now();
    b.wait_counter("tasks_owned", 4, Duration::from_secs(120));
    // Past the transaction timeout, with a second to spare.
    thread::sleep(Duration::from_secs(6).saturating_sub(frozen.elapsed()));
    let committed = b.counter_now("transactions");
    b.wait_counter("transactions", committed + 2, Duration::from_secs(120));
    // SAFETY: as above.
    unsafe { libc::kill(a.pid() as i32, libc::SIGCONT) };
    sender.join().unwrap();
    let want = expected(&d);
    let got = read_committed_values(
        &bootstrap(),
        &t.results,
        want.len(),
        Duration::from_secs(3),
        Duration::from_secs(90),
    );
    let a_log = a.log();
    let counters = [a.stop(), b.stop()];
    let dups = check(&got, &want);
    assert_eq!(dups, 0, "results repeated");
    assert!(
        counter(&counters[0], "aborts") > 0,
        "the zombie aborted its transaction: {counters:?} {a_log:#?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn exactly_once_holds_when_a_process_dies_inside_a_commit_or_a_hand_over() {
    for (i, point) in ["commit-before-offsets", "commit-before-end", "hand-over"]
        .into_iter()
        .enumerate()
    {
        let name = format!("ms-eos-fp{i}");
        let t = Topics::new(&name);
        let d = dir(&name);
        t.create(&bootstrap(), 4, 1);
        let flags = |instance: &str| {
            [
                t.flags(),
                // A 5 s session: a member is not dropped for a late heartbeat on a busy
                // machine (it then rejoined, and the failpoint's count went astray); a
                // process that restarts with its instance id takes its place at once.
                [
                    "--exactly-once",
                    "--session-timeout",
                    "5s",
                    "--instance-id",
                    instance,
                ]
                .map(String::from)
                .to_vec(),
            ]
            .concat()
        };
        // The input is all there first; A alone owns every task and dies at the point: in its
        // fifth commit, or when B's arrival makes it hand tasks over.
        send(&d, 60_000, Some(&t), &[]);
        let want = expected(&d);
        let nth = if point == "hand-over" { "1" } else { "5" };
        let fp = format!("{point}:{nth}");
        let mut a = KafkaPipeline::start_with_env(
            &bootstrap(),
            &name,
            &flags("a"),
            &[("CANTER_FAILPOINT", &fp)],
        );
        let b = if point == "hand-over" {
            a.wait_for("task started", Duration::from_secs(30));
            thread::sleep(Duration::from_millis(300));
            Some(KafkaPipeline::start(&bootstrap(), &name, &flags("b")))
        } else {
            None
        };
        let st = a.wait_exit(Duration::from_secs(60));
        assert!(!st.success(), "{point}: the failpoint ended A ({st})");
        assert!(
            a.log()
                .iter()
                .any(|l| l.contains("CANTER_FAILPOINT reached")),
            "{point}: {:#?}",
            a.log()
        );
        // A again (its instance id aborts the open transaction), and the results once.
        let a = KafkaPipeline::start(&bootstrap(), &name, &flags("a"));
        let got = read_committed_values(
            &bootstrap(),
            &t.results,
            want.len(),
            Duration::from_secs(3),
            Duration::from_secs(90),
        );
        a.stop();
        if let Some(b) = b {
            b.stop();
        }
        let dups = check(&got, &want);
        assert_eq!(dups, 0, "{point}: results repeated");
        eprintln!("{point}: {} results, each once", got.len());
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// `canter pipeline market-spread --kafka ARGS` run to its end: (success, stderr, seconds).
fn run_pipeline(args: &[&str]) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_canter"));
    cmd.args(["pipeline", "market-spread"]).args(args);
    // The test cluster's settings where the address is its.
    if let Some(at) = args.iter().position(|a| *a == "--kafka") {
        if let Some(addr) = args.get(at + 1) {
            cmd.args(common::kafka::config_flags(addr));
        }
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    )
}

#[test]
fn inputs_that_are_not_co_partitioned_are_refused_at_start() {
    let t = Topics::new("ms-copart");
    t.create(&bootstrap(), 2, 1);
    // The orders topic again, with another partition count.
    let orders = "ms-copart-orders3";
    common::kafka::create_topic(&bootstrap(), orders, 3);
    let (ok, err, _) = run_pipeline(&[
        "--kafka",
        &bootstrap(),
        "--group",
        "ms-copart",
        "--nbbo-topic",
        &t.nbbo,
        "--orders-topic",
        orders,
        "--results-topic",
        &t.results,
    ]);
    assert!(!ok);
    assert!(
        err.contains("not co-partitioned") && err.contains(orders),
        "{err}"
    );
}

#[test]
fn a_pipeline_started_before_its_topics_waits_for_them() {
    let t = Topics::new("ms-later");
    let p = KafkaPipeline::spawn(&bootstrap(), "ms-later", &t.flags(), &[]);
    p.wait_for("kafka: waiting for topics", Duration::from_secs(60));
    let log = p.log();
    let line = log.iter().find(|l| l.contains("waiting for topics")).unwrap();
    assert!(
        line.contains(&t.nbbo) && line.contains(&t.orders) && line.contains(&t.results),
        "{line}"
    );
    t.create(&bootstrap(), 2, 1);
    p.wait_for("every topic exists now", Duration::from_secs(60));
    p.wait_for(
        "canter pipeline market-spread: Kafka",
        Duration::from_secs(60),
    );
    p.stop();
}

#[test]
fn results_over_the_maximum_record_are_refused_counted_and_reported() {
    let t = Topics::new("ms-toolarge");
    let d = dir("toolarge");
    t.create(&bootstrap(), 2, 1);
    send(&d, 10_000, Some(&t), &[]);
    let want = expected(&d);
    // A result is 59 bytes (4 of key, 55 of value): a 50-byte maximum refuses every one.
    let flags = [
        t.flags(),
        vec![
            "--max-record".into(),
            "50".into(),
            "--metrics".into(),
            "127.0.0.1:0".into(),
        ],
    ]
    .concat();
    let p = KafkaPipeline::start(&bootstrap(), "ms-toolarge", &flags);
    p.wait_for("the output refused a result", Duration::from_secs(30));
    p.wait_counter("records_in", 10_000, Duration::from_secs(30));
    let log = p.log();
    let counters = p.stop();
    assert!(
        log.iter()
            .any(|l| l.contains("kafka: a record of 59 bytes is over the maximum of 50")),
        "{log:#?}"
    );
    // Every input record was processed, every result refused and counted, none written.
    assert_eq!(counter(&counters, "records_in"), 10_000);
    assert_eq!(counter(&counters, "sink_refused"), want.len() as u64);
    assert_eq!(counter(&counters, "records_out"), 0);
    let written = read_values(
        &bootstrap(),
        &t.results,
        0,
        Duration::from_millis(500),
        Duration::from_secs(5),
    );
    assert!(written.is_empty(), "{} results written", written.len());
    let _ = std::fs::remove_dir_all(&d);
}
