//! Response compression: gzip, br and zstd, negotiated from `Accept-Encoding` (RFC 9110
//! §12.5.3).
//!
//! What is compressed and how is documented on [`Compression`]; this file holds the layer,
//! the `Accept-Encoding` parser, one encoder per coding and the streaming wrapper.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use canter_rt::http::{header, HeaderValue, StatusCode};
use canter_rt::{Body, BodyStream, Reply, Request, Response};

use super::{Coding, Middleware, Next};
#[cfg(test)]
use crate::negotiate::parse_qvalue;
use crate::negotiate::AcceptEncoding;

/// Full bodies up to this many bytes are compressed in one go, when the response is built:
/// one allocation, no per-piece flush, and an exact Content-Length. Larger ones are compressed
/// while they are sent, so a slow client never makes the server hold a large compressed copy
/// and the work is spread over the connection's turns.
const ONE_SHOT_MAX: usize = 256 * 1024;

/// Input bytes compressed per step of a streamed body: bounds the work and the output of one
/// poll whatever the size of the pieces the inner stream hands out.
const STEP: usize = 64 * 1024;

/// The brotli and zstd window (log2 bytes) for a body of unknown length: 256 KiB instead of
/// their defaults of 4 and 2 MiB. A long stream (NDJSON, server-sent events) then keeps its
/// encoder near 1.1 MiB (measured after 4 MiB of input; 5.2 MiB for brotli and 2.9 MiB for
/// zstd with their default windows), for a small loss of ratio on data that repeats only
/// further apart.
const STREAM_WINDOW_LOG: u32 = 18;

/// The window for a body of known length, whose memory the body itself bounds: 1 MiB. Brotli
/// is up to twice as fast with it as with a smaller one on 64 KiB writes.
const KNOWN_WINDOW_LOG: u32 = 20;

/// Steps one poll may take without producing output before it yields to other connections.
const STEPS_PER_POLL: usize = 8;

/// Compresses responses with gzip, br or zstd, as the client's `Accept-Encoding` allows.
///
/// The decision for one response, in order:
///
/// 1. **Is the response compressible at all?** Not for 1xx, 204, 206 and 304, not when it
///    already has `Content-Encoding` or says `Cache-Control: no-transform`, not for an empty
///    body, a body known to be shorter than the minimum size, a Content-Type outside the
///    configured list, or a body kind this layer does not know. Such a response passes
///    untouched.
/// 2. **It is compressible**: it gets `Vary: Accept-Encoding`, whether or not this client gets
///    it compressed, so that caches keep the variants apart.
/// 3. **Which coding?** The highest-weighted enabled coding the client accepts; ties go to the
///    server's order (default zstd, br, gzip). None acceptable, or `identity` weighted higher:
///    sent as is.
/// 4. **How?** A full body of at most 256 KiB is compressed at once (its Content-Length stays
///    exact, HEAD included); if that does not make it smaller it is sent as is. A larger full
///    body or a streamed one is compressed as the connection pulls it, piece by piece, and
///    sent chunked.
///
/// Defaults:
///
/// | setting | default | why |
/// |---|---|---|
/// | codings, most preferred first | zstd, br, gzip | zstd 3 is as small as br 4 in a fifth to a third of the time; br for clients without zstd; gzip for everyone else |
/// | zstd level | 3 | zstd's own default; level 1 saves little time |
/// | br level | 4 | 5 is 7–16 % smaller for 1.3–1.8 times the time; 11, the library's default, is far too slow to run per response |
/// | gzip level | 4 | 6 is up to 8 % smaller for up to three times the time |
/// | minimum size | 1 KiB | below it the coded body is hardly smaller, or larger, and encoder set-up dominates |
/// | content types | [`Compression::DEFAULT_CONTENT_TYPES`] | text formats only: images, video, archives and woff/woff2 fonts are already compressed |
///
/// The rough cost behind these choices, per response including encoder set-up (gzip through
/// flate2's zlib-rs backend): release build, one core of a shared two-core machine, best of
/// three batches (`cargo test --release -p canter --lib compression::tests::cost -- --ignored
/// --nocapture`):
///
/// | coding | 27 B (demo's `/json`) | 4 KiB of prose | 64 KiB of JSON | 64 KiB in 4 KiB pieces, each flushed |
/// |---|---|---|---|---|
/// | zstd 3 | 8 µs → 36 B | 26 µs → 2,075 B | 121 µs → 11,551 B | 152 µs → 12,111 B |
/// | br 4 | 12 µs → 31 B | 77 µs → 2,039 B | 557 µs → 11,522 B | 742 µs → 12,149 B |
/// | gzip 4 | 7 µs → 47 B | 33 µs → 2,024 B | 335 µs → 11,110 B | 423 µs → 11,436 B |
/// | br 5 | 21 µs → 31 B | 102 µs → 1,902 B | 979 µs → 9,688 B | 1.2 ms → 10,269 B |
/// | gzip 6 | 7 µs → 47 B | 35 µs → 2,020 B | 999 µs → 10,169 B | 1.1 ms → 10,476 B |
///
/// Serving the demo's `/json` costs about 8 µs of CPU in all (BENCHMARKS.md): compressing it
/// would double that and make it larger, hence the minimum size. At the defaults a 64 KiB text
/// body costs 0.1–0.6 ms, as much CPU as 15 to 70 whole `/json` requests: worth it on a slow
/// or metered link, and the reason compression is a layer to choose rather than a default. An
/// open stream holds its encoder: about 150 KiB for gzip and 1.1 MiB for zstd or br (whose
/// window is 256 KiB for bodies of unknown length instead of the libraries' 2–4 MiB).
///
/// The server preference applies among codings of equal weight: `Accept-Encoding: gzip, br`
/// gets br, `gzip, br, zstd` gets zstd, `gzip;q=1, br;q=0.5` gets gzip. Without
/// `Accept-Encoding` nothing is compressed (RFC 9110 allows any coding then, but clients
/// that send none are usually tools that would not decode it); an empty one means "no
/// coding". When the client accepts nothing this layer offers, the response goes out as is,
/// even after `identity;q=0`: a 406 or 415 would help nobody.
///
/// A strong `ETag` becomes weak on a compressed response (the bytes differ from the
/// uncompressed variant), `Accept-Ranges` is removed (ranges would apply to the
/// uncompressed bytes) and so is a handler-set `Content-Length` (the runtime derives it
/// from the body). A streamed body is compressed piece by piece and each piece is flushed,
/// so NDJSON or server-sent events still reach the client as they are produced. If
/// compressing fails midway, the stream fails and the runtime closes the connection: the
/// client sees a truncated body, never a false end.
///
/// ```
/// use canter::middleware::{Coding, Compression};
/// use canter::{get, Router};
///
/// let app = Router::new()
///     .route("/", get(|| "hello ".repeat(500)))
///     .layer(
///         Compression::new()
///             .codings(&[Coding::Zstd, Coding::Gzip])
///             .gzip_level(5)
///             .min_size(2048),
///     );
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct Compression {
    settings: Arc<Settings>,
}

