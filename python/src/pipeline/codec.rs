//! Decoders and encoders of records: built-in ones run in Rust (raw bytes, UTF-8 text,
//! `struct` formats; JSON through CPython's C parser), or a Python function.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyByteArray, PyBytes, PyList, PyString, PyTuple};

use super::key::{le_word, Key, Small, SMALL};
use super::Obj;

/// One field of a `struct` format.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Field {
    Pad(usize),
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    Bytes(usize),
}

/// A `struct` format with standard sizes and no alignment (`<`, `>`, `!` or `=`; `@` and no
/// prefix are taken as `=`): what Python's `struct` module does for those prefixes.
#[derive(Clone, Debug)]
pub(crate) struct Format {
    /// The format as written, for errors.
    text: Arc<str>,
    big: bool,
    fields: Arc<[Field]>,
    /// The fields that make values (no padding), each with where it starts in a record.
    vals: Arc<[(usize, Field)]>,
    size: usize,
    values: usize,
}

impl Format {
    pub(crate) fn parse(fmt: &str) -> PyResult<Format> {
        let bad = |why: String| PyValueError::new_err(format!("struct format {fmt:?}: {why}"));
        let mut chars = fmt.chars().filter(|c| !c.is_whitespace()).peekable();
        let big = match chars.peek() {
            Some('>') | Some('!') => {
                chars.next();
                true
            }
            Some('<') | Some('=') | Some('@') => {
                chars.next();
                cfg!(target_endian = "big")
            }
            _ => cfg!(target_endian = "big"),
        };
        let (mut fields, mut size, mut values) = (Vec::new(), 0usize, 0usize);
        let mut count: Option<usize> = None;
        for c in chars {
            if let Some(d) = c.to_digit(10) {
                count = Some(count.unwrap_or(0) * 10 + d as usize);
                if count > Some(1 << 24) {
                    return Err(bad("count too large".into()));
                }
                continue;
            }
            let n = count.take().unwrap_or(1);
            let one = match c {
                'x' => {
                    fields.push(Field::Pad(n));
                    size += n;
                    continue;
                }
                's' => {
                    fields.push(Field::Bytes(n));
                    size += n;
                    values += 1;
                    continue;
                }
                '?' => Field::Bool,
                'b' => Field::I8,
                'B' | 'c' => Field::U8,
                'h' => Field::I16,
                'H' => Field::U16,
                'i' | 'l' => Field::I32,
                'I' | 'L' => Field::U32,
                'q' | 'n' => Field::I64,
                'Q' | 'N' => Field::U64,
                'f' => Field::F32,
                'd' => Field::F64,
                other => return Err(bad(format!("unsupported code {other:?}"))),
            };
            for _ in 0..n {
                fields.push(one);
                size += width(one);
                values += 1;
            }
        }
        let mut at = 0;
        let mut vals = Vec::with_capacity(values);
        for f in &fields {
            if !matches!(f, Field::Pad(_)) {
                vals.push((at, *f));
            }
            at += width(*f);
        }
        Ok(Format {
            text: fmt.into(),
            big,
            fields: fields.into(),
            vals: vals.into(),
            size,
            values,
        })
    }

    /// A record's size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Where value `item` (an index as `operator.itemgetter` takes it) lies in a record, when
    /// the key `key_by` would make of it can be read there without unpacking: a bytes or an
    /// integer field. None for the others (floats are no keys).
    pub(crate) fn key_field(&self, item: isize) -> Option<KeyField> {
        let item = if item < 0 {
            usize::try_from(item + self.values as isize).ok()?
        } else {
            usize::try_from(item).ok()?
        };
        let (mut at, mut slot) = (0, 0);
        for f in self.fields.iter() {
            if !matches!(f, Field::Pad(_)) {
                if slot == item {
                    return match f {
                        Field::F32 | Field::F64 => None,
                        _ => Some(KeyField {
                            at,
                            field: *f,
                            big: self.big,
                        }),
                    };
                }
                slot += 1;
            }
            at += width(*f);
        }
        None
    }

