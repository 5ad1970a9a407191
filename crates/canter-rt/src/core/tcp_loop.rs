//! The worker's plain TCP connections, run by one task of its own from an epoll set of their
//! own.
//!
//! As tokio tasks, each woken connection paid tokio's per-task path: its socket's readiness
//! (`Registration::poll_ready`, `ScheduledIo::wake`), the scheduler's queue (`Shared::schedule`,
//! `LocalSet::tick`) and the task header's state machine; about 700 instructions a request at 50
//! connections, a quarter of the whole (bench/notebook/http1.md). Here a connection's readiness
//! is two flags in a slab, its waker pushes the connection's index on a queue, and the one task
//! (the *driver*, a `spawn_local` task of the worker like any other) takes the set's events and
//! polls the connections they woke. tokio still runs everything else on the same thread, and
//! parks the worker: the set's descriptor is one of its sockets, readable when a connection has
//! an event. So timers, `spawn_local` and tokio's own sockets in handlers work unchanged, and
//! a wake-up from another thread reaches a connection through the driver's tokio waker.
//!
//! Sockets join the set only when a read or write would block (as [`LazyTcp`] joins tokio's
//! loop): a connection answered and closed in one go costs no `epoll_ctl`. They are
//! edge-triggered: a flag is cleared when the kernel says "would block" (or a read came back
//! short, which empties the socket) and set again by the event that follows new data or room.
//! A socket leaves the set when it is closed (nothing else holds its descriptor).
//!
//! [`LazyTcp`]: crate::core::transport::LazyTcp

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWakerVTable, Wake, Waker};

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, ReadBuf};

use crate::core::syscall::{self, retry};
use crate::core::transport::{send_queue, tokio_io_through_transport, Transport};

/// Connections polled per turn of the driver before it lets the worker's other tasks run.
const TURN: usize = 256;
/// Events taken from the set per `epoll_wait`.
const EVENTS: usize = 256;
/// [`Inner::current`] while no connection is being polled.
const NO_TASK: (usize, *const (), *const RawWakerVTable) =
    (usize::MAX, std::ptr::null(), std::ptr::null());

thread_local! {
    /// This thread's set, once a connection has needed it.
    static LOOP: RefCell<Option<Rc<Inner>>> = const { RefCell::new(None) };
    /// The refusal of an epoll set was logged on this thread.
    static WARNED: Cell<bool> = const { Cell::new(false) };
}

/// What other threads share with the set: connections woken from elsewhere, and the driver's
/// tokio waker, which brings the worker back to them.
struct Shared {
    remote: Mutex<Vec<usize>>,
    pending: AtomicBool,
    driver: Mutex<Option<Waker>>,
}

/// A connection's waker: puts its index on the queue (through [`Shared`] from another thread).
struct TaskWaker {
    index: usize,
    /// On the queue already: a second wake-up adds nothing.
    queued: AtomicBool,
    shared: Arc<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let here = LOOP.try_with(|l| match l.borrow().as_ref() {
            Some(inner) if Arc::ptr_eq(&inner.shared, &self.shared) => {
                inner.ready.borrow_mut().push_back(self.index);
                inner.schedule();
                true
            }
            _ => false,
        });
        if here != Ok(true) {
            self.shared
                .remote
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.index);
            self.shared.pending.store(true, Ordering::Release);
            if let Some(w) = self
                .shared
                .driver
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                w.wake_by_ref();
            }
        }
    }
}

/// One connection's future and its waker.
struct Task {
    future: Pin<Box<dyn Future<Output = ()>>>,
    waker: Waker,
    flag: Arc<TaskWaker>,
}

/// Who waits for a socket's readiness.
#[derive(Default)]
enum Waiter {
    #[default]
    Nobody,
    /// A connection of the set, polled with its own waker (the usual case): queued by index,
    /// without going through a waker.
    Task(usize),
    /// Anyone else (a connection's future that polls with a waker of its own making).
    Other(Waker),
}

/// The readiness of one socket in the set, and who waits for it.
#[derive(Default)]
struct IoState {
    readable: Cell<bool>,
    writable: Cell<bool>,
    read_waiter: RefCell<Waiter>,
    write_waiter: RefCell<Waiter>,
}

