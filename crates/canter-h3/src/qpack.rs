//! QPACK (RFC 9204) without a dynamic table: the field sections of HTTP/3.
//!
//! This engine advertises `SETTINGS_QPACK_MAX_TABLE_CAPACITY` 0 and
//! `SETTINGS_QPACK_BLOCKED_STREAMS` 0, so a peer may only use the static table and literals
//! (Section 3.2.3: with a capacity of 0 the encoder cannot insert). Nothing can block, no
//! stream waits for the encoder stream, and a section either decodes at once or is an error.
//! [`decode`] reads a field section; [`Encoder`] writes one, from the static table where it
//! has the field or its name, Huffman-coding literals when that is shorter.

use canter_h2::huffman;

/// The static table (RFC 9204, Appendix A), index 0 first.
pub const STATIC: [(&[u8], &[u8]); 99] = [
    (b":authority", b""),                                    // 0
    (b":path", b"/"),                                        // 1
    (b"age", b"0"),                                          // 2
    (b"content-disposition", b""),                           // 3
    (b"content-length", b"0"),                               // 4
    (b"cookie", b""),                                        // 5
    (b"date", b""),                                          // 6
    (b"etag", b""),                                          // 7
    (b"if-modified-since", b""),                             // 8
    (b"if-none-match", b""),                                 // 9
    (b"last-modified", b""),                                 // 10
    (b"link", b""),                                          // 11
    (b"location", b""),                                      // 12
    (b"referer", b""),                                       // 13
    (b"set-cookie", b""),                                    // 14
    (b":method", b"CONNECT"),                                // 15
    (b":method", b"DELETE"),                                 // 16
    (b":method", b"GET"),                                    // 17
    (b":method", b"HEAD"),                                   // 18
    (b":method", b"OPTIONS"),                                // 19
    (b":method", b"POST"),                                   // 20
    (b":method", b"PUT"),                                    // 21
    (b":scheme", b"http"),                                   // 22
    (b":scheme", b"https"),                                  // 23
    (b":status", b"103"),                                    // 24
    (b":status", b"200"),                                    // 25
    (b":status", b"304"),                                    // 26
    (b":status", b"404"),                                    // 27
    (b":status", b"503"),                                    // 28
    (b"accept", b"*/*"),                                     // 29
    (b"accept", b"application/dns-message"),                 // 30
    (b"accept-encoding", b"gzip, deflate, br"),              // 31
    (b"accept-ranges", b"bytes"),                            // 32
    (b"access-control-allow-headers", b"cache-control"),     // 33
    (b"access-control-allow-headers", b"content-type"),      // 34
    (b"access-control-allow-origin", b"*"),                  // 35
    (b"cache-control", b"max-age=0"),                        // 36
    (b"cache-control", b"max-age=2592000"),                  // 37
    (b"cache-control", b"max-age=604800"),                   // 38
    (b"cache-control", b"no-cache"),                         // 39
    (b"cache-control", b"no-store"),                         // 40
    (b"cache-control", b"public, max-age=31536000"),         // 41
    (b"content-encoding", b"br"),                            // 42
    (b"content-encoding", b"gzip"),                          // 43
    (b"content-type", b"application/dns-message"),           // 44
    (b"content-type", b"application/javascript"),            // 45
    (b"content-type", b"application/json"),                  // 46
    (b"content-type", b"application/x-www-form-urlencoded"), // 47
    (b"content-type", b"image/gif"),                         // 48
    (b"content-type", b"image/jpeg"),                        // 49
    (b"content-type", b"image/png"),                         // 50
    (b"content-type", b"text/css"),                          // 51
    (b"content-type", b"text/html; charset=utf-8"),          // 52
    (b"content-type", b"text/plain"),                        // 53
    (b"content-type", b"text/plain;charset=utf-8"),          // 54
    (b"range", b"bytes=0-"),                                 // 55
    (b"strict-transport-security", b"max-age=31536000"),     // 56
    (
        b"strict-transport-security",
        b"max-age=31536000; includesubdomains",
    ), // 57
    (
        b"strict-transport-security",
        b"max-age=31536000; includesubdomains; preload",
    ), // 58
    (b"vary", b"accept-encoding"),                           // 59
    (b"vary", b"origin"),                                    // 60
    (b"x-content-type-options", b"nosniff"),                 // 61
    (b"x-xss-protection", b"1; mode=block"),                 // 62
    (b":status", b"100"),                                    // 63
    (b":status", b"204"),                                    // 64
    (b":status", b"206"),                                    // 65
    (b":status", b"302"),                                    // 66
    (b":status", b"400"),                                    // 67
    (b":status", b"403"),                                    // 68
    (b":status", b"421"),                                    // 69
    (b":status", b"425"),                                    // 70
    (b":status", b"500"),                                    // 71
    (b"accept-language", b""),                               // 72
    (b"access-control-allow-credentials", b"FALSE"),         // 73
    (b"access-control-allow-credentials", b"TRUE"),          // 74
    (b"access-control-allow-headers", b"*"),                 // 75
    (b"access-control-allow-methods", b"get"),               // 76
    (b"access-control-allow-methods", b"get, post, options"), // 77
    (b"access-control-allow-methods", b"options"),           // 78
    (b"access-control-expose-headers", b"content-length"),   // 79
    (b"access-control-request-headers", b"content-type"),    // 80
    (b"access-control-request-method", b"get"),              // 81
    (b"access-control-request-method", b"post"),             // 82
    (b"alt-svc", b"clear"),                                  // 83
    (b"authorization", b""),                                 // 84
    (
        b"content-security-policy",
        b"script-src 'none'; object-src 'none'; base-uri 'none'",
    ), // 85
    (b"early-data", b"1"),                                   // 86
    (b"expect-ct", b""),                                     // 87
    (b"forwarded", b""),                                     // 88
    (b"if-range", b""),                                      // 89
    (b"origin", b""),                                        // 90
    (b"purpose", b"prefetch"),                               // 91
    (b"server", b""),                                        // 92
    (b"timing-allow-origin", b"*"),                          // 93
    (b"upgrade-insecure-requests", b"1"),                    // 94
    (b"user-agent", b""),                                    // 95
    (b"x-forwarded-for", b""),                               // 96
    (b"x-frame-options", b"deny"),                           // 97
    (b"x-frame-options", b"sameorigin"),                     // 98
];

