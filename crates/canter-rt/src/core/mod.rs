//! The core: system calls, the worker and its event loop, transports (TCP, TLS), the link a
//! connection's task owns, settings, the accept loop. It knows no protocol.

pub(crate) mod config;
pub(crate) mod link;
pub(crate) mod log_bridge;
pub(crate) mod outbound;
pub(crate) mod output;
pub mod proxy;
pub(crate) mod server;
pub(crate) mod stats;
pub(crate) mod syscall;
pub(crate) mod tcp_loop;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod transport;
pub(crate) mod worker;