    /// Unpacks `rec` (exactly the format's size) into a tuple; short bytes fields from
    /// `cache` where their values repeat, and, with a cache, into the tuple of the record
    /// before when nothing but the cache holds it any more (see [`Interner`]).
    pub(crate) fn unpack<'py>(
        &self,
        py: Python<'py>,
        rec: &[u8],
        mut cache: Option<&mut Interner>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if rec.len() != self.size {
            return Err(PyValueError::new_err(format!(
                "record of {} bytes, the format takes {}",
                rec.len(),
                self.size
            )));
        }
        let spare = cache.as_deref_mut().and_then(|c| c.spare(py, self.values));
        let fresh = spare.is_none();
        let tuple = match spare {
            Some(t) => t,
            // SAFETY: a new tuple of `values` slots, each filled exactly once below with a new
            // reference (the tuple takes it) before the tuple is handed out; on an error the
            // tuple is dropped with its unfilled slots NULL, which tuple deallocation allows.
            None => unsafe {
                let t = ffi::PyTuple_New(self.values as ffi::Py_ssize_t);
                Bound::from_owned_ptr_or_err(py, t)?
            },
        };
        let t = tuple.as_ptr();
        let ints = if fresh {
            IntLayout::Unknown
        } else {
            int_layout()
        };
        for (slot, &(at, field)) in self.vals.iter().enumerate() {
            // SAFETY: `vals` holds the format's fields with their offsets, each within its
            // size, which is `rec`'s; `slot` < `values` (one per value field), and the tuple's
            // slots are all set unless `fresh`.
            unsafe {
                let v = Value {
                    t,
                    slot: slot as ffi::Py_ssize_t,
                    fresh,
                };
                let made = if self.big {
                    v.make::<true>(py, rec, at, field, ints, cache.as_deref_mut())
                } else {
                    v.make::<false>(py, rec, at, field, ints, cache.as_deref_mut())
                };
                match made {
                    Made::Refilled => {}
                    Made::New(o) if o.is_null() => return Err(PyErr::fetch(py)),
                    Made::New(o) => v.set(o),
                }
            }
        }
        if fresh {
            if let Some(c) = cache {
                c.spare = Some(tuple.clone().unbind());
            }
        }
        Ok(tuple)
    }

    /// Packs the sequence `v` (one value per field) onto `buf`: a tuple's or a list's items
    /// taken in place, any other sequence's through `len` and `__getitem__`.
    pub(crate) fn pack(&self, v: &Bound<'_, PyAny>, buf: &mut Vec<u8>) -> PyResult<()> {
        if let Ok(t) = v.cast::<PyTuple>() {
            self.values_are(t.len())?;
            return self.pack_items(buf, |i| t.get_item(i));
        }
        if let Ok(l) = v.cast::<PyList>() {
            self.values_are(l.len())?;
            return self.pack_items(buf, |i| l.get_item(i));
        }
        self.values_are(v.len()?)?;
        self.pack_items(buf, |i| v.get_item(i))
    }

    fn values_are(&self, n: usize) -> PyResult<()> {
        if n != self.values {
            return Err(PyValueError::new_err(format!(
                "the format packs {} values, got {n}",
                self.values
            )));
        }
        Ok(())
    }

    /// Packs the values `item(0)`, `item(1)`, ... (one per field) onto `buf`, as strictly as
    /// `struct.pack`: bytes (or a bytearray) for `s`, an int in the field's range for an
    /// integer; an error names the field and the format.
    #[inline]
    fn pack_items<'py>(
        &self,
        buf: &mut Vec<u8>,
        item: impl Fn(usize) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        buf.reserve(self.size);
        let mut i = 0;
        for f in self.fields.iter() {
            if let Field::Pad(n) = *f {
                buf.resize(buf.len() + n, 0);
                continue;
            }
            let v = item(i)?;
            if let Err(e) = self.pack_one(*f, &v, buf) {
                return Err(self.field_error(v.py(), i, *f, e));
            }
            i += 1;
        }
        Ok(())
    }

    #[inline]
    fn pack_one(&self, f: Field, v: &Bound<'_, PyAny>, buf: &mut Vec<u8>) -> PyResult<()> {
        macro_rules! put {
            ($t:ty) => {{
                let x: $t = v.extract()?;
                if self.big {
                    buf.extend_from_slice(&x.to_be_bytes())
                } else {
                    buf.extend_from_slice(&x.to_le_bytes())
                }
            }};
        }
        match f {
            Field::Pad(n) => buf.resize(buf.len() + n, 0),
            Field::Bytes(n) => {
                let at = buf.len();
                if let Ok(b) = v.cast::<PyBytes>() {
                    let b = b.as_bytes();
                    buf.extend_from_slice(&b[..b.len().min(n)]);
                } else if let Ok(b) = v.cast::<PyByteArray>() {
                    let b = b.to_vec();
                    buf.extend_from_slice(&b[..b.len().min(n)]);
                } else {
                    return Err(PyTypeError::new_err(format!(
                        "needs bytes, not {}",
                        v.get_type().name()?
                    )));
                }
                buf.resize(at + n, 0);
            }
            Field::Bool => buf.push(u8::from(v.is_truthy()?)),
            Field::I8 => put!(i8),
            Field::U8 => put!(u8),
            Field::I16 => put!(i16),
            Field::U16 => put!(u16),
            Field::I32 => put!(i32),
            Field::U32 => put!(u32),
            Field::I64 => put!(i64),
            Field::U64 => put!(u64),
            Field::F32 => put!(f32),
            Field::F64 => put!(f64),
        }
        Ok(())
    }

    /// `e` (from packing value `i`, of field `f`) said with the field and the format, as the
    /// same kind of exception.
    #[cold]
    fn field_error(&self, py: Python<'_>, i: usize, f: Field, e: PyErr) -> PyErr {
        let code = match f {
            Field::Pad(_) => "x".to_owned(),
            Field::Bool => "?".into(),
            Field::I8 => "b".into(),
            Field::U8 => "B".into(),
            Field::I16 => "h".into(),
            Field::U16 => "H".into(),
            Field::I32 => "i".into(),
            Field::U32 => "I".into(),
            Field::I64 => "q".into(),
            Field::U64 => "Q".into(),
            Field::F32 => "f".into(),
            Field::F64 => "d".into(),
            Field::Bytes(n) => format!("{n}s"),
        };
        let msg = format!(
            "struct format '{}', value {i} ('{code}'): {}",
            &*self.text,
            e.value(py)
        );
        PyErr::from_type(e.get_type(py), msg)
    }
}

