//! What a server's binlog is set to, whether the outbox can be read from it, and where it
//! starts and ends.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::{MySqlPool, Row};

use super::BinlogPosition;
use crate::error::map_sqlx_error;

/// The server-wide settings that decide whether the binlog carries outbox rows as row events.
/// A session may change `binlog_format` and `binlog_row_image` for itself; these are the
/// defaults every new session starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinlogSettings {
    /// `log_bin`: the server writes a binlog at all (a startup option).
    pub log_bin: bool,
    /// `binlog_format`: `ROW`, `STATEMENT` or `MIXED`.
    pub format: String,
    /// `binlog_row_image`: `FULL`, `NOBLOB` or `MINIMAL` (MariaDB also `FULL_NODUP`).
    pub row_image: String,
    /// MariaDB's `log_bin_compress`: large events are written compressed, as event types a
    /// replication client that announces no MariaDB capability is never sent (the server sends
    /// a dummy in their place). Always off on MySQL, which has no such setting.
    pub compress: bool,
}

impl BinlogSettings {
    /// Whether every column of an inserted row reaches the binlog as a row event; if not,
    /// the cause and what to set, once.
    ///
    /// `MIXED` is refused: it logs most inserts as statements, which carry no row values
    /// (defaults such as the message id are computed again by whoever replays them). A
    /// row image other than `FULL` leaves out columns the insert did not name, and the outbox
    /// fills several from defaults.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !self.log_bin {
            return Err(
                "the server writes no binlog (log_bin is OFF); start it with \
                        --log-bin --binlog-format=ROW, or relay by polling"
                    .into(),
            );
        }
        if !self.format.eq_ignore_ascii_case("ROW") {
            return Err(format!(
                "binlog_format is {}, so inserts are logged as statements without their \
                 values; set binlog_format=ROW on the server (SET GLOBAL and in its \
                 configuration), or relay by polling",
                self.format
            ));
        }
        if !self.row_image.eq_ignore_ascii_case("FULL") {
            return Err(format!(
                "binlog_row_image is {}, which leaves out columns an insert fills from \
                 defaults; set binlog_row_image=FULL on the server, or relay by polling",
                self.row_image
            ));
        }
        if self.compress {
            return Err(
                "log_bin_compress is ON: MariaDB writes large row events compressed, which \
                 the binlog reader is never sent (those rows would be relayed late, out of \
                 their keys' order); set log_bin_compress=OFF on the server (SET GLOBAL and in \
                 its configuration), or relay by polling"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The server's binlog settings.
pub async fn settings(pool: &MySqlPool) -> Result<BinlogSettings> {
    let row = sqlx::query(include_str!("../../queries/binlog_settings.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the server's binlog settings", e))?;
    // MariaDB only: MySQL knows no such variable (an error, read as off).
    let compress: Option<i64> =
        sqlx::query_scalar(include_str!("../../queries/binlog_compress.sql"))
            .fetch_one(pool)
            .await
            .ok();
    Ok(BinlogSettings {
        log_bin: row.try_get::<i64, _>(0).unwrap_or(0) != 0,
        format: row.try_get(1).unwrap_or_default(),
        row_image: row.try_get(2).unwrap_or_default(),
        compress: compress.unwrap_or(0) != 0,
    })
}

/// Where the binlog ends now: the position the next transaction will be written at.
/// `SHOW MASTER STATUS` (MariaDB, MySQL before 8.4), or `SHOW BINARY LOG STATUS` (MySQL 8.2+).
pub async fn end_position(pool: &MySqlPool) -> Result<BinlogPosition> {
    let rows = match sqlx::raw_sql(include_str!("../../queries/show_binary_log_status.sql"))
        .fetch_all(pool)
        .await
    {
        Ok(rows) => rows,
        Err(_) => sqlx::raw_sql(include_str!("../../queries/show_master_status.sql"))
            .fetch_all(pool)
            .await
            .map_err(|e| map_sqlx_error("reading where the binlog ends", e))?,
    };
    let row = rows.first().ok_or_else(|| {
        Error::config(
            "the server reports no binlog position (log_bin is OFF, or this user lacks the \
             BINLOG MONITOR / REPLICATION CLIENT privilege)",
        )
    })?;
    position_of(row, "reading where the binlog ends")
}

/// [`end_position`] on one connection (a migrator's, holding its lock). Not shared with the
/// pool's version: a `raw_sql` on a borrowed connection makes the future not `Send` for
/// every lifetime (sqlx), and the sequencer's task, which reads the end, is spawned.
pub async fn end_position_on(conn: &mut sqlx::MySqlConnection) -> Result<BinlogPosition> {
    let rows = match sqlx::raw_sql(include_str!("../../queries/show_binary_log_status.sql"))
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => rows,
        Err(_) => sqlx::raw_sql(include_str!("../../queries/show_master_status.sql"))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error("reading where the binlog ends", e))?,
    };
    let row = rows.first().ok_or_else(|| {
        Error::config(
            "the server reports no binlog position (log_bin is OFF, or this user lacks the \
             BINLOG MONITOR / REPLICATION CLIENT privilege)",
        )
    })?;
    position_of(row, "reading where the binlog ends")
}

