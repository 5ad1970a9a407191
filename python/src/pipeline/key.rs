//! Keys as the engine routes and stores them: a Python key made once into a value that is
//! hashed and compared without the interpreter. Below the steps and the codecs, which both
//! make keys.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};

use super::Obj;

/// A key as the engine routes and stores it: hashed and compared without the interpreter.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Key {
    None,
    Int(i64),
    /// A str of at most 23 bytes, in place.
    SmallStr(Small),
    /// A bytes value of at most 23 bytes, in place.
    SmallBytes(Small),
    Str(Arc<str>),
    Bytes(Arc<[u8]>),
    Tuple(Arc<[Key]>),
}

/// The longest str or bytes key kept in place.
pub(crate) const SMALL: usize = 23;

/// Up to 23 bytes in place: the length, then the bytes, zeros after them; compared and hashed
/// as three words (a symbol's key is one). Aligned as words: unaligned, a key moved through
/// memory in pieces that the loads after them could not take from the stores before them
/// (store-forwarding stalls; the decoder's share of Market Spread in Python's samples fell
/// from 7.6% to 4.5% with the alignment, perf).
#[derive(Clone, Copy, Debug)]
#[repr(align(8))]
pub(crate) struct Small([u8; 24]);

impl Small {
    #[inline]
    pub(crate) fn new(b: &[u8]) -> Small {
        let mut a = [0u8; 24];
        if b.len() <= 7 {
            // A symbol's key: one word, built without a call to `memcpy`.
            let w = b.len() as u64 | le_word(b) << 8;
            a[..8].copy_from_slice(&w.to_le_bytes());
        } else {
            a[0] = b.len() as u8;
            a[1..=b.len()].copy_from_slice(b);
        }
        Small(a)
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        &self.0[1..=self.0[0] as usize]
    }

    #[inline]
    fn word(&self, i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    }
}

impl PartialEq for Small {
    #[inline]
    fn eq(&self, other: &Small) -> bool {
        self.word(0) == other.word(0)
            && self.word(1) == other.word(1)
            && self.word(2) == other.word(2)
    }
}

impl Eq for Small {}

impl std::hash::Hash for Small {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The words past the length are zero: equal keys hash the same words.
        state.write_u64(self.word(0));
        if self.0[0] > 7 {
            state.write_u64(self.word(1));
        }
        if self.0[0] > 15 {
            state.write_u64(self.word(2));
        }
    }
}

impl Key {
    /// The key of a Python value (str, int, bytes, None or a tuple of them), by exact type
    /// first: no failed conversion (and no exception made and dropped) on the way.
    #[inline]
    pub(crate) fn of(v: &Bound<'_, PyAny>) -> PyResult<Key> {
        if let Ok(b) = v.cast_exact::<PyBytes>() {
            let b = b.as_bytes();
            return Ok(if b.len() <= SMALL {
                Key::SmallBytes(Small::new(b))
            } else {
                Key::Bytes(b.into())
            });
        }
        if let Ok(s) = v.cast::<PyString>() {
            let s = s.to_str()?;
            return Ok(if s.len() <= SMALL {
                Key::SmallStr(Small::new(s.as_bytes()))
            } else {
                Key::Str(s.into())
            });
        }
        if v.is_instance_of::<PyInt>() {
            return v.extract::<i64>().map(Key::Int);
        }
        if v.is_none() {
            return Ok(Key::None);
        }
        if let Ok(b) = v.cast::<PyBytes>() {
            return Ok(Key::Bytes(b.as_bytes().into()));
        }
        if let Ok(t) = v.cast::<PyTuple>() {
            return t
                .iter()
                .map(|x| Key::of(&x))
                .collect::<PyResult<Vec<_>>>()
                .map(|v| Key::Tuple(v.into()));
        }
        Err(PyTypeError::new_err(format!(
            "a key must be str, int, bytes, None or a tuple of them, not {}",
            v.get_type().name()?
        )))
    }

    /// The key's bytes as a Kafka record key: a str's UTF-8, bytes as they are, an int in
    /// decimal, None empty, a tuple's items joined by NUL.
    pub(crate) fn natural_bytes(&self, buf: &mut Vec<u8>) {
        match self {
            Key::None => {}
            Key::Int(i) => buf.extend_from_slice(i.to_string().as_bytes()),
            Key::SmallStr(b) | Key::SmallBytes(b) => buf.extend_from_slice(b.bytes()),
            Key::Str(s) => buf.extend_from_slice(s.as_bytes()),
            Key::Bytes(b) => buf.extend_from_slice(b),
            Key::Tuple(v) => {
                for (i, k) in v.iter().enumerate() {
                    if i > 0 {
                        buf.push(0);
                    }
                    k.natural_bytes(buf);
                }
            }
        }
    }

