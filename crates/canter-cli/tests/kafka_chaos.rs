//! The black-box fault harness: Market Spread with `--exactly-once` on a three-broker Kafka
//! cluster, two pipeline processes, generated input arriving at a steady rate, and faults at
//! random points chosen by a seed: a pipeline process killed (SIGKILL) and restarted, with its
//! instance id or a new one; a pipeline process frozen (SIGSTOP, then SIGCONT), sometimes
//! past its session timeout (it comes back a zombie the group has fenced); a broker killed
//! and restarted; a broker frozen. When the input has all been sent, the faults stop and the
//! results are read `read_committed` and checked against the independent reference: every
//! expected result exactly once, nothing else.
//!
//! The test suite runs a short version (about 20 s of faults). Knobs, for replaying a seed or
//! running a long version (`bench/chaos.py`):
//! `CANTER_CHAOS_SEED` (default 1; always printed), `CANTER_CHAOS_SECONDS`
//! (how long input flows and faults happen, default 20), `CANTER_CHAOS_RATE` (input records
//! a second, default 10000).

#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::{Duration, Instant};

mod common;
use common::kafka::{compare, expected, read_committed_values, KafkaPipeline, Topics};

use canter_testkit::KafkaCluster;

/// splitmix64: the schedule from the seed (the same seed gives the same faults, in the same
/// order and with the same pauses).
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

#[derive(Default, Debug)]
struct Counts {
    kills: u32,
    new_ids: u32,
    stops: u32,
    zombies: u32,
    broker_kills: u32,
    broker_stops: u32,
}

impl Counts {
    fn total(&self) -> u32 {
        self.kills + self.stops + self.broker_kills + self.broker_stops
    }
}

#[test]
fn exactly_once_survives_random_kills_freezes_and_broker_restarts() {
    // The suite runs one schedule (seed 1); other seeds are for replays and long runs.
    let seed = env_u64("CANTER_CHAOS_SEED", 1);
    let seconds = env_u64("CANTER_CHAOS_SECONDS", 20);
    let rate = env_u64("CANTER_CHAOS_RATE", 10_000);
    eprintln!(
        "kafka chaos: seed={seed} seconds={seconds} rate={rate} (replay: CANTER_CHAOS_SEED={seed})"
    );
    let mut rng = Rng(seed);
    let started = Instant::now();

    let cluster = KafkaCluster::start(3);
    let bootstrap = cluster.bootstrap().to_owned();
    let t = Topics::new("chaos");
    t.create(&bootstrap, 4, 3);
    let dir = std::env::temp_dir().join(format!("canter-kafka-chaos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let flags = |instance: &str| {
        [
            t.flags(),
            [
                "--exactly-once",
                "--session-timeout",
                "1s",
                "--transaction-timeout",
                "5s",
                "--instance-id",
                instance,
            ]
            .map(String::from)
            .to_vec(),
        ]
        .concat()
    };
    let mut names = ["p0".to_owned(), "p1".to_owned()];
    let mut procs: Vec<KafkaPipeline> = names
        .iter()
        .map(|n| KafkaPipeline::start(&bootstrap, "chaos", &flags(n)))
        .collect();

    let count = seconds * rate;
    let sender = {
        let (dir, t, bootstrap) = (dir.clone(), t.clone(), bootstrap.clone());
        thread::spawn(move || {
            let (count, rate) = (count.to_string(), rate.to_string());
            let args = ["--symbols", "500", "--count", &count, "--rate", &rate];
            common::kafka::send_market_spread(&bootstrap, &t, &dir, &args)
        })
    };

    let mut counts = Counts::default();
    let at = || format!("{:.1}s", started.elapsed().as_secs_f64());
    while !sender.is_finished() {
        thread::sleep(rng.millis(300, 1_500));
        if sender.is_finished() {
            break;
        }
        let which = rng.below(procs.len() as u64) as usize;
        match rng.below(100) {
            // A pipeline process killed mid-whatever, restarted after a pause: mostly with its
            // instance id (its open transaction is aborted at once), sometimes as a new
            // instance (the brokers abort the dead one's transaction after its timeout).
            0..=39 => {
                let p = procs.remove(which);
                eprintln!(
                    "kafka chaos {}: SIGKILL {} (pid {})",
                    at(),
                    names[which],
                    p.pid()
                );
                p.kill();
                counts.kills += 1;
                thread::sleep(rng.millis(0, 1_000));
                if rng.below(5) == 0 {
                    names[which] = format!("{}-{}", &names[which][..2], counts.kills);
                    counts.new_ids += 1;
                }
                procs.insert(
                    which,
                    KafkaPipeline::start(&bootstrap, "chaos", &flags(&names[which])),
                );
            }
            // Frozen, then let go: past the 1 s session timeout it is a zombie whose group
            // fenced it, and its open transaction must never commit.
            40..=64 => {
                let pause = rng.millis(200, 3_000);
                let pid = procs[which].pid();
                eprintln!(
                    "kafka chaos {}: SIGSTOP {} for {pause:?}",
                    at(),
                    names[which]
                );
                signal(pid, libc::SIGSTOP);
                thread::sleep(pause);
                signal(pid, libc::SIGCONT);
                counts.stops += 1;
                counts.zombies += u32::from(pause > Duration::from_secs(1));
            }
            // A broker killed and restarted: leaders, group and transaction coordinators move.
            65..=77 => {
                let node = 1 + rng.below(3) as usize;
                let down = rng.millis(500, 3_000);
                eprintln!("kafka chaos {}: broker {node} SIGKILL for {down:?}", at());
                cluster.signal(node, "KILL");
                thread::sleep(down);
                cluster.restart(node);
                counts.broker_kills += 1;
            }
            // A broker frozen: requests to it time out or wait.
            _ => {
                let node = 1 + rng.below(3) as usize;
                let pause = rng.millis(200, 2_000);
                eprintln!("kafka chaos {}: broker {node} SIGSTOP for {pause:?}", at());
                cluster.signal(node, "STOP");
                thread::sleep(pause);
                cluster.signal(node, "CONT");
                counts.broker_stops += 1;
            }
        }
    }
    sender.join().unwrap();
    let want = expected(&dir);
    let got = read_committed_values(
        &bootstrap,
        &t.results,
        want.len(),
        Duration::from_secs(3),
        Duration::from_secs(180),
    );
    for p in procs {
        p.kill();
    }
    let (duplicates, missing, wrong) = compare(&got, &want);
    eprintln!(
        "kafka chaos: seed={seed} faults={} {counts:?} expected={} got={} duplicates={duplicates} missing={missing} wrong={wrong} took={:.0}s",
        counts.total(),
        want.len(),
        got.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        duplicates == 0 && missing == 0 && wrong == 0,
        "exactly once broken: {duplicates} repeated, {missing} missing, {wrong} not in the reference ({}); replay with CANTER_CHAOS_SEED={seed}",
        common::kafka::explain(&got, &want)
    );
    assert!(counts.total() > 0, "no fault happened");
    let _ = std::fs::remove_dir_all(&dir);
}
