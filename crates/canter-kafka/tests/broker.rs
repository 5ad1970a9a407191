//! The client against a real Kafka broker (tools/kafka/kafka.sh, one per test binary).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use canter_kafka::{
    partition_for, Cluster, Compression, Config, Error, FetchConfig, Fetcher, Member, Producer,
    ProducerConfig,
};
use canter_testkit::KafkaCluster;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn cluster() -> Cluster {
    Cluster::connect(Config::new(KafkaCluster::shared().bootstrap()))
        .await
        .unwrap()
}

/// Reads every record of `topic` from the beginning until `want` arrived (or 30 s passed):
/// (partition, key, value) in offset order per partition.
async fn read_all(topic: &str, want: usize) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    read(topic, want, false).await
}

/// [`read_all`], `read_committed` if asked.
async fn read(topic: &str, want: usize, read_committed: bool) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    let mut c = cluster().await;
    c.refresh(&[topic]).await.unwrap();
    let n = c.topic(topic).unwrap().partitions.len() as i32;
    let config = FetchConfig {
        read_committed,
        ..FetchConfig::default()
    };
    let mut f = Fetcher::new(c, config);
    for p in 0..n {
        f.assign(topic, p, None).await.unwrap();
    }
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < want && Instant::now() < deadline {
        for got in f.fetch().await.unwrap() {
            got.for_each(&mut scratch, |r| {
                out.push((
                    got.partition,
                    r.key.unwrap_or_default().to_vec(),
                    r.value.unwrap_or_default().to_vec(),
                ))
            })
            .unwrap();
        }
    }
    out
}

#[test]
fn records_go_to_their_keys_partition_and_come_back_in_every_codec() {
    rt().block_on(async {
        for (i, codec) in [
            Compression::None,
            Compression::Gzip,
            Compression::Lz4,
            Compression::Zstd,
        ]
        .into_iter()
        .enumerate()
        {
            let topic = format!("roundtrip-{i}");
            let mut c = cluster().await;
            c.create_topic(&topic, 3, 1, &[]).await.unwrap();
            let config = ProducerConfig {
                compression: codec,
                ..ProducerConfig::default()
            };
            let mut p = Producer::new(c, config).await.unwrap();
            assert!(p.producer_id().0 >= 0, "an idempotent producer has an id");
            let (t, n) = p.topic(&topic).await.unwrap();
            assert_eq!(n, 3);
            // Three flushes: the sequence numbers carry on from one batch to the next (a gap
            // would be refused with OUT_OF_ORDER_SEQUENCE_NUMBER).
            for round in 0..3 {
                for k in 0..100 {
                    let key = format!("key-{k}");
                    let value = format!("{round}:{k}");
                    let part = partition_for(key.as_bytes(), n);
                    p.send(
                        t,
                        part,
                        Some(key.as_bytes()),
                        value.as_bytes(),
                        1_700_000_000_000,
                    )
                    .unwrap();
                }
                assert_eq!(p.flush().await.unwrap(), 100);
            }
            let got = read_all(&topic, 300).await;
            assert_eq!(got.len(), 300, "{codec:?}");
            let mut per_key: BTreeMap<Vec<u8>, Vec<String>> = BTreeMap::new();
            for (part, key, value) in got {
                assert_eq!(
                    part,
                    partition_for(&key, 3),
                    "a key's records share its partition"
                );
                per_key
                    .entry(key)
                    .or_default()
                    .push(String::from_utf8(value).unwrap());
            }
            assert_eq!(per_key.len(), 100);
            for (key, values) in per_key {
                let k = std::str::from_utf8(&key)
                    .unwrap()
                    .trim_start_matches("key-")
                    .to_owned();
                // Per key, in the order they were sent.
                assert_eq!(
                    values,
                    vec![format!("0:{k}"), format!("1:{k}"), format!("2:{k}")]
                );
            }
        }
    });
}

