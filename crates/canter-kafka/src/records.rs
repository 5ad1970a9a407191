//! Kafka's record batches (magic 2, the only format Kafka 4 accepts): read in place from a
//! fetch response's bytes, written into a producer's buffer.
//!
//! A batch is a 61-byte header (base offset, length, leader epoch, magic, CRC-32C, attributes,
//! last offset delta, timestamps, producer id, epoch and sequence, record count) and its
//! records, compressed together or not. A record is varint-framed: attributes, timestamp and
//! offset deltas, key, value, headers. Reading an uncompressed batch copies nothing: keys and
//! values are slices of the fetched bytes.

use crate::error::Error;

/// Bytes of a batch header, from the base offset to the record count.
pub const BATCH_HEADER: usize = 61;
/// Where a batch's CRC-32C starts covering (the attributes).
const CRC_FROM: usize = 21;
const MAGIC: i8 = 2;
const ATTR_COMPRESSION: i16 = 0x07;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
/// The most a compressed batch may grow to when inflated: a bomb stops here.
pub const MAX_INFLATED: usize = 64 << 20;

/// How a batch's records are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Not compressed.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// Snappy: read framed as Java's producer writes it (xerial's `\x82SNAPPY` blocks) or raw,
    /// as librdkafka writes it; written raw (which every client reads).
    Snappy,
    /// LZ4's frame format.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Compression {
    fn from_attributes(attributes: i16) -> Result<Compression, Error> {
        Ok(match attributes & ATTR_COMPRESSION {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => return Err(Error::Corrupt(format!("compression type {other}"))),
        })
    }

    fn bits(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            "snappy" => Ok(Compression::Snappy),
            other => Err(format!(
                "unknown compression {other:?} (none, gzip, lz4, zstd)"
            )),
        }
    }
}

/// One batch's header, read in place.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The first record's offset.
    pub base_offset: i64,
    /// The offset just past the batch's last record (what a consumer fetches next).
    pub next_offset: i64,
    /// The batch's first timestamp (ms).
    pub base_timestamp: i64,
    /// The producer that wrote it (-1: none).
    pub producer_id: i64,
    /// Written inside a transaction.
    pub transactional: bool,
    /// A transaction marker (commit or abort), not data.
    pub control: bool,
    /// How the records are compressed.
    pub compression: Compression,
    /// How many records the header says.
    pub count: u32,
    body: &'a [u8],
}

impl<'a> Batch<'a> {
    /// The batch's records. An uncompressed batch is read in place; a compressed one is
    /// inflated into `scratch` (cleared first) and read from there.
    pub fn records<'s>(&self, scratch: &'s mut Vec<u8>) -> Result<Records<'s>, Error>
    where
        'a: 's,
    {
        let body: &'s [u8] = match self.compression {
            Compression::None => self.body,
            other => {
                scratch.clear();
                inflate(other, self.body, scratch)?;
                scratch
            }
        };
        Ok(Records {
            rest: body,
            left: self.count,
            base_offset: self.base_offset,
            base_timestamp: self.base_timestamp,
        })
    }
}

impl Batch<'_> {
    /// Inflates a compressed batch's records into `out` (appended); read them with
    /// [`Batch::records_in`]. Keeps the inflated bytes for as long as the caller wants.
    pub fn inflate(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        inflate(self.compression, self.body, out)
    }

    /// The records of this batch in `inflated` (what [`Batch::inflate`] wrote; the batch's own
    /// bytes if it is not compressed).
    pub fn records_in<'s>(&self, inflated: &'s [u8]) -> Records<'s> {
        Records {
            rest: inflated,
            left: self.count,
            base_offset: self.base_offset,
            base_timestamp: self.base_timestamp,
        }
    }
}

/// Walks the batches of a fetch response's record bytes. A batch cut off at the end (the
/// broker sends whole segments up to a byte limit) ends the walk; a batch whose CRC or header
/// is wrong is an error.
pub struct Batches<'a> {
    rest: &'a [u8],
    check_crc: bool,
}

