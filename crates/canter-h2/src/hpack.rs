//! HPACK (RFC 7541): the header compression of HTTP/2.
//!
//! [`Decoder`] turns header blocks into fields, keeping the peer's dynamic table, bounded by the
//! table size this side advertised and by a limit on the decoded header list. [`Encoder`] writes
//! fields, indexing the ones worth indexing in its own dynamic table (bounded by the peer's
//! setting) and Huffman-coding literals when that is shorter.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::huffman;

/// The static table (RFC 7541, Appendix A), index 1 first.
pub(crate) const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),                   // 1
    (b":method", b"GET"),                   // 2
    (b":method", b"POST"),                  // 3
    (b":path", b"/"),                       // 4
    (b":path", b"/index.html"),             // 5
    (b":scheme", b"http"),                  // 6
    (b":scheme", b"https"),                 // 7
    (b":status", b"200"),                   // 8
    (b":status", b"204"),                   // 9
    (b":status", b"206"),                   // 10
    (b":status", b"304"),                   // 11
    (b":status", b"400"),                   // 12
    (b":status", b"404"),                   // 13
    (b":status", b"500"),                   // 14
    (b"accept-charset", b""),               // 15
    (b"accept-encoding", b"gzip, deflate"), // 16
    (b"accept-language", b""),              // 17
    (b"accept-ranges", b""),                // 18
    (b"accept", b""),                       // 19
    (b"access-control-allow-origin", b""),  // 20
    (b"age", b""),                          // 21
    (b"allow", b""),                        // 22
    (b"authorization", b""),                // 23
    (b"cache-control", b""),                // 24
    (b"content-disposition", b""),          // 25
    (b"content-encoding", b""),             // 26
    (b"content-language", b""),             // 27
    (b"content-length", b""),               // 28
    (b"content-location", b""),             // 29
    (b"content-range", b""),                // 30
    (b"content-type", b""),                 // 31
    (b"cookie", b""),                       // 32
    (b"date", b""),                         // 33
    (b"etag", b""),                         // 34
    (b"expect", b""),                       // 35
    (b"expires", b""),                      // 36
    (b"from", b""),                         // 37
    (b"host", b""),                         // 38
    (b"if-match", b""),                     // 39
    (b"if-modified-since", b""),            // 40
    (b"if-none-match", b""),                // 41
    (b"if-range", b""),                     // 42
    (b"if-unmodified-since", b""),          // 43
    (b"last-modified", b""),                // 44
    (b"link", b""),                         // 45
    (b"location", b""),                     // 46
    (b"max-forwards", b""),                 // 47
    (b"proxy-authenticate", b""),           // 48
    (b"proxy-authorization", b""),          // 49
    (b"range", b""),                        // 50
    (b"referer", b""),                      // 51
    (b"refresh", b""),                      // 52
    (b"retry-after", b""),                  // 53
    (b"server", b""),                       // 54
    (b"set-cookie", b""),                   // 55
    (b"strict-transport-security", b""),    // 56
    (b"transfer-encoding", b""),            // 57
    (b"user-agent", b""),                   // 58
    (b"vary", b""),                         // 59
    (b"via", b""),                          // 60
    (b"www-authenticate", b""),             // 61
];

/// The index of the first static entry named `name`, or 0.
fn static_name(name: &[u8]) -> usize {
    match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => 0,
    }
}

/// Per-entry overhead counted in a table's size (RFC 7541, Section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Why a header block cannot be decoded: always a connection error (COMPRESSION_ERROR), as the
/// two dynamic tables can no longer agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer does not fit (more than 2^32).
    IntegerOverflow,
    /// An index outside both tables, or index 0.
    BadIndex,
    /// A Huffman string with bad padding or an EOS symbol.
    BadHuffman,
    /// A dynamic table size update above the advertised maximum, or after the first field.
    BadSizeUpdate,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::Truncated => "header block truncated",
            DecodeError::IntegerOverflow => "HPACK integer overflow",
            DecodeError::BadIndex => "HPACK index out of range",
            DecodeError::BadHuffman => "invalid Huffman string",
            DecodeError::BadSizeUpdate => "invalid dynamic table size update",
        })
    }
}

impl std::error::Error for DecodeError {}

