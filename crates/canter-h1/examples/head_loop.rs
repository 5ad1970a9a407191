//! The protocol engine's share of a pipelined request, timed in a tight loop: parse a head,
//! encode a response head and body the way the runtime does (`start_response_prevalidated`
//! with a preformatted status/Server/Date block), finish the exchange; 16 requests per buffer
//! refill, like `GET /plaintext` pipelined 16 deep.
//!
//! ```sh
//! taskset -c 0 cargo run --release -p canter-h1 --example head_loop
//! ```
//!
//! With `BROWSER=1` the request is a browser-like head instead (a 47-byte target with a query
//! and eight fields, 471 bytes in all), where the scans of long values weigh most.
//!
//! Prints the fastest of 40 runs of 160,000 requests, in nanoseconds per request. Noise on a
//! shared machine mostly adds time, so the minimum is far steadier than whole-server timings
//! (within about 2% over a few minutes, where rounds of a server benchmark spread by 10-25%),
//! though it still drifts with the machine's load over longer periods. To check a change to the
//! parser or the encoder, build the example at both commits and run the two alternately; a
//! difference of a few percent can still come from code placement rather than the change. It
//! leaves out everything around the engine (sockets, scheduling, the application) and runs with
//! warm caches, so it measures the engine's own work only.

use std::time::Instant;

use bytes::BytesMut;
use canter_h1::{BodyLen, Conn};
use canter_http::{Limits, Timeouts};

const DEPTH: usize = 16;
const BATCHES: usize = 10_000;
const RUNS: usize = 40;

fn main() {
    let browser = std::env::var_os("BROWSER").is_some();
    let path = if browser {
        "/static/app/main.3f2a9c1e.js"
    } else {
        "/plaintext"
    };
    let request = if browser {
        b"GET /static/app/main.3f2a9c1e.js?v=20261122&lang=en HTTP/1.1\r\nHost: www.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\nAccept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br, zstd\r\nReferer: https://www.example.com/products/list?page=2\r\nCookie: session=8f14e45fceea167a5a36dedd4bea2543; theme=dark; consent=1\r\nConnection: keep-alive\r\n\r\n".repeat(DEPTH)
    } else {
        b"GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n".repeat(DEPTH)
    };
    let preamble = canter_h1::Preamble::new("canter", b"Sun, 22 Nov 2026 12:00:00 GMT")
        .expect("a valid Server value");
    let content_type = http::HeaderValue::from_static("text/plain");
    let body: &[u8] = std::hint::black_box(b"Hello, World!");
    let now = Instant::now();
    let mut conn = Conn::new(Limits::default(), Timeouts::default(), now);
    let mut input = BytesMut::with_capacity(16384);
    let mut out = BytesMut::with_capacity(8192);
    let mut best = f64::MAX;
    let mut path_bytes = 0usize;
    for _ in 0..RUNS {
        let start = Instant::now();
        for _ in 0..BATCHES {
            input.extend_from_slice(&request);
            for _ in 0..DEPTH {
                let Ok(Some(head)) = conn.poll_request(&mut input, now) else {
                    panic!("the request did not parse");
                };
                path_bytes += head.path().len();
                drop(head);
                conn.start_response_prevalidated(
                    200,
                    Some(&content_type),
                    [],
                    BodyLen::Known(body.len() as u64),
                    &preamble,
                    &mut out,
                );
                if conn.data_prefix(body.len(), &mut out) != Ok(true) {
                    panic!("the body was refused");
                }
                out.extend_from_slice(body);
                if conn.finish(&mut out, now).is_err() {
                    panic!("the exchange did not finish");
                }
            }
            out.clear();
        }
        let per_request = start.elapsed().as_nanos() as f64 / (BATCHES * DEPTH) as f64;
        best = best.min(per_request);
    }
    assert_eq!(path_bytes, path.len() * BATCHES * DEPTH * RUNS);
    println!("{best:.2} ns per request (fastest of {RUNS} runs of {BATCHES} x {DEPTH})");
}
