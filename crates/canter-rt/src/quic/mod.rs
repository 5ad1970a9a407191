//! QUIC on the workers: each owns a UDP socket on the listening port and a `quinn-proto`
//! endpoint; each connection is a task of its own that owns its QUIC state and its protocol.
//! `endpoint.rs` routes datagrams and hands out connections, `route.rs` hands a datagram to the
//! worker that owns its connection; the HTTP/3 driver is `httpd/h3.rs`.

pub(crate) mod endpoint;
pub(crate) mod route;