/// An entry of a dynamic table: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// A dynamic table: newest entry at the front.
#[derive(Debug, Default)]
struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
    /// Entries ever inserted: the absolute index of the newest is `inserted - 1`.
    inserted: u64,
}

impl Table {
    fn new(max: usize) -> Table {
        Table {
            max,
            ..Table::default()
        }
    }

    fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(index).map(|(n, v)| (&n[..], &v[..]))
    }

    /// Evicts from the back until `size + extra <= max`; calls `evicted` with each evicted
    /// entry's absolute index.
    fn make_room(&mut self, extra: usize, mut evicted: impl FnMut(u64, &[u8], &[u8])) {
        while self.size + extra > self.max {
            let Some((n, v)) = self.entries.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + ENTRY_OVERHEAD;
            let abs = self.inserted - 1 - self.entries.len() as u64;
            evicted(abs, &n, &v);
        }
    }

    /// Inserts an entry; one larger than the table empties it (RFC 7541, Section 4.4).
    fn insert(&mut self, name: &[u8], value: &[u8], evicted: impl FnMut(u64, &[u8], &[u8])) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        self.make_room(size, evicted);
        if size <= self.max {
            self.inserted += 1;
            self.entries.push_front((name.into(), value.into()));
            self.size += size;
        }
    }

    fn set_max(&mut self, max: usize, evicted: impl FnMut(u64, &[u8], &[u8])) {
        self.max = max;
        self.make_room(0, evicted);
    }
}

/// Reads an HPACK integer with an `n`-bit prefix from `buf[*pos..]`.
fn read_int(buf: &[u8], pos: &mut usize, n: u8) -> Result<usize, DecodeError> {
    let mask = (1usize << n) - 1;
    let first = *buf.get(*pos).ok_or(DecodeError::Truncated)? as usize & mask;
    *pos += 1;
    if first < mask {
        return Ok(first);
    }
    let mut value = mask;
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift > 28 {
            return Err(DecodeError::IntegerOverflow);
        }
        value += ((b & 0x7f) as usize) << shift;
        if value > u32::MAX as usize {
            return Err(DecodeError::IntegerOverflow);
        }
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// Writes `value` as an HPACK integer with an `n`-bit prefix, `flags` in the bits above it.
pub(crate) fn write_int(dst: &mut Vec<u8>, flags: u8, n: u8, mut value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        dst.push(flags | value as u8);
        return;
    }
    dst.push(flags | mask as u8);
    value -= mask;
    while value >= 0x80 {
        dst.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    dst.push(value as u8);
}

/// What decoding a header block found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The header list size (RFC 9113, Section 6.5.2: name + value + 32 per field) of the
    /// whole block, counted even past the limit.
    pub list_size: usize,
    /// The list exceeded the limit: fields after it were decoded (to keep the table in step)
    /// but not handed out.
    pub over_limit: bool,
}

