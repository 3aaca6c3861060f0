//! The wall clock, in the units the record contracts use: unix milliseconds (delivery records,
//! due times, history) and unix seconds (`webhook-timestamp`, the seen-set's coarse times).
//! One helper, so every stage reads time the same way; a clock before 1970 reads as 0.
//!
//! Every wall-clock read of hookline's own code goes through here, which lets the fault suite
//! step one process's clock the way an NTP step would: `HOOKLINE_TEST_CLOCK_OFFSET_FILE` names a
//! file holding an offset (`+0`, `+1h`, `-1h`, `+90s`, `-5m`, `+250ms`) that is added to every
//! read, re-read every 100 ms. Unset (always, outside the fault suite) it costs one atomic load.
//! The monotonic clock (`Instant`) and clocks read inside libraries (librdkafka's record
//! timestamps, TLS certificate times) are not offset.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The variable naming the test offset file.
pub const OFFSET_FILE_VAR: &str = "HOOKLINE_TEST_CLOCK_OFFSET_FILE";

/// Current unix time in milliseconds.
pub fn now_ms() -> i64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    real.saturating_add(offset_ms()).max(0)
}

/// Current unix time in seconds.
pub fn now_secs() -> i64 {
    now_ms() / 1000
}

/// The current wall clock as a [`SystemTime`] (for APIs that take one, e.g. HTTP dates).
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(now_ms()).unwrap_or(0))
}

static OFFSET_MS: AtomicI64 = AtomicI64::new(0);
static WATCHING: OnceLock<bool> = OnceLock::new();

fn offset_ms() -> i64 {
    if *WATCHING.get_or_init(start_watching) {
        OFFSET_MS.load(Ordering::Relaxed)
    } else {
        0
    }
}

/// Starts re-reading the offset file when the variable is set; `false` when it is not.
fn start_watching() -> bool {
    let Some(path) = std::env::var_os(OFFSET_FILE_VAR) else {
        return false;
    };
    let read = move || {
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| parse_offset(&text))
    };
    if let Some(ms) = read() {
        OFFSET_MS.store(ms, Ordering::Relaxed);
    }
    let spawned = std::thread::Builder::new()
        .name("test-clock".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            if let Some(ms) = read() {
                OFFSET_MS.store(ms, Ordering::Relaxed);
            }
        });
    eprintln!(
        "hookline: {OFFSET_FILE_VAR} is set: the wall clock is offset by a test file ({})",
        if spawned.is_ok() {
            "re-read every 100 ms"
        } else {
            "read once: no thread"
        }
    );
    true
}

/// Parses `+1h`, `-1h`, `+0`, `90s`, `-5m`, `+250ms` into milliseconds; `None` if malformed.
fn parse_offset(text: &str) -> Option<i64> {
    let text = text.trim();
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text.strip_prefix('+').unwrap_or(text)),
    };
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (number, unit) = rest.split_at(digits);
    let n: i64 = number.parse().ok()?;
    let scale = match unit {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale)?.checked_mul(sign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_and_seconds_agree() {
        let (ms, s) = (now_ms(), now_secs());
        assert!(ms > 1_600_000_000_000, "{ms}");
        assert!((ms / 1000 - s).abs() <= 1);
        let t = now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!((t - ms).abs() < 1000);
    }

    #[test]
    fn offsets_parse_as_the_fault_suite_writes_them() {
        assert_eq!(parse_offset("+0"), Some(0));
        assert_eq!(parse_offset("+1h\n"), Some(3_600_000));
        assert_eq!(parse_offset("-1h"), Some(-3_600_000));
        assert_eq!(parse_offset("90"), Some(90_000));
        assert_eq!(parse_offset("-5m"), Some(-300_000));
        assert_eq!(parse_offset("+250ms"), Some(250));
        assert_eq!(parse_offset("+1x"), None);
        assert_eq!(parse_offset("h"), None);
        assert_eq!(parse_offset(""), None);
    }
}
