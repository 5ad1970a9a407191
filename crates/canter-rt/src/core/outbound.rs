//! Outbound connections: connect with a timeout, plain or TLS (with the `tls` feature).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

#[cfg(feature = "tls")]
use crate::core::tls::ClientTls;
use crate::core::transport::Stream;

/// Connects to `addr` over plain TCP (TCP_NODELAY set), failing after `timeout`.
pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Stream> {
    Ok(Stream::Plain(connect_tcp(addr, timeout).await?))
}

/// Connects to `addr` and runs a TLS handshake for `server_name` (sent as SNI and verified
/// against the certificate as `tls` says), all within `timeout`.
#[cfg(feature = "tls")]
pub async fn connect_tls(
    addr: SocketAddr,
    server_name: &str,
    tls: &ClientTls,
    timeout: Duration,
) -> io::Result<Stream> {
    let deadline = tokio::time::Instant::now() + timeout;
    let tcp = connect_tcp(addr, timeout).await?;
    match tokio::time::timeout_at(deadline, tls.connect(server_name, tcp)).await {
        Ok(stream) => Ok(Stream::Tls(Box::new(stream?))),
        Err(_) => Err(timed_out("TLS handshake")),
    }
}

/// Connects to `addr` over plain TCP (TCP_NODELAY set), failing after `timeout`, and hands
/// back the bare socket, for a caller that drives its writes itself rather than through a
/// connection actor.
pub async fn connect_tcp(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(tcp) => {
            let tcp = tcp?;
            tcp.set_nodelay(true)?;
            Ok(tcp)
        }
        Err(_) => Err(timed_out("connect")),
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out"))
}