/// Decodes header blocks from one peer.
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    /// The table size advertised in SETTINGS_HEADER_TABLE_SIZE: the ceiling of size updates.
    max_allowed: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    /// A decoder whose peer may use a dynamic table of up to `max_table` bytes.
    pub fn new(max_table: usize) -> Decoder {
        Decoder {
            table: Table::new(max_table),
            max_allowed: max_table,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// The dynamic table's current size in bytes (entries plus overhead).
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Reads a string literal into `out` (scratch) and returns where it is: in `out`, or a
    /// range of `block` when not Huffman-coded.
    ///
    /// No limit of its own: a string is at most the block, which the caller bounds, and a
    /// Huffman string decodes to at most 8/5 of its length.
    fn read_string(block: &[u8], pos: &mut usize, out: &mut Vec<u8>) -> Result<Str, DecodeError> {
        let huff = *block.get(*pos).ok_or(DecodeError::Truncated)? & 0x80 != 0;
        let len = read_int(block, pos, 7)?;
        let end = pos.checked_add(len).ok_or(DecodeError::Truncated)?;
        let raw = block.get(*pos..end).ok_or(DecodeError::Truncated)?;
        *pos = end;
        if huff {
            out.clear();
            huffman::decode(raw, out).map_err(|_| DecodeError::BadHuffman)?;
            Ok(Str::Scratch)
        } else {
            Ok(Str::Block(end - len, end))
        }
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex),
            1..=61 => Ok(STATIC[index - 1]),
            _ => self.table.get(index - 62).ok_or(DecodeError::BadIndex),
        }
    }

    /// Decodes one complete header block, calling `field` with each name and value while the
    /// header list stays within `max_list` bytes.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<Decoded, DecodeError> {
        let mut pos = 0;
        let mut list_size = 0usize;
        let mut over = false;
        let mut fields_seen = false;
        let mut emit = |name: &[u8], value: &[u8], list_size: &mut usize, over: &mut bool| {
            *list_size += name.len() + value.len() + ENTRY_OVERHEAD;
            if *list_size > max_list {
                *over = true;
            }
            if !*over {
                field(name, value);
            }
        };
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                // Indexed field.
                let index = read_int(block, &mut pos, 7)?;
                let (n, v) = self.entry(index)?;
                emit(n, v, &mut list_size, &mut over);
                fields_seen = true;
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update: only before the first field.
                let size = read_int(block, &mut pos, 5)?;
                if fields_seen || size > self.max_allowed {
                    return Err(DecodeError::BadSizeUpdate);
                }
                self.table.set_max(size, |_, _, _| {});
            } else {
                // A literal: with incremental indexing (01), without (0000) or never (0001).
                let (prefix, index_it) = if b & 0xc0 == 0x40 {
                    (6, true)
                } else {
                    (4, false)
                };
                let index = read_int(block, &mut pos, prefix)?;
                let mut name_buf = std::mem::take(&mut self.name);
                let mut value_buf = std::mem::take(&mut self.value);
                let result = (|| {
                    let name_at = if index == 0 {
                        Some(Self::read_string(block, &mut pos, &mut name_buf)?)
                    } else {
                        let (n, _) = self.entry(index)?;
                        name_buf.clear();
                        name_buf.extend_from_slice(n);
                        None
                    };
                    let value_at = Self::read_string(block, &mut pos, &mut value_buf)?;
                    Ok::<_, DecodeError>((name_at, value_at))
                })();
                let (name_at, value_at) = match result {
                    Ok(r) => r,
                    Err(e) => {
                        self.name = name_buf;
                        self.value = value_buf;
                        return Err(e);
                    }
                };
                let name: &[u8] = match name_at {
                    Some(Str::Block(s, e)) => &block[s..e],
                    Some(Str::Scratch) | None => &name_buf,
                };
                let value: &[u8] = match value_at {
                    Str::Block(s, e) => &block[s..e],
                    Str::Scratch => &value_buf,
                };
                emit(name, value, &mut list_size, &mut over);
                if index_it {
                    self.table.insert(name, value, |_, _, _| {});
                }
                self.name = name_buf;
                self.value = value_buf;
                fields_seen = true;
            }
        }
        Ok(Decoded {
            list_size,
            over_limit: over,
        })
    }
}

/// Where a decoded string is.
enum Str {
    /// `block[start..end]`, taken as it is.
    Block(usize, usize),
    /// The scratch buffer (a decoded Huffman string).
    Scratch,
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A hash of a field for the encoder's index of its dynamic table: word at a time (byte at a
/// time was most of the encoder's cost), collisions resolved by comparing the entry.
fn field_hash(name: &[u8], value: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = (name.len() as u64) << 32 | value.len() as u64;
    for part in [name, value] {
        let mut words = part.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(K);
        }
    }
    h
}

/// Whether a field is worth a dynamic table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indexing {
    /// Index it if it fits (repeated fields then cost one byte).
    Yes,
    /// Send it literally, without indexing.
    No,
    /// Never index it, here or at intermediaries (credentials, cookies).
    Never,
}

/// Encodes header blocks for one peer.
#[derive(Debug)]
pub struct Encoder {
    table: Table,
    /// Hash of (name, value) → absolute index of the newest entry with it.
    index: HashMap<u64, u64, BuildHasherDefault<Identity>>,
    /// A size update to announce at the start of the next block (RFC 7541, Section 4.2).
    pending_update: Option<usize>,
    /// The smallest size the table went through since the last block, which the peer must
    /// hear first.
    min_update: Option<usize>,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new(4096)
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity")
    }
}

/// The encoder never uses a table larger than this, whatever the peer allows.
const ENCODER_TABLE_CAP: usize = 4096;