/// Why a field section cannot be decoded: a connection error `QPACK_DECOMPRESSION_FAILED`
/// (RFC 9204, Section 2.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The section ends inside a representation.
    Truncated,
    /// An integer does not fit in 62 bits.
    IntegerOverflow,
    /// A static index beyond the table.
    BadIndex,
    /// A reference to the dynamic table, which is empty: its capacity is 0.
    DynamicReference,
    /// A Huffman string with bad padding or an EOS symbol.
    BadHuffman,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::Truncated => "field section truncated",
            DecodeError::IntegerOverflow => "QPACK integer overflow",
            DecodeError::BadIndex => "QPACK static index out of range",
            DecodeError::DynamicReference => "QPACK dynamic table reference (capacity is 0)",
            DecodeError::BadHuffman => "invalid Huffman string",
        })
    }
}

impl std::error::Error for DecodeError {}

/// What [`decode`] tells besides the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The decoded list passed the size limit (name + value + 32 per field, RFC 9114 Section
    /// 4.2.2): decoding stopped there, the request must be answered 431.
    pub over_limit: bool,
}

/// Reads an `n`-bit prefix integer (RFC 7541, Section 5.1, which RFC 9204 Section 4.1.1
/// uses) starting at `buf[*pos]`, whose high `8 - n` bits are the caller's.
fn int(buf: &[u8], pos: &mut usize, n: u8) -> Result<u64, DecodeError> {
    let mask = ((1u16 << n) - 1) as u8;
    let first = *buf.get(*pos).ok_or(DecodeError::Truncated)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(u64::from(first));
    }
    let mut v = u64::from(mask);
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift > 56 {
            return Err(DecodeError::IntegerOverflow);
        }
        v += u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