/// What [`Value::make`] did.
enum Made {
    /// The object in the slot was given the new value in place (nothing else holds it).
    Refilled,
    /// A new reference for the slot (NULL with an exception set on a failure).
    New(*mut ffi::PyObject),
}

/// One value of a tuple being filled: slot `slot` of `t`, which is a new tuple (`fresh`) or
/// the last record's, nothing but the decoder holding it.
///
/// In a reused tuple, a float, an int or a bytes object in the slot that the tuple alone holds
/// (reference count 1: no step, state or sink kept it) is given the new value in place rather
/// than freed and made again (nobody can see the change): floats always, bytes of the same
/// length (the hash they cache is forgotten), ints that are not the interpreter's shared small
/// ones (values past 256) with as many digits as the new value needs (positive values below
/// 2^60, one or two of CPython's 30-bit digits), on an interpreter whose layout of ints was
/// recognised ([`int_layout`]); and an int that has the new value already stays as it is.
#[derive(Clone, Copy)]
struct Value {
    t: *mut ffi::PyObject,
    slot: ffi::Py_ssize_t,
    fresh: bool,
}

impl Value {
    /// The value of `field` at `at` in `rec` (`BIG`: big-endian numbers).
    ///
    /// # Safety
    /// `at + width(field)` <= `rec.len()`; the tuple has the slot, set unless `fresh`.
    #[inline(always)]
    unsafe fn make<const BIG: bool>(
        self,
        py: Python<'_>,
        rec: &[u8],
        at: usize,
        field: Field,
        ints: IntLayout,
        cache: Option<&mut Interner>,
    ) -> Made {
        // Used inside the `unsafe` block below: the read is within `rec` (the caller's promise).
        macro_rules! num {
            ($t:ty) => {{
                let b = rec
                    .as_ptr()
                    .add(at)
                    .cast::<[u8; std::mem::size_of::<$t>()]>()
                    .read_unaligned();
                if BIG {
                    <$t>::from_be_bytes(b)
                } else {
                    <$t>::from_le_bytes(b)
                }
            }};
        }
        // SAFETY: the caller's promises; each arm gives a new reference or refills in place.
        unsafe {
            match field {
                // Never: `vals` holds no padding.
                Field::Pad(_) => Made::New(ffi::Py_NewRef(ffi::Py_None())),
                // In a reused tuple, refilled in place, or else made anew so that the next
                // record can refill it: the cache's slot and object are two likely cache misses
                // a record (about 8% of Market Spread in Python's samples were those two loads,
                // perf). The cache serves new tuples (records that are kept share its objects).
                Field::Bytes(n) => {
                    let b = rec.get_unchecked(at..at + n);
                    if self.refill_bytes(b) {
                        return Made::Refilled;
                    }
                    let cache = if self.fresh { cache } else { None };
                    match cache.and_then(|c| c.get(py, self.slot as usize, b)) {
                        Some(v) => Made::New(v),
                        None => Made::New(ffi::PyBytes_FromStringAndSize(
                            b.as_ptr().cast(),
                            n as ffi::Py_ssize_t,
                        )),
                    }
                }
                Field::Bool => Made::New(ffi::PyBool_FromLong(std::os::raw::c_long::from(
                    *rec.get_unchecked(at) != 0,
                ))),
                Field::I8 => self.int(num!(i8).into(), ints),
                Field::U8 => self.int(num!(u8).into(), ints),
                Field::I16 => self.int(num!(i16).into(), ints),
                Field::U16 => self.int(num!(u16).into(), ints),
                Field::I32 => self.int(num!(i32).into(), ints),
                Field::U32 => self.int(num!(u32).into(), ints),
                Field::I64 => self.int(num!(i64), ints),
                Field::U64 => {
                    let x = num!(u64);
                    match i64::try_from(x) {
                        Ok(x) => self.int(x, ints),
                        Err(_) => Made::New(ffi::PyLong_FromUnsignedLongLong(x)),
                    }
                }
                Field::F32 => self.float(f64::from(num!(f32))),
                Field::F64 => self.float(num!(f64)),
            }
        }
    }