impl Encoder {
    /// An encoder for a peer whose table holds `max_table` bytes (4096 until its SETTINGS say
    /// otherwise).
    pub fn new(max_table: usize) -> Encoder {
        Encoder {
            table: Table::new(max_table.min(ENCODER_TABLE_CAP)),
            index: HashMap::default(),
            pending_update: None,
            min_update: None,
        }
    }

    /// The peer changed SETTINGS_HEADER_TABLE_SIZE: the next block starts with a size update.
    pub fn set_max_table(&mut self, max: usize) {
        let max = max.min(ENCODER_TABLE_CAP);
        if max == self.table.max && self.pending_update.is_none() {
            return;
        }
        self.min_update = Some(self.min_update.map_or(max, |m| m.min(max)));
        self.pending_update = Some(max);
        let index = &mut self.index;
        self.table.set_max(max, |abs, n, v| {
            let h = field_hash(n, v);
            if index.get(&h) == Some(&abs) {
                index.remove(&h);
            }
        });
    }

    /// Starts a header block: writes a pending table size update.
    pub fn begin(&mut self, dst: &mut Vec<u8>) {
        if let Some(min) = self.min_update.take() {
            if let Some(last) = self.pending_update.take() {
                if min < last {
                    write_int(dst, 0x20, 5, min);
                }
                write_int(dst, 0x20, 5, last);
            }
        }
    }

    /// Writes `:status`.
    pub fn status(&mut self, status: u16, dst: &mut Vec<u8>) {
        let idx = match status {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if idx != 0 {
            dst.push(0x80 | idx);
            return;
        }
        let mut digits = [0u8; 3];
        let s = status.min(999);
        digits[0] = b'0' + (s / 100) as u8;
        digits[1] = b'0' + (s / 10 % 10) as u8;
        digits[2] = b'0' + (s % 10) as u8;
        self.field(b":status", &digits, Indexing::Yes, dst);
    }

    /// Writes one field; `name` must be lowercase.
    pub fn field(&mut self, name: &[u8], value: &[u8], indexing: Indexing, dst: &mut Vec<u8>) {
        let name_index = static_name(name);
        // Only pseudo-headers and accept-encoding have values in the static table.
        if name_index != 0 && (name.first() == Some(&b':') || name_index == 16) {
            for (i, (n, v)) in STATIC.iter().enumerate().skip(name_index - 1) {
                if *n != name {
                    break;
                }
                if *v == value && indexing != Indexing::Never {
                    write_int(dst, 0x80, 7, i + 1);
                    return;
                }
            }
        }
        let h = field_hash(name, value);
        if indexing != Indexing::Never {
            if let Some(&abs) = self.index.get(&h) {
                let newest = self.table.inserted - 1;
                let rel = (newest - abs) as usize;
                if let Some((n, v)) = self.table.get(rel) {
                    if n == name && v == value {
                        write_int(dst, 0x80, 7, 62 + rel);
                        return;
                    }
                }
            }
        }
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        let insert = indexing == Indexing::Yes && size <= self.table.max / 2;
        let (flags, prefix) = match (insert, indexing) {
            (true, _) => (0x40, 6),
            (false, Indexing::Never) => (0x10, 4),
            (false, _) => (0x00, 4),
        };
        write_int(dst, flags, prefix, name_index);
        if name_index == 0 {
            write_string(dst, name);
        }
        write_string(dst, value);
        if insert {
            let index = &mut self.index;
            self.table.insert(name, value, |abs, n, v| {
                let h = field_hash(n, v);
                if index.get(&h) == Some(&abs) {
                    index.remove(&h);
                }
            });
            self.index.insert(h, self.table.inserted - 1);
        }
    }
}

/// Writes a string literal, Huffman-coded when that is shorter.
fn write_string(dst: &mut Vec<u8>, s: &[u8]) {
    let huff = huffman::encoded_len(s);
    if huff < s.len() {
        write_int(dst, 0x80, 7, huff);
        huffman::encode(s, dst);
    } else {
        write_int(dst, 0, 7, s.len());
        dst.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_names_point_at_their_first_entry() {
        for (i, (n, _)) in STATIC.iter().enumerate() {
            let first = STATIC.iter().position(|(m, _)| m == n).map_or(0, |p| p + 1);
            assert_eq!(static_name(n), first, "{}", String::from_utf8_lossy(n));
            assert!(static_name(n) <= i + 1);
        }
        assert_eq!(static_name(b"x-unknown"), 0);
    }
}