impl IoState {
    /// The readiness flag and the waiter of one direction: reading, or writing.
    fn side(&self, read: bool) -> (&Cell<bool>, &RefCell<Waiter>) {
        if read {
            (&self.readable, &self.read_waiter)
        } else {
            (&self.writable, &self.write_waiter)
        }
    }
}

/// A worker's set: its connections, their sockets' readiness, and the queue of woken ones.
pub(crate) struct Inner {
    epoll: AsyncFd<OwnedFd>,
    shared: Arc<Shared>,
    tasks: RefCell<Vec<Option<Box<Task>>>>,
    free: RefCell<Vec<usize>>,
    ready: RefCell<VecDeque<usize>>,
    ios: RefCell<Vec<Option<Rc<IoState>>>>,
    free_ios: RefCell<Vec<usize>>,
    /// The driver's tokio waker, for wake-ups on this thread.
    driver: RefCell<Option<Waker>>,
    /// The driver is running or has been woken: a wake-up only needs to queue the connection.
    scheduled: Cell<bool>,
    /// The connection being polled, and its waker: a socket waited for with that waker
    /// records the index (see [`Waiter::Task`]).
    current: Cell<(usize, *const (), *const RawWakerVTable)>,
}

/// This thread's set, made (and its driver spawned on the worker's `LocalSet`) the first time;
/// `None`, with a log line, if the kernel refuses an epoll set.
pub(crate) fn here() -> Option<Rc<Inner>> {
    LOOP.with(|l| {
        if let Some(inner) = l.borrow().as_ref() {
            return Some(inner.clone());
        }
        let inner = match Inner::new() {
            Ok(inner) => Rc::new(inner),
            Err(e) => {
                // Tried again at the next connection; said once per worker (out of descriptors,
                // this would otherwise be a line per connection).
                if !WARNED.replace(true) {
                    tracing::warn!(error = %e, "no epoll set for the worker's connections; they run as tokio tasks");
                }
                return None;
            }
        };
        *l.borrow_mut() = Some(inner.clone());
        // Unconstrained: tokio's per-task budget would be shared by every connection the driver
        // polls in one turn; the driver's turn and the connections' read budgets bound the work.
        tokio::task::spawn_local(tokio::task::unconstrained(Driver {
            inner: inner.clone(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS],
        }));
        Some(inner)
    })
}

/// Spawns `future` where the connection being polled runs: in this thread's set when one of
/// its connections is being polled (a connection that goes on as another task, such as a
/// WebSocket after its upgrade), as a tokio task of the worker otherwise.
#[cfg(feature = "ws")]
pub(crate) fn spawn_beside(future: impl Future<Output = ()> + 'static) {
    let set = LOOP.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|inner| inner.current.get().0 != usize::MAX)
            .cloned()
    });
    match set {
        Some(set) => set.spawn(future),
        None => {
            tokio::task::spawn_local(future);
        }
    }
}

