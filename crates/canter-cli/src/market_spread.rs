//! Market Spread's records (all integers and floats big-endian) and a generator of its two input
//! streams with the results they must produce.
//!
//! | record | bytes | fields |
//! |---|---|---|
//! | NBBO | 42 | u8 type (2), symbol (4, ASCII, right-aligned), transact time (21, ASCII), f64 bid, f64 offer |
//! | order | 53 | u8 type (1), u8 side (1 buy, 2 sell), u32 account, order id (6, ASCII), symbol (4), f64 quantity, f64 price, transact time (21) |
//! | result | 55 | u8 side, u32 account, order id (6), symbol (4), f64 quantity, f64 price, f64 last bid, f64 last offer, u64 timestamp (ns since the Unix epoch, when the order was read) |

use std::fs;
use std::io::Write;
use std::net::{Shutdown, SocketAddr};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use canter_stream::send::{self, SendError};
use serde::Serialize;

/// A symbol: 4 ASCII bytes, right-aligned and padded with spaces.
pub type Symbol = [u8; 4];

/// A quote: the best bid and offer of a symbol.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nbbo {
    /// The symbol quoted.
    pub symbol: Symbol,
    /// Transact time, ASCII (`YYYYMMDD-HH:MM:SS.mmm`).
    pub time: [u8; 21],
    /// Best bid.
    pub bid: f64,
    /// Best offer.
    pub offer: f64,
}

/// An order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Order {
    /// 1 buy, 2 sell.
    pub side: u8,
    /// The account placing it.
    pub account: u32,
    /// Order id, ASCII.
    pub id: [u8; 6],
    /// The symbol ordered.
    pub symbol: Symbol,
    /// Quantity.
    pub quantity: f64,
    /// Limit price.
    pub price: f64,
    /// Transact time, ASCII.
    pub time: [u8; 21],
}

/// The output for a rejected order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejected {
    /// The order.
    pub order: Order,
    /// The symbol's bid when the order was checked.
    pub bid: f64,
    /// The symbol's offer when the order was checked.
    pub offer: f64,
    /// When the order was read from its source, ns since the Unix epoch.
    pub timestamp: u64,
}

/// NBBO record size.
pub const NBBO_LEN: usize = 42;
/// Order record size.
pub const ORDER_LEN: usize = 53;
/// Result record size.
pub const RESULT_LEN: usize = 55;

/// Why a record does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// The record has the wrong size for its kind.
    Size {
        /// Bytes expected.
        expected: usize,
        /// Bytes found.
        found: usize,
    },
    /// The type byte (or side) is not one this record may have.
    Type(u8),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Size { expected, found } => {
                write!(
                    f,
                    "a record of {found} bytes where {expected} were expected"
                )
            }
            RecordError::Type(t) => write!(f, "unexpected record type or side {t}"),
        }
    }
}

impl std::error::Error for RecordError {}

fn f64_at(b: &[u8], at: usize) -> f64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    f64::from_be_bytes(x)
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut x = [0u8; N];
    x.copy_from_slice(&b[at..at + N]);
    x
}

impl Nbbo {
    /// Appends the 42-byte record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(2);
        out.extend_from_slice(&self.symbol);
        out.extend_from_slice(&self.time);
        out.extend_from_slice(&self.bid.to_be_bytes());
        out.extend_from_slice(&self.offer.to_be_bytes());
    }

    /// Reads a 42-byte record.
    pub fn decode(b: &[u8]) -> Result<Nbbo, RecordError> {
        if b.len() != NBBO_LEN {
            return Err(RecordError::Size {
                expected: NBBO_LEN,
                found: b.len(),
            });
        }
        if b[0] != 2 {
            return Err(RecordError::Type(b[0]));
        }
        Ok(Nbbo {
            symbol: array(b, 1),
            time: array(b, 5),
            bid: f64_at(b, 26),
            offer: f64_at(b, 34),
        })
    }

    /// Whether orders for this symbol are rejected after this quote: a spread of 0.05 or more,
    /// absolute or relative to the midpoint.
    pub fn rejects(&self) -> bool {
        let spread = self.offer - self.bid;
        spread >= 0.05 || spread / ((self.bid + self.offer) / 2.0) >= 0.05
    }
}

