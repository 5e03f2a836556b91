//! Byte counts on the command line, one syntax for every subcommand.
//!
//! A byte count is a non-negative integer, optionally followed (spaces allowed) by a unit:
//! `B`; `K`/`KB`/`k`/`kB`, `M`/`MB`, `G`/`GB`, `T`/`TB` for powers of 1000; `KiB`, `MiB`, `GiB`,
//! `TiB` for powers of 1024. So `--budget 256MiB` is 268435456 bytes and `--shard-bytes 5G` is
//! 5000000000. Every option taking a byte count is a size, cap or budget, where 0 makes no sense:
//! 0 is refused.

/// The help text that options taking a byte count share.
pub const BYTE_UNITS_HELP: &str = "K/M/G/T = 1000-based, KiB/MiB/GiB/TiB = 1024-based";

/// The multiplier of a unit suffix, `None` for an unknown one.
fn unit_bytes(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    })
}

/// Parse a positive byte count (see the module docs): a clap `value_parser`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let trimmed = s.trim();
    let digits_end = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("{s:?} is not a byte count (e.g. 4096, 64MiB, 10G)"));
    }
    let n: u64 = digits.parse().map_err(|_| format!("byte count {s:?} does not fit in 64 bits"))?;
    let scale = unit_bytes(unit.trim())
        .ok_or_else(|| format!("unknown unit {:?} in {s:?} ({BYTE_UNITS_HELP})", unit.trim()))?;
    let bytes = n.checked_mul(scale).ok_or_else(|| format!("byte count {s:?} does not fit in 64 bits"))?;
    if bytes == 0 {
        return Err("byte count must be positive".to_owned());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4096B"), Ok(4096));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("2TiB"), Ok(2 << 40));
        assert_eq!(parse_bytes("3KiB"), Ok(3 << 10));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_bytes("3 K"), Ok(3000));
        assert_eq!(parse_bytes("3k"), Ok(3000));
        assert_eq!(parse_bytes("2 MB"), Ok(2_000_000));
        assert_eq!(parse_bytes("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_bytes(" 7M "), Ok(7_000_000));
    }

    #[test]
    fn refuses_zero_junk_and_overflow() {
        for bad in [
            "0",
            "0GiB",
            "",
            "MiB",
            "-1",
            "1.5G",
            "12 parsecs",
            "12XB",
            "1mib",
            "99999999999TiB",
            "18446744073709551616",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert!(parse_bytes("12 parsecs").unwrap_err().contains("1024-based"));
    }
}