    /// The object in the slot, if it may be refilled: the tuple is not new, and the object
    /// is of type `ty` and held by the tuple alone.
    ///
    /// # Safety
    /// As for [`Value::make`].
    #[inline(always)]
    unsafe fn refillable(self, ty: *mut ffi::PyTypeObject) -> Option<*mut ffi::PyObject> {
        if self.fresh {
            return None;
        }
        // SAFETY: the slot is set (not fresh).
        unsafe {
            let old = ffi::PyTuple_GET_ITEM(self.t, self.slot);
            (ffi::Py_TYPE(old) == ty && ffi::Py_REFCNT(old) == 1).then_some(old)
        }
    }

    /// # Safety
    /// As for [`Value::make`].
    #[inline(always)]
    unsafe fn float(self, x: f64) -> Made {
        // SAFETY: a float the tuple alone holds; nobody sees its value change.
        unsafe {
            match self.refillable(std::ptr::addr_of_mut!(ffi::PyFloat_Type)) {
                Some(old) => {
                    (*old.cast::<ffi::PyFloatObject>()).ob_fval = x;
                    Made::Refilled
                }
                None => Made::New(ffi::PyFloat_FromDouble(x)),
            }
        }
    }

    /// # Safety
    /// As for [`Value::make`].
    #[inline(always)]
    unsafe fn refill_bytes(self, b: &[u8]) -> bool {
        // SAFETY: bytes the tuple alone holds, of `b.len()` bytes of value.
        unsafe {
            match self.refillable(std::ptr::addr_of_mut!(ffi::PyBytes_Type)) {
                Some(old) if ffi::Py_SIZE(old) == b.len() as ffi::Py_ssize_t => {
                    let o = old.cast::<ffi::PyBytesObject>();
                    let to = std::ptr::addr_of_mut!((*o).ob_sval).cast::<u8>();
                    let n = b.len();
                    if (4..=8).contains(&n) {
                        // Two words that overlap, no call to `memcpy`.
                        let lo = b.as_ptr().cast::<u32>().read_unaligned();
                        let hi = b.as_ptr().add(n - 4).cast::<u32>().read_unaligned();
                        to.cast::<u32>().write_unaligned(lo);
                        to.add(n - 4).cast::<u32>().write_unaligned(hi);
                    } else {
                        std::ptr::copy_nonoverlapping(b.as_ptr(), to, n);
                    }
                    #[allow(deprecated)]
                    {
                        (*o).ob_shash = -1;
                    }
                    true
                }
                _ => false,
            }
        }
    }

    /// # Safety
    /// As for [`Value::make`].
    #[inline(always)]
    unsafe fn int(self, x: i64, layout: IntLayout) -> Made {
        // SAFETY: an int in the slot, read in the layout `int_layout` recognised: kept as it
        // is when it has the value already (ints are immutable: an equal one serves), or
        // refilled when the tuple alone holds it and it has the digits the value needs.
        unsafe {
            if layout != IntLayout::Unknown && !self.fresh && x > 0 && x < 1 << 60 {
                let old = ffi::PyTuple_GET_ITEM(self.t, self.slot);
                if ffi::Py_TYPE(old) == std::ptr::addr_of_mut!(ffi::PyLong_Type) {
                    let n: usize = if x < 1 << 30 { 1 } else { 2 };
                    let word = old.cast::<u8>().add(std::mem::size_of::<ffi::PyObject>());
                    if word.cast::<isize>().read() == layout.size_word(n) {
                        let digits = word.add(std::mem::size_of::<isize>()).cast::<u32>();
                        let (lo, hi) = ((x & DIGIT_MASK) as u32, (x >> 30) as u32);
                        if digits.read() == lo && (n == 1 || digits.add(1).read() == hi) {
                            return Made::Refilled;
                        }
                        // Not one of the interpreter's shared small ints (-5 to 256).
                        if x > 256 && ffi::Py_REFCNT(old) == 1 {
                            digits.write(lo);
                            if n == 2 {
                                digits.add(1).write(hi);
                            }
                            return Made::Refilled;
                        }
                    }
                }
            }
            Made::New(ffi::PyLong_FromLongLong(x))
        }
    }

