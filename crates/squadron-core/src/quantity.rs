//! Durations and byte sizes as written in manifests (`30s`, `1h30m`, `8G`, `40Gi`).
//!
//! Parsing is strict on purpose: a manifest is replicated through Raft and re-validated on
//! every replica, so any spelling accepted here is accepted forever.

use crate::validation_error::ValidationError;

const DURATION_FORMS: &str =
    "expected a whole-number duration with units ms, s, m, h or d, largest unit first, \
     such as 500ms, 30s, 15m, 24h, 7d or 1h30m";

const BYTE_SIZE_FORMS: &str = "expected a whole number of bytes, optionally followed by K, M, G \
     or T (1024-based; KB/Ki/KiB etc. mean the same), such as 4096, 1024K, 512M, 8G, 40Gi or 8GB";

const MS_PER_S: u64 = 1_000;
const MS_PER_M: u64 = 60 * MS_PER_S;
const MS_PER_H: u64 = 60 * MS_PER_M;
const MS_PER_D: u64 = 24 * MS_PER_H;

/// Duration units from largest to smallest; compounds must follow this order.
const DURATION_UNITS: [(&str, u64); 5] = [
    ("d", MS_PER_D),
    ("h", MS_PER_H),
    ("m", MS_PER_M),
    ("s", MS_PER_S),
    ("ms", 1),
];

/// Parses a duration such as `500ms`, `30s`, `15m`, `24h`, `7d` or `1h30m` into milliseconds.
///
/// Each part is a whole number followed by a unit; parts must go from the largest unit to the
/// smallest with no unit repeated, so every value has few spellings and `30m1h` is refused.
pub fn parse_duration_ms(field: &str, s: &str) -> Result<u64, ValidationError> {
    let bad = |what: &str| ValidationError::new(field, format!("{what}; {DURATION_FORMS}"));
    if s.is_empty() {
        return Err(bad("must not be empty"));
    }
    if s.starts_with('-') {
        return Err(bad(&format!("must not be negative, got {s:?}")));
    }
    let mut rest = s;
    let mut total: u64 = 0;
    // Index into DURATION_UNITS of the next unit allowed; enforces largest-first order.
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad(&format!("expected a number in {s:?}")));
        }
        let (number, after) = rest.split_at(digits);
        let letters = after.len()
            - after
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let (unit, after) = after.split_at(letters);
        if unit.is_empty() {
            return Err(if after.is_empty() {
                bad(&format!("missing unit after {number:?} in {s:?}"))
            } else {
                bad(&format!("unexpected {after:?} in {s:?}"))
            });
        }
        let Some(index) = DURATION_UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(bad(&format!("unknown unit {unit:?} in {s:?}")));
        };
        if index < next_unit {
            return Err(bad(&format!(
                "unit {unit:?} out of order or repeated in {s:?}"
            )));
        }
        next_unit = index + 1;
        let too_large = || bad(&format!("{s:?} is too large"));
        let value: u64 = number.parse().map_err(|_| too_large())?;
        let part = value
            .checked_mul(DURATION_UNITS[index].1)
            .ok_or_else(too_large)?;
        total = total.checked_add(part).ok_or_else(too_large)?;
        rest = after;
    }
    Ok(total)
}

/// Formats milliseconds as the shortest compound [`parse_duration_ms`] reads back to the same
/// value. Days are never used, so a day reads `24h` as operators usually write it.
pub fn format_duration_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (name, size) in &DURATION_UNITS[1..] {
        let count = rest / size;
        if count > 0 {
            out.push_str(&count.to_string());
            out.push_str(name);
            rest %= size;
        }
    }
    out
}

const KIB: u64 = 1024;

/// Binary multipliers; decimal-looking suffixes (`GB`) deliberately mean the same as `G` and
/// `Gi`, because sandbox sizes are always allocated in binary units.
const BYTE_UNITS: [(char, u64); 4] = [
    ('K', KIB),
    ('M', KIB * KIB),
    ('G', KIB * KIB * KIB),
    ('T', KIB * KIB * KIB * KIB),
];

/// Parses a byte size: plain bytes (`4096`, `4096B`) or a whole number with a 1024-based
/// suffix `K`, `M`, `G` or `T`, optionally followed by `i`, `B` or `iB` (`8G`, `40Gi`, `8GB`,
/// `1024KiB`). Suffix letters are case-insensitive.
pub fn parse_byte_size(field: &str, s: &str) -> Result<u64, ValidationError> {
    let bad = |what: &str| ValidationError::new(field, format!("{what}; {BYTE_SIZE_FORMS}"));
    if s.is_empty() {
        return Err(bad("must not be empty"));
    }
    if s.starts_with('-') {
        return Err(bad(&format!("must not be negative, got {s:?}")));
    }
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return Err(bad(&format!("expected a number in {s:?}")));
    }
    let (number, suffix) = s.split_at(digits);
    let upper = suffix.to_ascii_uppercase();
    let multiplier = match upper.as_str() {
        "" | "B" => 1,
        _ => {
            let mut chars = upper.chars();
            let letter = chars.next().unwrap_or(' ');
            let tail: String = chars.collect();
            let unit = BYTE_UNITS.iter().find(|(c, _)| *c == letter);
            match (unit, tail.as_str()) {
                (Some((_, size)), "" | "I" | "B" | "IB") => *size,
                _ => return Err(bad(&format!("unknown unit {suffix:?} in {s:?}"))),
            }
        }
    };
    let too_large = || bad(&format!("{s:?} is too large"));
    let value: u64 = number.parse().map_err(|_| too_large())?;
    value.checked_mul(multiplier).ok_or_else(too_large)
}

