//! The request head: parsing the request line and header section, and the framing rules of
//! RFC 9112 §6 that decide how the body is delimited.

use bytes::BytesMut;
use smallvec::SmallVec;

use canter_http::{
    alnum_and, BodyKind, HeadParts, Limits, Method, PathAndQuery, RequestHead, Span, Version, TCHAR,
};

use crate::error::{Error, Malformed};

/// `finish`'s flags: the client sent `Expect: 100-continue`; it asks to upgrade to h2c.
const EXPECT_CONTINUE: u8 = 1;
const H2C_UPGRADE: u8 = 2;

fn ascii(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: only called on spans `scan` validated as ASCII (tokens, the target), and ASCII is
    // valid UTF-8.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// Parses one request head from the front of `buf`. On success the head's bytes are split off
/// `buf` (zero-copy); `Ok(None)` means more bytes are needed.
///
/// The outcome never depends on how the bytes were split into reads: every byte is judged by the
/// bytes before it only, and a limit is reported at the byte that exceeds it (a syntax error
/// further on would not have been seen yet had the bytes arrived one at a time).
pub(crate) fn parse(
    buf: &mut BytesMut,
    limits: &Limits,
    host_cache: &mut HostCache,
) -> Result<Option<RequestHead>, Error> {
    // Spans are 16-bit offsets into the head: the head limit is capped to fit.
    let max_head = limits.max_head().min(Limits::HEAD_CAP);
    let window = buf.len().min(max_head);
    let max_headers = limits.max_headers().min(Limits::HEADER_COUNT_CAP);
    let mut headers = SmallVec::new();
    let base: &[u8] = buf;
    let line = match scan(
        &base[..window],
        limits.max_target(),
        max_headers,
        &mut headers,
    )? {
        Some(line) => line,
        None if buf.len() >= max_head => return Err(Error::HeadersTooLarge),
        None => return Ok(None),
    };
    let target = ascii(line.target.get(base));
    let method_kind = line.kind;
    let path = match origin_part(method_kind, target)? {
        Origin::Slice(p) => PathAndQuery::Span(Span::of(base, p.as_bytes())),
        Origin::Root { query } => PathAndQuery::Owned(format!("/{query}").into_boxed_str()),
    };
    let mut framing = Framing::default();
    for (name, value) in &headers {
        framing.field(ascii(name.get(base)), value.get(base), host_cache)?;
    }
    let version = line.version;
    let (body, keep_alive, flags) = framing.finish(version, limits)?;
    let path_len = match (&path, line.query) {
        // The path ends the target, so the target's first `?` is the path's if it is in it.
        (PathAndQuery::Span(span), None) => span.len,
        (PathAndQuery::Span(span), Some(q)) if q >= usize::from(span.start) => {
            (q - usize::from(span.start)) as u16
        }
        // A `?` before the path (not produced by `origin_part`, whose authority ends at the
        // first `?`): look in the path itself.
        (PathAndQuery::Span(span), Some(_)) => {
            let pq = span.get(base);
            pq.iter().position(|&b| b == b'?').unwrap_or(pq.len()) as u16
        }
        (PathAndQuery::Owned(pq), _) => pq.find('?').unwrap_or(pq.len()) as u16,
    };
    let parts = HeadParts {
        buf: buf.split_to(line.len).freeze(),
        method: method_kind,
        method_span: line.method,
        target: line.target,
        path,
        path_len,
        version,
        headers,
        body,
        keep_alive,
        expect_continue: flags & EXPECT_CONTINUE != 0,
        h2c_upgrade: flags & H2C_UPGRADE != 0,
    };
    // SAFETY: every span comes from `scan` and `origin_part` over the head's bytes, which are
    // `parts.buf` (split off unchanged); `scan` validated the method and field names as tokens
    // and the target byte by byte, all ASCII.
    Ok(Some(unsafe { RequestHead::from_parts(parts) }))
}

/// The request line of a complete head and the head's length.
struct Line {
    method: Span,
    kind: Method,
    target: Span,
    /// Where the first `?` of the target is, if it has one.
    query: Option<usize>,
    version: Version,
    len: usize,
}

/// Scans a head: the request line and every field line up to the empty line, recording where
/// the parts are (`headers` gets the name and value of each field, the value without the
/// whitespace around it). `Ok(None)`: `buf` ends before the head does, with no error so far.
///
/// Strict by construction (RFC 9112 §2-5): CRLF line endings only (a bare LF or CR is a 400:
/// servers that disagree about line ends are a request-smuggling lever), single spaces in the
/// request line, a token method, a target of visible ASCII only (bytes above 0x7f must be
/// percent-encoded), `HTTP/1.0` or `HTTP/1.1` (`HTTP/1.2` to `HTTP/1.9` are read as 1.1; any
/// other well-formed `HTTP/d.d` is a 505), token field names with no whitespace before the colon,
/// no obs-fold, no control bytes in values (HTAB and obs-text allowed). Empty lines before the request line are skipped (§2.2).
fn scan(
    buf: &[u8],
    max_target: usize,
    max_headers: usize,
    headers: &mut SmallVec<[(Span, Span); 12]>,
) -> Result<Option<Line>, Error> {
    let bare_lf = Error::Malformed(Malformed::BareLf);
    let bad_end = Error::Malformed(Malformed::LineEnding);
    let mut i = 0;
    loop {
        match buf.get(i) {
            None => return Ok(None),
            Some(b'\r') => match buf.get(i + 1) {
                None => return Ok(None),
                Some(b'\n') => i += 2,
                Some(_) => return Err(bad_end),
            },
            Some(b'\n') => return Err(bare_lf),
            Some(_) => break,
        }
    }

    // `GET ` with one compare: the usual method skips the token scan and its lookup.
    let (method, kind) = if buf.get(i..i + 4) == Some(b"GET ") {
        (Span::new(i, i + 3), Method::Get)
    } else {
        let Some(method) = token_until(buf, i, b' ', Malformed::Method)? else {
            return Ok(None);
        };
        (method, Method::from_token(ascii(method.get(buf))))
    };
    i = method.end() + 1;

    let start = i;
    let query;
    (i, query) = skip_target(buf, i);
    // Every byte before `i` is valid: if there are more than `max_target` of them, the limit was
    // exceeded by a valid byte, before any invalid one.
    if i - start > max_target {
        return Err(Error::UriTooLong);
    }
    match buf.get(i) {
        None => return Ok(None),
        Some(b' ') if i > start => {}
        Some(_) => return Err(Error::Malformed(Malformed::TargetByte)),
    }
    let target = Span::new(start, i);
    i += 1;

    const HTTP1: &[u8] = b"HTTP/1.";
    // One 8-byte compare in the usual case; byte by byte only when the version is not all here
    // yet or is not 1.0 or 1.1.
    let version = match word(buf, i) {
        Some(w) if w == u64::from_le_bytes(*b"HTTP/1.1") => Version::Http11,
        Some(w) if w == u64::from_le_bytes(*b"HTTP/1.0") => Version::Http10,
        Some(w) => match higher_minor(w) {
            Some(version) => version,
            None => return version_error(buf).map_or(Ok(None), Err),
        },
        None => {
            let rest = buf.get(i..).unwrap_or_default();
            if !HTTP1.starts_with(rest) {
                return version_error(buf).map_or(Ok(None), Err);
            }
            return Ok(None);
        }
    };
    i += HTTP1.len() + 1;
    match buf.get(i) {
        None => return Ok(None),
        Some(b'\r') => {}
        Some(b'\n') => return Err(bare_lf),
        Some(_) => return Err(Error::Malformed(Malformed::Version)),
    }

    // `i` is at the CR ending the previous line.
    loop {
        match buf.get(i + 1) {
            None => return Ok(None),
            Some(b'\n') => i += 2,
            Some(_) => return Err(bad_end),
        }
        match buf.get(i) {
            None => return Ok(None),
            Some(b'\r') => match buf.get(i + 1) {
                None => return Ok(None),
                Some(b'\n') => {
                    return Ok(Some(Line {
                        method,
                        kind,
                        target,
                        query,
                        version,
                        len: i + 2,
                    }))
                }
                Some(_) => return Err(bad_end),
            },
            Some(b'\n') => return Err(bare_lf),
            Some(_) if headers.len() >= max_headers => return Err(Error::HeadersTooLarge),
            Some(_) => {}
        }
        let Some(name) = token_until(buf, i, b':', Malformed::HeaderName)? else {
            return Ok(None);
        };
        i = name.end() + 1;
        while matches!(buf.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        let start = i;
        i = skip_value(buf, i);
        match buf.get(i) {
            None => return Ok(None),
            Some(b'\r') => {}
            Some(b'\n') => return Err(bare_lf),
            Some(_) => return Err(Error::Malformed(Malformed::HeaderValue)),
        }
        let mut end = i;
        while end > start && matches!(buf[end - 1], b' ' | b'\t') {
            end -= 1;
        }
        headers.push((name, Span::new(start, end)));
    }
}

/// The non-empty token starting at `i` and ended by `delim`; `Ok(None)` if `buf` ends first, a
/// 400 saying `what` if another byte ends it (or nothing precedes `delim`).
#[inline(always)]
fn token_until(buf: &[u8], i: usize, delim: u8, what: Malformed) -> Result<Option<Span>, Error> {
    let end = skip_tokens(buf, i);
    match buf.get(end) {
        None => Ok(None),
        Some(&b) if b == delim && end > i => Ok(Some(Span::new(i, end))),
        Some(_) => Err(Error::Malformed(what)),
    }
}

/// The index of the first byte at or after `i` that is not a token character (or `buf.len()`).
#[inline]
fn skip_tokens(buf: &[u8], i: usize) -> usize {
    let rest = buf.get(i..).unwrap_or_default();
    i + rest
        .iter()
        .position(|&b| !TCHAR[b as usize])
        .unwrap_or(rest.len())
}

/// Eight bytes of `buf` from `i` as a little-endian word (byte `i` lowest), if there are eight.
#[inline]
fn word(buf: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(i..i + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

/// Per byte of `w`: the high bit set where the byte is below `n` (for `n` <= 0x80; bytes of 0x80
/// and above count as not below). Carry-free: every byte is masked to seven bits first.
#[inline]
fn below(w: u64, n: u8) -> u64 {
    let low7 = w & !HIGH;
    !(low7 + ONES * u64::from(0x80 - n)) & !w & HIGH
}

/// Per byte of `w`: the high bit set where the byte is DEL (0x7f).
#[inline]
fn is_del(w: u64) -> u64 {
    ((w & !HIGH) + ONES) & !w & HIGH
}

/// The index of the first byte at or after `i` that cannot be in a request target (anything but
/// visible ASCII, 0x21..=0x7e, and `#`: RFC 9112's targets carry no fragment), or `buf.len()`;
/// and the index of the first `?` before it, if any (where the query starts, found in the same
/// pass). Sixteen bytes per step while they are all valid, then eight.
#[inline]
fn skip_target(buf: &[u8], mut i: usize) -> (usize, Option<usize>) {
    const QUESTION: u64 = ONES * b'?' as u64;
    const HASH: u64 = ONES * b'#' as u64;
    let mut query = None;
    #[cfg(target_arch = "x86_64")]
    while let Some(block) = block16(buf, i) {
        let (bad, q) = sse2::target(block);
        if query.is_none() && q != 0 {
            query = Some(i + q.trailing_zeros() as usize);
        }
        if bad != 0 {
            let end = i + bad.trailing_zeros() as usize;
            return (end, query.filter(|&q| q < end));
        }
        i += 16;
    }
    while let Some(w) = word(buf, i) {
        let bad = below(w, 0x21) | is_del(w) | (w & HIGH) | below(w ^ HASH, 1);
        if query.is_none() {
            let q = below(w ^ QUESTION, 1);
            if q != 0 {
                query = Some(i + (q.trailing_zeros() / 8) as usize);
            }
        }
        if bad != 0 {
            let end = i + (bad.trailing_zeros() / 8) as usize;
            return (end, query.filter(|&q| q < end));
        }
        i += 8;
    }
    let rest = buf.get(i..).unwrap_or_default();
    let end = i + rest
        .iter()
        .position(|&b| !(0x21..0x7f).contains(&b) || b == b'#')
        .unwrap_or(rest.len());
    let query = query.or_else(|| {
        let tail = buf.get(i..end).unwrap_or_default();
        tail.iter().position(|&b| b == b'?').map(|q| i + q)
    });
    (end, query)
}

/// The index of the first byte at or after `i` that cannot be in a field value (RFC 9110 §5.5:
/// controls other than HTAB, and DEL; obs-text is allowed), or `buf.len()`. Sixteen, then eight
/// bytes per step while none is below 0x20 or DEL; a tab only slows its block down.
#[inline(always)]
fn skip_value(buf: &[u8], mut i: usize) -> usize {
    loop {
        'suspect: {
            #[cfg(target_arch = "x86_64")]
            while let Some(block) = block16(buf, i) {
                let suspect = sse2::value_suspects(block);
                if suspect != 0 {
                    i += suspect.trailing_zeros() as usize;
                    break 'suspect;
                }
                i += 16;
            }
            while let Some(w) = word(buf, i) {
                let suspect = below(w, 0x20) | is_del(w);
                if suspect != 0 {
                    i += (suspect.trailing_zeros() / 8) as usize;
                    break 'suspect;
                }
                i += 8;
            }
        }
        match buf.get(i) {
            Some(b'\t') => i += 1,
            Some(&b) if b >= 0x20 && b != 0x7f => i += 1,
            _ => return i,
        }
    }
}

/// Sixteen bytes of `buf` from `i`, if there are sixteen.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block16(buf: &[u8], i: usize) -> Option<&[u8; 16]> {
    buf.get(i..i + 16)?.try_into().ok()
}

/// The scanners' sixteen-byte steps, in SSE2 (part of every x86-64 CPU): one compare per class
/// of byte for the whole block, and a bit per byte in the result (bit `k` for byte `k`).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8,
        _mm_or_si128, _mm_set1_epi8,
    };

    #[inline(always)]
    fn load(block: &[u8; 16]) -> __m128i {
        // SAFETY: `block` is 16 readable bytes, and an unaligned load needs no alignment.
        unsafe { _mm_loadu_si128(block.as_ptr().cast()) }
    }

    /// Bytes that cannot be in a target (outside 0x21..=0x7e, and `#`), and the `?` bytes.
    #[inline(always)]
    pub(super) fn target(block: &[u8; 16]) -> (u32, u32) {
        let v = load(block);
        // SAFETY: SSE2 is part of the x86-64 baseline, enabled for every x86_64 target; these
        // operate on registers only.
        unsafe {
            // A signed compare: bytes 0x80 and above are negative, so "below 0x21" too.
            let low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x21));
            let del = _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f));
            let hash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'#' as i8));
            let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'?' as i8));
            (
                _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(low, del), hash)) as u32,
                _mm_movemask_epi8(q) as u32,
            )
        }
    }

    /// Bytes below 0x20 (HTAB included: the caller looks at those one by one) and DEL.
    #[inline(always)]
    pub(super) fn value_suspects(block: &[u8; 16]) -> u32 {
        let v = load(block);
        // SAFETY: as in `target`.
        unsafe {
            // Unsigned `v >= 0x20`: the byte is its own maximum with 0x20.
            let high = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x20)), v);
            let del = _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f));
            (!_mm_movemask_epi8(high) | _mm_movemask_epi8(del)) as u32 & 0xffff
        }
    }
}