impl Order {
    /// Appends the 53-byte record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(1);
        out.push(self.side);
        out.extend_from_slice(&self.account.to_be_bytes());
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&self.symbol);
        out.extend_from_slice(&self.quantity.to_be_bytes());
        out.extend_from_slice(&self.price.to_be_bytes());
        out.extend_from_slice(&self.time);
    }

    /// Reads a 53-byte record.
    pub fn decode(b: &[u8]) -> Result<Order, RecordError> {
        if b.len() != ORDER_LEN {
            return Err(RecordError::Size {
                expected: ORDER_LEN,
                found: b.len(),
            });
        }
        if b[0] != 1 {
            return Err(RecordError::Type(b[0]));
        }
        if !matches!(b[1], 1 | 2) {
            return Err(RecordError::Type(b[1]));
        }
        Ok(Order {
            side: b[1],
            account: u32::from_be_bytes(array(b, 2)),
            id: array(b, 6),
            symbol: array(b, 12),
            quantity: f64_at(b, 16),
            price: f64_at(b, 24),
            time: array(b, 32),
        })
    }
}

impl Rejected {
    /// Appends the 55-byte record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let o = &self.order;
        out.push(o.side);
        out.extend_from_slice(&o.account.to_be_bytes());
        out.extend_from_slice(&o.id);
        out.extend_from_slice(&o.symbol);
        out.extend_from_slice(&o.quantity.to_be_bytes());
        out.extend_from_slice(&o.price.to_be_bytes());
        out.extend_from_slice(&self.bid.to_be_bytes());
        out.extend_from_slice(&self.offer.to_be_bytes());
        out.extend_from_slice(&self.timestamp.to_be_bytes());
    }

    /// Reads a 55-byte record (its order's transact time is not in it: left blank).
    pub fn decode(b: &[u8]) -> Result<Rejected, RecordError> {
        if b.len() != RESULT_LEN {
            return Err(RecordError::Size {
                expected: RESULT_LEN,
                found: b.len(),
            });
        }
        Ok(Rejected {
            order: Order {
                side: b[0],
                account: u32::from_be_bytes(array(b, 1)),
                id: array(b, 5),
                symbol: array(b, 11),
                quantity: f64_at(b, 15),
                price: f64_at(b, 23),
                time: [b' '; 21],
            },
            bid: f64_at(b, 31),
            offer: f64_at(b, 39),
            timestamp: u64::from_be_bytes(array(b, 47)),
        })
    }
}

/// A symbol's state in the Market Spread pipelines: its last quote, and whether its orders are
/// rejected. Before any quote, orders are rejected.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SymbolState {
    /// Orders for the symbol are rejected.
    pub reject: bool,
    /// Last bid.
    pub bid: f64,
    /// Last offer.
    pub offer: f64,
}

impl SymbolState {
    /// The state's bytes (in checkpoints and changelogs): reject flag, bid, offer.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.push(u8::from(self.reject));
        buf.extend_from_slice(&self.bid.to_be_bytes());
        buf.extend_from_slice(&self.offer.to_be_bytes());
    }

    /// A state from its bytes (`None`: not 17 bytes).
    pub fn decode(b: &[u8]) -> Option<SymbolState> {
        if b.len() != 17 {
            return None;
        }
        let f = |at: usize| b[at..at + 8].try_into().ok().map(f64::from_be_bytes);
        Some(SymbolState {
            reject: b[0] != 0,
            bid: f(1)?,
            offer: f(9)?,
        })
    }
}

impl Default for SymbolState {
    fn default() -> Self {
        SymbolState {
            reject: true,
            bid: 0.0,
            offer: 0.0,
        }
    }
}