/// Reads a string whose length has an `n`-bit prefix and whose Huffman flag is the bit above
/// it; a Huffman string is decoded into `scratch`.
fn string<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    n: u8,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], DecodeError> {
    let huff = *buf.get(*pos).ok_or(DecodeError::Truncated)? & (1 << n) != 0;
    let len = int(buf, pos, n)?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| pos.checked_add(l))
        .filter(|&e| e <= buf.len())
        .ok_or(DecodeError::Truncated)?;
    let raw = &buf[*pos..end];
    *pos = end;
    if !huff {
        return Ok(raw);
    }
    scratch.clear();
    huffman::decode(raw, scratch).map_err(|_| DecodeError::BadHuffman)?;
    Ok(scratch)
}

fn entry(index: u64) -> Result<(&'static [u8], &'static [u8]), DecodeError> {
    usize::try_from(index)
        .ok()
        .and_then(|i| STATIC.get(i).copied())
        .ok_or(DecodeError::BadIndex)
}

/// Decodes the field section `block` (a HEADERS frame's payload), calling `field` for each
/// field in order until the decoded size passes `max_size`.
pub fn decode(
    block: &[u8],
    max_size: usize,
    mut field: impl FnMut(&[u8], &[u8]),
) -> Result<Decoded, DecodeError> {
    let mut pos = 0;
    // Encoded Required Insert Count: anything but 0 needs a dynamic table (Section 4.5.1.1).
    if int(block, &mut pos, 8)? != 0 {
        return Err(DecodeError::DynamicReference);
    }
    // Delta Base: meaningless without dynamic references, but it must be there.
    int(block, &mut pos, 7)?;
    let mut size = 0usize;
    let (mut name_buf, mut value_buf) = (Vec::new(), Vec::new());
    while pos < block.len() {
        let b = block[pos];
        let (name, value): (&[u8], &[u8]) = if b & 0x80 != 0 {
            // Indexed field line (Section 4.5.2): 1 T index(6).
            if b & 0x40 == 0 {
                return Err(DecodeError::DynamicReference);
            }
            entry(int(block, &mut pos, 6)?)?
        } else if b & 0x40 != 0 {
            // Literal with name reference (Section 4.5.4): 0 1 N T index(4), value.
            if b & 0x10 == 0 {
                return Err(DecodeError::DynamicReference);
            }
            let (name, _) = entry(int(block, &mut pos, 4)?)?;
            (name, string(block, &mut pos, 7, &mut value_buf)?)
        } else if b & 0x20 != 0 {
            // Literal with literal name (Section 4.5.6): 0 0 1 N H len(3), name, value.
            let name = string(block, &mut pos, 3, &mut name_buf)?;
            (name, string(block, &mut pos, 7, &mut value_buf)?)
        } else {
            // 0001: indexed with post-base index; 0000: literal with post-base name
            // reference. Both are dynamic.
            return Err(DecodeError::DynamicReference);
        };
        size += name.len() + value.len() + 32;
        if size > max_size {
            return Ok(Decoded { over_limit: true });
        }
        field(name, value);
    }
    Ok(Decoded { over_limit: false })
}

