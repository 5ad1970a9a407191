//! HTTP on the core: request bodies and the service a handler is, the state both protocols
//! share, the HTTP/1.1, HTTP/2 and HTTP/3 drivers, and the module that chooses between them.

pub(crate) mod body;
#[cfg(feature = "http2")]
pub(crate) mod h2;
#[cfg(feature = "http3")]
pub(crate) mod h3;
pub(crate) mod http1;
pub(crate) mod serve;
pub(crate) mod service;
pub(crate) mod state;
