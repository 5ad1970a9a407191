//! Content negotiation shared by the compression layer and static files: what a request's
//! `Accept-Encoding` says about the codings canter produces (RFC 9110 §12.5.3).

use crate::middleware::Coding;

/// A weight in thousandths (RFC 9110 §12.4.2: at most three decimals), 0 to 1000.
pub(crate) type Weight = u16;

/// What a request's `Accept-Encoding` fields say about the codings this layer knows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AcceptEncoding {
    pub(crate) gzip: Option<Weight>,
    pub(crate) brotli: Option<Weight>,
    pub(crate) zstd: Option<Weight>,
    pub(crate) identity: Option<Weight>,
    /// `*`: any coding not listed.
    pub(crate) any: Option<Weight>,
}

impl AcceptEncoding {
    /// Parses every `Accept-Encoding` field value of a request, as one list. `None` if there
    /// is none. Malformed elements are skipped (a client's typo should cost it compression,
    /// not the response); the first of duplicate entries counts.
    pub(crate) fn parse<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<AcceptEncoding> {
        let mut accept = None;
        for value in values {
            let accept = accept.get_or_insert_with(AcceptEncoding::default);
            for element in value.split(|&b| b == b',') {
                let mut parts = element.split(|&b| b == b';');
                let coding = parts.next().unwrap_or_default().trim_ascii();
                if coding.is_empty() {
                    continue; // empty list elements are allowed (RFC 9110 §5.6.1)
                }
                let Some(weight) = parse_weight(parts) else {
                    continue;
                };
                let slot = if coding.eq_ignore_ascii_case(b"gzip")
                    || coding.eq_ignore_ascii_case(b"x-gzip")
                {
                    &mut accept.gzip
                } else if coding.eq_ignore_ascii_case(b"br") {
                    &mut accept.brotli
                } else if coding.eq_ignore_ascii_case(b"zstd") {
                    &mut accept.zstd
                } else if coding.eq_ignore_ascii_case(b"identity") {
                    &mut accept.identity
                } else if coding == b"*" {
                    &mut accept.any
                } else {
                    continue;
                };
                slot.get_or_insert(weight);
            }
        }
        accept
    }

    /// The weight the client gives `coding`.
    pub(crate) fn weight(&self, coding: Coding) -> Weight {
        let listed = match coding {
            Coding::Gzip => self.gzip,
            Coding::Brotli => self.brotli,
            Coding::Zstd => self.zstd,
        };
        listed.or(self.any).unwrap_or(0)
    }

    /// The coding to use among `offered` (most preferred first), or `None` for none.
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    pub(crate) fn choose(&self, offered: &[Coding]) -> Option<Coding> {
        let mut best: Option<(Coding, Weight)> = None;
        for &coding in offered {
            let weight = self.weight(coding);
            if weight > 0 && best.is_none_or(|(_, w)| weight > w) {
                best = Some((coding, weight));
            }
        }
        let (coding, weight) = best?;
        // Identity is always acceptable unless refused; it wins only when the client weights
        // it higher than the best coding (listed, or through `*`).
        match self.identity.or(self.any) {
            Some(identity) if identity > weight => None,
            _ => Some(coding),
        }
    }
}

/// The weight among an element's parameters (`q=0.5`); 1 without one, `None` if malformed.
fn parse_weight<'a>(params: impl Iterator<Item = &'a [u8]>) -> Option<Weight> {
    let mut weight = 1000;
    for param in params {
        let param = param.trim_ascii();
        let (name, value) = match param.iter().position(|&b| b == b'=') {
            Some(i) => (param[..i].trim_ascii(), param[i + 1..].trim_ascii()),
            None => (param, &b""[..]),
        };
        if name.eq_ignore_ascii_case(b"q") {
            weight = parse_qvalue(value)?;
        }
    }
    Some(weight)
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
pub(crate) fn parse_qvalue(v: &[u8]) -> Option<Weight> {
    let (&first, rest) = v.split_first()?;
    let decimals = match rest {
        [] => &[][..],
        [b'.', decimals @ ..] if decimals.len() <= 3 => decimals,
        _ => return None,
    };
    let mut thousandths: Weight = 0;
    let mut scale = 100;
    for &d in decimals {
        if !d.is_ascii_digit() {
            return None;
        }
        thousandths += Weight::from(d - b'0') * scale;
        scale /= 10;
    }
    match first {
        b'0' => Some(thousandths),
        b'1' if thousandths == 0 => Some(1000),
        _ => None,
    }
}