/// Formats bytes with the largest 1024-based suffix that divides them exactly (`8G`, `1536M`),
/// or as a plain number; [`parse_byte_size`] reads the result back to the same value.
pub fn format_byte_size(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_string();
    }
    for (letter, size) in BYTE_UNITS.iter().rev() {
        if bytes % size == 0 {
            return format!("{}{letter}", bytes / size);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let cases = [
            ("0s", 0),
            ("0ms", 0),
            ("500ms", 500),
            ("30s", 30_000),
            ("15m", 900_000),
            ("24h", 86_400_000),
            ("7d", 604_800_000),
            ("1h30m", 5_400_000),
            ("1d2h3m4s5ms", 93_784_005),
            ("90s", 90_000),
        ];
        for (text, ms) in cases {
            assert_eq!(parse_duration_ms("t", text), Ok(ms), "{text}");
        }
    }

    #[test]
    fn durations_refused() {
        for text in [
            "", "-5s", "30", "5x", "5 s", " 5s", "5s ", "1.5h", "h", "30m1h", "1h1h", "5S",
            "1ms1s", "1h30", "+5s",
        ] {
            let err = parse_duration_ms("lifecycle.timeout", text).unwrap_err();
            assert_eq!(err.field, "lifecycle.timeout", "{text}");
            assert!(
                err.reason.contains("expected a whole-number duration"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn duration_overflow_refused() {
        for text in [
            "18446744073709551616ms",
            "213503982336d",
            "99999999999999999999999d",
        ] {
            let err = parse_duration_ms("t", text).unwrap_err();
            assert!(err.reason.contains("too large"), "{text}: {err}");
        }
        assert_eq!(
            parse_duration_ms("t", "18446744073709551615ms"),
            Ok(u64::MAX)
        );
    }

    #[test]
    fn durations_format() {
        assert_eq!(format_duration_ms(86_400_000), "24h");
        assert_eq!(format_duration_ms(90_000), "1m30s");
        assert_eq!(format_duration_ms(0), "0s");
        assert_eq!(format_duration_ms(500), "500ms");
        assert_eq!(format_duration_ms(3_723_004), "1h2m3s4ms");
        for ms in [0, 1, 999, 1_000, 59_999, 86_400_000, 604_800_000, u64::MAX] {
            assert_eq!(
                parse_duration_ms("t", &format_duration_ms(ms)),
                Ok(ms),
                "{ms}"
            );
        }
    }

    #[test]
    fn byte_sizes_parse() {
        let g = 1024 * 1024 * 1024;
        let cases = [
            ("4096", 4096),
            ("4096B", 4096),
            ("0", 0),
            ("1024K", 1024 * 1024),
            ("512M", 512 * 1024 * 1024),
            ("8G", 8 * g),
            ("40Gi", 40 * g),
            ("8GB", 8 * g),
            ("8GiB", 8 * g),
            ("8g", 8 * g),
            ("1T", 1024 * g),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_byte_size("s", text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn byte_sizes_refused() {
        for text in [
            "",
            "-1G",
            "G",
            "8X",
            "8P",
            "1.5G",
            "8 G",
            "8GG",
            "8Gb2",
            "8iB",
            "99999999999999999999",
            "17179869184G",
        ] {
            let err = parse_byte_size("vm.memory", text).unwrap_err();
            assert_eq!(err.field, "vm.memory", "{text}");
            assert!(err.reason.contains("1024-based"), "{text}: {err}");
        }
    }

    #[test]
    fn byte_sizes_format() {
        assert_eq!(format_byte_size(8 * 1024 * 1024 * 1024), "8G");
        assert_eq!(format_byte_size(1536 * 1024 * 1024), "1536M");
        assert_eq!(format_byte_size(4097), "4097");
        assert_eq!(format_byte_size(0), "0");
        for bytes in [0, 1, 1023, 1024, 16 << 20, 1 << 40, 16 << 40, u64::MAX] {
            assert_eq!(
                parse_byte_size("s", &format_byte_size(bytes)),
                Ok(bytes),
                "{bytes}"
            );
        }
    }
}