impl<'a> Batches<'a> {
    /// Batches of `bytes`, CRCs checked.
    pub fn new(bytes: &'a [u8]) -> Batches<'a> {
        Batches {
            rest: bytes,
            check_crc: true,
        }
    }
}

impl<'a> Iterator for Batches<'a> {
    type Item = Result<Batch<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 12 {
            return None;
        }
        let len = be_i32(&self.rest[8..12]);
        if len < (BATCH_HEADER - 12) as i32 {
            self.rest = &[];
            return Some(Err(Error::Corrupt(format!("batch length {len}"))));
        }
        let total = 12 + len as usize;
        if self.rest.len() < total {
            return None;
        }
        let (b, rest) = self.rest.split_at(total);
        self.rest = rest;
        Some(read_batch(b, self.check_crc))
    }
}

fn read_batch(b: &[u8], check_crc: bool) -> Result<Batch<'_>, Error> {
    let magic = b[16] as i8;
    if magic != MAGIC {
        return Err(Error::Corrupt(format!("record batch magic {magic}")));
    }
    let crc = u32::from_be_bytes([b[17], b[18], b[19], b[20]]);
    if check_crc && crc32c::crc32c(&b[CRC_FROM..]) != crc {
        return Err(Error::Corrupt("record batch CRC mismatch".into()));
    }
    let attributes = i16::from_be_bytes([b[21], b[22]]);
    let base_offset = be_i64(&b[0..8]);
    let last_delta = be_i32(&b[23..27]);
    let count = be_i32(&b[57..61]);
    if count < 0 {
        return Err(Error::Corrupt(format!("record count {count}")));
    }
    Ok(Batch {
        base_offset,
        next_offset: base_offset + i64::from(last_delta) + 1,
        base_timestamp: be_i64(&b[27..35]),
        producer_id: be_i64(&b[43..51]),
        transactional: attributes & ATTR_TRANSACTIONAL != 0,
        control: attributes & ATTR_CONTROL != 0,
        compression: Compression::from_attributes(attributes)?,
        count: count as u32,
        body: &b[BATCH_HEADER..],
    })
}

/// One record, its key and value borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp (ms).
    pub timestamp: i64,
    /// Its key (`None`: null).
    pub key: Option<&'a [u8]>,
    /// Its value (`None`: null, a tombstone).
    pub value: Option<&'a [u8]>,
}

/// The records of one batch.
pub struct Records<'a> {
    rest: &'a [u8],
    left: u32,
    base_offset: i64,
    base_timestamp: i64,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.read() {
            Ok(r) => Some(Ok(r)),
            Err(e) => {
                self.left = 0;
                Some(Err(e))
            }
        }
    }
}

