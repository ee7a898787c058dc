//! Connecting: SQLite URLs and database files, the pool, and `BEGIN IMMEDIATE` begun so that a
//! dropped caller cannot leave the file's write lock held.

use super::*;

/// The database file a URL without a path (`sqlite://`, `sqlite:`) names, relative to the
/// working directory.
pub const DEFAULT_PATH: &str = "./outbox.db";

/// How long a statement waits for another connection's write lock before failing with
/// `SQLITE_BUSY` (mapped to [`ErrorKind::Timeout`]).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per pool. WAL lets readers (claims, stats) run beside the one writer; writers
/// queue on the file lock whatever the pool size.
const MAX_CONNECTIONS: u32 = 8;
/// A write transaction that takes the file's write lock at once.
const BEGIN_IMMEDIATE: &str = include_str!("../../queries/begin_immediate.sql");

/// Connection options for `url`: `sqlite://path`, `sqlite:path`, or `sqlite://` with no path
/// meaning [`DEFAULT_PATH`]; a query string (`?mode=ro`, …) is kept. The file is created if
/// missing; connections use WAL, `synchronous = FULL` (a committed row survives a power
/// loss), a [`BUSY_TIMEOUT`] and foreign keys.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            Error::config(format!(
                "database URL `{}` is not a SQLite URL; use sqlite://path",
                outbox_core::redact::url(url)
            ))
        })?;
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let path = if path.is_empty() { DEFAULT_PATH } else { path };
    let normalised = match query {
        Some(query) => format!("sqlite://{path}?{query}"),
        None => format!("sqlite://{path}"),
    };
    let options = SqliteConnectOptions::from_str(&normalised).map_err(|e| {
        map_sqlx_error(
            &format!("database URL `{}`", outbox_core::redact::url(url)),
            e,
        )
    })?;
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true))
}

/// The database file a SQLite URL names (see [`connect_options`]; `sqlite://` alone is
/// [`DEFAULT_PATH`]).
pub fn database_path(url: &str) -> Result<std::path::PathBuf> {
    Ok(connect_options(url)?.get_filename().to_path_buf())
}

/// Deletes the database file at `path` with its `-wal` and `-shm` companions (for scratch
/// databases: demos, checks). Missing files are not an error.
pub fn remove_database(path: &std::path::Path) {
    for ext in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        let _ = std::fs::remove_file(p);
    }
}

/// Opens a pool to the SQLite file `url` names (see [`connect_options`]), creating the file if
/// missing, with [`MAX_CONNECTIONS`] connections. Fails at once if the file cannot be opened.
pub async fn connect_pool(url: &str) -> Result<SqlitePool> {
    connect_pool_sized(url, MAX_CONNECTIONS).await
}

/// [`connect_pool`] with at most `max_connections` connections: the one place a SQLite pool is
/// set up (WAL, `synchronous = FULL`, the busy timeout, a 10 s acquire timeout), whoever opens
/// the file (the outbox, the inbox, the demo's ledger).
pub async fn connect_pool_sized(url: &str, max_connections: u32) -> Result<SqlitePool> {
    let options = connect_options(url)?;
    SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!("opening SQLite database {}", outbox_core::redact::url(url)),
                e,
            )
        })
}

/// Begins a `BEGIN IMMEDIATE` transaction (the file's write lock, taken at once) on `pool`,
/// whether or not the caller is still waiting when it has begun.
///
/// sqlx runs a SQLite connection's BEGIN on the connection's worker thread. A caller dropped
/// after the worker began but before it took the answer (a publish or store deadline, a
/// shutdown) left no `Transaction` to end it: the connection went back to the pool inside a
/// transaction nobody could commit or roll back, holding the write lock, and every writer of
/// the file failed with "database is locked" from then on (an inbox processor on a loaded
/// machine stopped for good that way). Begun in a task of its own, the BEGIN always ends as a
/// `Transaction`, which rolls back when dropped.
pub async fn begin_immediate(
    pool: &SqlitePool,
) -> std::result::Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin_with(BEGIN_IMMEDIATE).await }).await {
        Ok(begun) => begun,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::PoolClosed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_path_follows_the_url_and_remove_database_takes_the_companions() {
        assert_eq!(
            database_path("sqlite://").unwrap(),
            std::path::Path::new(DEFAULT_PATH)
        );
        assert_eq!(
            database_path("sqlite:/tmp/x.db?mode=rwc").unwrap(),
            std::path::Path::new("/tmp/x.db")
        );
        let dir = std::env::temp_dir().join(format!("outbox-remove-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("a.db");
        for ext in ["", "-wal", "-shm"] {
            std::fs::write(format!("{}{ext}", db.display()), b"x").unwrap();
        }
        remove_database(&db);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).ok();
    }

    fn filename(url: &str) -> String {
        connect_options(url)
            .unwrap()
            .get_filename()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn urls_name_files() {
        assert_eq!(
            filename("sqlite:///var/lib/app/outbox.db"),
            "/var/lib/app/outbox.db"
        );
        assert_eq!(filename("sqlite://data/app.db"), "data/app.db");
        assert_eq!(filename("sqlite:app.db"), "app.db");
        assert_eq!(filename("sqlite://"), DEFAULT_PATH);
        assert_eq!(filename("sqlite:"), DEFAULT_PATH);
        assert_eq!(filename("sqlite://?mode=rwc"), DEFAULT_PATH);
    }

    #[test]
    fn other_schemes_are_config_errors() {
        let e = connect_options("postgres://u:hunter2@db/x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.to_string().contains("hunter2"));
    }
}
