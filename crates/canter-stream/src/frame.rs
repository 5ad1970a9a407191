//! The framing of every record: a 4-byte big-endian length prefix, then the record.

/// The largest record the tools accept by default (1 MiB).
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Why a byte stream is not a sequence of frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// A length prefix larger than the maximum frame size.
    TooLarge {
        /// The length the prefix gives.
        len: usize,
        /// The maximum frame size.
        max: usize,
    },
    /// The stream ended inside a frame.
    Truncated {
        /// Bytes the last frame lacks.
        missing: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { len, max } => {
                write!(f, "a frame of {len} bytes is over the limit of {max}")
            }
            FrameError::Truncated { missing } => {
                write!(f, "the data ends inside a frame ({missing} bytes missing)")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Appends `record` to `out`, framed.
pub fn encode(record: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(record.len() as u32).to_be_bytes());
    out.extend_from_slice(record);
}

/// Splits the complete frames at the start of `buf`: calls `each` with every record and returns
/// how many bytes they took (the rest is an incomplete frame to keep for the next read).
pub fn split(buf: &[u8], max: usize, mut each: impl FnMut(&[u8])) -> Result<usize, FrameError> {
    let mut at = 0;
    while buf.len() - at >= 4 {
        let mut len = [0u8; 4];
        len.copy_from_slice(&buf[at..at + 4]);
        let len = u32::from_be_bytes(len) as usize;
        if len > max {
            return Err(FrameError::TooLarge { len, max });
        }
        if buf.len() - at - 4 < len {
            break;
        }
        each(&buf[at + 4..at + 4 + len]);
        at += 4 + len;
    }
    Ok(at)
}

/// The records of a whole buffer of frames (a file written by `canter receive --out`, or by a
/// generator): their byte ranges in `buf`, frame headers included.
pub fn frames(buf: &[u8], max: usize) -> Result<Vec<std::ops::Range<usize>>, FrameError> {
    let mut ranges = Vec::new();
    let mut start = 0;
    let used = split(buf, max, |record| {
        let end = start + 4 + record.len();
        ranges.push(start..end);
        start = end;
    })?;
    if used != buf.len() {
        let rest = &buf[used..];
        let missing = if rest.len() < 4 {
            4 - rest.len()
        } else {
            let mut len = [0u8; 4];
            len.copy_from_slice(&rest[..4]);
            u32::from_be_bytes(len) as usize + 4 - rest.len()
        };
        return Err(FrameError::Truncated { missing });
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_incomplete_frames_for_later() {
        let mut buf = Vec::new();
        encode(b"one", &mut buf);
        encode(b"", &mut buf);
        encode(b"three", &mut buf);
        let whole = buf.len();
        buf.extend_from_slice(&[0, 0, 0, 9, b'x']);
        let mut seen = Vec::new();
        let used = split(&buf, 100, |r| seen.push(r.to_vec())).unwrap_or(0);
        assert_eq!(used, whole);
        assert_eq!(seen, vec![b"one".to_vec(), vec![], b"three".to_vec()]);
        assert_eq!(split(&buf[..3], 100, |_| panic!("no frame")), Ok(0));
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut buf = Vec::new();
        encode(&[7u8; 10], &mut buf);
        assert_eq!(
            split(&buf, 9, |_| {}),
            Err(FrameError::TooLarge { len: 10, max: 9 })
        );
        assert_eq!(frames(&buf, 10).map(|r| r.len()), Ok(1));
        assert_eq!(
            frames(&buf[..8], 10),
            Err(FrameError::Truncated { missing: 6 })
        );
        assert_eq!(
            frames(&buf[..2], 10),
            Err(FrameError::Truncated { missing: 2 })
        );
    }
}