/// Appends `v` as an `n`-bit prefix integer, the high bits of the first byte `flags`.
fn put_int(v: u64, n: u8, flags: u8, dst: &mut Vec<u8>) {
    let mask = ((1u16 << n) - 1) as u8;
    if v < u64::from(mask) {
        dst.push(flags | v as u8);
        return;
    }
    dst.push(flags | mask);
    let mut rest = v - u64::from(mask);
    while rest >= 0x80 {
        dst.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    dst.push(rest as u8);
}

/// Appends a string with an `n`-bit length prefix, Huffman-coded (flag bit `1 << n`) when
/// that is shorter.
fn put_string(s: &[u8], n: u8, flags: u8, dst: &mut Vec<u8>) {
    let huff_len = huffman::encoded_len(s);
    if huff_len < s.len() {
        put_int(huff_len as u64, n, flags | (1 << n), dst);
        huffman::encode(s, dst);
    } else {
        put_int(s.len() as u64, n, flags, dst);
        dst.extend_from_slice(s);
    }
}

/// Where the static table has `name`: `(index of name and value, index of the name)`.
fn find(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let entries = named(name);
    let exact = entries
        .iter()
        .map(|&i| i as usize)
        .find(|&i| STATIC[i].1 == value);
    (exact, entries.first().map(|&i| i as usize))
}

/// The static table's entries named `name`, in index order (empty if none).
fn named(name: &[u8]) -> &'static [u8] {
    match name {
        b":authority" => &[0],
        b":path" => &[1],
        b"age" => &[2],
        b"content-disposition" => &[3],
        b"content-length" => &[4],
        b"cookie" => &[5],
        b"date" => &[6],
        b"etag" => &[7],
        b"if-modified-since" => &[8],
        b"if-none-match" => &[9],
        b"last-modified" => &[10],
        b"link" => &[11],
        b"location" => &[12],
        b"referer" => &[13],
        b"set-cookie" => &[14],
        b":method" => &[15, 16, 17, 18, 19, 20, 21],
        b":scheme" => &[22, 23],
        b":status" => &[24, 25, 26, 27, 28, 63, 64, 65, 66, 67, 68, 69, 70, 71],
        b"accept" => &[29, 30],
        b"accept-encoding" => &[31],
        b"accept-ranges" => &[32],
        b"access-control-allow-headers" => &[33, 34, 75],
        b"access-control-allow-origin" => &[35],
        b"cache-control" => &[36, 37, 38, 39, 40, 41],
        b"content-encoding" => &[42, 43],
        b"content-type" => &[44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54],
        b"range" => &[55],
        b"strict-transport-security" => &[56, 57, 58],
        b"vary" => &[59, 60],
        b"x-content-type-options" => &[61],
        b"x-xss-protection" => &[62],
        b"accept-language" => &[72],
        b"access-control-allow-credentials" => &[73, 74],
        b"access-control-allow-methods" => &[76, 77, 78],
        b"access-control-expose-headers" => &[79],
        b"access-control-request-headers" => &[80],
        b"access-control-request-method" => &[81, 82],
        b"alt-svc" => &[83],
        b"authorization" => &[84],
        b"content-security-policy" => &[85],
        b"early-data" => &[86],
        b"expect-ct" => &[87],
        b"forwarded" => &[88],
        b"if-range" => &[89],
        b"origin" => &[90],
        b"purpose" => &[91],
        b"server" => &[92],
        b"timing-allow-origin" => &[93],
        b"upgrade-insecure-requests" => &[94],
        b"user-agent" => &[95],
        b"x-forwarded-for" => &[96],
        b"x-frame-options" => &[97, 98],
        _ => &[],
    }
}

/// Encoded fields kept for reuse, per encoder: a response's `server`, `date` and
/// `content-type` repeat from one response to the next, and re-encoding them (a table lookup,
/// a Huffman pass over the value) was a tenth of a small response's CPU.
const RECENT: usize = 8;
/// Longest value kept among the recent fields.
const RECENT_VALUE: usize = 64;

/// Writes field sections with the static table and literals only: what a peer that
/// advertised any table capacity can always decode, and what blocks no stream.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    /// `(name, value, encoding)` of fields encoded lately; the oldest is replaced.
    recent: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
    next: usize,
}

impl Encoder {
    /// An encoder with nothing kept yet.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Starts a field section: Required Insert Count 0, Delta Base 0.
    pub fn begin(&self, dst: &mut Vec<u8>) {
        dst.extend_from_slice(&[0, 0]);
    }

    /// Appends `:status`.
    pub fn status(&mut self, status: u16, dst: &mut Vec<u8>) {
        self.field(b":status", &itoa_3(status), dst);
    }