impl<'a> Records<'a> {
    fn read(&mut self) -> Result<Record<'a>, Error> {
        let mut c = Cursor(self.rest);
        let len = c.varint()?;
        if len < 0 || len as usize > c.0.len() {
            return Err(Error::Corrupt(format!("record length {len}")));
        }
        let (rec, after) = c.0.split_at(len as usize);
        self.rest = after;
        let mut c = Cursor(rec);
        c.take(1)?; // attributes: unused
        let ts = c.varlong()?;
        let od = c.varint()?;
        let key = c.bytes()?;
        let value = c.bytes()?;
        // Headers are not read: the pipelines don't use them.
        Ok(Record {
            offset: self.base_offset + i64::from(od),
            timestamp: self.base_timestamp + ts,
            key,
            value,
        })
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(Error::Corrupt("record cut short".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn varlong(&mut self) -> Result<i64, Error> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let Some((&b, rest)) = self.0.split_first() else {
                return Err(Error::Corrupt("varint cut short".into()));
            };
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(Error::Corrupt("varint too long".into()))
    }

    fn varint(&mut self) -> Result<i32, Error> {
        let v = self.varlong()?;
        i32::try_from(v).map_err(|_| Error::Corrupt("varint out of range".into()))
    }

    fn bytes(&mut self) -> Result<Option<&'a [u8]>, Error> {
        let n = self.varint()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_be_bytes(a)
}

fn inflate(c: Compression, body: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    use std::io::Read;
    let limit = MAX_INFLATED as u64 + 1;
    let r = match c {
        Compression::None => {
            out.extend_from_slice(body);
            Ok(0)
        }
        Compression::Gzip => flate2::read::GzDecoder::new(body)
            .take(limit)
            .read_to_end(out),
        Compression::Lz4 => lz4_flex::frame::FrameDecoder::new(body)
            .take(limit)
            .read_to_end(out),
        Compression::Zstd => match zstd::stream::read::Decoder::new(body) {
            Ok(d) => d.take(limit).read_to_end(out),
            Err(e) => Err(e),
        },
        Compression::Snappy => {
            return unsnappy(body, out).map_err(|e| Error::Corrupt(format!("snappy batch: {e}")))
        }
    };
    r.map_err(|e| Error::Corrupt(format!("{c:?} batch: {e}")))?;
    if out.len() > MAX_INFLATED {
        return Err(Error::Corrupt(format!(
            "{c:?} batch inflates past {MAX_INFLATED} bytes"
        )));
    }
    Ok(())
}

fn deflate(c: Compression, raw: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Corrupt(format!("{c:?} compression: {e}"));
    match c {
        Compression::None => out.extend_from_slice(raw),
        Compression::Gzip => {
            let mut w = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
            w.write_all(raw).map_err(io)?;
            w.finish().map_err(io)?;
        }
        Compression::Lz4 => {
            let mut w = lz4_flex::frame::FrameEncoder::new(out);
            w.write_all(raw).map_err(io)?;
            w.finish()
                .map_err(|e| Error::Corrupt(format!("lz4 compression: {e}")))?;
        }
        Compression::Zstd => {
            let z = zstd::bulk::compress(raw, 1).map_err(io)?;
            out.extend_from_slice(&z);
        }
        Compression::Snappy => {
            let z = snap::raw::Encoder::new()
                .compress_vec(raw)
                .map_err(|e| Error::Corrupt(format!("snappy compression: {e}")))?;
            out.extend_from_slice(&z);
        }
    }
    Ok(())
}

/// The magic of xerial's snappy framing (Java's `SnappyOutputStream`), then a version and a
/// compatible version, 4 bytes each.
const XERIAL: &[u8] = b"\x82SNAPPY\x00";

/// Inflates a snappy batch body, framed or raw, into `out`, at most [`MAX_INFLATED`] bytes.
fn unsnappy(body: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), String> {
        let n = snap::raw::decompress_len(block).map_err(|e| e.to_string())?;
        if out.len() + n > MAX_INFLATED {
            return Err(format!("inflates past {MAX_INFLATED} bytes"));
        }
        let start = out.len();
        out.resize(start + n, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| e.to_string())?;
        Ok(())
    };
    let Some(mut rest) = body.strip_prefix(XERIAL) else {
        return raw(body, out);
    };
    rest = rest.get(8..).ok_or("a truncated xerial header")?;
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("a truncated block length")?;
        let block = rest.get(4..4 + len).ok_or("a truncated block")?;
        raw(block, out)?;
        rest = &rest[4 + len..];
    }
    Ok(())
}

/// Writes one batch: [`BatchBuilder::push`] records, then [`BatchBuilder::finish`] into a
/// request's buffer. Records are written as they come (varint framing, no intermediate
/// structs); the header is filled in at the end.
#[derive(Debug)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    count: u32,
    base_timestamp: i64,
    max_timestamp: i64,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder::new()
    }
}

impl BatchBuilder {
    /// An empty batch.
    pub fn new() -> BatchBuilder {
        BatchBuilder {
            buf: Vec::new(),
            count: 0,
            base_timestamp: 0,
            max_timestamp: 0,
        }
    }