    /// Puts the new reference `v` in the slot, releasing what a reused tuple held there (one
    /// of ours: an int, float, bool or bytes, whose release runs no Python code).
    ///
    /// # Safety
    /// As for [`Value::make`]; `v` is a new reference, not NULL.
    #[inline(always)]
    unsafe fn set(self, v: *mut ffi::PyObject) {
        // SAFETY: the tuple takes `v`; the old value (set unless fresh) is released after.
        unsafe {
            if self.fresh {
                ffi::PyTuple_SET_ITEM(self.t, self.slot, v);
            } else {
                let old = ffi::PyTuple_GET_ITEM(self.t, self.slot);
                ffi::PyTuple_SET_ITEM(self.t, self.slot, v);
                ffi::Py_DECREF(old);
            }
        }
    }
}

const DIGIT_MASK: i64 = (1 << 30) - 1;

/// Where an int keeps its number of digits: the word after the object's header, as its size
/// (CPython up to 3.11: the count, negative for a negative value) or as a tag (3.12 on: the
/// count shifted left by 3, the sign in the low bits, 0 for a positive value).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum IntLayout {
    Unknown,
    Size,
    Tag,
}

impl IntLayout {
    /// The size word of a positive int of `n` digits.
    fn size_word(self, n: usize) -> isize {
        match self {
            IntLayout::Size => n as isize,
            IntLayout::Tag => (n as isize) << 3,
            IntLayout::Unknown => -1,
        }
    }
}

/// This interpreter's layout of ints, probed once: two ints made by the interpreter (one and
/// two 30-bit digits) must show their digit counts and digits where the layout says. Any other
/// layout (15-bit digits, a new one) is `Unknown`, and ints are then always made anew.
#[inline]
fn int_layout() -> IntLayout {
    match INT_LAYOUT.load(Ordering::Relaxed) {
        1 => IntLayout::Unknown,
        2 => IntLayout::Size,
        3 => IntLayout::Tag,
        _ => probe_int_layout(),
    }
}

static INT_LAYOUT: AtomicU8 = AtomicU8::new(0);

#[cold]
fn probe_int_layout() -> IntLayout {
    let probe = |layout: IntLayout| {
        [(1i64 << 20) + 7, (5i64 << 30) + 9]
            .iter()
            .enumerate()
            .all(|(i, &x)| {
                // SAFETY: an int made here and released below; its first words are read only
                // (its header, then at least one more word and a digit, whatever the layout).
                unsafe {
                    let o = ffi::PyLong_FromLongLong(x);
                    if o.is_null() {
                        ffi::PyErr_Clear();
                        return false;
                    }
                    let word = o.cast::<u8>().add(std::mem::size_of::<ffi::PyObject>());
                    let n = i + 1;
                    let ok = word.cast::<isize>().read() == layout.size_word(n) && {
                        let d = word.add(std::mem::size_of::<isize>()).cast::<u32>();
                        d.read() == (x & DIGIT_MASK) as u32
                            && (n == 1 || d.add(1).read() == (x >> 30) as u32)
                    };
                    ffi::Py_DECREF(o);
                    ok
                }
            })
    };
    let found = [IntLayout::Size, IntLayout::Tag]
        .into_iter()
        .find(|&l| probe(l))
        .unwrap_or(IntLayout::Unknown);
    let code = match found {
        IntLayout::Unknown => 1,
        IntLayout::Size => 2,
        IntLayout::Tag => 3,
    };
    INT_LAYOUT.store(code, Ordering::Relaxed);
    found
}

