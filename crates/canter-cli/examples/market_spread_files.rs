//! Market Spread from files to a file, to the end of the input: the job `bench/market_spread_files.py`
//! runs side by side with the same job in Bytewax.
//!
//!     market_spread_files NBBO_FILE ORDERS_FILE OUT_FILE [WORKERS]
//!
//! Prints one JSON line: records read, results written, seconds, records/s.

use std::time::Instant;

use canter_cli::market_spread::{topology, Rejected};
use canter_stream::pipeline::{RunOptions, Sink, Source};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: market_spread_files NBBO_FILE ORDERS_FILE OUT_FILE [WORKERS]");
        std::process::exit(2);
    }
    let workers = args.get(4).and_then(|w| w.parse().ok()).unwrap_or(1);
    let _ = std::fs::remove_file(&args[3]);
    let out = Sink::file(&args[3], |r: &Rejected, b: &mut Vec<u8>| r.encode(b));
    let t = topology(Source::file(&args[1]), Source::file(&args[2]), out);
    let started = Instant::now();
    let running = t.start(RunOptions::default().workers(workers))?;
    let metrics = running.metrics();
    running.wait()?;
    let seconds = started.elapsed().as_secs_f64();
    let (q, o) = (metrics.totals("nbbo"), metrics.totals("orders"));
    let read = q.map_or(0, |t| t.source_records) + o.map_or(0, |t| t.source_records);
    let results = o.map_or(0, |t| t.sink_records);
    println!(
        "{{\"records\":{read},\"results\":{results},\"seconds\":{seconds:.3},\"rate\":{:.0}}}",
        read as f64 / seconds
    );
    Ok(())
}
