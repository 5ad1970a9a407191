//! Market Spread on Kafka: the task behind `canter pipeline market-spread --kafka`, and the
//! producer of its inputs behind `canter send market-spread --kafka`.
//!
//! Topics `nbbo` and `orders` (co-partitioned) in, `results` out; every record's value is the
//! record of the TCP form without its length prefix, keyed by its 4-byte symbol. A symbol's
//! state (its last quote) lives with its partition and is written to the changelog topic
//! `<group>-symbols-changelog` as 17 bytes: reject flag, bid, offer.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use canter_kafka::{partition_for, ClientSettings, Cluster, Error, Producer, ProducerConfig};
use canter_stream::kafka::{Keyed, KeyedTask, Out, Refused};
use serde::Serialize;

use crate::market_spread::{generate, Nbbo, Order, Rejected, Symbol, SymbolState};

/// Market Spread as a [`KeyedTask`]: input 0 is NBBO, input 1 orders.
#[derive(Debug, Default, Clone, Copy)]
pub struct MarketSpreadTask;

impl KeyedTask for MarketSpreadTask {
    type Key = Symbol;
    type State = SymbolState;

    #[inline]
    fn process(
        &self,
        input: usize,
        _key: Option<&[u8]>,
        value: &[u8],
        state: &mut Keyed<Symbol, SymbolState>,
        out: &mut Out<'_>,
    ) -> Result<(), Refused> {
        if input == 0 {
            let q = Nbbo::decode(value)?;
            *state.update(q.symbol, SymbolState::default) = SymbolState {
                reject: q.rejects(),
                bid: q.bid,
                offer: q.offer,
            };
        } else {
            let order = Order::decode(value)?;
            let st = state.get(&order.symbol).copied().unwrap_or_default();
            if st.reject {
                let r = Rejected {
                    order,
                    bid: st.bid,
                    offer: st.offer,
                    timestamp: out.read_time_ns(),
                };
                out.emit_with(&order.symbol, |buf| r.encode(buf));
            }
        }
        Ok(())
    }

    fn encode_key(&self, key: &Symbol, buf: &mut Vec<u8>) {
        buf.extend_from_slice(key);
    }

    fn decode_key(&self, bytes: &[u8]) -> Option<Symbol> {
        bytes.try_into().ok()
    }

    fn encode_state(&self, s: &SymbolState, buf: &mut Vec<u8>) {
        s.encode(buf)
    }

    fn decode_state(&self, b: &[u8]) -> Option<SymbolState> {
        SymbolState::decode(b)
    }
}

/// What `canter send market-spread --kafka` does.
#[derive(Debug, Clone)]
pub struct KafkaSend {
    /// The brokers.
    pub bootstrap: String,
    /// The NBBO topic.
    pub nbbo_topic: String,
    /// The orders topic.
    pub orders_topic: String,
    /// The results topic (created with the others when `partitions` is set).
    pub results_topic: String,
    /// Create the three topics with this many partitions if they are missing.
    pub partitions: Option<i32>,
    /// Replication of created topics.
    pub replication: i16,
    /// Symbols.
    pub symbols: usize,
    /// Share of orders rejected.
    pub reject_share: f64,
    /// Input records in all.
    pub count: u64,
    /// Records per second over both topics (`None`: as fast as the brokers take them).
    pub rate: Option<f64>,
    /// The generator's seed.
    pub seed: u64,
    /// Client settings (security, linger, compression, …).
    pub settings: ClientSettings,
    /// How long the brokers may be unreachable at start.
    pub bootstrap_timeout: Duration,
    /// How long a batch may go unacknowledged before the send fails.
    pub delivery_timeout: Duration,
}

