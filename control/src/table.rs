//! Tables and times for the control plane's command line (`endpoints list`, `trace`,
//! `endpoints health`).

pub use hookline_common::runtime::table::write_table;

/// RFC 3339 (UTC, milliseconds) of a unix-ms time; `-` for none.
pub fn time(ms: Option<i64>) -> String {
    match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
        .to_string(),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_millis() {
        assert_eq!(time(Some(1_000)), "1970-01-01T00:00:01.000Z");
        assert_eq!(time(None), "-");
    }
}