    /// Appends one field (a lowercase name).
    pub fn field(&mut self, name: &[u8], value: &[u8], dst: &mut Vec<u8>) {
        if let Some((_, _, enc)) = self
            .recent
            .iter()
            .find(|(n, v, _)| v.len() == value.len() && n == name && v == value)
        {
            dst.extend_from_slice(enc);
            return;
        }
        let start = dst.len();
        encode_field(name, value, dst);
        if value.len() <= RECENT_VALUE {
            let entry = (name.to_vec(), value.to_vec(), dst[start..].to_vec());
            if self.recent.len() < RECENT {
                self.recent.push(entry);
            } else {
                self.recent[self.next] = entry;
                self.next = (self.next + 1) % RECENT;
            }
        }
    }
}

/// Appends one field's representation.
fn encode_field(name: &[u8], value: &[u8], dst: &mut Vec<u8>) {
    match find(name, value) {
        (Some(i), _) => put_int(i as u64, 6, 0xc0, dst),
        (None, Some(i)) => {
            // 0 1 N=0 T=1 index(4)
            put_int(i as u64, 4, 0x50, dst);
            put_string(value, 7, 0, dst);
        }
        (None, None) => {
            // 0 0 1 N=0 H len(3)
            put_string(name, 3, 0x20, dst);
            put_string(value, 7, 0, dst);
        }
    }
}

