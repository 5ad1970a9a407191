//! Limits and timeouts, each built through a builder that checks every value once, when it is built, so a
//! [`Limits`] or [`Timeouts`] in hand is always a valid one; both can gain settings without
//! breaking code that builds them.

use std::fmt;
use std::time::Duration;

/// Size limits applied while parsing requests. The engines answer a request over one with its status (431, 414, 413).
///
/// ```
/// let limits = canter_http::Limits::builder().max_body(1 << 20).max_headers(50).build()?;
/// assert_eq!(limits.max_body(), 1 << 20);
/// # Ok::<(), canter_http::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    max_head: usize,
    max_headers: usize,
    max_target: usize,
    max_body: u64,
    max_chunk_ext: usize,
    max_trailers: usize,
}

impl Limits {
    /// Hard upper bound on [`Limits::max_head`] (64 KiB − 1): offsets into a head are 16-bit.
    pub const HEAD_CAP: usize = u16::MAX as usize;

    /// Hard upper bound on [`Limits::max_headers`]: the parser's scratch space is fixed.
    pub const HEADER_COUNT_CAP: usize = 256;

    /// A builder starting from the defaults.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder(Limits::default())
    }

    /// A builder starting from these limits, to change some of them.
    pub fn to_builder(self) -> LimitsBuilder {
        LimitsBuilder(self)
    }

    /// Maximum size of the request line plus header section, in bytes (431 beyond it). At most
    /// [`Limits::HEAD_CAP`].
    #[inline]
    pub fn max_head(&self) -> usize {
        self.max_head
    }

    /// Maximum number of header fields (431 beyond it). At most [`Limits::HEADER_COUNT_CAP`].
    #[inline]
    pub fn max_headers(&self) -> usize {
        self.max_headers
    }

    /// Maximum length of the request target, in bytes (414 beyond it).
    #[inline]
    pub fn max_target(&self) -> usize {
        self.max_target
    }

    /// Maximum request body size, in bytes (413 beyond it; checked before reading when the
    /// length is declared).
    #[inline]
    pub fn max_body(&self) -> u64 {
        self.max_body
    }

    /// Maximum length of one chunk's extensions, in bytes (400 beyond it).
    #[inline]
    pub fn max_chunk_ext(&self) -> usize {
        self.max_chunk_ext
    }

    /// Maximum size of the trailer section of a chunked body, in bytes (431 beyond it).
    #[inline]
    pub fn max_trailers(&self) -> usize {
        self.max_trailers
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 16 * 1024,
            max_headers: 100,
            max_target: 8 * 1024,
            max_body: 16 * 1024 * 1024,
            max_chunk_ext: 1024,
            max_trailers: 8 * 1024,
        }
    }
}

/// Builds [`Limits`]; [`LimitsBuilder::build`] checks them.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct LimitsBuilder(Limits);

impl LimitsBuilder {
    /// See [`Limits::max_head`]: 1 to [`Limits::HEAD_CAP`].
    pub fn max_head(mut self, bytes: usize) -> Self {
        self.0.max_head = bytes;
        self
    }

    /// See [`Limits::max_headers`]: 0 to [`Limits::HEADER_COUNT_CAP`] (0 refuses any field).
    pub fn max_headers(mut self, count: usize) -> Self {
        self.0.max_headers = count;
        self
    }

    /// See [`Limits::max_target`]: at least 1.
    pub fn max_target(mut self, bytes: usize) -> Self {
        self.0.max_target = bytes;
        self
    }

    /// See [`Limits::max_body`].
    pub fn max_body(mut self, bytes: u64) -> Self {
        self.0.max_body = bytes;
        self
    }

    /// See [`Limits::max_chunk_ext`].
    pub fn max_chunk_ext(mut self, bytes: usize) -> Self {
        self.0.max_chunk_ext = bytes;
        self
    }

    /// See [`Limits::max_trailers`].
    pub fn max_trailers(mut self, bytes: usize) -> Self {
        self.0.max_trailers = bytes;
        self
    }

    /// The limits, or the first setting out of its range.
    pub fn build(self) -> Result<Limits, ConfigError> {
        let l = self.0;
        check(
            (1..=Limits::HEAD_CAP).contains(&l.max_head),
            "max_head",
            "must be 1 to 65535 bytes",
        )?;
        check(
            l.max_headers <= Limits::HEADER_COUNT_CAP,
            "max_headers",
            "must be at most 256",
        )?;
        check(l.max_target >= 1, "max_target", "must be at least 1 byte")?;
        Ok(l)
    }
}

/// Timeouts enforced by the connection. The engine never reads a clock: the driver passes the
/// current time in and asks the engine's deadline when to come back.
///
/// ```
/// use std::time::Duration;
/// let timeouts = canter_http::Timeouts::builder().idle(Duration::from_secs(5)).build()?;
/// assert_eq!(timeouts.idle(), Duration::from_secs(5));
/// # Ok::<(), canter_http::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeouts {
    idle: Duration,
    head: Duration,
    body: Duration,
    write: Duration,
}

