//! UTF-8 validated as it arrives: a text message is refused at its first invalid byte, in
//! whichever fragment it comes, not once the whole message is in (RFC 6455, Section 8.1).

/// The state of a validation that may stop inside a character.
#[derive(Debug, Clone, Default)]
pub struct Utf8 {
    /// The start of a character the last piece ended inside (at most 3 bytes).
    pending: [u8; 4],
    len: usize,
}

/// The bytes are not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidUtf8;

impl Utf8 {
    /// Validates the next piece. Fails as soon as a byte cannot continue valid UTF-8; a piece
    /// that ends inside a character is fine until [`Utf8::finish`].
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), InvalidUtf8> {
        // Complete the character the last piece ended inside, a byte at a time.
        while self.len > 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return Ok(());
            };
            self.pending[self.len] = b;
            self.len += 1;
            bytes = rest;
            match std::str::from_utf8(&self.pending[..self.len]) {
                Ok(_) => self.len = 0,
                Err(e) if e.error_len().is_some() => return Err(InvalidUtf8),
                Err(_) if self.len == 4 => return Err(InvalidUtf8),
                Err(_) => {}
            }
        }
        if bytes.is_ascii() {
            // Most text is ASCII: checked a word at a time, no character decoding.
            return Ok(());
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_some() => Err(InvalidUtf8),
            Err(e) => {
                // Ends inside a character: keep its first bytes for the next piece.
                let tail = &bytes[e.valid_up_to()..];
                self.pending[..tail.len()].copy_from_slice(tail);
                self.len = tail.len();
                Ok(())
            }
        }
    }

    /// The message is complete: fails if it ended inside a character.
    pub fn finish(&mut self) -> Result<(), InvalidUtf8> {
        let complete = self.len == 0;
        self.len = 0;
        match complete {
            true => Ok(()),
            false => Err(InvalidUtf8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(bytes: &[u8], at: &[usize]) -> Result<(), InvalidUtf8> {
        let mut v = Utf8::default();
        let mut from = 0;
        for &to in at.iter().chain(std::iter::once(&bytes.len())) {
            v.feed(&bytes[from..to])?;
            from = to;
        }
        v.finish()
    }

    #[test]
    fn valid_text_passes_however_it_is_cut() {
        let text = "κόσμε – 😀 ok".as_bytes();
        for a in 0..=text.len() {
            for b in a..=text.len() {
                assert_eq!(pieces(text, &[a, b]), Ok(()), "cut at {a}, {b}");
            }
        }
    }

    #[test]
    fn invalid_text_fails_however_it_is_cut_and_at_its_first_bad_byte() {
        for bad in [
            &b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"[..], // a surrogate
            b"\xf4\x90\x80\x80",                                                    // past U+10FFFF
            b"\xc0\xaf",                                                            // overlong
            b"ab\xffcd",
            b"\xe2\x82", // cut short
        ] {
            for a in 0..=bad.len() {
                assert_eq!(pieces(bad, &[a]), Err(InvalidUtf8), "{bad:?} cut at {a}");
            }
        }
        // Fail fast: the piece with the bad byte fails, before the message ends.
        let mut v = Utf8::default();
        assert_eq!(v.feed(b"hello \xed"), Ok(()));
        assert_eq!(v.feed(b"\xa0"), Err(InvalidUtf8));
    }
}