/// Length of the empty lines before the request line.
fn empty_lines(buf: &[u8]) -> usize {
    let mut i = 0;
    loop {
        match &buf[i..] {
            [b'\r', b'\n', ..] => i += 2,
            [b'\n', ..] => i += 1,
            _ => return i,
        }
    }
}

/// `HTTP/1.2` to `HTTP/1.9`, read as 1.1: RFC 9110 §2.5 has a recipient process a higher minor
/// version as the highest it conforms to. Out of line: 1.0 and 1.1 are matched before it.
#[cold]
#[inline(never)]
fn higher_minor(w: u64) -> Option<Version> {
    let [h, t, t2, p, s, one, dot, minor] = w.to_le_bytes();
    (&[h, t, t2, p, s, one, dot] == b"HTTP/1." && (b'2'..=b'9').contains(&minor))
        .then_some(Version::Http11)
}

/// `scan` accepted `method SP target SP` and then found a version other than HTTP/1.0 to 1.9. A
/// well-formed `HTTP/d.d` we do not speak is a 505 (RFC 9110 §15.6.6), anything else a 400.
/// `None`: the line is still open and may yet become `HTTP/d.d`, so wait for more bytes
/// (otherwise the answer would depend on where the reads were split).
fn version_error(buf: &[u8]) -> Option<Error> {
    let line = &buf[empty_lines(buf)..];
    let (line, complete) = match line.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(end) => (&line[..end], true),
        None => (line, false),
    };
    let mut parts = line.splitn(3, |&b| b == b' ');
    let version = match (parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(_), Some(version)) => version,
        _ => return Some(Error::Malformed(Malformed::RequestLine)),
    };
    let shape = b"HTTP/#.#";
    let fits = version.len() <= shape.len()
        && version.iter().zip(shape).all(|(&b, &s)| match s {
            b'#' => b.is_ascii_digit(),
            _ => b == s,
        });
    match (fits, complete) {
        (true, true) if version.len() == shape.len() => Some(Error::VersionNotSupported),
        (true, false) => None,
        _ => Some(Error::Malformed(Malformed::Version)),
    }
}

