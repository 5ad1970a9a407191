//! JSON between Python values and bytes, in Rust: no intermediate tree either way.

use std::fmt;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Deepest nesting written; deeper values (or a cycle) are refused.
const MAX_DEPTH: usize = 128;

/// Appends `value` as JSON to `out`: dict (string keys), list, tuple, str, int, float (finite),
/// bool and None, as `json.dumps` with `ensure_ascii=False` and compact separators writes them.
pub fn write(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    write_at(out, value, 0)
}

fn write_at(out: &mut Vec<u8>, value: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(
            "JSON value nested too deeply (or circular)",
        ));
    }
    if let Ok(s) = value.cast::<PyString>() {
        write_str(out, s.to_str()?);
    } else if let Ok(d) = value.cast::<PyDict>() {
        out.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match k.cast::<PyString>() {
                Ok(k) => write_str(out, k.to_str()?),
                Err(_) => {
                    return Err(PyTypeError::new_err(format!(
                        "JSON object keys must be str, not {}",
                        k.get_type().name()?
                    )))
                }
            }
            out.push(b':');
            write_at(out, &v, depth + 1)?;
        }
        out.push(b'}');
    } else if let Ok(l) = value.cast::<PyList>() {
        write_array(out, l.iter(), depth)?;
    } else if value.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = value.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if let Ok(i) = value.cast::<PyInt>() {
        if let Ok(n) = i.extract::<i64>() {
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        } else if let Ok(n) = i.extract::<u64>() {
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        } else {
            // Larger integers: their decimal digits, as json.dumps writes them.
            out.extend_from_slice(i.str()?.to_str()?.as_bytes());
        }
    } else if let Ok(f) = value.cast::<PyFloat>() {
        let x = f.value();
        if !x.is_finite() {
            return Err(PyValueError::new_err(format!("{x} is not a JSON number")));
        }
        out.extend_from_slice(ryu::Buffer::new().format_finite(x).as_bytes());
    } else if let Ok(t) = value.cast::<PyTuple>() {
        write_array(out, t.iter(), depth)?;
    } else {
        return Err(PyTypeError::new_err(format!(
            "{} is not JSON serializable",
            value.get_type().name()?
        )));
    }
    Ok(())
}

/// Writes the items of a list or tuple as a JSON array.
fn write_array<'py>(
    out: &mut Vec<u8>,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<()> {
    out.push(b'[');
    for (i, v) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_at(out, &v, depth + 1)?;
    }
    out.push(b']');
    Ok(())
}

/// Writes `s` as a JSON string: quotes, backslash and control characters escaped, the rest as
/// UTF-8.
fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 15) as usize],
            ]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Parses JSON text into Python values (dict, list, str, int, float, bool, None).
pub fn parse<'py>(py: Python<'py>, text: &[u8]) -> Result<Bound<'py, PyAny>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = Seed(py).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Builds Python values straight from the parser's events.
#[derive(Clone, Copy)]
struct Seed<'py>(Python<'py>);

/// A Python error met while building (out of memory, mostly), carried through serde.
fn py_err<E: de::Error, P: fmt::Display>(e: P) -> E {
    E::custom(e)
}

impl<'de, 'py> DeserializeSeed<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, 'py> Visitor<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.0, v).to_owned().into_any())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into_pyobject(self.0).map_err(py_err)?.into_any())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into_pyobject(self.0).map_err(py_err)?.into_any())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(PyFloat::new(self.0, v).into_any())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.0, v).into_any())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.None().into_bound(self.0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let list = PyList::empty(self.0);
        while let Some(v) = seq.next_element_seed(self)? {
            list.append(v).map_err(py_err)?;
        }
        Ok(list.into_any())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.0);
        // JSON keys are strings: the seed makes them Python str without a Rust copy.
        while let Some(k) = map.next_key_seed(self)? {
            let v = map.next_value_seed(self)?;
            dict.set_item(k, v).map_err(py_err)?;
        }
        Ok(dict.into_any())
    }
}

#[cfg(test)]
mod tests {
    use super::write_str;

    #[test]
    fn strings_are_escaped() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\n\u{1}é");
        assert_eq!(out, b"\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");
    }
}