    /// Records pushed since the last finish.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// No records yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of the records so far (uncompressed).
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// Adds a record with timestamp `ts` (ms).
    pub fn push(&mut self, ts: i64, key: Option<&[u8]>, value: Option<&[u8]>) {
        if self.count == 0 {
            self.base_timestamp = ts;
            self.max_timestamp = ts;
        }
        self.max_timestamp = self.max_timestamp.max(ts);
        let ts_delta = ts - self.base_timestamp;
        let od = i64::from(self.count);
        let klen = key.map_or(-1, |k| k.len() as i64);
        let vlen = value.map_or(-1, |v| v.len() as i64);
        let body = 1
            + varlen(ts_delta)
            + varlen(od)
            + varlen(klen)
            + key.map_or(0, <[u8]>::len)
            + varlen(vlen)
            + value.map_or(0, <[u8]>::len)
            + 1;
        put_var(&mut self.buf, body as i64);
        self.buf.push(0);
        put_var(&mut self.buf, ts_delta);
        put_var(&mut self.buf, od);
        put_var(&mut self.buf, klen);
        if let Some(k) = key {
            self.buf.extend_from_slice(k);
        }
        put_var(&mut self.buf, vlen);
        if let Some(v) = value {
            self.buf.extend_from_slice(v);
        }
        put_var(&mut self.buf, 0); // no headers
        self.count += 1;
    }

    /// Appends the batch to `out` and empties the builder. `sequence` is the first record's
    /// sequence number for an idempotent producer (-1 with producer id -1 otherwise).
    pub fn finish(
        &mut self,
        out: &mut Vec<u8>,
        compression: Compression,
        producer: (i64, i16),
        sequence: i32,
        transactional: bool,
    ) -> Result<(), Error> {
        let start = out.len();
        out.resize(start + BATCH_HEADER, 0);
        deflate(compression, &self.buf, out)?;
        let len = (out.len() - start - 12) as i32;
        let mut attributes = compression.bits();
        if transactional {
            attributes |= ATTR_TRANSACTIONAL;
        }
        let h = &mut out[start..start + BATCH_HEADER];
        h[0..8].copy_from_slice(&0i64.to_be_bytes());
        h[8..12].copy_from_slice(&len.to_be_bytes());
        h[12..16].copy_from_slice(&(-1i32).to_be_bytes());
        h[16] = MAGIC as u8;
        h[21..23].copy_from_slice(&attributes.to_be_bytes());
        h[23..27].copy_from_slice(&(self.count as i32 - 1).to_be_bytes());
        h[27..35].copy_from_slice(&self.base_timestamp.to_be_bytes());
        h[35..43].copy_from_slice(&self.max_timestamp.to_be_bytes());
        h[43..51].copy_from_slice(&producer.0.to_be_bytes());
        h[51..53].copy_from_slice(&producer.1.to_be_bytes());
        h[53..57].copy_from_slice(&sequence.to_be_bytes());
        h[57..61].copy_from_slice(&(self.count as i32).to_be_bytes());
        let crc = crc32c::crc32c(&out[start + CRC_FROM..]);
        out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
        self.buf.clear();
        self.count = 0;
        Ok(())
    }
}