/// A status code's three digits (100..=999; others are clamped by the caller's type).
fn itoa_3(status: u16) -> [u8; 3] {
    let s = status.clamp(100, 999);
    [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn fields(block: &[u8]) -> Result<Fields, DecodeError> {
        let mut out = Vec::new();
        decode(block, 64 * 1024, |n, v| out.push((n.to_vec(), v.to_vec())))?;
        Ok(out)
    }

    #[test]
    fn rfc_9204_appendix_b1_literal_with_name_reference() {
        let block = [
            0x00, 0x00, 0x51, 0x0b, 0x2f, 0x69, 0x6e, 0x64, 0x65, 0x78, 0x2e, 0x68, 0x74, 0x6d,
            0x6c,
        ];
        assert_eq!(
            fields(&block).unwrap(),
            vec![(b":path".to_vec(), b"/index.html".to_vec())]
        );
    }

    #[test]
    fn the_table_is_the_rfcs_at_its_landmarks() {
        assert_eq!(STATIC[0], (&b":authority"[..], &b""[..]));
        assert_eq!(STATIC[17], (&b":method"[..], &b"GET"[..]));
        assert_eq!(STATIC[25], (&b":status"[..], &b"200"[..]));
        assert_eq!(STATIC[53], (&b"content-type"[..], &b"text/plain"[..]));
        assert_eq!(STATIC[71], (&b":status"[..], &b"500"[..]));
        assert_eq!(STATIC[98], (&b"x-frame-options"[..], &b"sameorigin"[..]));
    }

    #[test]
    fn what_the_encoder_writes_decodes_back() {
        let mut enc = Encoder::new();
        let mut block = Vec::new();
        enc.begin(&mut block);
        enc.status(200, &mut block);
        enc.status(418, &mut block);
        enc.field(b"content-type", b"text/plain", &mut block);
        enc.field(b"content-type", b"text/html; charset=utf-8", &mut block);
        enc.field(b"server", b"canter", &mut block);
        enc.field(
            b"x-custom-header-with-a-long-name",
            b"some value here",
            &mut block,
        );
        enc.field(b"date", b"Sun, 06 Dec 2026 07:00:00 GMT", &mut block);
        let got = fields(&block).unwrap();
        let want: Vec<(&[u8], &[u8])> = vec![
            (b":status", b"200"),
            (b":status", b"418"),
            (b"content-type", b"text/plain"),
            (b"content-type", b"text/html; charset=utf-8"),
            (b"server", b"canter"),
            (b"x-custom-header-with-a-long-name", b"some value here"),
            (b"date", b"Sun, 06 Dec 2026 07:00:00 GMT"),
        ];
        let want: Vec<(Vec<u8>, Vec<u8>)> = want
            .into_iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(got, want);
        // The exact static matches are one byte each.
        assert_eq!(&block[2..3], &[0xc0 | 25]);
    }

    #[test]
    fn every_static_entry_is_found_by_name_and_value() {
        for (i, &(n, v)) in STATIC.iter().enumerate() {
            let (exact, name) = find(n, v);
            // The first entry with this name and value (the table has no duplicates).
            assert_eq!(
                exact,
                Some(i),
                "{}: {}",
                String::from_utf8_lossy(n),
                String::from_utf8_lossy(v)
            );
            assert_eq!(name.map(|j| STATIC[j].0), Some(n));
        }
        assert_eq!(find(b"x-unknown", b""), (None, None));
    }

    #[test]
    fn a_field_encoded_again_comes_from_the_recent_ones_unchanged() {
        let mut enc = Encoder::new();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        enc.field(b"date", b"Sun, 06 Dec 2026 07:00:00 GMT", &mut a);
        for i in 0..20 {
            // Pushes the date out of the recent fields and back in.
            enc.field(format!("x-{i}").as_bytes(), b"v", &mut Vec::new());
        }
        enc.field(b"date", b"Sun, 06 Dec 2026 07:00:00 GMT", &mut b);
        enc.field(b"date", b"Sun, 06 Dec 2026 07:00:00 GMT", &mut b);
        assert_eq!([a.clone(), a].concat(), b);
    }

    #[test]
    fn dynamic_references_are_refused() {
        // Required Insert Count 2.
        assert_eq!(
            fields(&[0x03, 0x81, 0x10]),
            Err(DecodeError::DynamicReference)
        );
        // Indexed field line, dynamic (T = 0).
        assert_eq!(
            fields(&[0x00, 0x00, 0x80]),
            Err(DecodeError::DynamicReference)
        );
        // Post-base index.
        assert_eq!(
            fields(&[0x00, 0x00, 0x10]),
            Err(DecodeError::DynamicReference)
        );
        // Literal with post-base name reference.
        assert_eq!(
            fields(&[0x00, 0x00, 0x00, 0x00]),
            Err(DecodeError::DynamicReference)
        );
        // Literal with a dynamic name reference (T = 0).
        assert_eq!(
            fields(&[0x00, 0x00, 0x40, 0x00]),
            Err(DecodeError::DynamicReference)
        );
    }

    #[test]
    fn bad_sections_are_errors_not_panics() {
        assert_eq!(fields(&[]), Err(DecodeError::Truncated));
        assert_eq!(fields(&[0x00]), Err(DecodeError::Truncated));
        // Static index 99 does not exist (6-bit prefix 63 + 36).
        assert_eq!(
            fields(&[0x00, 0x00, 0xff, 0x24]),
            Err(DecodeError::BadIndex)
        );
        // A literal whose length runs past the end.
        assert_eq!(
            fields(&[0x00, 0x00, 0x51, 0x0b, b'/']),
            Err(DecodeError::Truncated)
        );
        // An integer that never ends within 62 bits.
        let mut long = vec![0x00, 0x00, 0xff];
        long.extend_from_slice(&[0xff; 12]);
        assert_eq!(fields(&long), Err(DecodeError::IntegerOverflow));
        // Every prefix of a good section either decodes or says truncated.
        let mut block = Vec::new();
        let mut enc = Encoder::new();
        enc.begin(&mut block);
        enc.field(b"x-long", b"a value long enough to need two length bytes, well over 127 characters, which takes a while to type out in full, honestly, but here we are", &mut block);
        for cut in 0..block.len() {
            let r = fields(&block[..cut]);
            assert!(
                matches!(r, Err(DecodeError::Truncated)) || r.is_ok(),
                "{cut}: {r:?}"
            );
        }
    }

    #[test]
    fn the_size_limit_counts_32_per_field() {
        let mut block = Vec::new();
        let mut enc = Encoder::new();
        enc.begin(&mut block);
        enc.field(b"a", b"b", &mut block);
        enc.field(b"c", b"d", &mut block);
        let mut n = 0;
        assert_eq!(
            decode(&block, 68, |_, _| n += 1),
            Ok(Decoded { over_limit: false })
        );
        assert_eq!(n, 2);
        assert_eq!(
            decode(&block, 67, |_, _| n += 1),
            Ok(Decoded { over_limit: true })
        );
        assert_eq!(n, 3, "decoding stops at the field that passes the limit");
    }
}
