//! The wall clock, in the units the record contracts use: unix milliseconds (delivery records,
//! due times, history) and unix seconds (`webhook-timestamp`, the seen-set's coarse times).
//! One helper, so every stage reads time the same way; a clock before 1970 reads as 0.

use std::time::{SystemTime, UNIX_EPOCH};

/// Current unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Current unix time in seconds.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_and_seconds_agree() {
        let (ms, s) = (now_ms(), now_secs());
        assert!(ms > 1_600_000_000_000, "{ms}");
        assert!((ms / 1000 - s).abs() <= 1);
    }
}