fn varlen(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - (z | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_var(buf: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn roundtrip(c: Compression) {
        let mut b = BatchBuilder::new();
        b.push(1_000, Some(b"k1"), Some(b"v1"));
        b.push(1_005, None, Some(&[7u8; 300]));
        b.push(999, Some(b""), None);
        let mut out = Vec::new();
        b.finish(&mut out, c, (42, 3), 17, false).unwrap();
        assert!(b.is_empty());
        // Two batches back to back and a third cut short: the walk stops before the third.
        let one = out.clone();
        out.extend_from_slice(&one);
        out.extend_from_slice(&one[..one.len() - 1]);
        let batches: Vec<_> = Batches::new(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(batches.len(), 2);
        let mut scratch = Vec::new();
        let recs: Vec<_> = batches[0]
            .records(&mut scratch)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches[0].producer_id, 42);
        assert_eq!(batches[0].next_offset, 3);
        assert_eq!(batches[0].compression, c);
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].key, Some(&b"k1"[..]));
        assert_eq!(recs[0].value, Some(&b"v1"[..]));
        assert_eq!(recs[1].timestamp, 1_005);
        assert_eq!(recs[1].offset, 1);
        assert_eq!(recs[1].value.unwrap().len(), 300);
        assert_eq!(
            recs[2],
            Record {
                offset: 2,
                timestamp: 999,
                key: Some(b""),
                value: None
            }
        );
    }

    #[test]
    fn batches_round_trip_in_every_codec() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            roundtrip(c);
        }
    }

    #[test]
    fn snappy_reads_xerial_framing_and_refuses_a_bomb() {
        let text = b"hello hello hello hello, snappy".repeat(10);
        let block = snap::raw::Encoder::new().compress_vec(&text).unwrap();
        let mut framed = XERIAL.to_vec();
        framed.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        for _ in 0..2 {
            framed.extend_from_slice(&(block.len() as u32).to_be_bytes());
            framed.extend_from_slice(&block);
        }
        let mut out = Vec::new();
        unsnappy(&framed, &mut out).unwrap();
        assert_eq!(out, [text.clone(), text].concat());
        assert!(unsnappy(&framed[..framed.len() - 3], &mut Vec::new()).is_err());
        // A raw block that claims 1 GiB.
        let mut bomb = vec![0x80, 0x80, 0x80, 0x80, 0x04];
        bomb.extend_from_slice(&[0; 8]);
        let e = unsnappy(&bomb, &mut Vec::new()).unwrap_err();
        assert!(e.contains("inflates past"), "{e}");
    }

    #[test]
    fn a_flipped_byte_fails_the_crc() {
        let mut b = BatchBuilder::new();
        b.push(1, None, Some(b"hello"));
        let mut out = Vec::new();
        b.finish(&mut out, Compression::None, (-1, -1), -1, false)
            .unwrap();
        let last = out.len() - 2;
        out[last] ^= 1;
        assert!(matches!(
            Batches::new(&out).next(),
            Some(Err(Error::Corrupt(_)))
        ));
    }

    #[test]
    fn varints_match_kafkas_zigzag() {
        for v in [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            300,
            -300,
            i32::MAX as i64,
            i64::MIN,
            i64::MAX,
        ] {
            let mut buf = Vec::new();
            put_var(&mut buf, v);
            assert_eq!(buf.len(), varlen(v), "{v}");
            assert_eq!(Cursor(&buf).varlong().unwrap(), v);
        }
        // Kafka's examples: 0 → 00, -1 → 01, 1 → 02, -64 → 7f, 64 → 80 01.
        let enc = |v| {
            let mut b = Vec::new();
            put_var(&mut b, v);
            b
        };
        assert_eq!(enc(-1), [1]);
        assert_eq!(enc(1), [2]);
        assert_eq!(enc(64), [0x80, 1]);
    }

    #[test]
    fn a_record_longer_than_its_batch_is_corrupt_not_a_panic() {
        let mut b = BatchBuilder::new();
        b.push(1, None, Some(b"hello"));
        let mut out = Vec::new();
        b.finish(&mut out, Compression::None, (-1, -1), -1, false)
            .unwrap();
        // Say the record is 100 bytes long, then fix the CRC.
        out[BATCH_HEADER] = 200;
        let crc = crc32c::crc32c(&out[CRC_FROM..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        let batch = Batches::new(&out).next().unwrap().unwrap();
        let mut s = Vec::new();
        assert!(matches!(
            batch.records(&mut s).unwrap().next(),
            Some(Err(Error::Corrupt(_)))
        ));
    }
}