/// Short bytes fields (at most 7 bytes: symbols, codes) whose values repeat, handed out from
/// the objects already made (bytes are immutable: an equal object serves as well as a new one),
/// a small direct-mapped cache per field, for records decoded into new tuples. A field whose
/// values seldom repeat (an order id) turns its cache off after 4,096 lookups. One per worker
/// (a decoder's clone starts empty).
///
/// It also keeps the last record's tuple: when the next record is decoded and nothing else
/// holds that tuple any more (the steps and the user's functions are done with it and kept
/// no reference), it is refilled instead of freed and made again, as CPython's `zip` and
/// `enumerate` reuse their result tuples; the floats, ints and bytes in it that nothing else
/// holds get their new values in place too ([`Value`]). A tuple someone kept is left alone.
#[derive(Default)]
pub(crate) struct Interner {
    fields: Vec<FieldCache>,
    spare: Option<Obj>,
}

struct FieldCache {
    slots: Vec<Option<(u64, Obj)>>,
    looks: u32,
    hits: u32,
    on: bool,
}

impl Clone for Interner {
    fn clone(&self) -> Self {
        Interner::default()
    }
}

/// Slots per cached field (a power of two): with a thousand distinct values (a market's
/// symbols) a direct-mapped cache of 1,024 slots hit 58% of lookups and failed its trial;
/// 4,096 hit 97% (64 KiB per field and worker).
const CACHE_BITS: u32 = 12;
const CACHE_SLOTS: usize = 1 << CACHE_BITS;
const CACHE_TRIAL: u32 = 4096;

impl Interner {
    /// The last record's tuple of `values` values, when nothing else holds it.
    #[inline]
    fn spare<'py>(&self, py: Python<'py>, values: usize) -> Option<Bound<'py, PyAny>> {
        let t = self.spare.as_ref()?.bind(py);
        // SAFETY: `t` is a live tuple (only tuples are kept); reading its counts is safe.
        let free = unsafe {
            ffi::Py_REFCNT(t.as_ptr()) == 1
                && ffi::PyTuple_GET_SIZE(t.as_ptr()) == values as ffi::Py_ssize_t
        };
        free.then(|| t.clone())
    }

    /// A new reference to a bytes object equal to `b` from value `slot`'s cache (made and
    /// kept there on a miss); None when the field is not cached.
    #[inline(always)]
    fn get(&mut self, py: Python<'_>, slot: usize, b: &[u8]) -> Option<*mut ffi::PyObject> {
        if b.len() > 7 {
            return None;
        }
        if self.fields.len() <= slot {
            self.fields.resize_with(slot + 1, || FieldCache {
                slots: Vec::new(),
                looks: 0,
                hits: 0,
                on: true,
            });
        }
        let f = &mut self.fields[slot];
        if !f.on {
            return None;
        }
        let key = le_word(b) | (b.len() as u64) << 56;
        let at = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE_BITS)) as usize;
        if f.looks < CACHE_TRIAL {
            return f.trial(py, at, key, b);
        }
        match f.slots.get(at) {
            Some(Some((k, v))) if *k == key => {
                // SAFETY: a live object of the cache's; the new reference is the caller's.
                Some(unsafe { ffi::Py_NewRef(v.as_ptr()) })
            }
            _ => Some(f.fill(py, at, key, b)),
        }
    }
}

impl FieldCache {
    /// A lookup while the cache is on trial: counted, and the cache turned off (None) after
    /// `CACHE_TRIAL` lookups of which fewer than half hit.
    #[cold]
    #[inline(never)]
    fn trial(
        &mut self,
        py: Python<'_>,
        at: usize,
        key: u64,
        b: &[u8],
    ) -> Option<*mut ffi::PyObject> {
        if self.slots.is_empty() {
            self.slots.resize_with(CACHE_SLOTS, || None);
        }
        self.looks += 1;
        if self.looks == CACHE_TRIAL && self.hits < CACHE_TRIAL / 2 {
            self.on = false;
            self.slots = Vec::new();
            return None;
        }
        if let Some((k, v)) = &self.slots[at] {
            if *k == key {
                self.hits += 1;
                return Some(v.clone_ref(py).into_ptr());
            }
        }
        Some(self.fill(py, at, key, b))
    }

    /// A miss: a new bytes object of `b`, kept in slot `at` (the one there released).
    #[cold]
    #[inline(never)]
    fn fill(&mut self, py: Python<'_>, at: usize, key: u64, b: &[u8]) -> *mut ffi::PyObject {
        let v = PyBytes::new(py, b).into_any().unbind();
        let ptr = v.clone_ref(py).into_ptr();
        self.slots[at] = Some((key, v));
        ptr
    }
}

/// A field a key is read from in place ([`Format::key_field`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyField {
    at: usize,
    field: Field,
    big: bool,
}

