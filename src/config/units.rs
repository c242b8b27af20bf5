//! Human-readable durations (`250ms`, `30s`, `5m`, `1h`) and sizes (`64KiB`, `4MiB`) in the
//! configuration file and on the command line, and the keyed forms every section parses with.

use std::time::Duration;

use super::error::{invalid, ConfigError};

/// Parses a human duration: `250ms`, `30s`, `5m`, `1h` (a bare number is seconds).
///
/// # Errors
/// A message saying what was expected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 250ms, 30s, 5m, 1h"))?;
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("`{s}` has an unknown unit (use ms, s, m or h)")),
    };
    Ok(d)
}

/// Parses a human size: `512`, `64KiB`, `4MiB`, `1GiB` (also `KB`/`MB`, taken as binary).
///
/// # Errors
/// A message saying what was expected.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 64KiB or 4MiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{s}` has an unknown unit (use B, KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `key`'s duration, or `default` when absent.
pub(super) fn duration(
    key: &'static str,
    v: Option<&str>,
    default: &str,
) -> Result<Duration, ConfigError> {
    parse_duration(v.unwrap_or(default)).map_err(|e| invalid(key, e))
}

/// `key`'s duration, or `default` when absent; zero is refused.
pub(super) fn nonzero_duration(
    key: &'static str,
    v: Option<&str>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let d = duration(key, v, default)?;
    if d.is_zero() {
        return Err(invalid(key, "must be greater than zero"));
    }
    Ok(d)
}

/// `key`'s size, or `default` when absent; zero is refused.
pub(super) fn size(
    key: &'static str,
    v: Option<&str>,
    default: &str,
) -> Result<usize, ConfigError> {
    match parse_size(v.unwrap_or(default)).map_err(|e| invalid(key, e))? {
        0 => Err(invalid(key, "must be greater than zero")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("64kb").unwrap(), 64 << 10);
        assert!(parse_size("lots").is_err());
    }
}
