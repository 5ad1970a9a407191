//! A line protocol that upgrades to TLS in place, as SMTP, IMAP and POP3 do with STARTTLS.
//!
//! Commands, one per line (CRLF or LF), at most 1,024 bytes:
//! - `PING` → `PONG`
//! - `ECHO text` → `text`
//! - `TLS?` → `yes` or `no`
//! - `STARTTLS` → `OK begin TLS`, then the TLS handshake on the same connection (the server's
//!   certificate is a self-signed development one unless `CERT` and `KEY` are given). Bytes sent
//!   after the command but before the handshake are refused: the connection is closed.
//! - `QUIT` → `BYE`, then close. Anything else → `ERR unknown command`.
//!
//! ```sh
//! cargo run --release -p canter-rt --example starttls_line -- 127.0.0.1:9001 [CERT KEY]
//! ```

use bytes::Bytes;
use canter_rt::framing::{FrameHandler, Framed, Lines};
use canter_rt::proto::{Close, Conn, TlsUpgrade};
use canter_rt::{Config, Server, ServerTls, TlsAcceptor};

/// One connection's state: the certificates to upgrade with.
pub struct Session {
    tls: TlsAcceptor,
}

/// The protocol of one connection, upgrading with `tls`.
pub fn protocol(tls: TlsAcceptor) -> Framed<Lines, Session> {
    Framed::new(Lines::new(1024), Session { tls })
}

impl Session {
    fn reply(conn: &mut Conn<'_>, line: &str) {
        let _ = conn.send(Bytes::from(format!("{line}\r\n")));
    }
}

impl FrameHandler for Session {
    fn on_frame(&mut self, conn: &mut Conn<'_>, line: Bytes) {
        let line = String::from_utf8_lossy(&line);
        let (command, rest) = line.split_once(' ').unwrap_or((&line, ""));
        match command.to_ascii_uppercase().as_str() {
            "PING" => Session::reply(conn, "PONG"),
            "ECHO" => Session::reply(conn, rest),
            "TLS?" => Session::reply(conn, if conn.is_tls() { "yes" } else { "no" }),
            "STARTTLS" if conn.is_tls() => Session::reply(conn, "ERR already TLS"),
            "STARTTLS" => {
                Session::reply(conn, "OK begin TLS");
                conn.start_tls(TlsUpgrade::Server(self.tls.clone()));
            }
            "QUIT" => {
                Session::reply(conn, "BYE");
                conn.close();
            }
            _ => Session::reply(conn, "ERR unknown command"),
        }
    }

    fn on_close(&mut self, why: &Close) {
        if let Close::Tls(e) = why {
            tracing::info!(error = %e, "STARTTLS refused");
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .map_or("127.0.0.1:9001", String::as_str)
        .parse()?;
    let tls = match (args.get(1), args.get(2)) {
        (Some(cert), Some(key)) => ServerTls::new().cert(cert, key),
        _ => ServerTls::new().self_signed(),
    }
    .alpn(&[])
    .build()?;
    let server = Server::bind(Config::builder().addr(addr).build()?)?;
    canter_rt::shutdown_on_signals(server.shutdown_handle())?;
    tracing::info!(
        "STARTTLS line protocol listening on {}",
        server.local_addr()
    );
    server.serve_protocol(move |_worker| {
        let tls = tls.clone();
        move |_peer| protocol(tls.clone())
    })?;
    Ok(())
}