impl KeyField {
    /// Whether [`KeyField::key`] gives a key for every record of the format's size (a bytes
    /// or an integer field that fits an `i64`; not a bool, whose value `Key::of` refuses).
    pub(crate) fn infallible(&self) -> bool {
        !matches!(
            self.field,
            Field::U64 | Field::Bool | Field::Pad(_) | Field::F32 | Field::F64
        )
    }

    /// The key of a record of the format's size: the same [`Key`] as `Key::of` gives for the
    /// value `unpack` makes (bytes as they are, integers as `i64`; an unsigned value past
    /// `i64::MAX` is no key).
    #[inline]
    pub(crate) fn key(&self, rec: &[u8]) -> Result<Key, String> {
        if let Field::Bytes(n) = self.field {
            if let Some(b) = rec.get(self.at..self.at + n) {
                if n <= SMALL {
                    return Ok(Key::SmallBytes(Small::new(b)));
                }
            }
        }
        self.other_key(rec)
    }

    fn other_key(&self, rec: &[u8]) -> Result<Key, String> {
        let n = width(self.field);
        let b = rec
            .get(self.at..self.at + n)
            .ok_or_else(|| format!("a record of {} bytes", rec.len()))?;
        let mut w = [0u8; 8];
        let int = |w: &mut [u8; 8], signed: bool| -> i128 {
            // Sign- or zero-extended to 8 bytes, in the format's order.
            let fill = if signed && (if self.big { b[0] } else { b[n - 1] }) & 0x80 != 0 {
                0xff
            } else {
                0
            };
            w.fill(fill);
            if self.big {
                w[8 - n..].copy_from_slice(b);
                if signed {
                    i64::from_be_bytes(*w) as i128
                } else {
                    u64::from_be_bytes(*w) as i128
                }
            } else {
                w[..n].copy_from_slice(b);
                if signed {
                    i64::from_le_bytes(*w) as i128
                } else {
                    u64::from_le_bytes(*w) as i128
                }
            }
        };
        let v = match self.field {
            Field::Bytes(_) => {
                return Ok(if n <= SMALL {
                    Key::SmallBytes(Small::new(b))
                } else {
                    Key::Bytes(b.into())
                })
            }
            Field::Bool => i128::from(b[0] != 0),
            Field::I8 | Field::I16 | Field::I32 | Field::I64 => int(&mut w, true),
            Field::U8 | Field::U16 | Field::U32 | Field::U64 => int(&mut w, false),
            Field::Pad(_) | Field::F32 | Field::F64 => return Err("not a key field".into()),
        };
        i64::try_from(v)
            .map(Key::Int)
            .map_err(|_| format!("a key of {v} (past a 64-bit integer)"))
    }
}

fn width(f: Field) -> usize {
    match f {
        Field::Pad(n) | Field::Bytes(n) => n,
        Field::Bool | Field::I8 | Field::U8 => 1,
        Field::I16 | Field::U16 => 2,
        Field::I32 | Field::U32 | Field::F32 => 4,
        Field::I64 | Field::U64 | Field::F64 => 8,
    }
}

/// Calls `f` with the bytes of a bytes-like value or a str (UTF-8).
fn with_bytes<R>(v: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(f(s.to_str()?.as_bytes()));
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(f(&b.to_vec()));
    }
    Err(PyTypeError::new_err(format!(
        "expected bytes or str, got {}",
        v.get_type().name()?
    )))
}

/// How a record's bytes become a Python value.
pub(crate) enum Decoder {
    Raw,
    Str,
    Json(Obj),
    Struct(Format),
    Py(Obj),
    /// The items of a list (`canter.pipeline.iterable`): each record is an item's index (8
    /// bytes, little-endian).
    Items(Obj),
}

impl Clone for Decoder {
    fn clone(&self) -> Self {
        Python::attach(|py| match self {
            Decoder::Raw => Decoder::Raw,
            Decoder::Str => Decoder::Str,
            Decoder::Json(f) => Decoder::Json(f.clone_ref(py)),
            Decoder::Struct(f) => Decoder::Struct(f.clone()),
            Decoder::Py(f) => Decoder::Py(f.clone_ref(py)),
            Decoder::Items(l) => Decoder::Items(l.clone_ref(py)),
        })
    }
}

impl Decoder {
    /// Decodes `rec`, short bytes fields of a `struct` format from `cache`.
    #[inline]
    pub(crate) fn decode_cached(
        &self,
        py: Python<'_>,
        rec: &[u8],
        cache: &mut Interner,
    ) -> PyResult<Obj> {
        match self {
            Decoder::Struct(f) => Ok(f.unpack(py, rec, Some(cache))?.unbind()),
            other => other.decode(py, rec),
        }
    }

