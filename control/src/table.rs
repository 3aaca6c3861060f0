//! Aligned text tables for the command line (`endpoints list`, `trace`, `endpoints health`).

use std::io::Write;

/// Writes `header` and `rows` as left-aligned columns separated by two spaces.
pub fn write_table(
    out: &mut dyn Write,
    header: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    Ok(())
}

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
    fn columns_align() {
        let mut out = Vec::new();
        write_table(
            &mut out,
            &["A", "BB"],
            &[
                vec!["long".into(), "x".into()],
                vec!["s".into(), "y".into()],
            ],
        )
        .expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text, "A     BB\nlong  x\ns     y\n");
        assert_eq!(time(Some(1_000)), "1970-01-01T00:00:01.000Z");
        assert_eq!(time(None), "-");
    }
}
