//! QUIC's variable-length integers (RFC 9000, Section 16): the two high bits of the first
//! byte give the length (1, 2, 4 or 8 bytes), the rest is the value, big-endian.

/// The largest value a varint holds (2^62 - 1).
pub const MAX: u64 = (1 << 62) - 1;

/// Reads a varint from the front of `buf`: `(value, bytes used)`, or `None` if `buf` ends
/// before it does.
#[inline]
pub fn decode(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let len = 1usize << (first >> 6);
    let bytes = buf.get(..len)?;
    let mut v = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        v = (v << 8) | u64::from(b);
    }
    Some((v, len))
}

/// The encoded length of `v` (which must be at most [`MAX`]).
#[inline]
pub fn len(v: u64) -> usize {
    match v {
        0..=63 => 1,
        64..=16_383 => 2,
        16_384..=1_073_741_823 => 4,
        _ => 8,
    }
}

/// Appends `v` in its shortest encoding; values above [`MAX`] are written as [`MAX`].
#[inline]
pub fn encode(v: u64, dst: &mut Vec<u8>) {
    let v = v.min(MAX);
    match len(v) {
        1 => dst.push(v as u8),
        2 => dst.extend_from_slice(&(v as u16 | 0x4000).to_be_bytes()),
        4 => dst.extend_from_slice(&(v as u32 | 0x8000_0000).to_be_bytes()),
        _ => dst.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_9000_appendix_a_examples() {
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, v) in cases {
            assert_eq!(decode(bytes), Some((v, bytes.len())));
            let mut out = Vec::new();
            encode(v, &mut out);
            assert_eq!(out, bytes);
        }
        // A two-byte encoding of 37 is valid too.
        assert_eq!(decode(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn truncated_is_none_at_every_length() {
        let mut out = Vec::new();
        for v in [0, 63, 64, 16_383, 16_384, 1 << 30, MAX] {
            out.clear();
            encode(v, &mut out);
            assert_eq!(out.len(), len(v));
            for cut in 0..out.len() {
                assert_eq!(decode(&out[..cut]), None);
            }
            assert_eq!(decode(&out), Some((v, out.len())));
        }
    }
}