impl Inner {
    fn new() -> io::Result<Inner> {
        // SAFETY: a plain system call making a new descriptor.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an `OwnedFd` owns its descriptor, which stays open and the same until the
        // `AsyncFd` that owns it is dropped.
        let epoll = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Inner {
            epoll,
            shared: Arc::new(Shared {
                remote: Mutex::new(Vec::new()),
                pending: AtomicBool::new(false),
                driver: Mutex::new(None),
            }),
            tasks: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            ready: RefCell::new(VecDeque::new()),
            ios: RefCell::new(Vec::new()),
            free_ios: RefCell::new(Vec::new()),
            driver: RefCell::new(None),
            scheduled: Cell::new(false),
            current: Cell::new(NO_TASK),
        })
    }

    /// Runs `future` as a connection of the set.
    pub(crate) fn spawn(&self, future: impl Future<Output = ()> + 'static) {
        let future = Box::pin(future);
        let index = self.free.borrow_mut().pop().unwrap_or_else(|| {
            let mut tasks = self.tasks.borrow_mut();
            tasks.push(None);
            tasks.len() - 1
        });
        let flag = Arc::new(TaskWaker {
            index,
            queued: AtomicBool::new(true),
            shared: self.shared.clone(),
        });
        let waker = Waker::from(flag.clone());
        self.tasks.borrow_mut()[index] = Some(Box::new(Task {
            future,
            waker,
            flag,
        }));
        self.ready.borrow_mut().push_back(index);
        self.schedule();
    }

    /// Brings the driver back, unless it is running or already woken.
    fn schedule(&self) {
        if !self.scheduled.replace(true) {
            if let Some(w) = self.driver.borrow().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// Polls connection `index` once; drops it when it is done (or panicked).
    fn run(&self, index: usize) {
        let Some(mut task) = self
            .tasks
            .borrow_mut()
            .get_mut(index)
            .and_then(Option::take)
        else {
            return;
        };
        task.flag.queued.store(false, Ordering::Release);
        self.current
            .set((index, task.waker.data(), task.waker.vtable()));
        let mut cx = Context::from_waker(&task.waker);
        let done = match catch_unwind(AssertUnwindSafe(|| task.future.as_mut().poll(&mut cx))) {
            Ok(Poll::Pending) => false,
            Ok(Poll::Ready(())) => true,
            Err(_) => {
                tracing::error!("a connection's task panicked; it is closed");
                true
            }
        };
        self.current.set(NO_TASK);
        if done {
            drop(task);
            self.free.borrow_mut().push(index);
        } else if let Some(slot) = self.tasks.borrow_mut().get_mut(index) {
            *slot = Some(task);
        }
    }

    /// Adds `fd` to the set; its readiness starts unknown (both flags set).
    fn register(&self, fd: RawFd) -> io::Result<(usize, Rc<IoState>)> {
        let state = Rc::new(IoState::default());
        state.readable.set(true);
        state.writable.set(true);
        let token = self.free_ios.borrow_mut().pop().unwrap_or_else(|| {
            let mut ios = self.ios.borrow_mut();
            ios.push(None);
            ios.len() - 1
        });
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token as u64,
        };
        // SAFETY: the set and `fd` are open; `ev` is a valid event for the call's duration.
        let rc =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc < 0 {
            self.free_ios.borrow_mut().push(token);
            return Err(io::Error::last_os_error());
        }
        self.ios.borrow_mut()[token] = Some(state.clone());
        Ok((token, state))
    }

    /// Forgets socket `token`, which its closing has taken out of the set.
    fn forget(&self, token: usize) {
        if let Some(slot) = self.ios.borrow_mut().get_mut(token) {
            *slot = None;
        }
        self.free_ios.borrow_mut().push(token);
    }

    /// Marks socket `token` ready as `events` says and wakes who waits for it.
    fn dispatch(&self, token: u64, events: u32) {
        let state = self
            .ios
            .borrow()
            .get(token as usize)
            .and_then(|s| s.clone());
        let Some(state) = state else { return };
        let err = events & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if err || events & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 {
            state.readable.set(true);
            self.wake(state.read_waiter.take());
        }
        if err || events & libc::EPOLLOUT as u32 != 0 {
            state.writable.set(true);
            self.wake(state.write_waiter.take());
        }
    }

    fn wake(&self, waiter: Waiter) {
        match waiter {
            Waiter::Nobody => {}
            Waiter::Task(index) => {
                let queue = self
                    .tasks
                    .borrow()
                    .get(index)
                    .and_then(Option::as_ref)
                    .is_some_and(|t| !t.flag.queued.swap(true, Ordering::AcqRel));
                if queue {
                    self.ready.borrow_mut().push_back(index);
                }
            }
            Waiter::Other(w) => w.wake(),
        }
    }

    /// Records that the task polled with `cx` waits on `slot`.
    #[inline]
    fn wait_on(&self, slot: &RefCell<Waiter>, cx: &Context<'_>) {
        let (index, data, vtable) = self.current.get();
        let mut slot = slot.borrow_mut();
        if cx.waker().data() == data && std::ptr::eq(cx.waker().vtable(), vtable) {
            *slot = Waiter::Task(index);
        } else if !matches!(&*slot, Waiter::Other(w) if w.will_wake(cx.waker())) {
            *slot = Waiter::Other(cx.waker().clone());
        }
    }

    /// Queues what other threads woke.
    fn take_remote(&self) {
        if self.shared.pending.swap(false, Ordering::AcqRel) {
            let woken =
                std::mem::take(&mut *self.shared.remote.lock().unwrap_or_else(|e| e.into_inner()));
            self.ready.borrow_mut().extend(woken);
        }
    }
}