#[derive(Debug, Clone)]
struct Settings {
    /// Enabled codings, most preferred first.
    codings: Vec<Coding>,
    levels: Levels,
    min_size: u64,
    types: Vec<TypePattern>,
}

#[derive(Debug, Clone, Copy)]
struct Levels {
    gzip: u32,
    brotli: u32,
    zstd: i32,
}

/// One entry of the content-type list, lower-cased.
#[derive(Debug, Clone)]
enum TypePattern {
    /// `text/*`: the top-level type with its slash (`text/`).
    Type(String),
    /// `+json`: a structured-syntax suffix.
    Suffix(String),
    /// `application/json`: one media type.
    Exact(String),
}

impl Default for Compression {
    fn default() -> Compression {
        Compression::new()
    }
}

impl Compression {
    /// The content types compressed by default: text formats, and nothing that is already
    /// compressed. `text/*` covers HTML, CSS, CSV, plain text and server-sent events;
    /// `+json` and `+xml` cover suffixed types such as `application/problem+json`,
    /// `application/ld+json`, `application/atom+xml` and `image/svg+xml`.
    ///
    /// ```
    /// use canter::middleware::Compression;
    ///
    /// // The defaults and WebAssembly modules.
    /// let mut types = Compression::DEFAULT_CONTENT_TYPES.to_vec();
    /// types.push("application/wasm");
    /// let layer = Compression::new().content_types(&types);
    /// # let _ = layer;
    /// ```
    pub const DEFAULT_CONTENT_TYPES: &'static [&'static str] = &[
        "text/*",
        "application/json",
        "application/x-ndjson",
        "application/javascript",
        "application/x-javascript",
        "application/xml",
        "application/yaml",
        "application/vnd.ms-fontobject",
        "font/ttf",
        "font/otf",
        "image/svg+xml",
        "image/x-icon",
        "+json",
        "+xml",
        "+yaml",
    ];

    /// zstd, br and gzip (in that order of preference) at levels 3, 4 and 4, for bodies of at
    /// least 1 KiB of the [default types](Compression::DEFAULT_CONTENT_TYPES).
    ///
    /// ```
    /// let app = canter::Router::new().layer(canter::middleware::Compression::new());
    /// # let _ = app;
    /// ```
    pub fn new() -> Compression {
        Compression {
            settings: Arc::new(Settings {
                codings: vec![Coding::Zstd, Coding::Brotli, Coding::Gzip],
                levels: Levels {
                    gzip: 4,
                    brotli: 4,
                    zstd: 3,
                },
                min_size: 1024,
                types: parse_types(Compression::DEFAULT_CONTENT_TYPES),
            }),
        }
    }

    /// The codings to offer, most preferred first (the preference breaks ties between codings
    /// the client weights equally). An empty list turns compression off.
    ///
    /// ```
    /// use canter::middleware::{Coding, Compression};
    ///
    /// // gzip only, for clients that need it; nothing else.
    /// let layer = Compression::new().codings(&[Coding::Gzip]);
    /// # let _ = layer;
    /// ```
    pub fn codings(mut self, codings: &[Coding]) -> Compression {
        let list = &mut Arc::make_mut(&mut self.settings).codings;
        list.clear();
        for &c in codings {
            if !list.contains(&c) {
                list.push(c);
            }
        }
        self
    }

    /// The gzip level, 0 (stored) to 9 (smallest, slowest); higher values mean 9.
    ///
    /// ```
    /// let layer = canter::middleware::Compression::new().gzip_level(1);
    /// # let _ = layer;
    /// ```
    pub fn gzip_level(mut self, level: u32) -> Compression {
        Arc::make_mut(&mut self.settings).levels.gzip = level.min(9);
        self
    }

    /// The brotli quality, 0 to 11 (smallest, far too slow to run per response); higher values
    /// mean 11.
    ///
    /// ```
    /// let layer = canter::middleware::Compression::new().br_level(5);
    /// # let _ = layer;
    /// ```
    pub fn br_level(mut self, level: u32) -> Compression {
        Arc::make_mut(&mut self.settings).levels.brotli = level.min(11);
        self
    }

    /// The zstd level: negative levels are faster still, 1 to 22 trade speed for size; values
    /// outside what the library supports are clamped to it.
    ///
    /// ```
    /// let layer = canter::middleware::Compression::new().zstd_level(1);
    /// # let _ = layer;
    /// ```
    pub fn zstd_level(mut self, level: i32) -> Compression {
        let range = zstd::compression_level_range();
        Arc::make_mut(&mut self.settings).levels.zstd = level.clamp(*range.start(), *range.end());
        self
    }

    /// Bodies known to be shorter than `bytes` are sent as is (a streamed body of unknown
    /// length is always compressed).
    ///
    /// ```
    /// let layer = canter::middleware::Compression::new().min_size(4096);
    /// # let _ = layer;
    /// ```
    pub fn min_size(mut self, bytes: u64) -> Compression {
        Arc::make_mut(&mut self.settings).min_size = bytes;
        self
    }

    /// The content types to compress, replacing the list. Each entry is a media type
    /// (`application/json`), a top-level type with a wildcard (`text/*`) or a structured-syntax
    /// suffix (`+json`); parameters such as `charset` are ignored and case does not matter.
    /// A response without Content-Type is never compressed.
    ///
    /// ```
    /// use canter::middleware::Compression;
    ///
    /// let layer = Compression::new().content_types(&["text/html", "application/json", "+json"]);
    /// # let _ = layer;
    /// ```
    pub fn content_types(mut self, types: &[&str]) -> Compression {
        Arc::make_mut(&mut self.settings).types = parse_types(types);
        self
    }
}