/// Market Spread on the pipeline library: a quotes pipeline (`nbbo`) updating each symbol's
/// state, and an orders pipeline (`orders`) checking each order against it and sending a
/// result record for every rejected one to `out`. Both are keyed by symbol and share the
/// per-symbol state.
pub fn topology(
    nbbo: canter_stream::pipeline::Source,
    orders: canter_stream::pipeline::Source,
    out: canter_stream::pipeline::Sink<Rejected>,
) -> canter_stream::pipeline::Topology {
    use canter_stream::pipeline::{Emit, KeyedState, Pipeline, Sink, Topology};
    let symbols = KeyedState::new("symbols", |_s: &Symbol| SymbolState::default()).checkpointed(
        |k: &Symbol, b: &mut Vec<u8>| b.extend_from_slice(k),
        |b: &[u8]| b.try_into().ok(),
        SymbolState::encode,
        SymbolState::decode,
    );
    let quotes = Pipeline::new("nbbo", nbbo, Nbbo::decode)
        .key_by(|q: &Nbbo| q.symbol)
        .update(
            &symbols,
            |st: &mut SymbolState, q: Nbbo, _out: &mut Emit<'_, ()>| {
                *st = SymbolState {
                    reject: q.rejects(),
                    bid: q.bid,
                    offer: q.offer,
                }
            },
        )
        .sink(Sink::discard());
    let checks = Pipeline::new("orders", orders, Order::decode)
        .key_by(|o: &Order| o.symbol)
        .update(&symbols, |st: &mut SymbolState, order: Order, out| {
            if st.reject {
                let timestamp = out.source_time_ns();
                out.emit(Rejected {
                    order,
                    bid: st.bid,
                    offer: st.offer,
                    timestamp,
                });
            }
        })
        .sink(out);
    let mut t = Topology::new();
    t.add(quotes).add(checks);
    t
}

/// Market Spread's result records, framed, to a TCP receiver.
pub fn tcp_results(to: std::net::SocketAddr) -> canter_stream::pipeline::Sink<Rejected> {
    canter_stream::pipeline::Sink::tcp(to, |r: &Rejected, b: &mut Vec<u8>| r.encode(b))
}

/// Symbols written with capital letters (distinct: as in decimal, a leading `A`, the zero,
/// never appears): 26⁴.
const LETTER_SYMBOLS: usize = 456_976;

/// Distinct symbols ([`symbol`]): the generators make at most this many.
pub const MAX_SYMBOLS: usize = LETTER_SYMBOLS + 38 * 64 * 64 * 64;