/// The origin-form part of a target.
enum Origin<'a> {
    /// A slice of the target: the target itself for origin-form, `*` and authority-form, the path
    /// and query after the authority for absolute-form.
    Slice(&'a str),
    /// Absolute-form with an empty path, which means "/" (RFC 9112 §3.2.2), and this query
    /// (empty, or starting with `?`).
    Root { query: &'a str },
}

/// The origin-form part of a target: the target itself for origin-form, the path after the
/// authority for absolute-form, `*` or the authority for the special forms (RFC 9112 §3.2).
fn origin_part(method: Method, target: &str) -> Result<Origin<'_>, Error> {
    // `scan` accepted visible ASCII only: no controls, space, DEL or bytes above 0x7f.
    if method == Method::Connect {
        // RFC 9110 §9.3.6: only authority-form, and the port is mandatory.
        return match authority(target.as_bytes()) {
            Some((host, Some(port))) if !host.is_empty() && !port.is_empty() => {
                Ok(Origin::Slice(target))
            }
            _ => Err(Error::Malformed(Malformed::ConnectTarget)),
        };
    }
    if target.starts_with('/') {
        return Ok(Origin::Slice(target));
    }
    if target == "*" && method == Method::Options {
        return Ok(Origin::Slice(target));
    }
    let lower_scheme = target.get(..8).map(|s| s.to_ascii_lowercase());
    let rest = match lower_scheme.as_deref() {
        Some(s) if s.starts_with("http://") => &target[7..],
        Some("https://") => &target[8..],
        _ => return Err(Error::Malformed(Malformed::Target)),
    };
    let path_start = rest.find(['/', '?']).unwrap_or(rest.len());
    // RFC 9110 §4.2.1/§4.2.4: an http(s) URI needs a host, and userinfo is an error.
    match authority(&rest.as_bytes()[..path_start]) {
        Some((host, _)) if !host.is_empty() => {}
        _ => return Err(Error::Malformed(Malformed::AbsoluteAuthority)),
    }
    let path = &rest[path_start..];
    Ok(if path.is_empty() || path.starts_with('?') {
        Origin::Root { query: path }
    } else {
        Origin::Slice(path)
    })
}

