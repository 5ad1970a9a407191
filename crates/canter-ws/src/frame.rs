//! Frame headers (RFC 6455, Section 5.2) and masking (Section 5.3).

use crate::Error;

/// A frame's opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// A continuation of a fragmented message.
    Continuation,
    /// The first frame of a text message.
    Text,
    /// The first frame of a binary message.
    Binary,
    /// Close.
    Close,
    /// Ping.
    Ping,
    /// Pong.
    Pong,
}

impl Opcode {
    /// The opcode of a header's low nibble; `None` for the reserved ones.
    pub fn from_bits(bits: u8) -> Option<Opcode> {
        Some(match bits {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    /// The opcode's bits.
    pub fn bits(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    /// Close, ping or pong: at most 125 bytes, never fragmented.
    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// A frame's header, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    /// RSV1: the message is compressed (permessage-deflate, RFC 7692), where negotiated.
    pub rsv1: bool,
    /// The opcode.
    pub opcode: Opcode,
    /// The masking key, if the payload is masked.
    pub mask: Option<[u8; 4]>,
    /// The payload's length.
    pub len: u64,
    /// The header's own length, 2 to 14 bytes.
    pub header_len: usize,
}

/// Reads a frame header from the front of `buf`: `Ok(None)` when more bytes are needed.
/// Refuses what no peer may send whatever was negotiated: RSV2 or RSV3 set, a reserved opcode,
/// a fragmented or over-long control frame, a 64-bit length with its top bit set, a length not
/// in its shortest form (RFC 6455, Section 5.2: "the minimal number of bytes MUST be used").
/// RSV1 is left to the caller, which knows whether compression was agreed.
pub fn parse_header(buf: &[u8]) -> Result<Option<Header>, Error> {
    let [b0, b1, ..] = *buf else {
        return Ok(None);
    };
    if b0 & 0x30 != 0 {
        return Err(Error::Protocol("reserved bit RSV2 or RSV3 set"));
    }
    let opcode = Opcode::from_bits(b0 & 0x0F).ok_or(Error::Protocol("reserved opcode"))?;
    let fin = b0 & 0x80 != 0;
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7F {
        126 => {
            let Some(b) = buf.get(2..4) else {
                return Ok(None);
            };
            let len = u16::from_be_bytes([b[0], b[1]]) as u64;
            if len < 126 {
                return Err(Error::Protocol("length not in its shortest form"));
            }
            (len, 4)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut word = [0u8; 8];
            word.copy_from_slice(b);
            let len = u64::from_be_bytes(word);
            if len >> 63 != 0 {
                return Err(Error::Protocol("64-bit length with its top bit set"));
            }
            if len <= u16::MAX as u64 {
                return Err(Error::Protocol("length not in its shortest form"));
            }
            (len, 10)
        }
        n => (n as u64, 2),
    };
    if opcode.is_control() && (!fin || len > 125) {
        return Err(Error::Protocol(
            "control frame fragmented or over 125 bytes",
        ));
    }
    let mask = if masked {
        let Some(b) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([b[0], b[1], b[2], b[3]])
    } else {
        None
    };
    Ok(Some(Header {
        fin,
        rsv1: b0 & 0x40 != 0,
        opcode,
        mask,
        len,
        header_len: at,
    }))
}

/// Appends a frame header to `out`.
pub fn put_header(
    out: &mut Vec<u8>,
    fin: bool,
    rsv1: bool,
    opcode: Opcode,
    len: u64,
    mask: Option<[u8; 4]>,
) {
    let b0 = (fin as u8) << 7 | (rsv1 as u8) << 6 | opcode.bits();
    let m = if mask.is_some() { 0x80 } else { 0 };
    out.push(b0);
    match len {
        0..=125 => out.push(m | len as u8),
        126..=0xFFFF => {
            out.push(m | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(m | 127);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    if let Some(key) = mask {
        out.extend_from_slice(&key);
    }
}

/// XORs `data` with `key` (RFC 6455, Section 5.3), as if `data` began `offset` bytes into the
/// payload: masking and unmasking are the same operation, and a payload can be done in pieces.
/// Eight bytes at a time where it can.
pub fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    let mut rotated = [0u8; 4];
    for (i, b) in rotated.iter_mut().enumerate() {
        *b = key[(offset + i) % 4];
    }
    let mut doubled = [0u8; 8];
    doubled[..4].copy_from_slice(&rotated);
    doubled[4..].copy_from_slice(&rotated);
    let eight = u64::from_ne_bytes(doubled);
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(w) ^ eight).to_ne_bytes());
    }
    // The remainder starts a multiple of 8 (so of 4) bytes in: the rotated key still lines up.
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= rotated[i % 4];
    }
}