/// Which server wrote the binlog being read, saved with the sequencer's position: a binlog
/// position means nothing on another server. MySQL names itself by `server_uuid`; MariaDB has
/// none, so its `server_id` stands for it. (After a failover, a restore or `RESET MASTER`, a
/// file of the same name may exist at a meaningless offset: an identity that changed is
/// treated as a purged binlog.) `RESET MASTER` on the same MariaDB server keeps its
/// `server_id`; its binlog then starts again at file 1, which is caught as a position past the
/// file's end or a missing file.
pub async fn identity(pool: &MySqlPool) -> Result<String> {
    let uuid: Option<String> = sqlx::query_scalar(include_str!("../../queries/server_uuid.sql"))
        .fetch_one(pool)
        .await
        .ok()
        .flatten();
    if let Some(uuid) = uuid.filter(|u| !u.is_empty()) {
        return Ok(format!("uuid:{uuid}"));
    }
    let id: i64 = sqlx::query_scalar(include_str!("../../queries/server_id.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the server's server_id", e))?;
    Ok(format!("server_id:{id}"))
}

/// The binlog files the server still holds, oldest first (`SHOW BINARY LOGS`).
pub async fn files(pool: &MySqlPool) -> Result<Vec<String>> {
    Ok(file_sizes(pool)
        .await?
        .into_iter()
        .map(|(file, _)| file)
        .collect())
}

/// The binlog files the server still holds with their sizes in bytes, oldest first.
pub async fn file_sizes(pool: &MySqlPool) -> Result<Vec<(String, u64)>> {
    let doing = "listing the binlog files";
    let rows = sqlx::raw_sql(include_str!("../../queries/show_binary_logs.sql"))
        .fetch_all(pool)
        .await
        .map_err(|e| map_sqlx_error(doing, e))?;
    rows.iter()
        .map(|row| Ok((text(row, 0, doing)?, number(row, 1, doing)?)))
        .collect()
}

/// The binlog bytes from `from` to the end of `files` (as [`file_sizes`] lists them): what a
/// reader at `from` has still to read. `None` when `from`'s file is not among them (purged).
pub fn bytes_after(files: &[(String, u64)], from: &BinlogPosition) -> Option<u64> {
    let at = files.iter().position(|(f, _)| *f == from.file)?;
    let rest: u64 = files[at + 1..].iter().map(|(_, size)| size).sum();
    Some(files[at].1.saturating_sub(from.offset) + rest)
}

/// The file and position of a status row. Both come back as text or number depending on the
/// server, and sqlx reports MariaDB's text columns as binary.
fn position_of(row: &sqlx::mysql::MySqlRow, doing: &str) -> Result<BinlogPosition> {
    let file = text(row, 0, doing)?;
    Ok(BinlogPosition::new(file, number(row, 1, doing)?))
}

/// A column that comes back as an unsigned or signed number, or as its text.
fn number(row: &sqlx::mysql::MySqlRow, index: usize, doing: &str) -> Result<u64> {
    row.try_get::<u64, _>(index)
        .or_else(|_| row.try_get::<i64, _>(index).map(|v| v.max(0) as u64))
        .or_else(|_| {
            text(row, index, doing)?.parse::<u64>().map_err(|e| {
                Error::new(
                    ErrorKind::Other,
                    format!("{doing}: a position that is not a number: {e}"),
                )
            })
        })
        .map_err(|e| Error::new(ErrorKind::Other, format!("{doing}: {e}")))
}

fn text(row: &sqlx::mysql::MySqlRow, index: usize, doing: &str) -> Result<String> {
    row.try_get::<String, _>(index)
        .or_else(|_| {
            row.try_get::<Vec<u8>, _>(index)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
        .map_err(|e| Error::new(ErrorKind::Other, format!("{doing}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(log_bin: bool, format: &str, row_image: &str) -> BinlogSettings {
        BinlogSettings {
            log_bin,
            format: format.into(),
            row_image: row_image.into(),
            compress: false,
        }
    }

    #[test]
    fn the_bytes_left_to_read_run_to_the_end_of_the_last_file() {
        let files = vec![
            ("b.000007".to_string(), 1_000),
            ("b.000008".to_string(), 600),
            ("b.000009".to_string(), 250),
        ];
        assert_eq!(
            bytes_after(&files, &BinlogPosition::new("b.000008", 100)),
            Some(750)
        );
        assert_eq!(
            bytes_after(&files, &BinlogPosition::new("b.000009", 250)),
            Some(0)
        );
        assert_eq!(
            bytes_after(&files, &BinlogPosition::new("b.000006", 4)),
            None,
            "a purged file"
        );
    }

    #[test]
    fn only_a_full_row_binlog_is_accepted_and_each_refusal_says_what_to_set() {
        assert_eq!(settings(true, "ROW", "FULL").check(), Ok(()));
        let off = settings(false, "ROW", "FULL").check().unwrap_err();
        assert!(
            off.contains("log_bin is OFF") && off.contains("--log-bin"),
            "{off}"
        );
        let mixed = settings(true, "MIXED", "FULL").check().unwrap_err();
        assert!(mixed.contains("binlog_format is MIXED") && mixed.contains("binlog_format=ROW"));
        let minimal = settings(true, "ROW", "MINIMAL").check().unwrap_err();
        assert!(minimal.contains("binlog_row_image=FULL"), "{minimal}");
    }
}