/// Splits `uri-host [ ":" port ]` (RFC 3986 §3.2.2-3.2.3): a bracketed IP literal or a reg-name /
/// IPv4 address, then an optional port of digits. `None` if malformed (including userinfo).
fn authority(a: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let host_end = if a.first() == Some(&b'[') {
        let close = a.iter().position(|&b| b == b']')?;
        if !a[1..close]
            .iter()
            .all(|&b| b == b':' || is_reg_name_char(b))
        {
            return None;
        }
        close + 1
    } else {
        // One pass: reg-name bytes up to the first other byte, which may only be the ':'.
        match a.iter().position(|&b| !is_reg_name_char(b)) {
            None => a.len(),
            Some(i) if a[i] == b':' => i,
            Some(_) => return None,
        }
    };
    let (host, rest) = a.split_at(host_end);
    match rest {
        [] => Some((host, None)),
        [b':', port @ ..] if port.iter().all(u8::is_ascii_digit) => Some((host, Some(port))),
        _ => None,
    }
}

/// unreserved / pct-encoded / sub-delims (RFC 3986 §3.2.2 reg-name; `%` is not checked further).
fn is_reg_name_char(b: u8) -> bool {
    REG_NAME[b as usize]
}

static REG_NAME: [bool; 256] = alnum_and(b"-._~%!$&'()*+,;=");