fn parse_types(types: &[&str]) -> Vec<TypePattern> {
    types
        .iter()
        .map(|t| {
            let t = t.trim().to_ascii_lowercase();
            if let Some(top) = t.strip_suffix('*') {
                TypePattern::Type(top.to_owned())
            } else if t.starts_with('+') {
                TypePattern::Suffix(t)
            } else {
                TypePattern::Exact(t)
            }
        })
        .collect()
}

/// What static files (`ServeDir::compress`) use of the settings: the same codings, levels,
/// types and minimum size as the middleware, and its encoders.
impl Compression {
    /// The enabled codings, most preferred first.
    pub(crate) fn offered(&self) -> &[Coding] {
        &self.settings.codings
    }

    /// Whether a body of `len` bytes of `content_type` is worth compressing.
    pub(crate) fn worth(&self, content_type: &[u8], len: u64) -> bool {
        !self.settings.codings.is_empty()
            && len > 0
            && len >= self.settings.min_size
            && self.settings.type_matches(content_type)
    }

    /// `data` compressed with `coding` in one go.
    pub(crate) fn compress_bytes(&self, coding: Coding, data: &[u8]) -> io::Result<Vec<u8>> {
        compress_full(coding, self.settings.levels, data)
    }

    /// A body that compresses `source` (`len` bytes) with `coding` as the connection pulls it.
    pub(crate) fn compress_stream(
        &self,
        coding: Coding,
        len: u64,
        source: Pin<Box<dyn BodyStream>>,
    ) -> io::Result<Body> {
        let mut encoder = Encoder::new(coding, self.settings.levels, Some(len))?;
        encoder.pledge(len)?;
        Ok(Body::stream(
            None,
            CompressStream::new(encoder, Bytes::new(), Some(source)),
        ))
    }
}

impl Middleware for Compression {
    fn call(&self, req: Request, next: Next<'_>) -> Reply {
        if self.settings.codings.is_empty() {
            return next.run(req);
        }
        let values = req
            .head()
            .headers()
            .filter(|(name, _)| name.eq_ignore_ascii_case("accept-encoding"))
            .map(|(_, value)| value);
        let coding = AcceptEncoding::parse(values).and_then(|a| a.choose(&self.settings.codings));
        let settings = self.settings.clone();
        next.run(req).map(move |res| settings.apply(res, coding))
    }
}

impl Settings {
    /// Adds Vary to a compressible response and compresses it with `coding`, if any.
    fn apply(&self, mut res: Response, coding: Option<Coding>) -> Response {
        if !self.compressible(&res) {
            return res;
        }
        add_vary(&mut res);
        let Some(coding) = coding else {
            return res;
        };
        let body = std::mem::replace(res.body_mut(), Body::Empty);
        match self.compress(coding, body) {
            Ok(compressed) => *res.body_mut() = compressed,
            Err(body) => {
                *res.body_mut() = body;
                return res;
            }
        }
        res.set_header(header::CONTENT_ENCODING, coding.header_value());
        res.remove_header(&header::CONTENT_LENGTH);
        res.remove_header(&header::ACCEPT_RANGES);
        weaken_etag(&mut res);
        res
    }