/// The task that runs the set: takes its events, polls the connections they woke.
struct Driver {
    inner: Rc<Inner>,
    events: Vec<libc::epoll_event>,
}

impl Driver {
    /// Takes the set's events while tokio says it has some; false if it may have more than
    /// one `epoll_wait` took (come back before waiting).
    fn take_events(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let mut guard = match self.inner.epoll.poll_read_ready(cx) {
                Poll::Pending => return true,
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(e)) => {
                    tracing::error!(error = %e, "the worker's connection set failed");
                    return true;
                }
            };
            let fd = self.inner.epoll.as_raw_fd();
            // SAFETY: `events` has room for `events.len()` entries, which the kernel fills.
            let n = unsafe {
                syscall::epoll_wait(fd, self.events.as_mut_ptr(), self.events.len() as i32, 0)
            };
            let n = match usize::try_from(n) {
                Ok(n) => n,
                Err(_) => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        tracing::error!(error = %e, "epoll_wait on the worker's connection set failed");
                    }
                    return true;
                }
            };
            for ev in &self.events[..n] {
                let (token, bits) = (ev.u64, ev.events);
                self.inner.dispatch(token, bits);
            }
            if n == self.events.len() {
                return false;
            }
            guard.clear_ready();
        }
    }
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let inner = self.inner.clone();
        inner.scheduled.set(true);
        {
            let mut driver = inner.driver.borrow_mut();
            if !driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *driver = Some(cx.waker().clone());
                *inner
                    .shared
                    .driver
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            }
        }
        let mut polled = 0;
        loop {
            inner.take_remote();
            let drained = self.take_events(cx);
            loop {
                let next = inner.ready.borrow_mut().pop_front();
                let Some(index) = next else { break };
                inner.run(index);
                polled += 1;
                if polled >= TURN {
                    break;
                }
            }
            if polled >= TURN {
                // Enough for one turn: let the worker's other tasks run, then come back.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if drained && !inner.shared.pending.load(Ordering::Acquire) {
                inner.scheduled.set(false);
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The worker's runtime is going away: its connections go with it (their futures hold
        // the set, which would otherwise keep itself alive).
        let tasks = std::mem::take(&mut *self.inner.tasks.borrow_mut());
        drop(tasks);
        let _ = LOOP.try_with(|l| {
            if l.borrow()
                .as_ref()
                .is_some_and(|i| Rc::ptr_eq(i, &self.inner))
            {
                *l.borrow_mut() = None;
            }
        });
    }
}

/// A plain TCP connection of the worker's set.
pub(crate) struct OwnTcp {
    tcp: std::net::TcpStream,
    /// Its place in the set, once an I/O has had to wait.
    io: Option<(usize, Rc<IoState>)>,
    set: Rc<Inner>,
}

impl OwnTcp {
    /// `tcp` (nonblocking), a connection of `set`.
    pub(crate) fn new(tcp: std::net::TcpStream, set: Rc<Inner>) -> OwnTcp {
        OwnTcp { tcp, io: None, set }
    }

    /// Adds the socket to the set, if it is not in it yet.
    fn join(&mut self) -> io::Result<()> {
        if self.io.is_none() {
            self.io = Some(self.set.register(self.tcp.as_raw_fd())?);
        }
        Ok(())
    }

    /// The socket would block: it waits in the set for `which` readiness.
    fn wait(&mut self, cx: &Context<'_>, read: bool) -> Poll<io::Result<()>> {
        self.join()?;
        let Some((_, state)) = &self.io else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let (flag, slot) = state.side(read);
        flag.set(false);
        self.set.wait_on(slot, cx);
        Poll::Pending
    }

    /// Whether the set says the socket is not readable (`read`) or writable; if so, the task
    /// waits for it.
    #[inline]
    fn not_ready(&self, cx: &Context<'_>, read: bool) -> bool {
        let Some((_, state)) = &self.io else {
            return false;
        };
        let (flag, slot) = state.side(read);
        if flag.get() {
            return false;
        }
        self.set.wait_on(slot, cx);
        true
    }

