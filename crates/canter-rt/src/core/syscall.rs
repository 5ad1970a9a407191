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
