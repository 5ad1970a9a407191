//! A flow's records between the processes of a group (`Flow.run(processes=N)` on TCP and file
//! sources): keys in their tagged bytes, the records of a batch pickled together.

use canter_stream::pipeline::Wire;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::key::Key;
use super::{py, Obj};

/// Keys and records of a keyed pipeline, a batch at a time: `u32` count, each key's length and
/// tagged bytes, then `pickle.dumps(list of records)`. Runs on the worker threads, which hold
/// the interpreter lock.
pub(crate) struct PyWire {
    dumps: Obj,
    loads: Obj,
}

impl PyWire {
    pub(crate) fn new(py: Python<'_>) -> PyResult<PyWire> {
        let pickle = py.import("pickle")?;
        Ok(PyWire {
            dumps: pickle.getattr("dumps")?.unbind(),
            loads: pickle.getattr("loads")?.unbind(),
        })
    }
}

impl Wire<Key, (Key, Obj)> for PyWire {
    fn encode(&self, items: Vec<(Key, (Key, Obj))>, out: &mut Vec<u8>) -> Result<(), String> {
        let py = py();
        out.extend_from_slice(&(items.len() as u32).to_le_bytes());
        let mut records = Vec::with_capacity(items.len());
        for (k, (_, x)) in items {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            k.tagged_bytes(out);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
            records.push(x);
        }
        let list = PyList::new(py, records).map_err(|e| e.to_string())?;
        let pickled = self
            .dumps
            .bind(py)
            .call1((list, 5))
            .map_err(|e| format!("a record cannot be pickled: {e}"))?;
        let pickled = pickled.cast::<PyBytes>().map_err(|e| e.to_string())?;
        out.extend_from_slice(pickled.as_bytes());
        Ok(())
    }

    fn decode(&self, bytes: &[u8], out: &mut Vec<(Key, (Key, Obj))>) -> Result<(), String> {
        let py = py();
        let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
            let end = at.checked_add(n).filter(|&e| e <= bytes.len());
            let end = end.ok_or("a batch cut short")?;
            let b = &bytes[*at..end];
            *at = end;
            Ok(b)
        };
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let mut at = 0;
        let n = word(take(&mut at, 4)?);
        let mut keys = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let len = word(take(&mut at, 4)?);
            keys.push(Key::from_tagged(take(&mut at, len)?).ok_or("a key that does not decode")?);
        }
        let records = self
            .loads
            .bind(py)
            .call1((PyBytes::new(py, &bytes[at..]),))
            .map_err(|e| format!("the records do not unpickle: {e}"))?;
        let records = records.cast::<PyList>().map_err(|e| e.to_string())?;
        if records.len() != n {
            return Err(format!("{} records for {n} keys", records.len()));
        }
        for (k, x) in keys.into_iter().zip(records.iter()) {
            out.push((k.clone(), (k, x.unbind())));
        }
        Ok(())
    }
}

/// A record as read, not decoded yet: what crosses processes when a pipeline's key is read
/// from its raw bytes ([`RawWire`]).
pub(crate) struct Raw(pub(crate) Box<[u8]>);

/// Keys and raw records, a batch at a time: for each, the key's length and tagged bytes, then
/// the record's length and bytes. Nothing is pickled: the owner decodes the records.
pub(crate) struct RawWire;

impl Wire<Key, (Key, Raw)> for RawWire {
    fn encode(&self, items: Vec<(Key, (Key, Raw))>, out: &mut Vec<u8>) -> Result<(), String> {
        for (k, (_, raw)) in items {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            k.tagged_bytes(out);
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(raw.0.len() as u32).to_le_bytes());
            out.extend_from_slice(&raw.0);
        }
        Ok(())
    }

    fn decode(&self, bytes: &[u8], out: &mut Vec<(Key, (Key, Raw))>) -> Result<(), String> {
        fn take<'b>(bytes: &'b [u8], at: &mut usize, n: usize) -> Result<&'b [u8], String> {
            let b = bytes.get(*at..*at + n).ok_or("a batch cut short")?;
            *at += n;
            Ok(b)
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let mut at = 0;
        while at < bytes.len() {
            let len = word(take(bytes, &mut at, 4)?);
            let k =
                Key::from_tagged(take(bytes, &mut at, len)?).ok_or("a key that does not decode")?;
            let len = word(take(bytes, &mut at, 4)?);
            let raw = Raw(take(bytes, &mut at, len)?.into());
            out.push((k.clone(), (k, raw)));
        }
        Ok(())
    }
}