    /// The key's bytes in a changelog: a tag, then the value (a tuple: its length, then each
    /// item with its length).
    pub(crate) fn tagged_bytes(&self, buf: &mut Vec<u8>) {
        match self {
            Key::None => buf.push(0),
            Key::Int(i) => {
                buf.push(1);
                buf.extend_from_slice(&i.to_be_bytes());
            }
            Key::SmallStr(b) => {
                buf.push(2);
                buf.extend_from_slice(b.bytes());
            }
            Key::Str(s) => {
                buf.push(2);
                buf.extend_from_slice(s.as_bytes());
            }
            Key::SmallBytes(b) => {
                buf.push(3);
                buf.extend_from_slice(b.bytes());
            }
            Key::Bytes(b) => {
                buf.push(3);
                buf.extend_from_slice(b);
            }
            Key::Tuple(v) => {
                buf.push(4);
                buf.extend_from_slice(&(v.len() as u32).to_be_bytes());
                for k in v.iter() {
                    let mut one = Vec::new();
                    k.tagged_bytes(&mut one);
                    buf.extend_from_slice(&(one.len() as u32).to_be_bytes());
                    buf.extend_from_slice(&one);
                }
            }
        }
    }

    /// A key from [`Key::tagged_bytes`] (None: not one).
    pub(crate) fn from_tagged(b: &[u8]) -> Option<Key> {
        let (&tag, rest) = b.split_first()?;
        Some(match tag {
            0 if rest.is_empty() => Key::None,
            1 => Key::Int(i64::from_be_bytes(rest.try_into().ok()?)),
            2 => {
                let s = std::str::from_utf8(rest).ok()?;
                if s.len() <= SMALL {
                    Key::SmallStr(Small::new(rest))
                } else {
                    Key::Str(s.into())
                }
            }
            3 => {
                if rest.len() <= SMALL {
                    Key::SmallBytes(Small::new(rest))
                } else {
                    Key::Bytes(rest.into())
                }
            }
            4 => {
                let n = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
                let mut at = 4;
                let mut items = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let len = u32::from_be_bytes(rest.get(at..at + 4)?.try_into().ok()?) as usize;
                    at += 4;
                    items.push(Key::from_tagged(rest.get(at..at.checked_add(len)?)?)?);
                    at += len;
                }
                if at != rest.len() {
                    return None;
                }
                Key::Tuple(items.into())
            }
            _ => return None,
        })
    }

    /// The key as Python sees it.
    pub(crate) fn to_py(&self, py: Python<'_>) -> Obj {
        match self {
            Key::None => py.None(),
            Key::Int(i) => i
                .into_pyobject(py)
                .map(|v| v.into_any().unbind())
                .unwrap_or_else(|_| py.None()),
            Key::SmallStr(b) => PyString::new(py, std::str::from_utf8(b.bytes()).unwrap_or(""))
                .into_any()
                .unbind(),
            Key::SmallBytes(b) => PyBytes::new(py, b.bytes()).into_any().unbind(),
            Key::Str(s) => PyString::new(py, s).into_any().unbind(),
            Key::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
            Key::Tuple(v) => PyTuple::new(py, v.iter().map(|k| k.to_py(py)))
                .map(|t| t.into_any().unbind())
                .unwrap_or_else(|_| py.None()),
        }
    }
}

/// Up to 8 bytes as a little-endian word (zeros after them): a few loads, no loop and no call
/// to `memcpy` (reads that overlap put the same bytes in the same places).
#[inline(always)]
pub(crate) fn le_word(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 8 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[..8]);
        u64::from_le_bytes(w)
    } else if n >= 4 {
        let lo = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let hi = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]);
        u64::from(lo) | u64::from(hi) << (8 * (n - 4))
    } else if n > 0 {
        u64::from(b[0])
            | u64::from(b[n / 2]) << (8 * (n / 2))
            | u64::from(b[n - 1]) << (8 * (n - 1))
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::le_word;
    #[test]
    fn le_word_is_the_bytes_as_a_little_endian_word() {
        for n in 0..=9usize {
            let b: Vec<u8> = (1..=n as u8).map(|i| i.wrapping_mul(37) | 1).collect();
            let mut w = [0u8; 8];
            let take = n.min(8);
            w[..take].copy_from_slice(&b[..take]);
            assert_eq!(le_word(&b), u64::from_le_bytes(w), "{n} bytes");
        }
    }
}