#[test]
fn a_record_over_the_maximum_is_refused_with_an_error() {
    rt().block_on(async {
        let mut c = cluster().await;
        c.create_topic("too-large", 1, 1, &[]).await.unwrap();
        let config = ProducerConfig {
            max_record: 1024,
            ..ProducerConfig::default()
        };
        let mut p = Producer::new(c, config).await.unwrap();
        let (t, _) = p.topic("too-large").await.unwrap();
        let e = p.send(t, 0, None, &[0u8; 2000], 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    size: 2000,
                    max: 1024
                }
            ),
            "{e}"
        );
        // The producer still works.
        p.send(t, 0, None, b"small", 0).unwrap();
        assert_eq!(p.flush().await.unwrap(), 1);
    });
}

#[test]
fn an_unreachable_broker_is_a_clear_error_after_a_bounded_wait() {
    rt().block_on(async {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = Config::new(format!("127.0.0.1:{port}"));
        config.bootstrap_timeout = Duration::from_secs(2);
        let t0 = Instant::now();
        let e = Cluster::connect(config).await.err().unwrap();
        let took = t0.elapsed();
        assert!(matches!(e, Error::Unreachable(_)), "{e}");
        assert!(
            e.to_string().contains(&port.to_string()),
            "names the address: {e}"
        );
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(10),
            "{took:?}"
        );
    });
}

