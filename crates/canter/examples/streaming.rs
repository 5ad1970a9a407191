//! Streaming both ways with newline-delimited JSON: `GET /ticks` streams one item per tick (each
//! reaches the client as it is produced, and the clock is only polled while the client keeps
//! reading); `POST /sum` adds up posted items one line at a time as the body arrives, holding at
//! most one line in memory.
//!
//! ```sh
//! cargo run --release -p canter --example streaming
//! curl -N 'http://127.0.0.1:8080/ticks?n=5&ms=500'
//! printf '{"value":1}\n{"value":2.5}\n' | curl -H 'content-type: application/x-ndjson' --data-binary @- http://127.0.0.1:8080/sum
//! # a slow client: one line a second, sent chunked as it is written
//! (for i in 1 2 3; do echo "{\"value\":$i}"; sleep 1; done) | curl -T - -X POST -H 'content-type: application/x-ndjson' http://127.0.0.1:8080/sum
//! # errors: a bad line (400, with its number), a wrong type (422), another content type (415)
//! printf '{"value":1}\n{"value":\n' | curl -H 'content-type: application/x-ndjson' --data-binary @- http://127.0.0.1:8080/sum
//! printf '{"value":"one"}\n' | curl -H 'content-type: application/x-ndjson' --data-binary @- http://127.0.0.1:8080/sum
//! curl -d '{"value":1}' http://127.0.0.1:8080/sum
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use canter::rt::{Config, Server};
use canter::{get, post, Json, JsonLines, NdJson, Query, Rejection, Router};
use futures_core::Stream;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct TickParams {
    /// How many ticks (at most 1000).
    n: Option<u32>,
    /// Milliseconds between ticks (at least 10).
    ms: Option<u64>,
}

#[derive(Serialize)]
struct Tick {
    n: u32,
    elapsed_ms: u128,
}

/// A stream of `total` ticks, one per `interval`.
struct Ticks {
    interval: tokio::time::Interval,
    start: Instant,
    sent: u32,
    total: u32,
}

impl Stream for Ticks {
    type Item = Tick;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Tick>> {
        if self.sent == self.total {
            return Poll::Ready(None);
        }
        if self.interval.poll_tick(cx).is_pending() {
            return Poll::Pending;
        }
        self.sent += 1;
        Poll::Ready(Some(Tick {
            n: self.sent,
            elapsed_ms: self.start.elapsed().as_millis(),
        }))
    }
}

/// NDJSON out: the response starts at once and each tick is sent when it happens.
fn ticks(Query(p): Query<TickParams>) -> NdJson {
    let every = Duration::from_millis(p.ms.unwrap_or(1000).max(10));
    NdJson::new(Ticks {
        interval: tokio::time::interval(every),
        start: Instant::now(),
        sent: 0,
        total: p.n.unwrap_or(10).min(1000),
    })
}

#[derive(Deserialize)]
struct Item {
    value: f64,
}

#[derive(Serialize)]
struct Total {
    count: u64,
    sum: f64,
}

/// NDJSON in: items are deserialized one by one while the body streams in; the first bad line
/// answers with its status and line number.
async fn sum(mut items: JsonLines<Item>) -> Result<Json<Total>, Rejection> {
    let mut total = Total { count: 0, sum: 0.0 };
    while let Some(item) = items.next().await {
        total.sum += item?.value;
        total.count += 1;
    }
    Ok(Json(total))
}

fn app() -> Router {
    Router::new()
        .route("/ticks", get(ticks))
        .route("/sum", post(sum))
        // An NDJSON body is never held in memory whole: allow more than the default 1 MiB, up
        // to the server's own limit (16 MiB by default).
        .body_limit(16 << 20)
}

fn main() -> std::io::Result<()> {
    let server = Server::bind(Config::default())?;
    canter::rt::shutdown_on_signals(server.shutdown_handle())?;
    println!("listening on http://{}/ticks and /sum", server.local_addr());
    server.serve(|_worker| app())
}
