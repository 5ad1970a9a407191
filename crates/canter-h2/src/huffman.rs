//! HPACK's static Huffman code (RFC 7541, Section 5.2 and Appendix B).
//!
//! The code is canonical: within one bit length, codes are consecutive in symbol order. Decoding
//! looks the next 8 bits up in a table (every symbol of 8 bits or fewer: the letters, digits and
//! common punctuation), and walks the longer lengths by their first code otherwise.

use crate::huffman_table::CODES;

/// Why a Huffman string does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HuffmanError;

const EOS: usize = 256;
const MAX_LEN: usize = 30;

/// Symbols of 8 bits or fewer, indexed by the next 8 input bits: `(symbol, length)`, length 0
/// for prefixes of longer codes.
const FAST: [(u8, u8); 256] = {
    let mut t = [(0u8, 0u8); 256];
    let mut sym = 0;
    while sym < EOS {
        let (code, len) = CODES[sym];
        if len <= 8 {
            let base = (code << (8 - len)) as usize;
            let mut i = 0;
            while i < 1 << (8 - len) {
                t[base + i] = (sym as u8, len);
                i += 1;
            }
        }
        sym += 1;
    }
    t
};

/// Per bit length: `(first code, number of codes, index of the first symbol in SORTED)`.
const LENGTHS: [(u32, u32, u16); MAX_LEN + 1] = {
    let mut t = [(0u32, 0u32, 0u16); MAX_LEN + 1];
    let mut at = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        let mut sym = 0;
        let mut count = 0u32;
        let mut first = 0u32;
        while sym <= EOS {
            if CODES[sym].1 as usize == len {
                if count == 0 {
                    first = CODES[sym].0;
                }
                count += 1;
            }
            sym += 1;
        }
        t[len] = (first, count, at);
        at += count as u16;
        len += 1;
    }
    t
};

/// Symbols ordered by (length, symbol), which is code order.
const SORTED: [u16; 257] = {
    let mut t = [0u16; 257];
    let mut at = 0;
    let mut len = 1;
    while len <= MAX_LEN {
        let mut sym = 0;
        while sym <= EOS {
            if CODES[sym].1 as usize == len {
                t[at] = sym as u16;
                at += 1;
            }
            sym += 1;
        }
        len += 1;
    }
    t
};

/// The encoded length of `src` in bytes.
#[inline]
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Appends the Huffman encoding of `src` to `dst`, padded with the EOS prefix (all ones).
pub fn encode(src: &[u8], dst: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | code as u64;
        bits += len as u32;
        while bits >= 8 {
            bits -= 8;
            dst.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        dst.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// Appends the decoding of `src` to `dst`. Fails on EOS inside the string, on padding longer
/// than 7 bits or not all ones (RFC 7541, Section 5.2).
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HuffmanError> {
    dst.reserve(src.len() * 8 / 5);
    // `acc` holds `bits` unread bits in its low end.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut input = src.iter();
    loop {
        while bits <= 56 {
            match input.next() {
                Some(&b) => {
                    acc = (acc << 8) | b as u64;
                    bits += 8;
                }
                None => break,
            }
        }
        if bits == 0 {
            return Ok(());
        }
        // Fast path: a code of 8 bits or fewer at the front.
        let peek8 = if bits >= 8 {
            (acc >> (bits - 8)) as u8
        } else {
            ((acc << (8 - bits)) as u8) | ((1u16 << (8 - bits)) - 1) as u8
        };
        let (sym, len) = FAST[peek8 as usize];
        if len != 0 && len as u32 <= bits {
            dst.push(sym);
            bits -= len as u32;
            continue;
        }
        // Slow path: the longer lengths, in order.
        let mut found = false;
        for (l, &(first, count, at)) in LENGTHS.iter().enumerate().skip(9) {
            if count == 0 {
                continue;
            }
            if l as u32 > bits {
                break;
            }
            let code = ((acc >> (bits - l as u32)) & ((1u64 << l) - 1)) as u32;
            if code >= first && code - first < count {
                let sym = SORTED[at as usize + (code - first) as usize];
                if sym as usize == EOS {
                    return Err(HuffmanError);
                }
                dst.push(sym as u8);
                bits -= l as u32;
                found = true;
                break;
            }
        }
        if !found {
            // What is left must be padding: fewer than 8 bits, all ones.
            let mask = (1u64 << bits) - 1;
            if bits < 8 && acc & mask == mask && input.len() == 0 {
                return Ok(());
            }
            return Err(HuffmanError);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn round_trip(s: &[u8]) {
        let mut enc = Vec::new();
        encode(s, &mut enc);
        assert_eq!(enc.len(), encoded_len(s));
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, s);
    }

    #[test]
    fn every_symbol_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        round_trip(&all);
        for b in 0..=255u8 {
            round_trip(&[b]);
            round_trip(&[b, b, b]);
        }
        round_trip(b"");
    }

    #[test]
    fn rfc_7541_c_4_strings() {
        // C.4.1: "www.example.com".
        let mut out = Vec::new();
        encode(b"www.example.com", &mut out);
        assert_eq!(
            out,
            [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff]
        );
        // C.4.2: "no-cache".
        out.clear();
        encode(b"no-cache", &mut out);
        assert_eq!(out, [0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // 'a' is 00011 (5 bits); padded with zeros instead of ones.
        assert_eq!(decode(&[0b0001_1000], &mut out), Err(HuffmanError));
        // A whole byte of padding (8 ones) after a full symbol.
        out.clear();
        assert_eq!(decode(&[0b0001_1111, 0xff], &mut out), Err(HuffmanError));
        // EOS itself (30 ones) inside the string.
        out.clear();
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(HuffmanError)
        );
        // Correct padding.
        out.clear();
        assert_eq!(decode(&[0b0001_1111], &mut out), Ok(()));
        assert_eq!(out, b"a");
    }
}