    /// The body compressed with `coding`, or the body as it was when compressing does not pay
    /// (or could not start).
    fn compress(&self, coding: Coding, body: Body) -> Result<Body, Body> {
        let len = body.exact_len();
        match body {
            Body::Full(data) if data.len() <= ONE_SHOT_MAX => {
                match compress_full(coding, self.levels, &data) {
                    Ok(out) if out.len() < data.len() => Ok(Body::Full(Bytes::from(out))),
                    // Not smaller (already compressed data under a text type).
                    Ok(_) => Err(Body::Full(data)),
                    Err(e) => {
                        tracing::warn!(error = %e, coding = coding.as_str(), "compression failed; sending the body as is");
                        Err(Body::Full(data))
                    }
                }
            }
            Body::Full(data) => match Encoder::new(coding, self.levels, len) {
                Ok(encoder) => Ok(Body::stream(None, CompressStream::new(encoder, data, None))),
                Err(e) => {
                    tracing::warn!(error = %e, coding = coding.as_str(), "cannot start compressing; sending the body as is");
                    Err(Body::Full(data))
                }
            },
            Body::Stream { len, stream } => match Encoder::new(coding, self.levels, len) {
                Ok(encoder) => Ok(Body::stream(
                    None,
                    CompressStream::new(encoder, Bytes::new(), Some(stream)),
                )),
                Err(e) => {
                    tracing::warn!(error = %e, coding = coding.as_str(), "cannot start compressing; sending the body as is");
                    Err(Body::Stream { len, stream })
                }
            },
            // `compressible` lets no other kind through.
            other => Err(other),
        }
    }

    /// Whether the response could be compressed for some client.
    fn compressible(&self, res: &Response) -> bool {
        let status = res.status();
        if status.is_informational()
            || matches!(
                status,
                StatusCode::NO_CONTENT | StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
            )
        {
            return false;
        }
        // File bodies go out with sendfile untouched: a static directory serves precompressed
        // `.br`/`.gz` siblings instead (see `ServeDir`), compressed once, not per request.
        let len = match res.body() {
            Body::Full(data) => Some(data.len() as u64),
            Body::Stream { len, .. } => *len,
            _ => return false,
        };
        if len.is_some_and(|n| n == 0 || n < self.min_size) {
            return false;
        }
        if res.header(&header::CONTENT_ENCODING).is_some() {
            return false;
        }
        let Some(content_type) = res.content_type() else {
            return false;
        };
        if !self.type_matches(content_type.as_bytes()) {
            return false;
        }
        !res.headers()
            .iter()
            .filter(|(name, _)| name == header::CACHE_CONTROL)
            .any(|(_, value)| has_token(value.as_bytes(), b"no-transform"))
    }

    fn type_matches(&self, content_type: &[u8]) -> bool {
        let essence = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        self.types.iter().any(|pattern| match pattern {
            TypePattern::Type(top) => {
                essence.len() > top.len()
                    && essence[..top.len()].eq_ignore_ascii_case(top.as_bytes())
            }
            TypePattern::Suffix(suffix) => {
                essence.len() > suffix.len()
                    && essence[essence.len() - suffix.len()..]
                        .eq_ignore_ascii_case(suffix.as_bytes())
            }
            TypePattern::Exact(t) => essence.eq_ignore_ascii_case(t.as_bytes()),
        })
    }
}

const VARY_ACCEPT_ENCODING: HeaderValue = HeaderValue::from_static("accept-encoding");

/// Adds `Vary: accept-encoding` unless a Vary field already lists it or `*`.
fn add_vary(res: &mut Response) {
    let listed = res
        .headers()
        .iter()
        .filter(|(name, _)| name == header::VARY)
        .any(|(_, value)| {
            has_token(value.as_bytes(), b"accept-encoding") || has_token(value.as_bytes(), b"*")
        });
    if !listed {
        res.append_header(header::VARY, VARY_ACCEPT_ENCODING);
    }
}

/// `"abc"` becomes `W/"abc"`: the compressed bytes are not those the tag was made for.
fn weaken_etag(res: &mut Response) {
    let Some(etag) = res.header(&header::ETAG) else {
        return;
    };
    if !etag.as_bytes().starts_with(b"\"") {
        return;
    }
    let mut weak = Vec::with_capacity(etag.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(etag.as_bytes());
    if let Ok(weak) = HeaderValue::from_bytes(&weak) {
        res.set_header(header::ETAG, weak);
    }
}

/// Whether the comma-separated list `value` has an element whose name (before any `=`) is
/// `token`, case-insensitively.
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|element| {
        let name = element.split(|&b| b == b'=').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(token)
    })
}

// ---------------------------------------------------------------------------------------------
// Encoders

/// One compression stream, writing into its own output buffer: `write` pieces (optionally
/// flushing, so that everything written so far can be decoded), `finish` once, and `take` the
/// output whenever convenient.
enum Encoder {
    Gzip(Box<Gzip>),
    Brotli(Box<Brotli>),
    Zstd(Box<Zstd>),
}

impl Encoder {
    /// A fresh encoder for a body of `len` bytes, if known: the window follows (see
    /// [`STREAM_WINDOW_LOG`]).
    fn new(coding: Coding, levels: Levels, len: Option<u64>) -> io::Result<Encoder> {
        let window_log = match len {
            Some(_) => KNOWN_WINDOW_LOG,
            None => STREAM_WINDOW_LOG,
        };
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(Box::new(Gzip::new(levels.gzip))),
            Coding::Brotli => Encoder::Brotli(Box::new(Brotli::new(levels.brotli, window_log))),
            Coding::Zstd => Encoder::Zstd(Box::new(Zstd::new(levels.zstd, window_log)?)),
        })
    }

    /// Promises exactly `len` bytes of input: zstd then fits its tables to them and records the
    /// size in the frame (a different amount fails the stream).
    fn pledge(&mut self, len: u64) -> io::Result<()> {
        match self {
            Encoder::Zstd(e) => e.ctx.set_pledged_src_size(Some(len)),
            Encoder::Gzip(_) | Encoder::Brotli(_) => Ok(()),
        }
    }

    fn write(&mut self, input: &[u8], flush: bool) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write(input, flush),
            Encoder::Brotli(e) => e.write(input, flush),
            Encoder::Zstd(e) => e.write(input, flush),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Brotli(e) => e.finish(),
            Encoder::Zstd(e) => e.finish(),
        }
    }

    /// The output produced since the last `take`.
    fn take(&mut self) -> Vec<u8> {
        let out = match self {
            Encoder::Gzip(e) => &mut e.out,
            Encoder::Brotli(e) => &mut e.out,
            Encoder::Zstd(e) => &mut e.out,
        };
        std::mem::take(out)
    }
}