/// The last Host value a connection found valid. Clients send the same Host on every request of
/// a connection, so an equal value needs no second look.
#[derive(Debug, Clone)]
pub(crate) struct HostCache {
    len: u8,
    bytes: [u8; HostCache::MAX],
}

impl Default for HostCache {
    fn default() -> HostCache {
        HostCache {
            len: 0,
            bytes: [0; HostCache::MAX],
        }
    }
}

impl HostCache {
    /// Longer values are validated every time.
    const MAX: usize = 48;

    /// Whether `value` is a valid Host field value (`uri-host [ ":" port ]`).
    fn valid(&mut self, value: &[u8]) -> bool {
        if eq_bytes(&self.bytes[..usize::from(self.len)], value) {
            return true;
        }
        let ok = authority(value).is_some();
        if let (true, Some(slot)) = (ok, self.bytes.get_mut(..value.len())) {
            slot.copy_from_slice(value);
            self.len = value.len() as u8;
        }
        ok
    }
}

/// Byte-slice equality compared eight bytes at a time, inlined: for the short keys of the
/// request path (a Host value, a route path) a call to `memcmp` costs more than the compare.
#[inline]
pub(crate) fn eq_bytes(a: &[u8], b: &[u8]) -> bool {
    eq_with_bits(a, b, 0)
}

