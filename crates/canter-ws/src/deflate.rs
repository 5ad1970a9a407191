//! permessage-deflate (RFC 7692): the negotiation, and a compressor and a bounded inflater for
//! whole messages.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::Error;

/// What this end accepts and does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeflateConfig {
    /// Messages shorter than this are sent uncompressed (compression would not pay).
    pub min_size: usize,
    /// Compression level, 0–9.
    pub level: u32,
    /// Ask the client not to keep its compression context between messages (saves the server
    /// a 32 KiB window per connection, costs ratio).
    pub client_no_context_takeover: bool,
    /// Do not keep the server's compression context between messages.
    pub server_no_context_takeover: bool,
}

impl Default for DeflateConfig {
    fn default() -> Self {
        DeflateConfig {
            min_size: 256,
            level: 1,
            client_no_context_takeover: false,
            server_no_context_takeover: false,
        }
    }
}

/// The parameters both ends agreed, from the server's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The server resets its compressor after each message.
    pub server_no_context_takeover: bool,
    /// The client resets its compressor after each message.
    pub client_no_context_takeover: bool,
    /// The server's LZ77 window, 9–15 bits.
    pub server_window_bits: u8,
    /// The client's LZ77 window, 9–15 bits.
    pub client_window_bits: u8,
    /// What this end does below its size threshold, and at which level.
    pub config: DeflateConfig,
}

/// The server's choice among a client's `Sec-WebSocket-Extensions` offers (each as sent, in
/// order): the first `permessage-deflate` offer it can honour, and the header value that says
/// so. An offer with an unknown, repeated or out-of-range parameter is declined, as RFC 7692
/// asks; so is one that wants a server window of 8 bits (zlib cannot write a raw stream with it).
pub fn negotiate(offers: &[String], config: DeflateConfig) -> Option<(Agreed, String)> {
    offers.iter().find_map(|offer| accept(offer, config))
}

/// The parameters of one permessage-deflate offer or answer.
#[derive(Default)]
struct Params {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    /// Present, with its value if it had one.
    server_max_window_bits: Option<Option<u8>>,
    client_max_window_bits: Option<Option<u8>>,
}

/// The parameters of `ext`; `None` when it is another extension, or a parameter is unknown,
/// repeated, given a value it must not have, or a window outside 8–15 bits (RFC 7692, Section
/// 7.1).
fn params(ext: &str) -> Option<Params> {
    let mut parts = ext.split(';').map(str::trim);
    if parts.next()? != "permessage-deflate" {
        return None;
    }
    let mut p = Params::default();
    let mut seen: Vec<&str> = Vec::new();
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        if seen.contains(&name) {
            return None;
        }
        seen.push(name);
        let bits = match value {
            None => None,
            Some(v) => Some(v.parse::<u8>().ok().filter(|b| (8..=15).contains(b))?),
        };
        match (name, value) {
            ("server_no_context_takeover", None) => p.server_no_context_takeover = true,
            ("client_no_context_takeover", None) => p.client_no_context_takeover = true,
            ("server_max_window_bits", _) => p.server_max_window_bits = Some(bits),
            ("client_max_window_bits", _) => p.client_max_window_bits = Some(bits),
            _ => return None,
        }
    }
    Some(p)
}

fn accept(offer: &str, config: DeflateConfig) -> Option<(Agreed, String)> {
    let p = params(offer)?;
    let server_window_bits = match p.server_max_window_bits {
        None => 15,
        // zlib cannot write a raw stream with an 8-bit window; a bare parameter is malformed.
        Some(Some(b)) if b >= 9 => b,
        Some(_) => return None,
    };
    // The client's window, bare or with a value, needs nothing of the server: the inflater
    // takes any window up to 15 bits.
    let agreed = Agreed {
        server_no_context_takeover: config.server_no_context_takeover
            || p.server_no_context_takeover,
        client_no_context_takeover: config.client_no_context_takeover
            || p.client_no_context_takeover,
        server_window_bits,
        client_window_bits: 15,
        config,
    };
    let mut header = String::from("permessage-deflate");
    if agreed.server_no_context_takeover {
        header.push_str("; server_no_context_takeover");
    }
    if agreed.client_no_context_takeover {
        header.push_str("; client_no_context_takeover");
    }
    if agreed.server_window_bits < 15 {
        header.push_str(&format!(
            "; server_max_window_bits={}",
            agreed.server_window_bits
        ));
    }
    Some((agreed, header))
}

/// What a client offers: permessage-deflate, saying it can take a smaller window of its own if
/// the server asks (`client_max_window_bits`), and asking for no context takeover on either side
/// as `config` says.
pub fn client_offer(config: DeflateConfig) -> String {
    let mut offer = String::from("permessage-deflate; client_max_window_bits");
    if config.server_no_context_takeover {
        offer.push_str("; server_no_context_takeover");
    }
    if config.client_no_context_takeover {
        offer.push_str("; client_no_context_takeover");
    }
    offer
}

