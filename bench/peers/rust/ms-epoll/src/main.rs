//! Market Spread with no framework: one thread, level-triggered epoll, nonblocking sockets.
//! The same job as `canter pipeline market-spread --workers 1`: NBBO and order sources (framed
//! TCP listeners), per-symbol state, one 55-byte result per rejected order to a receiver, and
//! backpressure (reading stops while more than 1 MiB of results wait).
//!
//!     ms-epoll --nbbo ADDR --orders ADDR --out ADDR
//!
//! Written to be hard to beat: the per-symbol state in a map with a multiply-and-fold hash of
//! the 4-byte symbol (std's SipHash cost about as much as the rest of a record's work), reads
//! into a buffer allocated and zeroed once, and `epoll_ctl` only when reading stops or resumes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{SystemTime, UNIX_EPOCH};

const HIGH: usize = 1 << 20;
const READ: usize = 256 * 1024;

struct State {
    reject: bool,
    bid: f64,
    offer: f64,
}

struct Source {
    stream: TcpStream,
    orders: bool,
    /// `buf[start..end]` is input not yet parsed; the buffer is allocated and zeroed once.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    muted: bool,
}

/// A multiply-and-fold hash for the 4-byte symbol keys (as canter's keyed state uses).
#[derive(Default)]
struct Fold(u64);

impl Hasher for Fold {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
    fn finish(&self) -> u64 {
        let m = u128::from(self.0 ^ 0x9e37_79b9_7f4a_7c15) * 0x2d35_8dcc_aa6c_78a5;
        (m as u64) ^ ((m >> 64) as u64)
    }
}

type Map = HashMap<u32, State, BuildHasherDefault<Fold>>;

fn f64_at(b: &[u8], at: usize) -> f64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    f64::from_be_bytes(x)
}

fn ctl(ep: RawFd, op: i32, fd: RawFd, events: u32) {
    let mut ev = libc::epoll_event { events, u64: fd as u64 };
    // SAFETY: ev is a valid epoll_event; ep and fd are open descriptors.
    unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| -> SocketAddr {
        let i = args.iter().position(|a| a == name).expect(name);
        args[i + 1].parse().expect("address")
    };
    let (nbbo_l, orders_l) = (TcpListener::bind(arg("--nbbo"))?, TcpListener::bind(arg("--orders"))?);
    let mut out = TcpStream::connect(arg("--out"))?;
    out.set_nodelay(true)?;
    out.set_nonblocking(true)?;
    nbbo_l.set_nonblocking(true)?;
    orders_l.set_nonblocking(true)?;
    eprintln!("ms-epoll: ready");
    // SAFETY: plain system call.
    let ep = unsafe { libc::epoll_create1(0) };
    for l in [&nbbo_l, &orders_l] {
        ctl(ep, libc::EPOLL_CTL_ADD, l.as_raw_fd(), libc::EPOLLIN as u32);
    }
    let out_fd = out.as_raw_fd();
    ctl(ep, libc::EPOLL_CTL_ADD, out_fd, 0);
    let mut sources: HashMap<RawFd, Source> = HashMap::new();
    let mut state: Map = Map::default();
    let mut pending: Vec<u8> = Vec::with_capacity(2 * HIGH);
    let mut sent = 0usize;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut was_full = false;
    loop {
        // SAFETY: events has room for 64 entries.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 64, -1) };
        if n < 0 {
            continue;
        }
        for ev in &events[..n as usize] {
            let fd = ev.u64 as RawFd;
            if fd == nbbo_l.as_raw_fd() || fd == orders_l.as_raw_fd() {
                let orders = fd == orders_l.as_raw_fd();
                let l = if orders { &orders_l } else { &nbbo_l };
                while let Ok((s, _)) = l.accept() {
                    s.set_nonblocking(true)?;
                    s.set_nodelay(true)?;
                    let sfd = s.as_raw_fd();
                    ctl(ep, libc::EPOLL_CTL_ADD, sfd, libc::EPOLLIN as u32);
                    let buf = vec![0; READ * 2];
                    sources.insert(sfd, Source { stream: s, orders, buf, start: 0, end: 0, muted: false });
                }
                continue;
            }
            if fd == out_fd {
                continue; // handled by the flush below
            }
            let Some(src) = sources.get_mut(&fd) else { continue };
            if src.buf.len() - src.end < READ {
                // Move the partial frame left over to the front (it is shorter than a frame).
                src.buf.copy_within(src.start..src.end, 0);
                src.end -= src.start;
                src.start = 0;
            }
            let end = src.end;
            let got = match src.stream.read(&mut src.buf[end..]) {
                Ok(n) if n > 0 => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                _ => {
                    // End of stream or error: drop the connection.
                    ctl(ep, libc::EPOLL_CTL_DEL, fd, 0);
                    sources.remove(&fd);
                    continue;
                }
            };
            src.end += got;
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            let b = &src.buf[..src.end];
            let mut at = src.start;
            while b.len() - at >= 4 {
                let flen = u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
                if b.len() - at - 4 < flen {
                    break;
                }
                let r = &b[at + 4..at + 4 + flen];
                at += 4 + flen;
                if !src.orders {
                    if r.len() != 42 || r[0] != 2 {
                        continue;
                    }
                    let (bid, offer) = (f64_at(r, 26), f64_at(r, 34));
                    let spread = offer - bid;
                    let reject = spread >= 0.05 || spread / ((bid + offer) / 2.0) >= 0.05;
                    let sym = u32::from_be_bytes([r[1], r[2], r[3], r[4]]);
                    state.insert(sym, State { reject, bid, offer });
                } else {
                    if r.len() != 53 || r[0] != 1 {
                        continue;
                    }
                    let sym = u32::from_be_bytes([r[12], r[13], r[14], r[15]]);
                    let st = state.entry(sym).or_insert(State { reject: true, bid: 0.0, offer: 0.0 });
                    if st.reject {
                        pending.extend_from_slice(&55u32.to_be_bytes());
                        pending.push(r[1]);
                        pending.extend_from_slice(&r[2..16]);
                        pending.extend_from_slice(&r[16..32]);
                        pending.extend_from_slice(&st.bid.to_be_bytes());
                        pending.extend_from_slice(&st.offer.to_be_bytes());
                        pending.extend_from_slice(&now.to_be_bytes());
                    }
                }
            }
            src.start = at;
            if src.start == src.end {
                src.start = 0;
                src.end = 0;
            }
        }
        // Flush results; stop reading while too many wait.
        while sent < pending.len() {
            match out.write(&pending[sent..]) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        if sent == pending.len() {
            pending.clear();
            sent = 0;
        }
        let full = pending.len() - sent >= HIGH;
        if full != was_full {
            was_full = full;
            ctl(ep, libc::EPOLL_CTL_MOD, out_fd, if full { libc::EPOLLOUT as u32 } else { 0 });
        }
        for (fd, s) in sources.iter_mut() {
            if s.muted != full {
                s.muted = full;
                ctl(ep, libc::EPOLL_CTL_MOD, *fd, if full { 0 } else { libc::EPOLLIN as u32 });
            }
        }
    }
}