#[test]
fn group_members_share_partitions_and_a_leaver_hands_them_over() {
    rt().block_on(async {
        let topic = "group-share";
        let mut c1 = cluster().await;
        c1.create_topic(topic, 4, 1, &[]).await.unwrap();
        let mut c2 = cluster().await;
        let mut a = Member::new("g-share", &[topic]);
        let mut b = Member::new("g-share", &[topic]);
        let mut owned_a = std::collections::BTreeSet::new();
        let mut owned_b = std::collections::BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        // Heartbeat both until each owns two partitions.
        while !(owned_a.len() == 2 && owned_b.len() == 2) {
            assert!(Instant::now() < deadline, "a={owned_a:?} b={owned_b:?}");
            for (m, c, owned) in [
                (&mut a, &mut c1, &mut owned_a),
                (&mut b, &mut c2, &mut owned_b),
            ] {
                let ch = m.heartbeat(c).await.unwrap();
                for tp in ch.revoked {
                    owned.remove(&tp);
                }
                for tp in ch.assigned {
                    owned.insert(tp);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(owned_a.is_disjoint(&owned_b), "a={owned_a:?} b={owned_b:?}");

        // Offsets committed by a member are what the group reads back.
        let commits: Vec<_> = owned_a.iter().map(|tp| (tp.clone(), 42)).collect();
        a.commit(&mut c1, &commits).await.unwrap();
        let parts: Vec<_> = owned_a.iter().cloned().collect();
        let got = a.committed(&mut c1, &parts).await.unwrap();
        assert!(got.iter().all(|(_, o)| *o == Some(42)), "{got:?}");
        let parts_b: Vec<_> = owned_b.iter().cloned().collect();
        let got = b.committed(&mut c2, &parts_b).await.unwrap();
        assert!(
            got.iter().all(|(_, o)| o.is_none()),
            "nothing committed yet: {got:?}"
        );

        // A leaves: B gets all four.
        a.leave(&mut c1).await.unwrap();
        while owned_b.len() < 4 {
            assert!(Instant::now() < deadline, "b={owned_b:?}");
            let ch = b.heartbeat(&mut c2).await.unwrap();
            owned_b.extend(ch.assigned);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And the offsets A committed are there for B.
        let got = b.committed(&mut c2, &parts).await.unwrap();
        assert!(got.iter().all(|(_, o)| *o == Some(42)), "{got:?}");
    });
}

#[test]
fn a_flush_bigger_than_a_batch_goes_out_as_several_in_order() {
    rt().block_on(async {
        let mut c = cluster().await;
        c.create_topic("big-flush", 1, 1, &[]).await.unwrap();
        // 3 MiB to one partition in one flush: over the broker's 1 MiB per batch unless the
        // producer splits it.
        let mut p = Producer::new(c, ProducerConfig::default()).await.unwrap();
        let (t, _) = p.topic("big-flush").await.unwrap();
        let value = vec![b'v'; 1_000];
        for i in 0..3_000u32 {
            p.send(t, 0, Some(&i.to_be_bytes()), &value, 0).unwrap();
        }
        assert_eq!(p.flush().await.unwrap(), 3_000);
        let got = read_all("big-flush", 3_000).await;
        assert_eq!(got.len(), 3_000);
        for (i, (_, key, _)) in got.iter().enumerate() {
            assert_eq!(key.as_slice(), (i as u32).to_be_bytes(), "in order");
        }
    });
}

/// Joins `group` alone and heartbeats until it owns every partition of `topic` (`n` of them).
async fn join_alone(group: &str, topic: &str, n: usize) -> (Member, Cluster) {
    let mut c = cluster().await;
    let mut m = Member::new(group, &[topic]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut owned = 0;
    while owned < n {
        assert!(Instant::now() < deadline, "{group} owns {owned} of {n}");
        owned += m.heartbeat(&mut c).await.unwrap().assigned.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (m, c)
}

#[test]
fn committed_transactions_are_read_once_and_aborted_ones_never() {
    rt().block_on(async {
        let topic = "txn-visibility";
        let mut c = cluster().await;
        c.create_topic(topic, 2, 1, &[]).await.unwrap();
        let (mut member, mut gc) = join_alone("g-txn", topic, 2).await;
        let config = ProducerConfig {
            transactional_id: Some("txn-visibility-1".into()),
            ..ProducerConfig::default()
        };
        let mut p = Producer::new(cluster().await, config).await.unwrap();
        let (t, n) = p.topic(topic).await.unwrap();
        let send = |p: &mut Producer, tag: &str, count: usize| {
            for i in 0..count {
                let key = format!("{tag}-{i}");
                p.send(
                    t,
                    partition_for(key.as_bytes(), n),
                    Some(key.as_bytes()),
                    tag.as_bytes(),
                    0,
                )
                .unwrap();
            }
        };
        // Committed, with offsets.
        send(&mut p, "a", 100);
        p.flush().await.unwrap();
        p.add_offsets("g-txn").await.unwrap();
        let txn = p.transaction().unwrap();
        let offsets = vec![((topic.to_owned(), 0), 7), ((topic.to_owned(), 1), 9)];
        member
            .commit_in_transaction(&mut gc, &txn, &offsets)
            .await
            .unwrap();
        p.commit_transaction().await.unwrap();
        // Written (acknowledged by the brokers), offsets given, then aborted.
        send(&mut p, "b", 100);
        p.flush().await.unwrap();
        p.add_offsets("g-txn").await.unwrap();
        let txn = p.transaction().unwrap();
        let offsets_b = vec![((topic.to_owned(), 0), 70), ((topic.to_owned(), 1), 90)];
        member
            .commit_in_transaction(&mut gc, &txn, &offsets_b)
            .await
            .unwrap();
        p.abort();
        p.ready().await.unwrap();
        assert!(
            p.transaction().unwrap().producer.1 > txn.producer.1,
            "a new epoch"
        );
        // Committed again after the abort.
        send(&mut p, "c", 100);
        p.commit_transaction().await.unwrap();

        let committed = read(topic, 200, true).await;
        let mut tags: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
        for (_, _, v) in &committed {
            *tags.entry(v.clone()).or_default() += 1;
        }
        assert_eq!(
            tags,
            BTreeMap::from([(b"a".to_vec(), 100), (b"c".to_vec(), 100)]),
            "read_committed sees both committed transactions once and nothing of the aborted one"
        );
        let everything = read(topic, 300, false).await;
        assert_eq!(
            everything.len(),
            300,
            "read_uncommitted sees the aborted records too"
        );
        // The offsets of the committed transaction count; the aborted one's do not.
        let parts = vec![(topic.to_owned(), 0), (topic.to_owned(), 1)];
        let got = member.committed(&mut gc, &parts).await.unwrap();
        assert_eq!(
            got,
            vec![
                ((topic.to_owned(), 0), Some(7)),
                ((topic.to_owned(), 1), Some(9))
            ]
        );
    });
}

#[test]
fn a_second_producer_with_the_same_transactional_id_fences_the_first() {
    rt().block_on(async {
        let topic = "txn-fence";
        let mut c = cluster().await;
        c.create_topic(topic, 1, 1, &[]).await.unwrap();
        let config = ProducerConfig {
            transactional_id: Some("txn-fence-1".into()),
            ..ProducerConfig::default()
        };
        let mut old = Producer::new(cluster().await, config.clone())
            .await
            .unwrap();
        let (t, _) = old.topic(topic).await.unwrap();
        old.send(t, 0, None, b"zombie", 0).unwrap();
        old.flush().await.unwrap();
        // The new one aborts the old one's open transaction and fences it.
        let mut new = Producer::new(cluster().await, config).await.unwrap();
        let (t2, _) = new.topic(topic).await.unwrap();
        new.send(t2, 0, None, b"live", 0).unwrap();
        new.commit_transaction().await.unwrap();
        old.send(t, 0, None, b"zombie again", 0).unwrap();
        let err = old.commit_transaction().await.unwrap_err();
        assert!(
            matches!(err, Error::Broker { code: 47 | 90, .. }),
            "the old producer is fenced: {err}"
        );
        let got = read(topic, 1, true).await;
        let values: Vec<&[u8]> = got.iter().map(|(_, _, v)| v.as_slice()).collect();
        assert_eq!(values, vec![b"live".as_slice()]);
    });
}

#[test]
fn snappy_batches_from_javas_producer_are_read_and_ours_are_read_by_javas_consumer() {
    rt().block_on(async {
        let mut c = cluster().await;
        c.create_topic("snappy-java", 2, 1, &[]).await.unwrap();
        let out = KafkaCluster::shared().run_tool(
            "org.apache.kafka.tools.ProducerPerformance",
            &[
                "--topic",
                "snappy-java",
                "--num-records",
                "2000",
                "--record-size",
                "300",
                "--throughput",
                "-1",
                "--producer-props",
                &format!("bootstrap.servers={}", KafkaCluster::shared().bootstrap()),
                "compression.type=snappy",
                "linger.ms=20",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = read_all("snappy-java", 2000).await;
        assert_eq!(got.len(), 2000);
        assert!(got.iter().all(|(_, _, v)| v.len() == 300));
        // Ours, snappy: Java's consumer reads them.
        c.create_topic("snappy-ours", 1, 1, &[]).await.unwrap();
        let config = ProducerConfig {
            compression: Compression::Snappy,
            ..ProducerConfig::default()
        };
        let mut p = Producer::new(cluster().await, config).await.unwrap();
        let (t, _) = p.topic("snappy-ours").await.unwrap();
        for i in 0..500 {
            let v = format!("snappy record {i} {}", "x".repeat(100));
            p.send(t, 0, None, v.as_bytes(), 1_700_000_000_000).unwrap();
        }
        assert_eq!(p.flush().await.unwrap(), 500);
        let out = KafkaCluster::shared().run_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            &[
                "--bootstrap-server",
                KafkaCluster::shared().bootstrap(),
                "--topic",
                "snappy-ours",
                "--from-beginning",
                "--max-messages",
                "500",
                "--timeout-ms",
                "60000",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("snappy record"))
                .count(),
            500,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}
