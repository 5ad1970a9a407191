//! Parsing of human durations such as `10s`, `500ms`, `1m`.

use std::time::Duration;

/// Why a duration did not parse; its message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// Nothing but spaces.
    Empty,
    /// No number before the unit.
    MissingNumber(String),
    /// The number does not parse.
    BadNumber(String),
    /// A unit other than `ns`, `us`, `ms`, `s`, `m`, `h`.
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit as given.
        unit: String,
    },
    /// Negative, not finite, or above 10^9 seconds.
    OutOfRange(String),
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationError::Empty => f.write_str("empty duration"),
            DurationError::MissingNumber(input) => {
                write!(f, "invalid duration {input:?}: missing number")
            }
            DurationError::BadNumber(input) => write!(f, "invalid duration {input:?}: bad number"),
            DurationError::UnknownUnit { input, unit } => write!(
                f,
                "invalid duration {input:?}: unknown unit {unit:?} (use ns, us, ms, s, m, h)"
            ),
            DurationError::OutOfRange(input) => {
                write!(f, "invalid duration {input:?}: out of range")
            }
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses a duration like `10s`, `500ms`, `1m`, `2h`, `250us`, `1.5s`.
///
/// A bare number is taken as seconds. Units: `ns`, `us`, `ms`, `s`, `m`, `h`.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(DurationError::MissingNumber(input.to_owned()));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| DurationError::BadNumber(input.to_owned()))?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(DurationError::UnknownUnit {
                input: input.to_owned(),
                unit: other.to_owned(),
            })
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(DurationError::OutOfRange(input.to_owned()));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "s", "10x", "-1s", "1.2.3s", "ms10", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_duration(" "), Err(DurationError::Empty));
        assert_eq!(
            parse_duration("10x"),
            Err(DurationError::UnknownUnit {
                input: "10x".into(),
                unit: "x".into()
            })
        );
        assert_eq!(
            parse_duration("1.2.3s").map_err(|e| e.to_string()),
            Err("invalid duration \"1.2.3s\": bad number".into())
        );
    }
}