    /// From `("raw",)`, `("str",)`, `("json",)`, `("struct", fmt)` or `("py", fn)`.
    pub(crate) fn from_spec(py: Python<'_>, spec: &Bound<'_, PyAny>) -> PyResult<Decoder> {
        let kind: String = spec.get_item(0)?.extract()?;
        Ok(match kind.as_str() {
            "raw" => Decoder::Raw,
            "str" => Decoder::Str,
            "json" => Decoder::Json(py.import("json")?.getattr("loads")?.unbind()),
            "struct" => Decoder::Struct(Format::parse(&spec.get_item(1)?.extract::<String>()?)?),
            "py" => Decoder::Py(spec.get_item(1)?.unbind()),
            "items" => Decoder::Items(spec.get_item(1)?.cast_into::<PyList>()?.into_any().unbind()),
            other => return Err(PyValueError::new_err(format!("unknown decoder {other:?}"))),
        })
    }

    #[inline]
    pub(crate) fn decode(&self, py: Python<'_>, rec: &[u8]) -> PyResult<Obj> {
        Ok(match self {
            Decoder::Raw => PyBytes::new(py, rec).into_any().unbind(),
            Decoder::Str => {
                let s = std::str::from_utf8(rec)
                    .map_err(|e| PyValueError::new_err(format!("not UTF-8: {e}")))?;
                PyString::new(py, s).into_any().unbind()
            }
            Decoder::Json(loads) => loads.bind(py).call1((PyBytes::new(py, rec),))?.unbind(),
            Decoder::Struct(f) => f.unpack(py, rec, None)?.unbind(),
            Decoder::Py(f) => f.bind(py).call1((PyBytes::new(py, rec),))?.unbind(),
            Decoder::Items(list) => {
                let i = <[u8; 8]>::try_from(rec)
                    .map(u64::from_le_bytes)
                    .map_err(|_| PyValueError::new_err("not an item's index"))?;
                list.bind(py).get_item(i as usize)?.unbind()
            }
        })
    }
}

/// How a Python value becomes a record's bytes.
pub(crate) enum Encoder {
    Raw,
    Json(Obj),
    Struct(Format),
    Py(Obj),
}

impl Clone for Encoder {
    fn clone(&self) -> Self {
        Python::attach(|py| match self {
            Encoder::Raw => Encoder::Raw,
            Encoder::Json(f) => Encoder::Json(f.clone_ref(py)),
            Encoder::Struct(f) => Encoder::Struct(f.clone()),
            Encoder::Py(f) => Encoder::Py(f.clone_ref(py)),
        })
    }
}

impl Encoder {
    /// From `("raw",)`, `("json",)`, `("struct", fmt)` or `("py", fn)`.
    pub(crate) fn from_spec(py: Python<'_>, spec: &Bound<'_, PyAny>) -> PyResult<Encoder> {
        let kind: String = spec.get_item(0)?.extract()?;
        Ok(match kind.as_str() {
            // Bytes as they are, a str as its UTF-8.
            "raw" | "str" => Encoder::Raw,
            "json" => {
                let json = py.import("json")?;
                let dumps = json
                    .getattr("JSONEncoder")?
                    .call((), Some(&[("separators", (",", ":"))].into_py_dict(py)?))?;
                Encoder::Json(dumps.getattr("encode")?.unbind())
            }
            "struct" => Encoder::Struct(Format::parse(&spec.get_item(1)?.extract::<String>()?)?),
            "py" => Encoder::Py(spec.get_item(1)?.unbind()),
            other => return Err(PyValueError::new_err(format!("unknown encoder {other:?}"))),
        })
    }

    #[inline]
    pub(crate) fn encode(
        &self,
        py: Python<'_>,
        v: &Bound<'_, PyAny>,
        buf: &mut Vec<u8>,
    ) -> PyResult<()> {
        match self {
            Encoder::Raw => raw(v, buf)?,
            Encoder::Json(encode) => {
                let s = encode.bind(py).call1((v,))?;
                buf.extend_from_slice(s.cast::<PyString>()?.to_str()?.as_bytes());
            }
            Encoder::Struct(f) => f.pack(v, buf)?,
            Encoder::Py(f) => raw(&f.bind(py).call1((v,))?, buf)?,
        }
        Ok(())
    }
}

/// Appends a bytes-like value, or a str's UTF-8.
fn raw(v: &Bound<'_, PyAny>, buf: &mut Vec<u8>) -> PyResult<()> {
    with_bytes(v, |b| buf.extend_from_slice(b))
}