/// The characters of the symbols past the capital letters' (a-z, 0-9, `.` and `-` first, then
/// the capitals).
const MORE: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyz0123456789.-ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Symbol `i` (0-based): letters in base 26, right-aligned (`   A`, `   B`, ..., `  BA`, up
/// to `ZZZZ`); past those (456,976 of them), four characters of 64 whose first is not a
/// capital letter (another 9,961,472: the first 10,418,448 symbols are distinct).
pub fn symbol(mut i: usize) -> Symbol {
    if i >= LETTER_SYMBOLS {
        let mut j = i - LETTER_SYMBOLS;
        let mut s = [0u8; 4];
        for at in (1..4).rev() {
            s[at] = MORE[j % 64];
            j /= 64;
        }
        s[0] = MORE[j % 38];
        return s;
    }
    let mut s = [b' '; 4];
    let mut at = 4;
    loop {
        at -= 1;
        s[at] = b'A' + (i % 26) as u8;
        i /= 26;
        if i == 0 || at == 0 {
            return s;
        }
    }
}

/// Generated input streams (framed records) and the results they must produce (framed, with
/// timestamp 0: the real ones are the time each order is read).
#[derive(Debug, Default)]
pub struct Generated {
    /// The NBBO stream: one quote per symbol first, then updates.
    pub nbbo: Vec<u8>,
    /// The order stream.
    pub orders: Vec<u8>,
    /// One result per rejected order, in order-stream order.
    pub expected: Vec<u8>,
    /// Records in `nbbo`.
    pub nbbo_count: u64,
    /// Records in `orders`.
    pub order_count: u64,
    /// Records in `expected`.
    pub expected_count: u64,
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 32) % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Generates `count` input records, half quotes and half orders, over `symbols` symbols, with
/// about `reject_share` of the orders rejected.
///
/// Each symbol keeps one quote for the whole run (updates repeat its bid and offer with later
/// times), so the results do not depend on how the two streams interleave once every symbol's
/// first quote has been processed: the NBBO stream opens with them, and `canter send
/// market-spread` sends them before any order.
pub fn generate(symbols: usize, reject_share: f64, count: u64, seed: u64) -> Generated {
    let symbols = symbols.clamp(1, MAX_SYMBOLS);
    let mut rng = Rng(seed | 1);
    // Each symbol's fixed quote: a wide spread (rejects) for about reject_share of them.
    let quotes: Vec<(Symbol, f64, f64)> = (0..symbols)
        .map(|i| {
            let bid = 10.0 + (rng.below(99_000) as f64) / 100.0;
            let rejects = rng.unit() < reject_share;
            let spread = if rejects {
                0.05 + rng.below(50) as f64 / 100.0
            } else {
                0.01
            };
            (symbol(i), bid, bid + spread)
        })
        .collect();
    let mut g = Generated::default();
    let nbbo_total = (count / 2).max(symbols as u64);
    let order_total = count.saturating_sub(nbbo_total);
    let mut record = Vec::with_capacity(64);
    let frame = |record: &mut Vec<u8>, out: &mut Vec<u8>| {
        canter_stream::frame::encode(record, out);
        record.clear();
    };
    let mut clock = 0u64;
    let mut time = || {
        clock += 1;
        transact_time(clock)
    };
    for n in 0..nbbo_total {
        let (symbol, bid, offer) = quotes[if (n as usize) < symbols {
            n as usize
        } else {
            rng.below(symbols as u64) as usize
        }];
        Nbbo {
            symbol,
            time: time(),
            bid,
            offer,
        }
        .encode(&mut record);
        frame(&mut record, &mut g.nbbo);
    }
    for n in 0..order_total {
        let (symbol, bid, offer) = quotes[rng.below(symbols as u64) as usize];
        let order = Order {
            side: 1 + rng.below(2) as u8,
            account: rng.below(100_000) as u32,
            id: order_id(n),
            symbol,
            quantity: (1 + rng.below(1_000)) as f64,
            price: bid + rng.below(100) as f64 / 1_000.0,
            time: time(),
        };
        order.encode(&mut record);
        frame(&mut record, &mut g.orders);
        let quote = Nbbo {
            symbol,
            time: [b' '; 21],
            bid,
            offer,
        };
        if quote.rejects() {
            Rejected {
                order,
                bid,
                offer,
                timestamp: 0,
            }
            .encode(&mut record);
            frame(&mut record, &mut g.expected);
            g.expected_count += 1;
        }
    }
    g.nbbo_count = nbbo_total;
    g.order_count = order_total;
    g
}

/// Order id `n` as 6 ASCII characters (base 36).
fn order_id(mut n: u64) -> [u8; 6] {
    const DIGITS: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut id = [b'0'; 6];
    for c in id.iter_mut().rev() {
        *c = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    id
}

/// A transact time `ms` milliseconds after 2026-01-01 09:30:00, as `YYYYMMDD-HH:MM:SS.mmm`.
fn transact_time(ms: u64) -> [u8; 21] {
    let total = 9 * 3_600_000 + 30 * 60_000 + ms % 23_400_000;
    let (h, m, s, milli) = (
        total / 3_600_000,
        total / 60_000 % 60,
        total / 1_000 % 60,
        total % 1_000,
    );
    let text = format!("20260101-{h:02}:{m:02}:{s:02}.{milli:03}");
    let mut t = [b' '; 21];
    t.copy_from_slice(&text.as_bytes()[..21]);
    t
}

/// The flags of `canter send market-spread`.
#[derive(clap::Args, Debug, Clone)]
pub struct SendArgs {
    /// The NBBO source (needs --orders too).
    #[arg(long, requires = "orders")]
    pub nbbo: Option<SocketAddr>,
    /// The order source (needs --nbbo too).
    #[arg(long, requires = "nbbo")]
    pub orders: Option<SocketAddr>,
    /// Symbols quoted and ordered (at most 10,418,448, all distinct).
    #[arg(long, default_value_t = 1_000)]
    pub symbols: usize,
    /// Share of orders whose symbol's spread rejects them.
    #[arg(long, default_value_t = 0.1)]
    pub reject_share: f64,
    /// Input records in all, half quotes and half orders.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: u64,
    /// Write nbbo.bin, orders.bin and expected.bin (the results, timestamps 0) to this
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub write_dir: Option<PathBuf>,
    /// Records per second over both streams (default: as fast as they are taken).
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// Records per write.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub batch: usize,
    /// Seed of the generator (the same seed gives the same records).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Produce to Kafka instead (brokers `host:port,...`): values are the records without
    /// their length prefix, keyed by symbol.
    #[arg(long, value_name = "BOOTSTRAP", conflicts_with_all = ["nbbo", "orders"])]
    pub kafka: Option<String>,
    /// The NBBO topic (with --kafka).
    #[arg(long, default_value = "nbbo", requires = "kafka")]
    pub nbbo_topic: String,
    /// The orders topic (with --kafka).
    #[arg(long, default_value = "orders", requires = "kafka")]
    pub orders_topic: String,
    /// The results topic (with --kafka; created with the others by --create-topics).
    #[arg(long, default_value = "results", requires = "kafka")]
    pub results_topic: String,
    /// With --kafka: create the three topics with this many partitions where missing.
    #[arg(long, value_name = "PARTITIONS", requires = "kafka")]
    pub create_topics: Option<i32>,
    /// Replication of the topics --create-topics creates.
    #[arg(long, default_value_t = 1, requires = "create_topics")]
    pub replication: i16,
    /// With --kafka: how long the brokers may be unreachable at start before the send gives up.
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "30s", requires = "kafka")]
    pub bootstrap_timeout: Duration,
    /// With --kafka: how long records may go unacknowledged by the brokers (retried meanwhile)
    /// before the send fails (librdkafka's delivery.timeout.ms).
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "120s", requires = "kafka")]
    pub delivery_timeout: Duration,
    /// Kafka client settings (with --kafka).
    #[command(flatten)]
    pub kafka_config: crate::kafka_args::KafkaConfigArgs,
    /// Speak the resend protocol to a checkpointing pipeline (the NBBO stream as stream 1,
    /// orders as 2): records are kept until a checkpoint acknowledges them and sent again
    /// after the pipeline restarts; the orders start once a checkpoint holds every symbol's
    /// first quote; the send ends when the last record is acknowledged.
    #[arg(long, requires = "nbbo")]
    pub resend: bool,
    /// With --resend: how long to keep trying to reach the pipeline again, and to wait for
    /// the last acknowledgement.
    #[arg(long, value_parser = canter_load::parse_duration, default_value = "30s")]
    pub reconnect_for: Duration,
}

