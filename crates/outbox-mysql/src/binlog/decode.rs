//! Reading what the sequencer needs of an outbox row from a binlog row event, and nothing more:
//! its `seq` and its key (`aggregate_id`), found by column name.
//!
//! Why only these two: the sequencer gives a row its partition (the key's hash) and its next
//! position there, by `seq`; the relay reads everything else from the table. A column the
//! reader does not decode cannot stop the route: a zero `created_at` (MariaDB's default
//! `sql_mode` accepts one), an `id` that is not a UUID, a JSON value MySQL keeps as an opaque
//! scalar, or a column left out of a `MINIMAL` row image. Such a row is positioned like any
//! other, and the claim fails it alone, naming its column (`store/claim.rs`).
//!
//! How a column is found: a row event carries values only for the columns in its image, each
//! named either by the table map's column names (`binlog_row_metadata=FULL`) or `@<ordinal>`
//! (its 0-based place in the table when the event was written). The name is taken first; the
//! ordinal from `information_schema` is the fallback for servers that send no names.

use mysql_async::binlog::row::BinlogRow as RawRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value;
use outbox_core::{Error, ErrorKind, Result};

use super::BinlogRow;

/// The columns the sequencer reads, by name.
pub(super) const COLUMNS: [&str; 2] = ["seq", "aggregate_id"];

/// Where each of [`COLUMNS`] sits in the table (0-based), for servers whose table map names no
/// columns. Migrations only ever add columns at the end, so these places stay put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    index: [usize; COLUMNS.len()],
}

impl Layout {
    /// The layout from `(column name, 1-based ordinal)` pairs, as `information_schema.COLUMNS`
    /// lists them.
    pub(super) fn from_columns(columns: &[(String, u64)]) -> Result<Self> {
        let mut index = [0; COLUMNS.len()];
        for (slot, name) in index.iter_mut().zip(COLUMNS) {
            let ordinal = columns
                .iter()
                .find(|(column, _)| column.eq_ignore_ascii_case(name))
                .map(|(_, ordinal)| *ordinal)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Schema,
                        format!(
                            "the outbox table has no `{name}` column; run `outbox migrate` \
                             for this database"
                        ),
                    )
                })?;
            *slot = usize::try_from(ordinal.saturating_sub(1)).unwrap_or(usize::MAX);
        }
        Ok(Self { index })
    }

    /// Where column `field` of [`COLUMNS`] is among the values of `raw`: by its name, or by
    /// `@<ordinal>` when the server sent no names.
    fn place(&self, raw: &RawRow, field: usize) -> Option<usize> {
        let name = COLUMNS[field];
        let unnamed = format!("@{}", self.index[field]);
        let columns = raw.columns_ref();
        columns
            .iter()
            .position(|c| c.name_str().eq_ignore_ascii_case(name))
            .or_else(|| columns.iter().position(|c| c.name_str() == unnamed))
    }

    /// The `seq` and key in a row event's after-image; an error names the column it could not
    /// read.
    pub(super) fn row(&self, mut raw: RawRow) -> Result<BinlogRow> {
        let mut take = |field: usize| -> Result<Value> {
            let name = COLUMNS[field];
            let value = self
                .place(&raw, field)
                .and_then(|i| raw.take(i))
                .ok_or_else(|| {
                    malformed(format!(
                        "the row event has no value for `{name}` (a row image without it: \
                         binlog_row_image must be FULL for every session that writes the outbox)"
                    ))
                })?;
            plain(value, name)
        };
        let seq = int(take(0)?, "seq")?.ok_or_else(|| malformed("`seq` is NULL".into()))?;
        let aggregate_id = text(take(1)?, "aggregate_id")?;
        Ok(BinlogRow { seq, aggregate_id })
    }
}

fn malformed(message: String) -> Error {
    Error::new(
        ErrorKind::Malformed,
        format!("decoding an outbox row from the binlog: {message}"),
    )
}

/// A binlog value as a plain value.
fn plain(value: BinlogValue<'_>, column: &str) -> Result<Value> {
    Value::try_from(value).map_err(|e| malformed(format!("`{column}`: {e}")))
}

fn int(value: Value, column: &str) -> Result<Option<i64>> {
    match value {
        Value::NULL => Ok(None),
        Value::Int(n) => Ok(Some(n)),
        Value::UInt(n) => i64::try_from(n)
            .map(Some)
            .map_err(|_| malformed(format!("`{column}` is {n}, past a BIGINT"))),
        other => Err(malformed(format!("`{column}` is {other:?}, not a number"))),
    }
}

fn text(value: Value, column: &str) -> Result<String> {
    match value {
        Value::Bytes(b) => {
            String::from_utf8(b).map_err(|_| malformed(format!("`{column}` is not UTF-8")))
        }
        other => Err(malformed(format!("`{column}` is {other:?}, not text"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(names: &[&str]) -> Vec<(String, u64)> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.to_string(), i as u64 + 1))
            .collect()
    }

    #[test]
    fn the_layout_finds_each_column_by_name_and_refuses_a_table_without_one() {
        let names = [
            "extra",
            "seq",
            "id",
            "aggregate_type",
            "aggregate_id",
            "later",
        ];
        let layout = Layout::from_columns(&columns(&names)).unwrap();
        assert_eq!(layout.index, [1, 4]);
        let err = Layout::from_columns(&columns(&["seq", "id"])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema);
        assert!(
            err.to_string().contains("no `aggregate_id` column"),
            "{err}"
        );
    }

    #[test]
    fn values_decode_as_the_outbox_writes_them() {
        assert_eq!(int(Value::Int(7), "seq").unwrap(), Some(7));
        assert_eq!(int(Value::NULL, "seq").unwrap(), None);
        assert!(int(Value::UInt(u64::MAX), "seq").is_err());
        assert_eq!(
            text(Value::Bytes(b"k".to_vec()), "aggregate_id").unwrap(),
            "k"
        );
        let err = text(Value::Bytes(vec![0xff]), "aggregate_id").unwrap_err();
        assert!(err.to_string().contains("`aggregate_id`"), "{err}");
    }
}