/// Whether `token` equals `lower` ignoring ASCII case, where `token` was validated as a token
/// and `lower` is lowercase letters, digits and `-` only (a field name we act on). Compared a
/// word at a time with the case bit (0x20) set in every byte of `token`: within token bytes
/// only the two cases of a letter, and only a digit or `-` itself, map to those bytes (0x0d
/// would map to `-` and 0x10–0x19 to digits, but control bytes are not token bytes).
#[inline]
fn token_is(token: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower
        .iter()
        .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    eq_with_bits(token, lower, 0x20)
}

/// Whether `a`, with the bits of `set` set in each of its bytes, equals `b`: eight bytes at a
/// time, the last word overlapping the one before.
#[inline(always)]
fn eq_with_bits(a: &[u8], b: &[u8], set: u8) -> bool {
    let set64 = u64::from_ne_bytes([set; 8]);
    let set32 = u32::from_ne_bytes([set; 4]);
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word(a, at).map(|w| w | set64) != word(b, at) {
                return false;
            }
            at += 8;
        }
        return word(a, n - 8).map(|w| w | set64) == word(b, n - 8);
    }
    if n >= 4 {
        return half(a, 0).map(|w| w | set32) == half(b, 0)
            && half(a, n - 4).map(|w| w | set32) == half(b, n - 4);
    }
    a.iter().zip(b).all(|(&x, &y)| x | set == y)
}

