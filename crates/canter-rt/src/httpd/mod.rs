//! HTTP on the core: request bodies and the service a handler is, the state both protocols
//! share, the HTTP/1.1 and HTTP/2 drivers, and the module that chooses between them.

pub(crate) mod body;
#[cfg(feature = "http2")]
pub(crate) mod h2;
pub(crate) mod http1;
pub(crate) mod serve;
pub(crate) mod service;
pub(crate) mod state;