/// What a Kafka send did.
#[derive(Debug, Clone, Serialize)]
pub struct KafkaSendReport {
    /// NBBO records produced.
    pub nbbo: u64,
    /// Order records produced.
    pub orders: u64,
    /// Results the orders must produce.
    pub expected_results: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Generates Market Spread's inputs and produces them, keyed by symbol: every symbol's first
/// quote first (flushed before any order, so no order meets a symbol without its quote), then
/// the rest, quotes and orders interleaved, paced to `rate` if given.
pub async fn send(args: &KafkaSend) -> Result<KafkaSendReport, Error> {
    let g = generate(args.symbols, args.reject_share, args.count, args.seed);
    let s = &args.settings;
    s.check_agrees(&args.bootstrap, None)?;
    let mut config = s.cluster_config(&args.bootstrap);
    config.bootstrap_timeout = args.bootstrap_timeout;
    let mut cluster = Cluster::connect(config).await?;
    if let Some(n) = args.partitions {
        let replication = s.replication_factor.unwrap_or(args.replication);
        for t in [&args.nbbo_topic, &args.orders_topic, &args.results_topic] {
            cluster.create_topic(t, n, replication, &[]).await?;
        }
    }
    let defaults = ProducerConfig::default();
    let producer = ProducerConfig {
        linger: s.linger.unwrap_or(defaults.linger),
        compression: s.compression.unwrap_or(defaults.compression),
        max_record: s.message_max_bytes.unwrap_or(defaults.max_record),
        delivery_timeout: s.delivery_timeout.unwrap_or(args.delivery_timeout),
        ..defaults
    };
    let mut p = Producer::new(cluster, producer).await?;
    let (nbbo_t, nbbo_n) = p.topic(&args.nbbo_topic).await?;
    let (orders_t, orders_n) = p.topic(&args.orders_topic).await?;
    let frames = |data: &[u8]| {
        canter_stream::frame::frames(data, usize::MAX)
            .map_err(|e| Error::Corrupt(format!("generated records: {e}")))
    };
    let nbbo = frames(&g.nbbo)?;
    let orders = frames(&g.orders)?;
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let started = Instant::now();
    let head = (g.nbbo_count.min(args.symbols as u64) as usize).min(nbbo.len());
    for r in &nbbo[..head] {
        let rec = &g.nbbo[r.start + 4..r.end];
        let sym = &rec[1..5];
        p.send(nbbo_t, partition_for(sym, nbbo_n), Some(sym), rec, now_ms())?;
    }
    p.flush().await?;
    let (mut i, mut j) = (head, 0usize);
    let mut sent = 0u64;
    while i < nbbo.len() || j < orders.len() {
        // Alternate, so both topics advance together.
        if i < nbbo.len() {
            let rec = &g.nbbo[nbbo[i].start + 4..nbbo[i].end];
            let sym = &rec[1..5];
            p.send(nbbo_t, partition_for(sym, nbbo_n), Some(sym), rec, now_ms())?;
            i += 1;
            sent += 1;
        }
        if j < orders.len() {
            let rec = &g.orders[orders[j].start + 4..orders[j].end];
            let sym = &rec[12..16];
            p.send(
                orders_t,
                partition_for(sym, orders_n),
                Some(sym),
                rec,
                now_ms(),
            )?;
            j += 1;
            sent += 1;
        }
        if let Some(rate) = args.rate {
            let due = Duration::from_secs_f64(sent as f64 / rate);
            let ahead = due.saturating_sub(started.elapsed());
            if ahead > Duration::from_millis(1) {
                p.flush().await?;
                tokio::time::sleep(ahead).await;
            }
        }
        if p.due() {
            p.flush().await?;
        }
    }
    p.flush().await?;
    Ok(KafkaSendReport {
        nbbo: nbbo.len() as u64,
        orders: orders.len() as u64,
        expected_results: g.expected_count,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_its_changelog_bytes() {
        let t = MarketSpreadTask;
        let s = SymbolState {
            reject: false,
            bid: 10.25,
            offer: 10.26,
        };
        let mut b = Vec::new();
        t.encode_state(&s, &mut b);
        assert_eq!(t.decode_state(&b), Some(s));
        assert_eq!(t.decode_state(&b[..16]), None);
        let mut k = Vec::new();
        t.encode_key(b"  AB", &mut k);
        assert_eq!(t.decode_key(&k), Some(*b"  AB"));
        assert_eq!(t.decode_key(b"ABC"), None);
    }
}
