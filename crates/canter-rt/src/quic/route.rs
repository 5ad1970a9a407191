//! Routing a datagram to the worker that owns its connection.
//!
//! The kernel spreads datagrams over the workers' `SO_REUSEPORT` sockets by address, so a
//! client whose address changes (a NAT rebinding, a move from one network to another: QUIC's
//! connection migration) reaches some other worker, which does not know the connection and
//! would answer with a stateless reset. Each worker therefore issues connection IDs that name
//! it ([`WorkerCids`]), and a worker that reads a packet naming another hands it over
//! ([`Routes::owner`], [`Mailbox`]) instead of answering it.
//!
//! The worker's number is not readable by an observer (RFC 9000, Section 5.1: connection IDs
//! must not let an observer link one to another): the first byte of the ID is the number XORed
//! with a keyed hash (SipHash, keyed per server start) of the other seven, which are random.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use quinn_proto::{ConnectionId, ConnectionIdGenerator, EcnCodepoint};
use tokio::sync::Notify;

/// Bytes in every connection ID the server issues: one naming the worker, seven random.
pub(crate) const CID_LEN: usize = 8;
/// Bytes of datagrams waiting in one worker's mailbox above which more are dropped, as the
/// network would drop them (the sender's loss recovery resends them).
const MAILBOX_BYTES: usize = 2 << 20;

/// A datagram handed from the worker that read it to the one that owns its connection.
pub(crate) struct Forwarded {
    pub(crate) peer: SocketAddr,
    pub(crate) ecn: Option<EcnCodepoint>,
    pub(crate) data: BytesMut,
}

/// Datagrams handed to one worker by the others, and the signal that wakes its endpoint.
#[derive(Default)]
pub(crate) struct Mailbox {
    /// The datagrams, and their bytes in all.
    queue: Mutex<(VecDeque<Forwarded>, usize)>,
    /// Notified when the queue goes from empty to not: the endpoint task waits on it beside
    /// its socket.
    pub(crate) ready: Notify,
}

impl Mailbox {
    /// Queues `d`; false when the mailbox is full and `d` was dropped.
    fn push(&self, d: Forwarded) -> bool {
        let Ok(mut q) = self.queue.lock() else {
            return false;
        };
        let (queue, bytes) = &mut *q;
        if *bytes + d.data.len() > MAILBOX_BYTES {
            return false;
        }
        let was_empty = queue.is_empty();
        *bytes += d.data.len();
        queue.push_back(d);
        drop(q);
        if was_empty {
            self.ready.notify_one();
        }
        true
    }

    /// Everything queued, oldest first.
    pub(crate) fn take(&self) -> VecDeque<Forwarded> {
        self.queue
            .lock()
            .map(|mut q| std::mem::take(&mut *q).0)
            .unwrap_or_default()
    }
}

/// What the workers share to route by connection ID: the key that hides the worker's number,
/// and a mailbox per worker.
pub(crate) struct Routes {
    key: RandomState,
    mailboxes: Box<[Mailbox]>,
}

impl Routes {
    /// Routes between `workers` workers. Connection IDs name up to 256 workers: above that,
    /// a worker's number is taken modulo 256, and a packet naming one of those numbers stays
    /// with the worker that read it (migration to them is not followed).
    pub(crate) fn new(workers: usize) -> Arc<Routes> {
        Arc::new(Routes {
            key: RandomState::new(),
            mailboxes: (0..workers).map(|_| Mailbox::default()).collect(),
        })
    }

    /// Worker `index`'s mailbox.
    pub(crate) fn mailbox(&self, index: usize) -> &Mailbox {
        &self.mailboxes[index]
    }

    /// The mask that hides the worker's number in a connection ID's first byte.
    fn mask(&self, rest: &[u8]) -> u8 {
        self.key.hash_one(rest) as u8
    }