/// Makes room for at least a little output, more for a larger input.
fn reserve_for(out: &mut Vec<u8>, input_left: usize) {
    if out.capacity() - out.len() < 256 {
        out.reserve((input_left / 2).clamp(4096, 64 * 1024));
    }
}

/// Compresses `data` in one go.
fn compress_full(coding: Coding, levels: Levels, data: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = Encoder::new(coding, levels, Some(data.len() as u64))?;
    encoder.pledge(data.len() as u64)?;
    encoder.write(data, false)?;
    encoder.finish()?;
    Ok(encoder.take())
}

/// gzip: a raw deflate stream between the RFC 1952 header and its CRC-32/length trailer.
struct Gzip {
    deflate: flate2::Compress,
    crc: flate2::Crc,
    out: Vec<u8>,
}

/// ID1 ID2, CM = deflate, no flags, no modification time, no extra flags, OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

impl Gzip {
    fn new(level: u32) -> Gzip {
        Gzip {
            deflate: flate2::Compress::new(flate2::Compression::new(level), false),
            crc: flate2::Crc::new(),
            out: GZIP_HEADER.to_vec(),
        }
    }

    fn write(&mut self, input: &[u8], flush: bool) -> io::Result<()> {
        self.crc.update(input);
        let mode = if flush {
            flate2::FlushCompress::Sync
        } else {
            flate2::FlushCompress::None
        };
        let mut rest = input;
        loop {
            reserve_for(&mut self.out, rest.len());
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(rest, &mut self.out, mode)
                .map_err(io::Error::other)?;
            let consumed = (self.deflate.total_in() - before) as usize;
            rest = rest.get(consumed..).unwrap_or_default();
            // Done once the input is in and (when flushing) the flush did not run out of room.
            if rest.is_empty() && (!flush || self.out.len() < self.out.capacity()) {
                return Ok(());
            }
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        loop {
            reserve_for(&mut self.out, 0);
            let status = self
                .deflate
                .compress_vec(&[], &mut self.out, flate2::FlushCompress::Finish)
                .map_err(io::Error::other)?;
            if status == flate2::Status::StreamEnd {
                break;
            }
        }
        self.out.extend_from_slice(&self.crc.sum().to_le_bytes());
        self.out.extend_from_slice(&self.crc.amount().to_le_bytes());
        Ok(())
    }
}

/// br, driving the encoder state directly so that a failure while finishing is reported
/// (the crate's writer swallows it) and output lands in our buffer without another copy.
struct Brotli {
    state: brotli::enc::encode::BrotliEncoderStateStruct<brotli::enc::StandardAlloc>,
    out: Vec<u8>,
}

impl Brotli {
    fn new(quality: u32, window_log: u32) -> Brotli {
        use brotli::enc::encode::BrotliEncoderParameter as P;
        let mut state = brotli::enc::encode::BrotliEncoderStateStruct::new(
            brotli::enc::StandardAlloc::default(),
        );
        state.set_parameter(P::BROTLI_PARAM_QUALITY, quality);
        state.set_parameter(P::BROTLI_PARAM_LGWIN, window_log);
        Brotli {
            state,
            out: Vec::new(),
        }
    }

    fn write(&mut self, input: &[u8], flush: bool) -> io::Result<()> {
        use brotli::enc::encode::BrotliEncoderOperation as Op;
        let op = if flush {
            Op::BROTLI_OPERATION_FLUSH
        } else {
            Op::BROTLI_OPERATION_PROCESS
        };
        self.run(op, input)
    }

    fn finish(&mut self) -> io::Result<()> {
        self.run(
            brotli::enc::encode::BrotliEncoderOperation::BROTLI_OPERATION_FINISH,
            &[],
        )
    }