impl Timeouts {
    /// A builder starting from the defaults.
    pub fn builder() -> TimeoutsBuilder {
        TimeoutsBuilder(Timeouts::default())
    }

    /// A builder starting from these timeouts, to change some of them.
    pub fn to_builder(self) -> TimeoutsBuilder {
        TimeoutsBuilder(self)
    }

    /// How long a keep-alive connection may sit between requests.
    #[inline]
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// How long a client may take to send a complete request head, from its first byte.
    #[inline]
    pub fn head(&self) -> Duration {
        self.head
    }

    /// How long a request body may go without progress.
    #[inline]
    pub fn body(&self) -> Duration {
        self.body
    }

    /// How long a response may wait for the peer to accept more bytes.
    #[inline]
    pub fn write(&self) -> Duration {
        self.write
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            idle: Duration::from_secs(60),
            head: Duration::from_secs(10),
            body: Duration::from_secs(30),
            write: Duration::from_secs(30),
        }
    }
}

/// Builds [`Timeouts`]; [`TimeoutsBuilder::build`] checks them (each must be above zero).
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct TimeoutsBuilder(Timeouts);

impl TimeoutsBuilder {
    /// See [`Timeouts::idle`].
    pub fn idle(mut self, after: Duration) -> Self {
        self.0.idle = after;
        self
    }

    /// See [`Timeouts::head`].
    pub fn head(mut self, after: Duration) -> Self {
        self.0.head = after;
        self
    }

    /// See [`Timeouts::body`].
    pub fn body(mut self, after: Duration) -> Self {
        self.0.body = after;
        self
    }

    /// See [`Timeouts::write`].
    pub fn write(mut self, after: Duration) -> Self {
        self.0.write = after;
        self
    }

    /// The timeouts, or the first that is zero.
    pub fn build(self) -> Result<Timeouts, ConfigError> {
        let t = self.0;
        for (value, name) in [
            (t.idle, "idle"),
            (t.head, "head"),
            (t.body, "body"),
            (t.write, "write"),
        ] {
            check(!value.is_zero(), name, "must be above zero")?;
        }
        Ok(t)
    }
}

/// A setting out of its range, found when limits, timeouts or a server configuration were
/// built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: &'static str,
    problem: String,
}

impl ConfigError {
    /// A setting and what is wrong with its value.
    pub fn new(setting: &'static str, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            setting,
            problem: problem.into(),
        }
    }

    /// The setting's name, as its builder method spells it.
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.setting, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// An invalid setting as an [`std::io::Error`] of kind `InvalidInput`, for callers that build a
/// configuration and bind a listener in one `io::Result`.
impl From<ConfigError> for std::io::Error {
    fn from(e: ConfigError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

fn check(ok: bool, setting: &'static str, problem: &'static str) -> Result<(), ConfigError> {
    match ok {
        true => Ok(()),
        false => Err(ConfigError::new(setting, problem)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_and_round_trip() {
        assert_eq!(Limits::builder().build(), Ok(Limits::default()));
        assert_eq!(Timeouts::builder().build(), Ok(Timeouts::default()));
        let limits = Limits::builder().max_body(7).build().expect("valid");
        let again = limits.to_builder().max_target(9).build().expect("valid");
        assert_eq!((again.max_body(), again.max_target()), (7, 9));
        assert_eq!(again.max_head(), Limits::default().max_head());
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        let refused = |b: LimitsBuilder| b.build().expect_err("refused").setting();
        assert_eq!(refused(Limits::builder().max_head(0)), "max_head");
        assert_eq!(
            refused(Limits::builder().max_head(Limits::HEAD_CAP + 1)),
            "max_head"
        );
        assert_eq!(
            refused(Limits::builder().max_headers(Limits::HEADER_COUNT_CAP + 1)),
            "max_headers"
        );
        assert_eq!(refused(Limits::builder().max_target(0)), "max_target");
        // The edges themselves are valid.
        Limits::builder()
            .max_head(Limits::HEAD_CAP)
            .max_headers(Limits::HEADER_COUNT_CAP)
            .max_headers(0)
            .max_target(1)
            .build()
            .expect("edges are valid");
        let zero = Duration::ZERO;
        for (builder, name) in [
            (Timeouts::builder().idle(zero), "idle"),
            (Timeouts::builder().head(zero), "head"),
            (Timeouts::builder().body(zero), "body"),
            (Timeouts::builder().write(zero), "write"),
        ] {
            let err = builder.build().expect_err(name);
            assert_eq!(err.setting(), name);
            assert_eq!(
                err.to_string(),
                format!("invalid {name}: must be above zero")
            );
        }
        let io: std::io::Error = ConfigError::new("x", "y").into();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    }
}
