//! Test-only helpers shared by the integration tests of `canter-rt` and `canter`: a small,
//! strict raw HTTP/1.1 client ([`Client`], [`Response`], [`chunked`]), probes of processes
//! ([`rss_kib`], [`open_files_limit`]), test data ([`random_bytes`]) and a real Kafka cluster
//! ([`KafkaCluster`]).
//!
//! Every socket operation has a timeout ([`IO_TIMEOUT`]) so a hung server fails a test instead
//! of hanging the suite.

// A test harness: a failed socket option or a poisoned lock must fail the test on the spot, so
// unwrapping is the intended behaviour here (the crate is `publish = false` and dev-only).
#![allow(clippy::unwrap_used)]

mod client;
mod data;
#[cfg(feature = "h3")]
pub mod h3;
mod kafka;
mod pki;
mod process;

pub use client::{
    chunked, connect_stream, read_some, wait_until_read_by_peer, wait_until_refused, Client,
    Response, IO_TIMEOUT,
};
pub use data::random_bytes;
pub use kafka::{KafkaCluster, Secured};
pub use pki::{fingerprint, CertFiles, Pki};
pub use process::{open_files_limit, rss_kib};