    fn run(
        &mut self,
        op: brotli::enc::encode::BrotliEncoderOperation,
        input: &[u8],
    ) -> io::Result<()> {
        use brotli::enc::encode::BrotliEncoderOperation as Op;
        let mut available_in = input.len();
        let mut in_offset = 0;
        let mut stalls = 0;
        loop {
            reserve_for(&mut self.out, available_in);
            let start = self.out.len();
            self.out.resize(self.out.capacity(), 0);
            let mut available_out = self.out.len() - start;
            let mut out_offset = start;
            let taken = in_offset;
            let ok = self.state.compress_stream(
                op,
                &mut available_in,
                input,
                &mut in_offset,
                &mut available_out,
                &mut self.out,
                &mut out_offset,
                &mut None,
                &mut |_, _, _, _| (),
            );
            self.out.truncate(out_offset);
            if !ok {
                return Err(io::Error::other("brotli encoder failed"));
            }
            let done = match op {
                Op::BROTLI_OPERATION_FINISH => self.state.is_finished(),
                _ => available_in == 0 && !self.state.has_more_output(),
            };
            if done {
                return Ok(());
            }
            if out_offset == start && available_in == input.len() - taken {
                // Neither input taken nor output made, twice: do not spin.
                stalls += 1;
                if stalls > 1 {
                    return Err(io::Error::other("brotli encoder made no progress"));
                }
            } else {
                stalls = 0;
            }
        }
    }
}

impl Drop for Brotli {
    fn drop(&mut self) {
        brotli::enc::encode::BrotliEncoderDestroyInstance(&mut self.state);
    }
}

/// zstd, through the raw streaming context, writing into the spare capacity of our buffer.
struct Zstd {
    ctx: zstd::stream::raw::Encoder<'static>,
    out: Vec<u8>,
}

impl Zstd {
    fn new(level: i32, window_log: u32) -> io::Result<Zstd> {
        let mut ctx = zstd::stream::raw::Encoder::new(level)?;
        ctx.set_parameter(zstd::zstd_safe::CParameter::WindowLog(window_log))?;
        Ok(Zstd {
            ctx,
            out: Vec::new(),
        })
    }

    fn write(&mut self, input: &[u8], flush: bool) -> io::Result<()> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(input);
        while input.pos() < input.src.len() {
            reserve_for(&mut self.out, input.src.len() - input.pos());
            let pos = self.out.len();
            let mut output = OutBuffer::around_pos(&mut self.out, pos);
            self.ctx.run(&mut input, &mut output)?;
        }
        if flush {
            loop {
                reserve_for(&mut self.out, 0);
                let pos = self.out.len();
                let mut output = OutBuffer::around_pos(&mut self.out, pos);
                if self.ctx.flush(&mut output)? == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        use zstd::stream::raw::{Operation, OutBuffer};
        loop {
            reserve_for(&mut self.out, 0);
            let pos = self.out.len();
            let mut output = OutBuffer::around_pos(&mut self.out, pos);
            if self.ctx.finish(&mut output, true)? == 0 {
                return Ok(());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Streaming

/// A body compressed as the connection pulls it. Memory: the encoder's state, the piece being
/// compressed and the output of one step.
struct CompressStream {
    state: StreamState,
}

enum StreamState {
    Open(Box<Open>),
    /// Finished, failed or the inner stream failed: nothing more.
    Done,
}

struct Open {
    encoder: Encoder,
    /// Input taken from the source and not compressed yet.
    pending: Bytes,
    /// Where more input comes from: the inner stream, whose pieces are each flushed; or
    /// nothing (a full body, all in `pending`, flushed only at its end).
    source: Option<Pin<Box<dyn BodyStream>>>,
}

/// What one step produced.
enum Step {
    Output(Bytes),
    /// Input went in, no output yet.
    Again,
    /// The encoder finished; its last bytes.
    Finished(Vec<u8>),
}

impl CompressStream {
    fn new(
        encoder: Encoder,
        pending: Bytes,
        source: Option<Pin<Box<dyn BodyStream>>>,
    ) -> CompressStream {
        CompressStream {
            state: StreamState::Open(Box::new(Open {
                encoder,
                pending,
                source,
            })),
        }
    }
}

impl Open {
    fn step(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Step>> {
        if self.pending.is_empty() {
            match &mut self.source {
                Some(source) => match source.as_mut().poll_next(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(piece))) if piece.is_empty() => {
                        return Poll::Ready(Ok(Step::Again))
                    }
                    Poll::Ready(Some(Ok(piece))) => self.pending = piece,
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(None) => return Poll::Ready(self.finish()),
                },
                None => return Poll::Ready(self.finish()),
            }
        }
        let slice = self.pending.split_to(self.pending.len().min(STEP));
        // A streamed piece is flushed once all of it is in, so the client can decode it now.
        let flush = self.pending.is_empty() && self.source.is_some();
        if let Err(e) = self.encoder.write(&slice, flush) {
            return Poll::Ready(Err(e));
        }
        let out = self.encoder.take();
        Poll::Ready(Ok(if out.is_empty() {
            Step::Again
        } else {
            Step::Output(Bytes::from(out))
        }))
    }

    fn finish(&mut self) -> io::Result<Step> {
        self.encoder.finish()?;
        Ok(Step::Finished(self.encoder.take()))
    }
}

impl BodyStream for CompressStream {
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        let this = self.get_mut();
        for _ in 0..STEPS_PER_POLL {
            let StreamState::Open(open) = &mut this.state else {
                return Poll::Ready(None);
            };
            match open.step(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Step::Output(out))) => return Poll::Ready(Some(Ok(out))),
                Poll::Ready(Ok(Step::Again)) => {}
                Poll::Ready(Ok(Step::Finished(tail))) => {
                    this.state = StreamState::Done;
                    if tail.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Bytes::from(tail))));
                }
                Poll::Ready(Err(e)) => {
                    // The runtime closes the connection: the client sees a truncated body.
                    this.state = StreamState::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        // Much input and no output yet: let the worker's other connections run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Option<AcceptEncoding> {
        AcceptEncoding::parse(values.iter().map(|v| v.as_bytes()))
    }

    fn choose(value: &str) -> Option<Coding> {
        let offered = Compression::new().settings.codings.clone();
        parse(&[value]).and_then(|a| a.choose(&offered))
    }

    #[test]
    fn qvalues() {
        for (text, weight) in [
            ("0", Some(0)),
            ("0.", Some(0)),
            ("0.5", Some(500)),
            ("0.25", Some(250)),
            ("0.125", Some(125)),
            ("0.001", Some(1)),
            ("1", Some(1000)),
            ("1.", Some(1000)),
            ("1.000", Some(1000)),
            ("1.001", None),
            ("0.1234", None),
            ("2", None),
            ("", None),
            (".5", None),
            ("0,5", None),
            ("0.a", None),
            ("-0", None),
            ("1e0", None),
        ] {
            assert_eq!(parse_qvalue(text.as_bytes()), weight, "{text:?}");
        }
    }

    #[test]
    fn parses_lists() {
        let a = parse(&["gzip, deflate, br, zstd"]).unwrap();
        assert_eq!(
            a,
            AcceptEncoding {
                gzip: Some(1000),
                brotli: Some(1000),
                zstd: Some(1000),
                identity: None,
                any: None,
            }
        );
        // Case, whitespace, empty elements, other parameters, x-gzip, several fields.
        let a = parse(&[
            " GZip ;Q=0.5 , ,BR; level=3;q=0.8",
            "x-gzip;q=1, *;q=0,identity ; q=0.1",
        ])
        .unwrap();
        assert_eq!(
            a,
            AcceptEncoding {
                gzip: Some(500),
                brotli: Some(800),
                zstd: None,
                identity: Some(100),
                any: Some(0),
            }
        );
        // A malformed weight drops its element only.
        let a = parse(&["br;q=2, gzip;q=0.3, zstd;q"]).unwrap();
        assert_eq!((a.brotli, a.gzip, a.zstd), (None, Some(300), None));
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&[""]), Some(AcceptEncoding::default()));
    }

