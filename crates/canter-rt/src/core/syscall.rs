//! System calls made by hand, below everything that makes them.

use std::io;

/// A nonblocking system call's result (a count, or -1 with `errno` set), with `EINTR` retried.
pub(crate) fn retry(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        match usize::try_from(call()) {
            Ok(n) => return Ok(n),
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

// The calls below go through `syscall(2)` rather than glibc's wrappers of the same name, which
// are cancellation points: each wraps the call in `__pthread_enable_asynccancel` and
// `__pthread_disable_asynccancel`, about 30 instructions, for thread cancellation, which canter
// never uses (bench/notebook/http1.md). Same arguments, same result, same `errno`.

/// `recv(fd, buf, len, 0)`.
///
/// # Safety
/// `fd` must be open, and `buf` writable for `len` bytes for the call's duration.
#[inline]
pub(crate) unsafe fn recv(fd: libc::c_int, buf: *mut u8, len: usize) -> isize {
    let null = std::ptr::null_mut::<libc::sockaddr>();
    // SAFETY: as the caller promises; no address is asked for (null, null).
    unsafe { libc::syscall(libc::SYS_recvfrom, fd, buf, len, 0, null, null) as isize }
}

/// `send(fd, buf, len, flags)`.
///
/// # Safety
/// `fd` must be open, and `buf` readable for `len` bytes for the call's duration.
#[inline]
pub(crate) unsafe fn send(
    fd: libc::c_int,
    buf: *const u8,
    len: usize,
    flags: libc::c_int,
) -> isize {
    let null = std::ptr::null::<libc::sockaddr>();
    // SAFETY: as the caller promises; no address is given (null, 0).
    unsafe { libc::syscall(libc::SYS_sendto, fd, buf, len, flags, null, 0) as isize }
}

/// `sendmsg(fd, msg, flags)`.
///
/// # Safety
/// `fd` must be open, and `msg` a valid `msghdr` whose buffers are readable for the call.
#[inline]
pub(crate) unsafe fn sendmsg(
    fd: libc::c_int,
    msg: *const libc::msghdr,
    flags: libc::c_int,
) -> isize {
    // SAFETY: as the caller promises.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as isize }
}

/// `epoll_wait(epfd, events, max, timeout)` (as `epoll_pwait` with no signal mask, which every
/// architecture has).
///
/// # Safety
/// `epfd` must be an epoll descriptor, and `events` writable for `max` entries.
#[inline]
pub(crate) unsafe fn epoll_wait(
    epfd: libc::c_int,
    events: *mut libc::epoll_event,
    max: libc::c_int,
    timeout: libc::c_int,
) -> libc::c_int {
    let no_mask = std::ptr::null::<libc::sigset_t>();
    // SAFETY: as the caller promises; a null mask leaves the signal mask alone (the size
    // argument is then ignored).
    unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait,
            epfd,
            events,
            max,
            timeout,
            no_mask,
            8,
        ) as libc::c_int
    }
}
