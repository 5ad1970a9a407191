//! An experiment, not a server: canter's HTTP/1.1 engine (`canter-h1`) on a bare `epoll` loop
//! with no tokio, to count what a request costs canter's own protocol code when nothing schedules
//! tasks (bench/notebook/http1.md, "the floor"). One thread, edge-triggered sockets, connections
//! indexed by descriptor, `GET /plaintext` answered as the demo answers it (the same Server,
//! Date, Content-Type and Content-Length), 404 for anything else.
//!
//! Left out on purpose, so the count is a floor and not a server: timeouts (a real loop adds a
//! timer wheel on the coarse clock), the router and handlers, output backpressure (a connection
//! whose peer does not take a whole answer at once is closed), limits on connections, request
//! bodies (answered, then the connection closes), TLS, HTTP/2 and shutdown.
//!
//! ```sh
//! cargo run --release -p canter-rt --example epoll_floor -- 127.0.0.1:31052
//! bench/cg_steady.py --conns 1 -- target/release/examples/epoll_floor 127.0.0.1:{port}
//! ```

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Instant, SystemTime};

use bytes::BytesMut;
use canter_h1::{BodyLen, Conn, Next, Preamble};
use canter_http::{Limits, Timeouts};
use http::HeaderValue;

const BODY: &[u8] = b"Hello, World!";

struct Client {
    stream: TcpStream,
    h1: Conn,
    input: BytesMut,
    out: BytesMut,
}

fn main() -> io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:31052".into());
    let listener = TcpListener::bind(&addr)?;
    listener.set_nonblocking(true)?;
    // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    add(ep, listener.as_raw_fd(), libc::EPOLLIN as u32)?;
    let content_type = HeaderValue::from_static("text/plain");
    let mut second = 0;
    let mut preamble = Preamble::new("canter", &date(&mut second).unwrap_or([b' '; 29]))
        .map_err(|e| io::Error::other(format!("{e:?}")))?;
    let mut clients: HashMap<RawFd, Client> = HashMap::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    eprintln!("epoll_floor listening on {addr}");
    loop {
        // SAFETY: `events` has room for the count passed; the kernel fills at most that many.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // One clock read a wake-up, as a real loop's coarse clock would take.
        let now = Instant::now();
        if let Some(d) = date(&mut second) {
            preamble
                .set_date(&d)
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
        }
        for ev in &events[..n as usize] {
            let fd = ev.u64 as RawFd;
            if fd == listener.as_raw_fd() {
                while let Ok((stream, _)) = listener.accept() {
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    let cfd = stream.as_raw_fd();
                    add(ep, cfd, (libc::EPOLLIN | libc::EPOLLET) as u32)?;
                    let h1 = Conn::new(Limits::default(), Timeouts::default(), now);
                    let (input, out) = (BytesMut::new(), BytesMut::new());
                    clients.insert(
                        cfd,
                        Client {
                            stream,
                            h1,
                            input,
                            out,
                        },
                    );
                }
                continue;
            }
            let keep = match clients.get_mut(&fd) {
                Some(c) => serve(c, now, &preamble, &content_type),
                None => continue,
            };
            if !keep {
                // Dropping the stream closes it, which also takes it out of the epoll set.
                clients.remove(&fd);
            }
        }
    }
}

/// Reads what the socket has, answers every complete request, writes the answers; false when
/// the connection is over.
fn serve(c: &mut Client, now: Instant, preamble: &Preamble, content_type: &HeaderValue) -> bool {
    loop {
        c.input.reserve(4096);
        let spare = c.input.spare_capacity_mut();
        // SAFETY: reading into spare capacity: `read` only writes, and `set_len` below covers
        // exactly the bytes it reports.
        let room =
            unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), spare.len()) };
        match c.stream.read(room) {
            Ok(0) => return false,
            Ok(n) => {
                // SAFETY: `read` initialised the first `n` bytes of the spare capacity.
                unsafe { c.input.set_len(c.input.len() + n) };
                if n < room.len() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let mut open = true;
    while open {
        match c.h1.poll_request(&mut c.input, now) {
            Ok(Some(head)) => {
                let found = head.path() == "/plaintext";
                let (status, body) = if found { (200, BODY) } else { (404, &b""[..]) };
                let len = BodyLen::Known(body.len() as u64);
                let ct = found.then_some(content_type);
                if c.h1
                    .start_response_prevalidated(status, ct, [], len, preamble, &mut c.out)
                    && matches!(c.h1.data_prefix(body.len(), &mut c.out), Ok(true))
                {
                    c.out.extend_from_slice(body);
                    c.h1.data_suffix(body.len(), &mut c.out);
                }
                open = matches!(c.h1.finish(&mut c.out, now), Ok(Next::KeepAlive));
            }
            Ok(None) => break,
            Err(e) => {
                c.h1.error_response(&e, b"", b"canter", &mut c.out);
                open = false;
            }
        }
    }
    if !c.out.is_empty() {
        match c.stream.write(&c.out) {
            Ok(n) if n == c.out.len() => c.out.clear(),
            _ => return false,
        }
    }
    open
}

/// The IMF-fixdate of the current second when the second changed since `*second`.
fn date(second: &mut u64) -> Option<[u8; 29]> {
    let wall = SystemTime::now();
    let s = wall.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    if s == *second {
        return None;
    }
    *second = s;
    httpdate::fmt_http_date(wall).as_bytes().try_into().ok()
}

fn add(ep: RawFd, fd: RawFd, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a valid event for the call's duration; both descriptors are open.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
