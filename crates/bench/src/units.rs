//! Parsing and printing of sizes and durations for flags and tables.

/// Parses a byte count: a plain number, or one with a suffix `K`/`KB`
/// (1000), `KiB` (1024), `M`/`MB` (1000²) or `MiB` (1024²), any case.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|character: char| !character.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let number: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 100, 10KB or 4MiB"))?;
    let multiplier = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1024,
        "m" | "mb" => 1_000_000,
        "mib" => 1024 * 1024,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1024 * 1024 * 1024,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit (use B, KB, KiB, MB, MiB, GB, GiB)"
            ))
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Prints a byte count the way the seeds label message sizes: `100B`,
/// `1KB`, `10KB`, `1KiB`, `4MiB`.
pub fn format_bytes(bytes: usize) -> String {
    const MEBIBYTE: usize = 1024 * 1024;
    if bytes >= MEBIBYTE && bytes.is_multiple_of(MEBIBYTE) {
        format!("{}MiB", bytes / MEBIBYTE)
    } else if bytes >= 1_000_000 && bytes.is_multiple_of(1_000_000) {
        format!("{}MB", bytes / 1_000_000)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}KiB", bytes / 1024)
    } else if bytes >= 1000 && bytes.is_multiple_of(1000) {
        format!("{}KB", bytes / 1000)
    } else {
        format!("{bytes}B")
    }
}

/// A number with `decimals` digits after the point.
pub fn fixed(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "-".to_string()
    }
}

/// Nanoseconds to microseconds.
pub fn micros(nanoseconds: u64) -> f64 {
    nanoseconds as f64 / 1000.0
}

/// `on` or `off` (also `true`/`false`, `yes`/`no`) for a switch flag.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        other => Err(format!("{other:?} is not on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_bytes("100"), Ok(100));
        assert_eq!(parse_bytes("1KB"), Ok(1000));
        assert_eq!(parse_bytes("1kib"), Ok(1024));
        assert_eq!(parse_bytes("4MiB"), Ok(4 * 1024 * 1024));
        assert_eq!(parse_bytes(" 10k "), Ok(10_000));
        assert!(parse_bytes("ten").is_err());
        assert!(parse_bytes("1XB").is_err());
    }

    #[test]
    fn sizes_print_in_their_natural_unit() {
        assert_eq!(format_bytes(100), "100B");
        assert_eq!(format_bytes(1000), "1KB");
        assert_eq!(format_bytes(1024), "1KiB");
        assert_eq!(format_bytes(100_000), "100KB");
        assert_eq!(format_bytes(4 * 1024 * 1024), "4MiB");
        assert_eq!(format_bytes(1500), "1500B");
    }
}