    #[test]
    fn chooses() {
        for (header, expected) in [
            // Equal weights: the server's order.
            ("gzip, deflate, br, zstd", Some(Coding::Zstd)),
            ("gzip, deflate, br", Some(Coding::Brotli)),
            ("gzip, zstd", Some(Coding::Zstd)),
            ("gzip", Some(Coding::Gzip)),
            ("x-gzip", Some(Coding::Gzip)),
            // Weights beat the server's order.
            ("gzip;q=1, br;q=0.5", Some(Coding::Gzip)),
            ("br;q=0.1, zstd;q=0.2, gzip;q=0.15", Some(Coding::Zstd)),
            // q=0 refuses.
            ("br;q=0, gzip", Some(Coding::Gzip)),
            ("br;q=0, zstd;q=0, gzip;q=0", None),
            // `*` covers what is not listed.
            ("*", Some(Coding::Zstd)),
            ("*;q=0.5, zstd;q=0", Some(Coding::Brotli)),
            ("*;q=0, gzip", Some(Coding::Gzip)),
            ("*;q=0", None),
            // identity: wins only when weighted higher.
            ("identity", None),
            ("identity, gzip", Some(Coding::Gzip)),
            ("identity;q=1, gzip;q=0.5", None),
            ("identity;q=0, gzip;q=0.5", Some(Coding::Gzip)),
            ("identity;q=0", None),
            ("*;q=0.6, gzip;q=0.5, br;q=0, zstd;q=0", None),
            // Nothing known, or nothing at all.
            ("deflate, compress", None),
            ("", None),
            ("gzip;q=x", None),
        ] {
            assert_eq!(choose(header), expected, "{header:?}");
        }
        // Only the codings offered count, in the offered order.
        let a = parse(&["gzip, br"]).unwrap();
        assert_eq!(
            a.choose(&[Coding::Gzip, Coding::Brotli]),
            Some(Coding::Gzip)
        );
        assert_eq!(a.choose(&[Coding::Zstd]), None);
    }

    #[test]
    fn list_tokens() {
        assert!(has_token(b"no-cache, No-Transform", b"no-transform"));
        assert!(has_token(b"max-age=0,no-transform", b"no-transform"));
        assert!(!has_token(b"no-transformation", b"no-transform"));
        assert!(has_token(b"origin, *", b"*"));
    }

    #[test]
    fn content_types() {
        let s = Compression::new().settings;
        for (t, yes) in [
            ("text/html; charset=utf-8", true),
            ("TEXT/PLAIN", true),
            ("text/event-stream", true),
            ("application/json", true),
            ("application/problem+json", true),
            ("image/svg+xml", true),
            ("application/x-ndjson", true),
            ("text/", false),
            ("image/png", false),
            ("image/webp", false),
            ("video/mp4", false),
            ("application/zip", false),
            ("application/gzip", false),
            ("font/woff2", false),
            ("application/octet-stream", false),
            ("application/jsonx", false),
            ("+json", false),
        ] {
            assert_eq!(s.type_matches(t.as_bytes()), yes, "{t}");
        }
    }

