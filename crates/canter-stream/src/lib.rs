//! Stream pipelines over TCP, and the tools that feed and measure them.
//!
//! Records travel framed: a 4-byte big-endian length, then the record. [`frame`] reads and
//! writes that framing; [`send`] (`canter send`) replays framed records from a file at a
//! paced rate, and [`receive`] (`canter receive`) accepts a pipeline's sink connection and
//! reports count, throughput over time and end-to-end latency from each record's timestamp.

mod failpoint;
pub mod frame;
pub mod kafka;
// The builder's types name every fused step's type: that is how steps fuse into one call.
#[allow(clippy::type_complexity)]
pub mod pipeline;
pub mod receive;
pub mod resend;
pub mod send;
