//! Aligned text tables for the command line (`dead list`, `endpoints list|health`, `trace`):
//! left-aligned columns separated by two spaces, no borders, like `kubectl get`.

use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement, Table};
use std::io::Write;

/// Writes `header` and `rows` as left-aligned columns separated by two spaces; no trailing blanks.
pub fn write_table<R: AsRef<[String]>>(
    out: &mut dyn Write,
    header: &[&str],
    rows: &[R],
) -> std::io::Result<()> {
    let mut table = Table::new();
    table
        .load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    for row in rows {
        table.add_row(row.as_ref().iter().map(String::as_str));
    }
    let last = header.len().saturating_sub(1);
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        column.set_cell_alignment(CellAlignment::Left);
    }
    for line in table.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_without_trailing_blanks() {
        let mut out = Vec::new();
        let rows = [
            vec!["long".to_string(), "x".to_string()],
            vec!["s".to_string(), "".to_string()],
        ];
        write_table(&mut out, &["A", "BB"], &rows).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text, "A     BB\nlong  x\ns\n");
    }

    #[test]
    fn wide_cells_are_not_wrapped() {
        let mut out = Vec::new();
        let long = "e".repeat(300);
        write_table(
            &mut out,
            &["ID", "ERROR"],
            &[[String::from("1"), long.clone()]],
        )
        .expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text, format!("ID  ERROR\n1   {long}\n"));
    }
}
