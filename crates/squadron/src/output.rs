//! Printing results: aligned text tables for people, pretty JSON of the typed value for tools.

use serde::Serialize;
use serde_json::Value;

use crate::cli::OutputFormat;

/// A table of aligned columns (drawn by `comfy-table`, without borders). Headers are printed
/// in capitals; cells are padded to the widest cell of their column (display width) and
/// separated by two spaces; trailing blanks are trimmed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Spaces after each cell: the gap between two columns.
const COLUMN_GAP: u16 = 2;

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_uppercase()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut table = comfy_table::Table::new();
        table
            .load_preset(comfy_table::presets::NOTHING)
            .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
            .set_header(self.headers.clone());
        for row in &self.rows {
            table.add_row(row.clone());
        }
        for column in table.column_iter_mut() {
            column.set_padding((0, COLUMN_GAP));
        }
        let mut out = String::new();
        for line in table.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if self.rows.is_empty() {
            out.push_str("(none)\n");
        }
        out
    }
}

/// `key  value` lines, keys aligned.
pub fn key_values(pairs: &[(String, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let pad = width - k.chars().count();
        out.push_str(format!("{k}{}  {v}", " ".repeat(pad)).trim_end());
        out.push('\n');
    }
    out
}

/// A JSON value as one table cell: scalars bare, `-` for null or empty, lists of scalars
/// comma-separated, anything else compact JSON.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) if items.iter().all(|i| !i.is_array() && !i.is_object()) => {
            items.iter().map(cell).collect::<Vec<_>>().join(",")
        }
        Value::Object(map) if map.is_empty() => "-".into(),
        other => other.to_string(),
    }
}

/// An object's fields as key/value pairs (a non-object becomes one `value` pair).
pub fn object_pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), cell(v))).collect(),
        other => vec![("value".into(), cell(other))],
    }
}

/// A list of objects as a table whose columns are the first object's fields.
pub fn value_table(items: &[Value]) -> Table {
    let headers: Vec<String> = match items.first() {
        Some(Value::Object(map)) => map.keys().cloned().collect(),
        _ => vec!["value".into()],
    };
    let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(&refs);
    for item in items {
        match item {
            Value::Object(map) => table.row(
                headers
                    .iter()
                    .map(|h| map.get(h).map(cell).unwrap_or_else(|| "-".into()))
                    .collect(),
            ),
            other => table.row(vec![cell(other)]),
        }
    }
    table
}

/// A write's outcome as text: `ok: <kind>` and the outcome's fields.
pub fn outcome_text(outcome: &squadron_core::Outcome) -> String {
    match serde_json::to_value(outcome) {
        Ok(Value::String(kind)) => format!("ok: {kind}\n"),
        Ok(Value::Object(map)) => {
            let mut out = String::new();
            for (kind, inner) in &map {
                out.push_str(&format!("ok: {kind}\n"));
                if let Value::Object(_) = inner {
                    out.push_str(&indent(&key_values(&object_pairs(inner))));
                } else {
                    out.push_str(&format!("  {}\n", cell(inner)));
                }
            }
            out
        }
        Ok(other) => format!("ok: {other}\n"),
        Err(e) => format!("ok (unprintable outcome: {e})\n"),
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Shortens a digest for a table cell.
pub fn short(digest: &str) -> String {
    digest.chars().take(12).collect()
}

/// Prints a value: pretty JSON, or the text `table` renders.
pub fn emit<T: Serialize>(
    format: OutputFormat,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => format!("{}\n", serde_json::to_string_pretty(value)?),
        OutputFormat::Table => table(value),
    };
    write_stdout(&text)
}

/// Writes to standard output; a closed pipe (`squadron … | head`) is not an error.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Prints any value: JSON, or its fields (an object) or rows (a list) as text.
pub fn emit_generic<T: Serialize>(format: OutputFormat, value: &T) -> anyhow::Result<()> {
    emit(format, value, |v| match serde_json::to_value(v) {
        Ok(Value::Array(items)) => value_table(&items).render(),
        Ok(other) => key_values(&object_pairs(&other)),
        Err(e) => format!("(unprintable: {e})\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns_and_trim() {
        let mut t = Table::new(&["id", "state", "worker"]);
        t.row(vec!["1".into(), "PENDING".into(), "-".into()]);
        t.row(vec!["12".into(), "RUNNING".into(), "worker-a".into()]);
        assert_eq!(
            t.render(),
            "ID  STATE    WORKER\n\
             1   PENDING  -\n\
             12  RUNNING  worker-a\n"
        );
    }

    #[test]
    fn empty_tables_say_so() {
        let t = Table::new(&["id", "name"]);
        assert_eq!(t.render(), "ID  NAME\n(none)\n");
    }

    #[test]
    fn wide_unicode_and_short_rows_do_not_break_alignment() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["héllo".into()]);
        t.row(vec!["x".into(), "y".into()]);
        assert_eq!(t.render(), "A      B\nhéllo\nx      y\n");
    }

    #[test]
    fn key_values_align() {
        let text = key_values(&[("id".into(), "7".into()), ("state".into(), "ok".into())]);
        assert_eq!(text, "id     7\nstate  ok\n");
    }

    #[test]
    fn cells_render_compactly() {
        assert_eq!(cell(&json!(null)), "-");
        assert_eq!(cell(&json!("")), "-");
        assert_eq!(cell(&json!([])), "-");
        assert_eq!(cell(&json!(["codex", "claude"])), "codex,claude");
        assert_eq!(cell(&json!(3)), "3");
        assert_eq!(cell(&json!({"a": 1})), "{\"a\":1}");
    }

    #[test]
    fn generic_tables_use_the_first_objects_fields() {
        let t = value_table(&[json!({"kind": "note", "seq": 1}), json!({"seq": 2})]);
        assert_eq!(t.render(), "KIND  SEQ\nnote  1\n-     2\n");
    }

    #[test]
    fn outcomes_print_their_kind_and_fields() {
        use squadron_core::Outcome;
        assert_eq!(
            outcome_text(&Outcome::ProjectCreated),
            "ok: project_created\n"
        );
        let text = outcome_text(&Outcome::TaskSubmitted {
            task: squadron_core::ids::TaskId::new(4).unwrap(),
        });
        assert_eq!(text, "ok: task_submitted\n  task  4\n");
    }
}
