//! Turning a binlog row event's values into a [`BinlogRow`], by the outbox table's column
//! numbers.

use chrono::{DateTime, NaiveDate, Utc};
use mysql_async::binlog::row::BinlogRow as RawRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value;
use outbox_core::{Error, ErrorKind, Result};

use super::BinlogRow;

/// The columns a [`BinlogRow`] is made of, by name, in the order of its fields.
pub(super) const COLUMNS: [&str; 10] = [
    "seq",
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "headers",
    "topic",
    "created_at",
    "part_seq",
];

/// Where each of [`COLUMNS`] sits in the table (0-based). A row event names no columns, only
/// numbers; migrations only ever add columns at the end, so the numbers of these stay put
/// and an event written before a later column was added still decodes.
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

    /// How many columns a row event must carry for this layout to read it.
    pub(super) fn width(&self) -> usize {
        self.index.iter().max().map_or(0, |i| i + 1)
    }

    /// The message in a row event's after-image.
    pub(super) fn row(&self, mut raw: RawRow) -> Result<BinlogRow> {
        let mut take = |field: usize| -> Result<Value> {
            let name = COLUMNS[field];
            let value = raw.take(self.index[field]).ok_or_else(|| {
                malformed(format!(
                    "the row event has no value for `{name}` (binlog_row_image is not FULL \
                     for the session that wrote it)"
                ))
            })?;
            plain(value, name)
        };
        let seq = int(take(0)?, "seq")?.ok_or_else(|| malformed("`seq` is NULL".into()))?;
        Ok(BinlogRow {
            seq,
            id: text(take(1)?, "id")?,
            aggregate_type: text(take(2)?, "aggregate_type")?,
            aggregate_id: text(take(3)?, "aggregate_id")?,
            event_type: text(take(4)?, "event_type")?,
            payload: bytes(take(5)?, "payload")?,
            headers: bytes(take(6)?, "headers")?,
            topic: match take(7)? {
                Value::NULL => None,
                value => Some(text(value, "topic")?),
            },
            created_at: time(take(8)?, "created_at")?,
            part_seq: int(take(9)?, "part_seq")?.filter(|n| *n > 0),
        })
    }
}

fn malformed(message: String) -> Error {
    Error::new(
        ErrorKind::Malformed,
        format!("decoding an outbox row from the binlog: {message}"),
    )
}

/// A binlog value as a plain value: MySQL's binary JSON becomes its text.
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

fn bytes(value: Value, column: &str) -> Result<Vec<u8>> {
    match value {
        Value::Bytes(b) => Ok(b),
        other => Err(malformed(format!("`{column}` is {other:?}, not text"))),
    }
}

fn text(value: Value, column: &str) -> Result<String> {
    String::from_utf8(bytes(value, column)?)
        .map_err(|_| malformed(format!("`{column}` is not UTF-8")))
}

/// A `DATETIME(6)`, which the outbox keeps in UTC.
fn time(value: Value, column: &str) -> Result<DateTime<Utc>> {
    match value {
        Value::Date(year, month, day, hour, minute, second, micros) => {
            NaiveDate::from_ymd_opt(year.into(), month.into(), day.into())
                .and_then(|d| {
                    d.and_hms_micro_opt(hour.into(), minute.into(), second.into(), micros)
                })
                .map(|t| t.and_utc())
                .ok_or_else(|| malformed(format!("`{column}` is not a valid time")))
        }
        other => Err(malformed(format!("`{column}` is {other:?}, not a time"))),
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
        let mut names = COLUMNS.to_vec();
        names.insert(1, "extra");
        names.push("later");
        let layout = Layout::from_columns(&columns(&names)).unwrap();
        assert_eq!(layout.index[0], 0);
        assert_eq!(layout.index[1], 2);
        assert_eq!(layout.width(), 11);
        let err = Layout::from_columns(&columns(&COLUMNS[..9])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema);
        assert!(err.to_string().contains("no `part_seq` column"), "{err}");
    }

    #[test]
    fn values_decode_as_the_outbox_writes_them() {
        assert_eq!(int(Value::Int(7), "seq").unwrap(), Some(7));
        assert_eq!(int(Value::NULL, "part_seq").unwrap(), None);
        assert!(int(Value::UInt(u64::MAX), "seq").is_err());
        let t = time(Value::Date(2026, 12, 5, 15, 4, 5, 123_456), "created_at").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-05T15:04:05.123456+00:00");
        assert!(time(Value::Date(2026, 2, 30, 0, 0, 0, 0), "created_at").is_err());
        assert!(text(Value::Bytes(vec![0xff]), "id").is_err());
    }
}
