//! A framed echo server: every frame (4-byte big-endian length, then the payload, at most
//! 1 MiB) is sent back as it came. An oversized frame closes that connection with an error
//! logged; a client that sends without reading is stopped being read from.
//!
//! ```sh
//! cargo run --release -p canter-rt --example framed_echo -- 127.0.0.1:9000 [WORKERS]
//! ```

use bytes::Bytes;
use canter_rt::framing::{FrameHandler, Framed, LengthPrefixed};
use canter_rt::proto::Conn;
use canter_rt::{Config, Server};

/// Largest frame accepted.
pub const MAX_FRAME: usize = 1 << 20;

/// Sends each frame back.
pub struct Echo;

/// The protocol of one connection.
pub fn protocol() -> Framed<LengthPrefixed, Echo> {
    Framed::new(LengthPrefixed::new(MAX_FRAME), Echo)
}

impl FrameHandler for Echo {
    fn on_frame(&mut self, conn: &mut Conn<'_>, frame: Bytes) {
        // `Framed` calls this only while sending is possible, so this send is accepted.
        let _ = conn.send(LengthPrefixed::frame(&frame));
    }
}

fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    let mut config = Config::builder().addr(
        addr.parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
    );
    if let Some(n) = args.next().and_then(|n| n.parse().ok()) {
        config = config.workers(n);
    }
    let server = Server::bind(config.build()?)?;
    canter_rt::shutdown_on_signals(server.shutdown_handle())?;
    tracing::info!("framed echo listening on {}", server.local_addr());
    server.serve_protocol(|_worker| |_peer| protocol())
}
