//! Where a broker is: a host name or an IP address, and a port.

use std::fmt;

use crate::error::Error;

/// A broker's address as the cluster advertises it: a host name or an IP address, and a
/// port. Resolved at each connect, and the name TLS checks the broker's certificate against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerAddr {
    /// Host name or IP address.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl BrokerAddr {
    /// Parses `host:port` (`[v6]:port` for IPv6 literals). A missing port is an error: Kafka
    /// has no default port every cluster uses.
    pub fn parse(s: &str) -> Result<BrokerAddr, Error> {
        let s = s.trim();
        let bad = |why: &str| Error::Config(format!("broker address {s:?}: {why}"));
        let (host, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (host, port) = rest
                    .split_once("]:")
                    .ok_or_else(|| bad("expected [ipv6]:port"))?;
                (host, port)
            }
            None => s
                .rsplit_once(':')
                .ok_or_else(|| bad("no port (host:port)"))?,
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| bad("the port is not a number"))?;
        Ok(BrokerAddr {
            host: host.to_owned(),
            port,
        })
    }

    /// Parses a comma-separated list (`bootstrap.servers`).
    pub fn parse_list(s: &str) -> Result<Vec<BrokerAddr>, Error> {
        let list = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(BrokerAddr::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if list.is_empty() {
            return Err(Error::Config("no broker address given".into()));
        }
        Ok(list)
    }
}

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}
