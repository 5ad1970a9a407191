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

fn accept(offer: &str, config: DeflateConfig) -> Option<(Agreed, String)> {
    let mut parts = offer.split(';').map(str::trim);
    if parts.next()? != "permessage-deflate" {
        return None;
    }
    let mut agreed = Agreed {
        server_no_context_takeover: config.server_no_context_takeover,
        client_no_context_takeover: config.client_no_context_takeover,
        server_window_bits: 15,
        client_window_bits: 15,
        config,
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut client_window: Option<Option<u8>> = None;
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        if seen.contains(&name) {
            return None;
        }
        seen.push(name);
        let bits = |v: Option<&str>| {
            v.and_then(|v| v.parse::<u8>().ok())
                .filter(|b| (8..=15).contains(b))
        };
        match (name, value) {
            ("server_no_context_takeover", None) => agreed.server_no_context_takeover = true,
            ("client_no_context_takeover", None) => agreed.client_no_context_takeover = true,
            ("server_max_window_bits", v) => {
                let b = bits(v)?;
                if b < 9 {
                    return None;
                }
                agreed.server_window_bits = b;
            }
            ("client_max_window_bits", None) => client_window = Some(None),
            ("client_max_window_bits", v) => client_window = Some(Some(bits(v)?)),
            _ => return None,
        }
    }
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
    // The inflater takes any window up to 15 bits: the client's stays as it offered.
    let _ = client_window;
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
    let mut parts = response.split(';').map(str::trim);
    if parts.next() != Some("permessage-deflate") {
        return Err(refuse);
    }
    let mut agreed = Agreed {
        server_no_context_takeover: config.server_no_context_takeover,
        client_no_context_takeover: config.client_no_context_takeover,
        server_window_bits: 15,
        client_window_bits: 15,
        config,
    };
    let mut seen: Vec<&str> = Vec::new();
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        if seen.contains(&name) {
            return Err(refuse);
        }
        seen.push(name);
        let bits = value
            .and_then(|v| v.parse::<u8>().ok())
            .filter(|b| (8..=15).contains(b));
        match (name, value) {
            ("server_no_context_takeover", None) => agreed.server_no_context_takeover = true,
            ("client_no_context_takeover", None) => agreed.client_no_context_takeover = true,
            // The inflater takes any window up to 15 bits.
            ("server_max_window_bits", Some(_)) => {
                agreed.server_window_bits = bits.ok_or(refuse)?;
            }
            // zlib cannot write a raw stream with an 8-bit window.
            ("client_max_window_bits", Some(_)) => match bits {
                Some(b) if b >= 9 => agreed.client_window_bits = b,
                _ => return Err(refuse),
            },
            _ => return Err(refuse),
        }
    }
    Ok(agreed)
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
            // The output has room; an error here would be a bug in the compressor's use.
            let _ = self.compress.compress_vec(input, out, FlushCompress::Sync);
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

    /// Appends the message `data` inflated to `out`, failing once `out` would pass `limit`.
    pub fn inflate(&mut self, data: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        for mut input in [data, &TAIL[..]] {
            loop {
                let room = limit.saturating_sub(out.len() - start);
                if room == 0 {
                    // Full: done only if nothing more comes out.
                    let mut probe = Vec::with_capacity(1);
                    let _ =
                        self.decompress
                            .decompress_vec(input, &mut probe, FlushDecompress::Sync);
                    if !probe.is_empty() {
                        return Err(Error::TooBig);
                    }
                    break;
                }
                out.reserve((input.len() * 4).clamp(256, 64 * 1024).min(room));
                let before = self.decompress.total_in();
                let status = self
                    .decompress
                    .decompress_vec(input, out, FlushDecompress::Sync)
                    .map_err(|_| Error::Protocol("compressed data is not a deflate stream"))?;
                input = &input[(self.decompress.total_in() - before) as usize..];
                if out.len() - start > limit {
                    return Err(Error::TooBig);
                }
                let full = out.len() == out.capacity();
                if status == Status::StreamEnd || (input.is_empty() && !full) {
                    break;
                }
            }
        }
        if self.no_context_takeover {
            self.decompress.reset(false);
        }
        Ok(())
    }
}
