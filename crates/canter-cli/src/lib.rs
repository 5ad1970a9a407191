//! What the `canter` command runs beyond the libraries' own: Market Spread, the stream pipeline
//! application behind `canter pipeline market-spread` and `canter send market-spread` (a
//! library target so that `examples/market_spread_files.rs` and the benchmarks build the same
//! topology). The demo and TechEmpower apps of `canter serve` are modules of the binary.

pub mod kafka_args;
pub mod market_spread;
pub mod market_spread_kafka;