    /// The worker that issued the connection ID of `datagram`, when it is a short-header
    /// packet (the only kind a migrated connection sends; long headers carry handshakes, and
    /// an address that changes during a handshake fails it, as RFC 9000, Section 9 allows),
    /// and not `me`. `None` means "handle it here".
    pub(crate) fn owner(&self, datagram: &[u8], me: usize) -> Option<usize> {
        let n = self.mailboxes.len();
        if n < 2 || datagram.len() < 1 + CID_LEN || datagram[0] & 0x80 != 0 {
            return None;
        }
        let cid = &datagram[1..1 + CID_LEN];
        let named = usize::from(cid[0] ^ self.mask(&cid[1..]));
        // Worker numbers above 255 share their low byte with a lower one: ambiguous, so kept.
        if named == me % 256 || named >= n || (n > 256 && named + 256 < n) {
            return None;
        }
        Some(named)
    }

    /// Hands `d` to worker `to`; false when its mailbox was full and `d` was dropped.
    pub(crate) fn forward(&self, to: usize, d: Forwarded) -> bool {
        self.mailboxes[to].push(d)
    }
}

/// The connection IDs of one worker's endpoint: eight bytes, seven random and one naming the
/// worker under a mask only the server knows.
pub(crate) struct WorkerCids {
    pub(crate) routes: Arc<Routes>,
    pub(crate) index: usize,
    pub(crate) random: ring::rand::SystemRandom,
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; CID_LEN];
        // The system's random source does not fail on Linux once booted; if it ever did, the
        // IDs would still be unique per connection with high probability from the clock.
        if self.random.fill(&mut bytes[1..]).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            bytes[1..].copy_from_slice(&self.routes.key.hash_one(t).to_le_bytes()[..7]);
        }
        bytes[0] = (self.index as u8) ^ self.routes.mask(&bytes[1..]);
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn short_header(cid: &ConnectionId) -> Vec<u8> {
        let mut d = vec![0x40];
        d.extend_from_slice(cid);
        d.extend_from_slice(&[0u8; 40]);
        d
    }

    #[test]
    fn a_connection_id_names_its_worker_to_every_other() {
        let routes = Routes::new(4);
        for index in 0..4 {
            let mut g = WorkerCids {
                routes: routes.clone(),
                index,
                random: ring::rand::SystemRandom::new(),
            };
            for _ in 0..100 {
                let d = short_header(&g.generate_cid());
                for me in 0..4 {
                    let want = (me != index).then_some(index);
                    assert_eq!(routes.owner(&d, me), want);
                }
            }
        }
    }

    #[test]
    fn long_headers_short_datagrams_and_one_worker_stay_put() {
        let routes = Routes::new(2);
        let mut g = WorkerCids {
            routes: routes.clone(),
            index: 1,
            random: ring::rand::SystemRandom::new(),
        };
        let cid = g.generate_cid();
        let mut long = short_header(&cid);
        long[0] = 0xc0;
        assert_eq!(routes.owner(&long, 0), None);
        assert_eq!(routes.owner(&short_header(&cid)[..5], 0), None);
        assert_eq!(routes.owner(&short_header(&cid), 0), Some(1));
        let alone = Routes::new(1);
        assert_eq!(alone.owner(&short_header(&cid), 0), None);
    }

    #[test]
    fn the_first_byte_does_not_show_the_worker() {
        // Over many IDs of one worker the first byte takes many values (it is masked by a hash
        // of the random rest), where a plain number would take one.
        let routes = Routes::new(2);
        let mut g = WorkerCids {
            routes,
            index: 0,
            random: ring::rand::SystemRandom::new(),
        };
        let firsts: std::collections::HashSet<u8> =
            (0..1000).map(|_| g.generate_cid()[0]).collect();
        assert!(firsts.len() > 200, "{} distinct first bytes", firsts.len());
    }

    #[test]
    fn a_full_mailbox_drops() {
        let routes = Routes::new(2);
        let d = || Forwarded {
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            ecn: None,
            data: BytesMut::from(&[0u8; 1024][..]),
        };
        for _ in 0..MAILBOX_BYTES / 1024 {
            assert!(routes.forward(1, d()));
        }
        assert!(!routes.forward(1, d()));
        assert_eq!(routes.mailbox(1).take().len(), MAILBOX_BYTES / 1024);
        assert!(routes.forward(1, d()));
    }
}