    /// Copies what the socket holds into `buf` without taking it (`MSG_PEEK`); waits in the set
    /// while it holds nothing. `Ok(0)`: the peer closed its side.
    pub(crate) fn poll_peek(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        if self.not_ready(cx, true) {
            return Poll::Pending;
        }
        let fd = self.tcp.as_raw_fd();
        // SAFETY: `fd` is open; the pointer and length describe `buf`, writable for the call.
        match retry(|| unsafe {
            libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(cx, true) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            done => Poll::Ready(done),
        }
    }

    fn send(
        &mut self,
        cx: &Context<'_>,
        bufs: &[IoSlice<'_>],
        flags: i32,
    ) -> Poll<io::Result<usize>> {
        if self.not_ready(cx, false) {
            return Poll::Pending;
        }
        let fd = self.tcp.as_raw_fd();
        let sent = match bufs {
            // SAFETY: `fd` is open; the pointer and length describe `one`.
            [one] => retry(|| unsafe {
                syscall::send(fd, one.as_ptr(), one.len(), flags | libc::MSG_NOSIGNAL)
            }),
            _ => {
                // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = bufs.len().min(1024);
                // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and `msg` describes
                // `bufs`, readable for the call's duration; `fd` is open.
                retry(|| unsafe { syscall::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) })
            }
        };
        match sent {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(cx, false) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            done => Poll::Ready(done),
        }
    }
}

impl Drop for OwnTcp {
    fn drop(&mut self) {
        // Closing the socket (the field's drop, after this) takes it out of the set.
        if let Some((token, _)) = self.io.take() {
            self.set.forget(token);
        }
    }
}

impl Transport for OwnTcp {
    #[inline]
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Outside the set readiness is unknown: a read finds out.
        if self.not_ready(cx, true) {
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.not_ready(cx, true) {
            return Poll::Pending;
        }
        // SAFETY: the kernel only writes to the unfilled part, and `assume_init` below covers
        // exactly the bytes it reports written.
        let spare = unsafe { buf.unfilled_mut() };
        let room = spare.len();
        let fd = self.tcp.as_raw_fd();
        // SAFETY: `fd` is open; the pointer and length describe `spare`, writable memory owned
        // by `buf` for the call's duration.
        match retry(|| unsafe { syscall::recv(fd, spare.as_mut_ptr().cast(), room) }) {
            Ok(n) => {
                if n > 0 && n < room {
                    // A short read emptied the socket: the next data comes with an event.
                    if let Some((_, state)) = &self.io {
                        state.readable.set(false);
                    }
                }
                // SAFETY: `recv` initialized the first `n` bytes of the unfilled part.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(cx, true) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    #[inline]
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.send(cx, &[IoSlice::new(buf)], 0)
    }

    #[inline]
    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.send(cx, bufs, 0)
    }

    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // Outside the set (the connection never waited: its peer sent its request and nothing
        // more), held back (`MSG_MORE`) so that the close's FIN leaves in the same segment. In
        // the set, sent at once, as `LazyTcp` does: a peer that may still be sending would have
        // its unread bytes turn the close into a reset, which discards what is held back.
        let flags = if self.io.is_none() { libc::MSG_MORE } else { 0 };
        self.send(cx, &[IoSlice::new(buf)], flags)
    }

    fn poll_shutdown(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.tcp.shutdown(std::net::Shutdown::Write))
    }

    #[inline]
    fn plain_tcp(&self) -> bool {
        true
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.tcp.as_raw_fd())
    }

    fn register(&mut self) -> io::Result<()> {
        self.join()
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        src: RawFd,
        offset: &mut libc::off_t,
        count: usize,
    ) -> Poll<io::Result<usize>> {
        if self.not_ready(cx, false) {
            return Poll::Pending;
        }
        let dst = self.tcp.as_raw_fd();
        // SAFETY: both descriptors are open for the call (borrowed from `self` and the caller),
        // `offset` is a valid, exclusively borrowed off_t that the kernel reads and advances,
        // and no user-space buffer is involved.
        match retry(|| unsafe { libc::sendfile(dst, src, offset, count) }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.wait(cx, false) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            done => Poll::Ready(done),
        }
    }

    fn kernel_queued(&self) -> Option<u32> {
        send_queue(self.tcp.as_raw_fd())
    }
}

// The socket as a tokio byte stream, for the TLS layer (`tokio_rustls`) over it.
tokio_io_through_transport!(OwnTcp);
