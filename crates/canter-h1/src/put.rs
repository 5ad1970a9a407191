//! Appending short byte strings to an output buffer without a call to `memcpy`.
//!
//! A response head is a handful of short pieces (the status line with Server and Date, the
//! Content-Length line, the Content-Type value) and a small body is one more. Each has a length
//! known only at run time, so `extend_from_slice` calls `memcpy`, whose dispatch on the length
//! costs more than the copy itself at these sizes. [`put`] copies up to [`MAX`] bytes inline
//! with two to four overlapping fixed-size moves.

use bytes::BytesMut;

/// The longest slice [`put`] copies inline; longer ones go to `extend_from_slice`.
pub const MAX: usize = 128;

/// Appends `src` to `out`, like `out.extend_from_slice(src)`; a slice of at most [`MAX`] bytes
/// that fits the spare capacity is copied inline.
#[inline(always)]
pub fn put(out: &mut BytesMut, src: &[u8]) {
    let n = src.len();
    let len = out.len();
    if n > MAX || out.capacity() - len < n {
        out.extend_from_slice(src);
        return;
    }
    let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    // SAFETY: the spare capacity holds at least `n` bytes (checked above) and `src` has exactly
    // `n`; `copy_short` reads and writes only within the first `n` bytes of each, and a
    // `&mut BytesMut` and a `&[u8]` cannot overlap.
    unsafe { copy_short(src.as_ptr(), dst, n) };
    // SAFETY: the `n` bytes after the current length were just initialised.
    unsafe { out.set_len(len + n) };
}

/// Appends `src` to `v`, like [`put`] for a `Vec`.
#[inline(always)]
pub(crate) fn put_vec(v: &mut Vec<u8>, src: &[u8]) {
    let n = src.len();
    let len = v.len();
    if n > MAX || v.capacity() - len < n {
        v.extend_from_slice(src);
        return;
    }
    let dst = v.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    // SAFETY: as in `put`: room for `n` bytes was checked, `src` has `n`, and they are distinct.
    unsafe { copy_short(src.as_ptr(), dst, n) };
    // SAFETY: the `n` bytes after the current length were just initialised.
    unsafe { v.set_len(len + n) };
}

/// Copies `n` (at most [`MAX`]) bytes with fixed-size moves: the first and last `K` bytes for
/// the largest `K` in 4, 8, 16, 32 with `K <= n` (twice that for `n` over 64), which together
/// cover all `n` bytes.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes, not overlapping, and
/// `n <= MAX`.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: every move below reads and writes `K` bytes at an offset in `0..=n - K`, within
    // the `n` bytes the caller vouches for.
    unsafe {
        if n >= 32 {
            copy::<32>(src, dst, 0);
            copy::<32>(src, dst, n - 32);
            if n > 64 {
                copy::<32>(src, dst, 32);
                copy::<32>(src, dst, n - 64);
            }
        } else if n >= 16 {
            copy::<16>(src, dst, 0);
            copy::<16>(src, dst, n - 16);
        } else if n >= 8 {
            copy::<8>(src, dst, 0);
            copy::<8>(src, dst, n - 8);
        } else if n >= 4 {
            copy::<4>(src, dst, 0);
            copy::<4>(src, dst, n - 4);
        } else if n > 0 {
            // 1 to 3 bytes: first, middle and last cover them.
            *dst = *src;
            *dst.add(n / 2) = *src.add(n / 2);
            *dst.add(n - 1) = *src.add(n - 1);
        }
    }
}

/// Moves `K` bytes at offset `at`.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `at + K` bytes.
#[inline(always)]
unsafe fn copy<const K: usize>(src: *const u8, dst: *mut u8, at: usize) {
    // SAFETY: in bounds per the caller; unaligned reads and writes of a byte array are allowed.
    unsafe {
        let bytes = src.add(at).cast::<[u8; K]>().read_unaligned();
        dst.add(at).cast::<[u8; K]>().write_unaligned(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_appends_exactly_the_slice() {
        let src: Vec<u8> = (0..=MAX as u8 + 40)
            .map(|b| b.wrapping_mul(31) ^ 0x5a)
            .collect();
        for n in 0..src.len() {
            for prefix in [0, 1, 7, 33] {
                // Room for the inline path, and (capacity exactly the prefix) for the fallback.
                for room in [MAX + 64, 0] {
                    let mut out = BytesMut::with_capacity(prefix + room);
                    out.extend_from_slice(&vec![b'#'; prefix]);
                    put(&mut out, &src[..n]);
                    assert_eq!(
                        &out[..prefix],
                        &vec![b'#'; prefix][..],
                        "n {n} prefix {prefix}"
                    );
                    assert_eq!(
                        &out[prefix..],
                        &src[..n],
                        "n {n} prefix {prefix} room {room}"
                    );
                }
            }
        }
    }
}