/// What `canter send market-spread` did.
#[derive(Debug, Clone, Serialize)]
pub struct SendReport {
    /// The NBBO stream (none when only writing files).
    pub nbbo: Option<send::Report>,
    /// The order stream.
    pub orders: Option<send::Report>,
    /// Results the orders must produce.
    pub expected_results: u64,
}

/// Runs `canter send market-spread`: generates the streams, writes them to `--write-dir`
/// and/or sends them to the two sources, every symbol's first quote ahead of the orders.
pub fn send(args: &SendArgs) -> Result<SendReport, SendError> {
    if args.write_dir.is_none() && args.nbbo.is_none() {
        return Err(SendError::Usage(
            "give --nbbo and --orders, --kafka, or --write-dir",
        ));
    }
    if !(0.0..=1.0).contains(&args.reject_share) {
        return Err(SendError::Usage("--reject-share is a share: from 0 to 1"));
    }
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(SendError::Usage("--rate must be above 0"));
    }
    let g = generate(args.symbols, args.reject_share, args.count, args.seed);
    if let Some(dir) = &args.write_dir {
        fs::create_dir_all(dir).map_err(|e| SendError::File(dir.clone(), e))?;
        for (name, data) in [
            ("nbbo.bin", &g.nbbo),
            ("orders.bin", &g.orders),
            ("expected.bin", &g.expected),
        ] {
            let path = dir.join(name);
            fs::write(&path, data).map_err(|e| SendError::File(path, e))?;
        }
    }
    let mut report = SendReport {
        nbbo: None,
        orders: None,
        expected_results: g.expected_count,
    };
    let (Some(nbbo_to), Some(orders_to)) = (args.nbbo, args.orders) else {
        return Ok(report);
    };
    let all = |data: &[u8]| {
        canter_stream::frame::frames(data, usize::MAX)
            .map_err(|e| SendError::Frames(PathBuf::from("generated"), e.to_string()))
    };
    let nbbo_frames = all(&g.nbbo)?;
    let order_frames = all(&g.orders)?;
    let first = g.nbbo_count.min(args.symbols as u64) as usize;
    let head = first.min(nbbo_frames.len());
    let pace = send::Pace {
        rate: args.rate.map(|r| r / 2.0),
        batch: args.batch,
        repeat: false,
        duration: None,
    };
    if args.resend {
        let wait = args.reconnect_for;
        let mut quotes = send::Session::new(nbbo_to, 1, &g.nbbo, &nbbo_frames, wait)?;
        let mut checks = send::Session::new(orders_to, 2, &g.orders, &order_frames, wait)?;
        // As below, every symbol's first quote goes first; and here the orders wait until a
        // checkpoint holds those quotes, so that a pipeline restarted at any point after has
        // them (replayed concurrently, the orders could overtake them).
        if head > 0 {
            quotes.write(head).map_err(|e| SendError::Io(nbbo_to, e))?;
            quotes.sync().map_err(|e| SendError::Io(nbbo_to, e))?;
        }
        let (q, o) = thread::scope(|scope| {
            let q = scope.spawn(|| {
                let r = pace.drive(nbbo_frames.len() - head, |_, n| quotes.write(n))?;
                quotes.finish().map(|()| r)
            });
            let o = pace
                .drive(order_frames.len(), |_, n| checks.write(n))
                .and_then(|r| checks.finish().map(|()| r));
            (q.join(), o)
        });
        let mut q = match q {
            Ok(r) => r.map_err(|e| SendError::Io(nbbo_to, e))?,
            Err(_) => return Err(SendError::Usage("the NBBO sender thread panicked")),
        };
        let mut o = o.map_err(|e| SendError::Io(orders_to, e))?;
        q.records += head as u64;
        quotes.report(&mut q);
        checks.report(&mut o);
        report.nbbo = Some(q);
        report.orders = Some(o);
        return Ok(report);
    }
    let mut nbbo = send::connect(nbbo_to)?;
    let mut orders = send::connect(orders_to)?;
    // Every symbol's first quote goes first, and a moment ahead of the orders, so that no order
    // meets a symbol still in its initial state (the results would then depend on timing).
    if head > 0 {
        nbbo.write_all(&g.nbbo[..nbbo_frames[head - 1].end])
            .map_err(|e| SendError::Io(nbbo_to, e))?;
        nbbo.flush().map_err(|e| SendError::Io(nbbo_to, e))?;
        thread::sleep(Duration::from_millis(200));
    }
    let (nbbo_report, orders_report) = thread::scope(|scope| {
        let rest = &nbbo_frames[head..];
        let quotes = scope.spawn(|| pace.send(&mut nbbo, &g.nbbo, rest));
        let sent = pace.send(&mut orders, &g.orders, &order_frames);
        (quotes.join(), sent)
    });
    let mut nbbo_report = match nbbo_report {
        Ok(r) => r.map_err(|e| SendError::Io(nbbo_to, e))?,
        Err(_) => return Err(SendError::Usage("the NBBO sender thread panicked")),
    };
    nbbo_report.records += head as u64;
    report.nbbo = Some(nbbo_report);
    report.orders = Some(orders_report.map_err(|e| SendError::Io(orders_to, e))?);
    let _ = nbbo.shutdown(Shutdown::Write);
    let _ = orders.shutdown(Shutdown::Write);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_at_their_sizes() {
        let nbbo = Nbbo {
            symbol: symbol(27),
            time: transact_time(5),
            bid: 10.5,
            offer: 10.56,
        };
        let mut b = Vec::new();
        nbbo.encode(&mut b);
        assert_eq!(b.len(), NBBO_LEN);
        assert_eq!(Nbbo::decode(&b), Ok(nbbo));
        assert_eq!(&nbbo.symbol, b"  BB");
        assert_eq!(&nbbo.time, b"20260101-09:30:00.005");
        let order = Order {
            side: 2,
            account: 7,
            id: order_id(36),
            symbol: symbol(0),
            quantity: 3.0,
            price: 1.25,
            time: transact_time(0),
        };
        let mut b = Vec::new();
        order.encode(&mut b);
        assert_eq!(b.len(), ORDER_LEN);
        assert_eq!(Order::decode(&b), Ok(order));
        assert_eq!(&order.id, b"000010");
        let r = Rejected {
            order,
            bid: 1.0,
            offer: 2.0,
            timestamp: 99,
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), RESULT_LEN);
        let back = Rejected::decode(&b).map(|r| (r.bid, r.offer, r.timestamp, r.order.account));
        assert_eq!(back, Ok((1.0, 2.0, 99, 7)));
    }

    #[test]
    fn wrong_sizes_and_types_are_refused() {
        assert_eq!(
            Nbbo::decode(&[2; 41]),
            Err(RecordError::Size {
                expected: 42,
                found: 41
            })
        );
        assert_eq!(Nbbo::decode(&[1; 42]), Err(RecordError::Type(1)));
        let mut order = [1u8; 53];
        order[1] = 3;
        assert_eq!(Order::decode(&order), Err(RecordError::Type(3)));
    }

    #[test]
    fn symbols_are_distinct_past_the_capital_letters() {
        let mut seen = std::collections::HashSet::new();
        let ranges = [0..LETTER_SYMBOLS + 300_000, 10_000_000..10_418_448];
        for i in ranges.into_iter().flatten() {
            assert!(seen.insert(symbol(i)), "symbol {i} repeats an earlier one");
        }
        assert_eq!(symbol(0), *b"   A");
        assert_eq!(symbol(LETTER_SYMBOLS - 1), *b"ZZZZ");
        assert_eq!(symbol(LETTER_SYMBOLS), *b"aaaa");
        assert_eq!(symbol(10_418_447), *b"-ZZZ");
        assert_eq!(MAX_SYMBOLS, 10_418_448);
    }

    #[test]
    fn the_reject_rule() {
        let q = |bid, offer| {
            Nbbo {
                symbol: symbol(0),
                time: [b' '; 21],
                bid,
                offer,
            }
            .rejects()
        };
        assert!(!q(100.0, 100.01));
        assert!(q(100.0, 100.06));
        // At the boundary the float subtraction decides, as in any implementation of the rule.
        assert!(!q(100.0, 100.05), "100.05 - 100.0 = 0.04999999999999716");
        assert!(q(0.5, 0.54), "relative spread 7.7%");
        assert!(!q(1.0, 1.04));
    }

    #[test]
    fn generation_is_deterministic_and_near_the_reject_share() {
        let a = generate(1_000, 0.1, 100_000, 7);
        let b = generate(1_000, 0.1, 100_000, 7);
        assert_eq!(
            (
                a.nbbo == b.nbbo,
                a.orders == b.orders,
                a.expected == b.expected
            ),
            (true, true, true)
        );
        assert_eq!((a.nbbo_count, a.order_count), (50_000, 50_000));
        let share = a.expected_count as f64 / a.order_count as f64;
        assert!((0.05..0.15).contains(&share), "{share}");
    }
}
