//! Why connections fail, said once: the first error of each kind during a run is explained on
//! stderr (as curl says why it failed), the rest only counted in the report.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

/// Reasons already said in this process.
static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Reasons said at most, however many kinds of failure a run meets.
const MOST: usize = 16;

/// Says why connecting to `addr` failed, the first time this reason comes up.
pub(crate) fn connect_failed(addr: SocketAddr, e: &io::Error) {
    once(format!("cannot connect to {addr}: {}", reason(addr, e)));
}

/// Says why an open connection to `addr` failed, the first time this reason comes up.
pub(crate) fn connection_failed(addr: SocketAddr, e: &io::Error) {
    once(format!("connection to {addr} failed: {}", reason(addr, e)));
}

/// Says that a request got no response in time, the first time.
pub(crate) fn timed_out(timeout: Duration) {
    once(format!(
        "a request got no response within {timeout:?} (--timeout); such requests are counted as timeouts"
    ));
}

/// Says that the server did not switch to WebSocket, the first time.
pub(crate) fn ws_refused(status_line: &str) {
    once(format!(
        "the server answered the WebSocket upgrade with {status_line:?}, not 101"
    ));
}

fn once(line: String) {
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if said.len() < MOST && said.insert(line.clone()) {
        eprintln!("canter load: {line} (said once; every error is counted in the report)");
    }
}

/// What `e` means for someone running a load test against `addr`.
fn reason(addr: SocketAddr, e: &io::Error) -> String {
    if let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::InvalidCertificate(why) => format!(
                "certificate not trusted ({why:?}): use --cacert FILE, or -k for a development \
                 certificate"
            ),
            other => format!("TLS: {other}"),
        };
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => {
            format!("connection refused (is a server listening on {addr}?)")
        }
        io::ErrorKind::ConnectionReset => "connection reset by the server".to_owned(),
        io::ErrorKind::TimedOut => format!("{e} (--timeout)"),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::reason;

    #[test]
    fn reasons_say_what_to_do() {
        let addr = "127.0.0.1:1".parse().unwrap_or_else(|_| unreachable!());
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            reason(addr, &refused),
            "connection refused (is a server listening on 127.0.0.1:1?)"
        );
        let untrusted = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            reason(addr, &untrusted),
            "certificate not trusted (UnknownIssuer): use --cacert FILE, or -k for a development certificate"
        );
    }
}