/// The four bytes at `i`, little-endian.
#[inline]
fn half(buf: &[u8], i: usize) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(i..i + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// Accumulates the header fields that decide framing and connection management.
#[derive(Default)]
struct Framing {
    content_length: Option<u64>,
    transfer_encoding: bool,
    chunked_last: bool,
    chunked_seen: bool,
    other_coding: bool,
    hosts: u32,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    /// What an h2c upgrade needs, one bit each: `Upgrade` lists `h2c` (`H2C_TOKEN`),
    /// `Connection` lists `upgrade` (`H2C_CONNECTION`), `HTTP2-Settings` is present
    /// (`H2C_SETTINGS`). One byte, not three flags: cheaper to clear and to test.
    h2c: u8,
}

const H2C_TOKEN: u8 = 1;
const H2C_CONNECTION: u8 = 2;
const H2C_SETTINGS: u8 = 4;

impl Framing {
    fn field(&mut self, name: &str, value: &[u8], host_cache: &mut HostCache) -> Result<(), Error> {
        // Dispatch on length first: most fields match none of these, at the cost of one compare.
        let is = |known: &str| token_is(name.as_bytes(), known.as_bytes());
        match name.len() {
            14 if is("content-length") => {
                // One Content-Length line with one value: a repeated line is refused like a
                // list (`5, 5`), equal values or not, as nginx does (RFC 9110 §8.6 allows it).
                let n = parse_content_length(value)?;
                if self.content_length.is_some() {
                    return Err(Error::Malformed(Malformed::ConflictingContentLength));
                }
                self.content_length = Some(n);
            }
            17 if is("transfer-encoding") => {
                self.transfer_encoding = true;
                for coding in list(value) {
                    let chunked = coding.eq_ignore_ascii_case(b"chunked");
                    if chunked && self.chunked_seen {
                        return Err(Error::Malformed(Malformed::ChunkedTwice));
                    }
                    self.chunked_seen |= chunked;
                    self.other_coding |= !chunked;
                    self.chunked_last = chunked;
                }
            }
            4 if is("host") => {
                // RFC 9112 §3.2: a Host with an invalid field value is a 400.
                if !host_cache.valid(value) {
                    return Err(Error::Malformed(Malformed::Host));
                }
                self.hosts += 1;
            }
            10 if is("connection") => {
                for token in list(value) {
                    self.close |= token.eq_ignore_ascii_case(b"close");
                    self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                    if token.eq_ignore_ascii_case(b"upgrade") {
                        self.h2c |= H2C_CONNECTION;
                    }
                }
            }
            7 if is("upgrade") => {
                let h2c = list(value).any(|t| t.eq_ignore_ascii_case(b"h2c"));
                self.h2c |= u8::from(h2c) * H2C_TOKEN;
            }
            14 if is("http2-settings") => self.h2c |= H2C_SETTINGS,
            6 if is("expect") => {
                if !trim(value).eq_ignore_ascii_case(b"100-continue") {
                    return Err(Error::ExpectationFailed);
                }
                self.expect_continue = true;
            }
            _ => {}
        }
        Ok(())
    }

    /// The body's framing, whether the connection stays open, and the head's flags (both
    /// flags are HTTP/1.1 only).
    fn finish(&self, version: Version, limits: &Limits) -> Result<(BodyKind, bool, u8), Error> {
        if version == Version::Http11 && self.hosts != 1 {
            return Err(Error::Malformed(Malformed::HostMissing));
        }
        if self.hosts > 1 {
            return Err(Error::Malformed(Malformed::HostRepeated));
        }
        let body = if self.transfer_encoding {
            if self.content_length.is_some() {
                return Err(Error::Malformed(Malformed::LengthAndChunked));
            }
            if version == Version::Http10 {
                return Err(Error::Malformed(Malformed::TransferEncodingInHttp10));
            }
            if !self.chunked_last {
                return Err(Error::Malformed(Malformed::FinalCodingNotChunked));
            }
            if self.other_coding {
                return Err(Error::UnsupportedTransferCoding);
            }
            BodyKind::Chunked
        } else {
            let n = self.content_length.unwrap_or(0);
            if n > limits.max_body() {
                return Err(Error::BodyTooLarge);
            }
            BodyKind::Length(n)
        };
        let (keep_alive, flags) = match version {
            Version::Http10 => (self.keep_alive && !self.close, 0),
            _ => {
                let h2c = self.h2c == H2C_TOKEN | H2C_CONNECTION | H2C_SETTINGS;
                let flags = (u8::from(self.expect_continue) * EXPECT_CONTINUE)
                    | (u8::from(h2c) * H2C_UPGRADE);
                (!self.close, flags)
            }
        };
        Ok((body, keep_alive, flags))
    }
}

/// Content-Length = 1*DIGIT, bounded so the value fits in a u64.
fn parse_content_length(value: &[u8]) -> Result<u64, Error> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(Error::Malformed(Malformed::ContentLength));
    }
    Ok(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Elements of a comma-separated list with optional whitespace; empty elements are skipped.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|e| !e.is_empty())
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scanners (sixteen, then eight bytes at a time) agree with a byte-at-a-time definition
    /// for every byte value at every position of a block or word, in every alignment and at the
    /// tail.
    #[test]
    fn scanners_agree_with_bytewise() {
        let target_ok = |b: u8| (0x21..0x7f).contains(&b) && b != b'#';
        let value_ok = |b: u8| b == b'\t' || (b >= 0x20 && b != 0x7f);
        for b in 0..=255u8 {
            for len in [1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40] {
                for at in 0..len {
                    for from in [0, 1, 3] {
                        if from > at {
                            continue;
                        }
                        let mut buf = vec![b'a'; len];
                        buf[at] = b;
                        let naive = |ok: &dyn Fn(u8) -> bool| {
                            from + buf[from..]
                                .iter()
                                .position(|&x| !ok(x))
                                .unwrap_or(len - from)
                        };
                        let (end, query) = skip_target(&buf, from);
                        assert_eq!(end, naive(&target_ok), "target {b:#x} at {at}/{len}");
                        let first_q = buf[from..end].iter().position(|&x| x == b'?');
                        assert_eq!(
                            query,
                            first_q.map(|q| from + q),
                            "query {b:#x} at {at}/{len}"
                        );
                        assert_eq!(
                            skip_value(&buf, from),
                            naive(&value_ok),
                            "value {b:#x} at {at}/{len}"
                        );
                        assert_eq!(
                            skip_tokens(&buf, from),
                            naive(&|x| TCHAR[x as usize]),
                            "token {b:#x} at {at}/{len}"
                        );
                    }
                }
            }
        }
    }

    /// `token_is` agrees with `eq_ignore_ascii_case` for every name it is used with, with any
    /// token byte in any position.
    #[test]
    fn token_is_matches_case_insensitive_equality_for_tokens() {
        let names = [
            "host",
            "expect",
            "connection",
            "content-length",
            "transfer-encoding",
        ];
        // Every token byte in every position of every name, in both cases where it has them.
        let tchars: Vec<u8> = (0..=255u8).filter(|&b| TCHAR[b as usize]).collect();
        for name in names {
            let lower = name.as_bytes();
            assert!(token_is(name.to_ascii_uppercase().as_bytes(), lower));
            for at in 0..lower.len() {
                for &b in &tchars {
                    let mut token = lower.to_vec();
                    token[at] = b;
                    assert_eq!(
                        token_is(&token, lower),
                        token.eq_ignore_ascii_case(lower),
                        "{name} with {:?} at {at}",
                        b as char
                    );
                }
            }
            assert!(!token_is(&lower[1..], lower));
        }
    }

    /// `eq_bytes` agrees with `==` at every length, for equal slices and for slices differing
    /// in any one byte, and for slices of different lengths.
    #[test]
    fn eq_bytes_is_slice_equality() {
        let a: Vec<u8> = (0..40u8)
            .map(|b| b.wrapping_mul(73).wrapping_add(5))
            .collect();
        for n in 0..=a.len() {
            let x = &a[..n];
            // A copy elsewhere in memory: equality of contents, not of addresses.
            let copy = x.to_vec();
            assert!(eq_bytes(x, &copy), "length {n}");
            for i in 0..n {
                let mut y = x.to_vec();
                y[i] ^= 0x20;
                assert!(!eq_bytes(x, &y), "length {n}, byte {i}");
            }
            if n > 0 {
                assert!(!eq_bytes(x, &a[..n - 1]));
                assert!(!eq_bytes(&x[..n - 1], x));
            }
        }
    }

    #[test]
    fn host_cache_remembers_only_valid_values() {
        let mut cache = HostCache::default();
        assert!(cache.valid(b"example.com:80"));
        assert!(cache.valid(b"example.com:80"));
        assert!(!cache.valid(b"example.com:8x"));
        assert!(!cache.valid(b"a b"));
        assert!(cache.valid(b"example.com:80"));
        assert!(cache.valid(b""));
        assert!(!cache.valid(b"u@h"));
        let long = [b'a'; 49];
        assert!(cache.valid(&long));
        assert!(!cache.valid(b"h/p"));
    }

    #[test]
    fn scanners_stop_at_the_end() {
        assert_eq!(skip_target(b"", 0), (0, None));
        // The first `?` only, and none past the end of the target.
        assert_eq!(skip_target(b"/a?b?c d?", 0), (6, Some(2)));
        assert_eq!(skip_target(b"/abcdefgh?x/yz?", 0), (15, Some(9)));
        assert_eq!(skip_target(b"/abcdefg ?", 0), (8, None));
        assert_eq!(skip_target(b"/abcdefghijk ?", 0), (12, None));
        assert_eq!(skip_value(b"abc", 3), 3);
        assert_eq!(skip_tokens(b"abc", 5), 5);
        assert_eq!(skip_value(b"a\tb\tc\td\te\tf\tg\th\t\x01", 0), 16);
    }
}
