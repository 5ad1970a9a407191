//! How a built-in stateful step's state goes into checkpoints: the codecs a user gives for its
//! keys and for the values it keeps, and the few layouts the steps build from them (with the
//! checkpoint file's own writer and [`Reader`]).

use std::sync::Arc;

use super::checkpoint::{put_with_len, Reader};

type Encode<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;
type Decode<T> = Arc<dyn Fn(&[u8]) -> Option<T> + Send + Sync>;

/// Codecs for a step's keys and for the values it keeps per key (an aggregate's value, a
/// join's records), given to [`Tail::checkpointed`](super::Tail::checkpointed).
pub struct Codecs<K, V> {
    pub(crate) encode_key: Encode<K>,
    pub(crate) decode_key: Decode<K>,
    encode_value: Encode<V>,
    decode_value: Decode<V>,
}

impl<K, V> Clone for Codecs<K, V> {
    fn clone(&self) -> Self {
        Codecs {
            encode_key: self.encode_key.clone(),
            decode_key: self.decode_key.clone(),
            encode_value: self.encode_value.clone(),
            decode_value: self.decode_value.clone(),
        }
    }
}

impl<K, V> Codecs<K, V> {
    pub(crate) fn new(
        encode_key: impl Fn(&K, &mut Vec<u8>) + Send + Sync + 'static,
        decode_key: impl Fn(&[u8]) -> Option<K> + Send + Sync + 'static,
        encode_value: impl Fn(&V, &mut Vec<u8>) + Send + Sync + 'static,
        decode_value: impl Fn(&[u8]) -> Option<V> + Send + Sync + 'static,
    ) -> Self {
        Codecs {
            encode_key: Arc::new(encode_key),
            decode_key: Arc::new(decode_key),
            encode_value: Arc::new(encode_value),
            decode_value: Arc::new(decode_value),
        }
    }

    /// A key inside a state, framed.
    pub(crate) fn put_key(&self, k: &K, b: &mut Vec<u8>) {
        put_with_len(b, |b| (self.encode_key)(k, b));
    }

    pub(crate) fn take_key(&self, r: &mut Reader<'_>) -> Option<K> {
        (self.decode_key)(r.bytes().ok()?)
    }

    /// A value, framed.
    pub(crate) fn put_value(&self, v: &V, b: &mut Vec<u8>) {
        put_with_len(b, |b| (self.encode_value)(v, b));
    }

    pub(crate) fn take_value(&self, r: &mut Reader<'_>) -> Option<V> {
        (self.decode_value)(r.bytes().ok()?)
    }

    /// A value that may not be there yet: a 0 byte, or 1 and the value.
    pub(crate) fn put_option(&self, v: &Option<V>, b: &mut Vec<u8>) {
        match v {
            None => b.push(0),
            Some(v) => {
                b.push(1);
                self.put_value(v, b)
            }
        }
    }

    pub(crate) fn take_option(&self, r: &mut Reader<'_>) -> Option<Option<V>> {
        match r.u8().ok()? {
            0 => Some(None),
            1 => self.take_value(r).map(Some),
            _ => None,
        }
    }

    /// Sides of records (a join's): their count, then each side's count and records.
    pub(crate) fn put_sides(&self, sides: &[Vec<V>], b: &mut Vec<u8>) {
        put_u32(b, sides.len());
        for side in sides {
            put_u32(b, side.len());
            for v in side {
                self.put_value(v, b);
            }
        }
    }

    pub(crate) fn take_sides(&self, r: &mut Reader<'_>) -> Option<Vec<Vec<V>>> {
        let mut sides = Vec::new();
        for _ in 0..r.u32().ok()? {
            let mut side = Vec::new();
            for _ in 0..r.u32().ok()? {
                side.push(self.take_value(r)?);
            }
            sides.push(side);
        }
        Some(sides)
    }
}

/// A built-in stateful step whose state goes into checkpoints once it has [`Codecs`] (see
/// [`Tail::checkpointed`](super::Tail::checkpointed)).
pub trait Checkpointable<K> {
    /// What the step keeps per key besides its own bookkeeping: an aggregate's value, a join's
    /// records.
    type Value;
    /// The step, its state written and read back with `codecs`.
    fn with_codecs(self, codecs: Codecs<K, Self::Value>) -> Self;
}

pub(crate) fn put_u32(b: &mut Vec<u8>, n: usize) {
    b.extend_from_slice(&(n as u32).to_be_bytes());
}

pub(crate) fn put_u64(b: &mut Vec<u8>, n: u64) {
    b.extend_from_slice(&n.to_be_bytes());
}

/// An optional time: a flag byte and the time (0 when absent).
pub(crate) fn put_opt_u64(b: &mut Vec<u8>, n: Option<u64>) {
    b.push(u8::from(n.is_some()));
    put_u64(b, n.unwrap_or(0));
}

pub(crate) fn take_opt_u64(r: &mut Reader<'_>) -> Option<Option<u64>> {
    let flag = r.u8().ok()?;
    let n = r.u64().ok()?;
    match flag {
        0 => Some(None),
        1 => Some(Some(n)),
        _ => None,
    }
}
