//! Parsing of human durations such as `10s`, `500ms`, `1m`.

use std::time::Duration;

/// Parses a duration like `10s`, `500ms`, `1m`, `2h`, `250us`, `1.5s`.
///
/// A bare number is taken as seconds. Units: `ns`, `us`, `ms`, `s`, `m`, `h`.
pub fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration".to_string());
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!("invalid duration {input:?}: missing number"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {input:?}: bad number"))?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "invalid duration {input:?}: unknown unit {other:?} (use ns, us, ms, s, m, h)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("invalid duration {input:?}: out of range"));
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
    }
}