    fn roundtrip_decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        use std::io::Read;
        match coding {
            Coding::Gzip => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
                out
            }
            Coding::Brotli => {
                let mut out = Vec::new();
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
                out
            }
            Coding::Zstd => zstd::stream::decode_all(data).unwrap(),
        }
    }

    /// What a client has decoded after receiving `data`, a prefix of a stream: everything up
    /// to where the decoder needs more input.
    fn decode_prefix(coding: Coding, data: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut decoder: Box<dyn Read + '_> = match coding {
            Coding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
            Coding::Brotli => Box::new(brotli::Decompressor::new(data, 4096)),
            Coding::Zstd => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
        };
        let mut out = Vec::new();
        let mut buf = [0; 4096];
        while let Ok(n @ 1..) = decoder.read(&mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    #[test]
    fn encoders_round_trip_whole_and_flushed() {
        let text: Vec<u8> = (0..20_000)
            .flat_map(|i| format!("line {i} of some text\n").into_bytes())
            .collect();
        let levels = Compression::new().settings.levels;
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let whole = compress_full(coding, levels, &text).unwrap();
            assert!(whole.len() < text.len() / 4, "{coding:?}");
            assert_eq!(roundtrip_decode(coding, &whole), text, "{coding:?}");
            assert_eq!(
                roundtrip_decode(coding, &compress_full(coding, levels, b"").unwrap()),
                b""
            );

            // Flushed pieces: each prefix decodes to the input so far.
            let mut encoder = Encoder::new(coding, levels, None).unwrap();
            let mut out = Vec::new();
            for (i, piece) in text.chunks(7000).enumerate() {
                encoder.write(piece, true).unwrap();
                out.extend(encoder.take());
                let sent = (i * 7000 + piece.len()).min(text.len());
                let decoded = decode_prefix(coding, &out);
                assert!(
                    decoded == text[..sent],
                    "{coding:?} piece {i}: {} of {sent} bytes",
                    decoded.len()
                );
            }
            encoder.finish().unwrap();
            out.extend(encoder.take());
            assert_eq!(roundtrip_decode(coding, &out), text, "{coding:?}");
        }
    }

    /// Rough cost per response (not a benchmark; the numbers in the docs of [`Compression`]
    /// come from it): `cargo test --release -p canter --lib compression::tests::cost --
    /// --ignored --nocapture`. Times are the best of three batches, to shed some of the noise
    /// of a shared machine.
    #[test]
    #[ignore]
    fn cost() {
        use std::time::{Duration, Instant};

        // The demo's /json; 4 KiB of English prose and code; 64 KiB of JSON-like text with
        // varied values.
        let json = br#"{"message":"Hello, World!"}"#.to_vec();
        let prose = &include_bytes!("../../../../README.md")[..4096];
        let words = [
            "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
        ];
        let mut text = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        while text.len() < 4 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let line = format!(
                "{{\"id\":{},\"name\":\"{} {}\",\"score\":{},\"tags\":[\"{}\"]}},\n",
                x % 100_000,
                words[(x >> 20) as usize % 8],
                words[(x >> 24) as usize % 8],
                (x >> 32) % 1000,
                words[(x >> 28) as usize % 8],
            );
            text.extend_from_slice(line.as_bytes());
        }
        let long = text.clone();
        text.truncate(64 * 1024);

        fn best(rounds: u32, mut f: impl FnMut() -> usize) -> (Duration, usize) {
            let mut size = 0;
            let time = (0..3)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..rounds {
                        size = f();
                    }
                    start.elapsed() / rounds
                })
                .min()
                .unwrap_or_default();
            (time, size)
        }

        let defaults = Compression::new().settings.levels;
        let mut variants = vec![];
        for gzip in [1, 4, 6] {
            variants.push((
                Coding::Gzip,
                Levels { gzip, ..defaults },
                format!("gzip {gzip}"),
            ));
        }
        for brotli in [1, 4, 5] {
            variants.push((
                Coding::Brotli,
                Levels { brotli, ..defaults },
                format!("br {brotli}"),
            ));
        }
        for zstd in [1, 3] {
            variants.push((
                Coding::Zstd,
                Levels { zstd, ..defaults },
                format!("zstd {zstd}"),
            ));
        }
        for (coding, levels, name) in variants {
            let whole = |data: &[u8], rounds| {
                best(rounds, || {
                    compress_full(coding, levels, std::hint::black_box(data))
                        .unwrap()
                        .len()
                })
            };
            let (t_json, n_json) = whole(&json, 1000);
            let (t_prose, n_prose) = whole(prose, 300);
            let (t_text, n_text) = whole(&text, 30);
            // The same 64 KiB streamed in 4 KiB pieces, each flushed.
            let (t_stream, n_stream) = best(30, || {
                let mut encoder = Encoder::new(coding, levels, None).unwrap();
                let mut n = 0;
                for piece in text.chunks(4096) {
                    encoder.write(piece, true).unwrap();
                    n += encoder.take().len();
                }
                encoder.finish().unwrap();
                n + encoder.take().len()
            });
            println!(
                "{name:8} | 27 B /json {t_json:>7.1?} -> {n_json} B | 4 KiB prose {t_prose:>7.1?} \
                 -> {n_prose} B | 64 KiB JSON {t_text:>7.1?} -> {n_text} B | same, streamed in \
                 4 KiB pieces {t_stream:>7.1?} -> {n_stream} B"
            );
        }

        // Memory of an open stream after 4 MiB in flushed 16 KiB pieces: RSS growth over 20.
        let rss_kib = || {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            let pages: u64 = statm
                .split(' ')
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            pages * 4
        };
        for coding in [Coding::Gzip, Coding::Brotli, Coding::Zstd] {
            let before = rss_kib();
            let mut open = Vec::new();
            for _ in 0..20 {
                let mut encoder = Encoder::new(coding, defaults, None).unwrap();
                for piece in long.chunks(16 * 1024) {
                    encoder.write(piece, true).unwrap();
                    encoder.take();
                }
                open.push(encoder);
            }
            let per_stream = rss_kib().saturating_sub(before) / 20;
            println!("{coding:?}: ~{per_stream} KiB per open stream");
        }
    }
}