/// A client's reading of the server's `Sec-WebSocket-Extensions` answer to
/// [`client_offer`]: what was agreed, or the protocol error that fails the connection (RFC 7692,
/// Section 5: an extension or parameter not offered, repeated or out of range).
pub fn client_agreed(response: &str, config: DeflateConfig) -> Result<Agreed, Error> {
    let refuse = Error::Protocol("permessage-deflate response not acceptable");
    let p = params(response).ok_or(refuse)?;
    Ok(Agreed {
        server_no_context_takeover: config.server_no_context_takeover
            || p.server_no_context_takeover,
        client_no_context_takeover: config.client_no_context_takeover
            || p.client_no_context_takeover,
        // The inflater takes any window up to 15 bits; an answer names it with a value.
        server_window_bits: match p.server_max_window_bits {
            None => 15,
            Some(Some(b)) => b,
            Some(None) => return Err(refuse),
        },
        // zlib cannot write a raw stream with an 8-bit window.
        client_window_bits: match p.client_max_window_bits {
            None => 15,
            Some(Some(b)) if b >= 9 => b,
            Some(_) => return Err(refuse),
        },
        config,
    })
}

/// The four bytes a sync flush ends with, which RFC 7692 leaves off each message.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Compresses whole messages.
pub struct Deflater {
    compress: Compress,
    no_context_takeover: bool,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater").finish_non_exhaustive()
    }
}

impl Deflater {
    /// A compressor at `level` with a window of `window_bits`, resetting after each message
    /// when `no_context_takeover`.
    pub fn new(level: u32, window_bits: u8, no_context_takeover: bool) -> Deflater {
        Deflater {
            compress: Compress::new_with_window_bits(
                Compression::new(level.min(9)),
                false,
                window_bits.clamp(9, 15),
            ),
            no_context_takeover,
        }
    }

    /// Appends `data` compressed, without the sync flush's tail, to `out`.
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        let mut input = data;
        loop {
            out.reserve(data.len() / 2 + 64);
            let before = self.compress.total_in();
            // The output has room: an error would be a misuse of the compressor, and is not
            // retried for ever.
            if self
                .compress
                .compress_vec(input, out, FlushCompress::Sync)
                .is_err()
            {
                break;
            }
            let used = (self.compress.total_in() - before) as usize;
            input = &input[used..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        if out[start..].ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        if self.no_context_takeover {
            self.compress.reset();
        }
    }
}

/// Inflates whole messages, never past a limit: a small message that inflates to gigabytes
/// (a "bomb") stops at the limit with [`Error::TooBig`] (1009), having allocated no more.
pub struct Inflater {
    decompress: Decompress,
    no_context_takeover: bool,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater").finish_non_exhaustive()
    }
}

impl Inflater {
    /// An inflater (any window up to 15 bits), resetting after each message when
    /// `no_context_takeover`.
    pub fn new(no_context_takeover: bool) -> Inflater {
        Inflater {
            decompress: Decompress::new_with_window_bits(false, 15),
            no_context_takeover,
        }
    }

    /// Appends the message `data` inflated to `out`, failing once `out` would pass `limit`
    /// (the buffer grows geometrically but never past `limit` + 1 bytes of message). A message
    /// whose last block is final (BFINAL, RFC 7692 Section 7.2.3.3) ends its stream: the next
    /// message starts a new one. Compressed bytes after that end, or that the inflater can make
    /// no progress with, are a protocol error rather than a loop.
    pub fn inflate(&mut self, data: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        let cap = start.saturating_add(limit).saturating_add(1);
        let mut ended = false;
        for (mut input, tail) in [(data, false), (&TAIL[..], true)] {
            // Until the input is used up and the last call left room (so nothing is pending).
            let mut pending = true;
            while !ended && (!input.is_empty() || pending) {
                if out.len() == out.capacity() {
                    let want = (out.capacity() * 2).max(out.len() + 256).min(cap);
                    out.reserve_exact(want.saturating_sub(out.len()));
                }
                let (in_before, out_before) = (self.decompress.total_in(), out.len());
                let status = self
                    .decompress
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .map_err(|_| Error::Protocol("compressed data is not a deflate stream"))?;
                let used = (self.decompress.total_in() - in_before) as usize;
                input = &input[used..];
                if out.len() - start > limit {
                    return Err(Error::TooBig);
                }
                ended = status == Status::StreamEnd;
                pending = out.len() == out.capacity();
                if used == 0 && out.len() == out_before && !ended {
                    if input.is_empty() {
                        break;
                    }
                    return Err(Error::Protocol(
                        "compressed data the inflater cannot go on with",
                    ));
                }
            }
            // The appended tail may follow a final block; message bytes may not.
            if ended && !tail && !input.is_empty() {
                return Err(Error::Protocol(
                    "data after the end of the compressed stream",
                ));
            }
        }
        if ended || self.no_context_takeover {
            self.decompress.reset(false);
        }
        Ok(())
    }
}
