//! The inbox's three databases as [`InboxBackend`]s: [`PgInbox`], a migrated inbox in schemas
//! of its own (random suffix) on the machine's PostgreSQL (`OUTBOX_TEST_DATABASE_URL`),
//! [`MysqlInbox`], one in databases of its own on the machine's MariaDB
//! (`OUTBOX_TEST_MYSQL_URL`), and [`SqliteInbox`], one in a file of its own. Each also holds
//! the application's outbox (for idempotency keys' events) and a table `effects` for handlers
//! to write to.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::Store;
use outbox_inbox::{Handlers, Inbox, InboxProcessor, InboxSchema, ProcessorConfig};
use sqlx::{MySql, MySqlPool, PgPool, Postgres, Row, Sqlite, SqlitePool, Transaction};

use crate::inbox_suite::{Arg, Concurrent, InboxBackend};

/// The PostgreSQL server the tests use: `OUTBOX_TEST_DATABASE_URL`, else the machine's.
pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

/// The MariaDB (MySQL) server the tests use: `OUTBOX_TEST_MYSQL_URL`, else the machine's.
pub fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A column of a row as text, for [`InboxBackend::texts`].
trait TextCell {
    fn text(&self, i: usize) -> Option<String>;
}

impl TextCell for sqlx::postgres::PgRow {
    fn text(&self, i: usize) -> Option<String> {
        self.try_get(i).unwrap()
    }
}

impl TextCell for sqlx::sqlite::SqliteRow {
    fn text(&self, i: usize) -> Option<String> {
        self.try_get(i).unwrap()
    }
}

/// MySQL sends a `utf8mb4_bin` column (the outbox databases' default) as binary, which sqlx
/// does not decode as a `String`: read bytes.
impl TextCell for sqlx::mysql::MySqlRow {
    fn text(&self, i: usize) -> Option<String> {
        self.try_get::<Option<Vec<u8>>, _>(i)
            .unwrap()
            .map(|b| String::from_utf8(b).unwrap())
    }
}

/// `impl InboxBackend for $backend` on sqlx's `$db`: the parts every database shares
/// (transactions, statements with arguments, reading results) and the `$specific` items.
macro_rules! sqlx_backend {
    ($backend:ty, $db:ty, { $($specific:tt)* }) => {
        #[async_trait]
        impl InboxBackend for $backend {
            type Db = $db;
            type Tx = Transaction<'static, $db>;

            $($specific)*

            fn start() -> impl std::future::Future<Output = Self> {
                Self::start_inbox()
            }

            /// The queue as the `outbox` commands open it.
            fn queue(&self) -> Arc<dyn Store> {
                self.database().queue()
            }

            async fn finish(tx: Self::Tx, commit: bool) {
                if commit {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
            }

            fn tx<'a>(tx: &'a mut Transaction<'static, $db>) -> &'a mut Self::Tx {
                tx
            }

            async fn execute(
                tx: &mut Self::Tx,
                sql: &str,
                args: &[Arg],
            ) -> Result<u64, sqlx::Error> {
                let mut q = sqlx::query(sql);
                for a in args {
                    q = match a {
                        Arg::Text(s) => q.bind(s.clone()),
                        Arg::Int(i) => q.bind(*i),
                    };
                }
                Ok(q.execute(&mut **tx).await?.rows_affected())
            }

            async fn scalar(&self, sql: &str) -> i64 {
                sqlx::query_scalar(&self.sql(sql))
                    .fetch_one(&self.pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }

            async fn texts(&self, sql: &str) -> Vec<Vec<Option<String>>> {
                let rows = sqlx::query(&self.sql(sql))
                    .fetch_all(&self.pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                rows.iter()
                    .map(|r| (0..r.len()).map(|i| TextCell::text(r, i)).collect())
                    .collect()
            }
        }
    };
}

/// A PostgreSQL inbox: tables in schema `name`, its processing queue in `name_inbox`.
pub struct PgInbox {
    /// Connections to the test database.
    pub pool: PgPool,
    /// The inbox's schemas.
    pub schema: InboxSchema,
    /// The schema of the inbox tables (and of the application's outbox and `effects`).
    pub name: String,
}

impl PgInbox {
    /// A fresh, migrated inbox (twice: the second migration finds nothing to do).
    pub async fn start_inbox() -> Self {
        let name = crate::unique_name("inbox");
        let pool = outbox_postgres::connect_pool(&database_url(), 2)
            .await
            .expect("PostgreSQL must be running (scripts/services.sh starts it)");
        let schema = InboxSchema::new(&name).unwrap();
        assert_eq!(
            outbox_inbox::migrate_postgres(&pool, &schema)
                .await
                .unwrap(),
            vec![1]
        );
        assert!(
            outbox_inbox::migrate_postgres(&pool, &schema)
                .await
                .unwrap()
                .is_empty(),
            "a second migration finds nothing to do"
        );
        // The application's outbox beside the inbox tables: idempotent requests enqueue into it.
        outbox_postgres::migrate(&pool, schema.tables())
            .await
            .unwrap();
        pool.close().await;
        Self::open(&name).await
    }

    /// An inbox some other way migrated (`outbox migrate --inbox`) in schema `name`, with the
    /// `effects` table added.
    pub async fn open(name: &str) -> Self {
        let pool = outbox_postgres::connect_pool(&database_url(), 16)
            .await
            .expect("PostgreSQL must be running (scripts/services.sh starts it)");
        let schema = InboxSchema::new(name).unwrap();
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {name}.effects (
                 n          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 message_id text   NOT NULL,
                 key        text   NOT NULL,
                 value      bigint NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Self {
            pool,
            schema,
            name: name.to_string(),
        }
    }
}

sqlx_backend!(PgInbox, Postgres, {
    const NAME: &'static str = "PostgreSQL";
    const CONCURRENT_REQUEST: Concurrent = Concurrent::InProgress;

    fn inbox(&self) -> Inbox {
        Inbox::new(self.schema.clone())
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    fn sql(&self, sql: &str) -> String {
        sql.replace(
            "{queue}",
            &format!("{}.outbox", self.schema.queue().as_str()),
        )
        .replace("{schema}", &self.name)
    }

    fn database(&self) -> outbox_inbox::InboxDatabase {
        outbox_inbox::InboxDatabase::from_pool(self.pool.clone(), self.schema.clone()).unwrap()
    }

    fn processor(&self, handlers: Handlers<Postgres>, config: ProcessorConfig) -> InboxProcessor {
        InboxProcessor::postgres(self.pool.clone(), self.schema.clone(), handlers, config).unwrap()
    }

    fn daemon_args(&self) -> Vec<String> {
        vec![
            "--database-url".into(),
            database_url(),
            "--schema".into(),
            self.name.clone(),
        ]
    }

    async fn teardown(self) {
        let _ = sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {0} CASCADE; DROP SCHEMA IF EXISTS {0}_inbox CASCADE",
            self.name
        ))
        .execute(&self.pool)
        .await;
        self.pool.close().await;
    }
});

/// A MySQL/MariaDB inbox: tables in database `name`, its processing queue in `name_inbox`.
pub struct MysqlInbox {
    /// Relay sessions (`READ COMMITTED`) to the test server.
    pub pool: MySqlPool,
    /// The inbox's databases.
    pub schema: InboxSchema,
    /// The database of the inbox tables (and of the application's outbox and `effects`).
    pub name: String,
}

impl MysqlInbox {
    /// A fresh, migrated inbox (twice: the second migration finds nothing to do).
    pub async fn start_inbox() -> Self {
        let name = crate::unique_name("inbox");
        let pool = outbox_mysql::connect_pool(&mysql_url(), 2)
            .await
            .expect("MariaDB must be running (scripts/services.sh starts it)");
        let schema = InboxSchema::new(&name).unwrap();
        assert_eq!(
            outbox_inbox::migrate_mysql(&pool, &schema).await.unwrap(),
            vec![1]
        );
        assert!(
            outbox_inbox::migrate_mysql(&pool, &schema)
                .await
                .unwrap()
                .is_empty(),
            "a second migration finds nothing to do"
        );
        // The application's outbox beside the inbox tables: idempotent requests enqueue into it.
        outbox_mysql::migrate(&pool, &outbox_mysql::Schema::new(&name).unwrap())
            .await
            .unwrap();
        pool.close().await;
        Self::open(&name).await
    }

    /// An inbox some other way migrated (`outbox migrate --inbox`) in database `name`, with
    /// the `effects` table added.
    pub async fn open(name: &str) -> Self {
        let pool = outbox_mysql::connect_pool(&mysql_url(), 16)
            .await
            .expect("MariaDB must be running (scripts/services.sh starts it)");
        let schema = InboxSchema::new(name).unwrap();
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {name}.effects (
                 n          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
                 message_id VARCHAR(64)  NOT NULL,
                 `key`      VARCHAR(255) NOT NULL,
                 value      BIGINT       NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Self {
            pool,
            schema,
            name: name.to_string(),
        }
    }
}

/// The suite's SQL (the part PostgreSQL and SQLite share) as MySQL reads it: `?` for `$n` (the
/// suite binds them in order, once each), `key` in backquotes (a reserved word), `CAST(… AS
/// CHAR)` and `AS SIGNED`, `VARCHAR(255)` primary keys (a `TEXT` key needs a prefix length),
/// and times without the zone letter (the columns are UTC `DATETIME`s).
pub fn mysql_dialect(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut word = String::new();
    let mut quoted = false;
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(if word == "key" { "`key`" } else { word });
        word.clear();
    };
    for c in sql.chars() {
        if quoted {
            out.push(c);
            quoted = c != '\'';
        } else if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            quoted = c == '\'';
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    for n in (1..=9).rev() {
        out = out.replace(&format!("${n}"), "?");
    }
    out.replace(" AS TEXT)", " AS CHAR)")
        .replace(" AS BIGINT)", " AS SIGNED)")
        .replace("TEXT PRIMARY KEY", "VARCHAR(255) PRIMARY KEY")
        .replace(".000Z'", "'")
}

sqlx_backend!(MysqlInbox, MySql, {
    const NAME: &'static str = "MariaDB";
    const CONCURRENT_REQUEST: Concurrent = Concurrent::WaitsThenReplays;
    const UPSERT_IF_NEWER: &'static str =
        "INSERT INTO {schema}.accounts (account_id, balance, as_of) VALUES ($1, $2, $3) \
         ON DUPLICATE KEY UPDATE balance = IF(as_of <= VALUES(as_of), VALUES(balance), balance), \
         as_of = IF(as_of <= VALUES(as_of), VALUES(as_of), as_of)";
    const UPSERT_UNCHANGED_ROWS: u64 = 1;

    fn inbox(&self) -> Inbox {
        Inbox::new(self.schema.clone())
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    fn sql(&self, sql: &str) -> String {
        mysql_dialect(
            &sql.replace(
                "{queue}",
                &format!("{}.outbox", self.schema.queue().as_str()),
            )
            .replace("{schema}", &self.name),
        )
    }

    fn database(&self) -> outbox_inbox::InboxDatabase {
        outbox_inbox::InboxDatabase::from_pool(self.pool.clone(), self.schema.clone()).unwrap()
    }

    fn processor(&self, handlers: Handlers<MySql>, config: ProcessorConfig) -> InboxProcessor {
        InboxProcessor::mysql(self.pool.clone(), self.schema.clone(), handlers, config).unwrap()
    }

    fn daemon_args(&self) -> Vec<String> {
        vec![
            "--database-url".into(),
            mysql_url(),
            "--schema".into(),
            self.name.clone(),
        ]
    }

    async fn teardown(self) {
        let _ = sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {0}; DROP DATABASE IF EXISTS {0}_inbox",
            self.name
        ))
        .execute(&self.pool)
        .await;
        self.pool.close().await;
    }
});

/// A SQLite inbox in a file of its own (its processing queue is the `inbox_queue` tables).
pub struct SqliteInbox {
    /// Connections to the file.
    pub pool: SqlitePool,
    /// The file's directory, removed afterwards.
    pub dir: std::path::PathBuf,
    /// `sqlite://<file>`.
    pub url: String,
}

impl SqliteInbox {
    /// A fresh, migrated inbox (twice: the second migration finds nothing to do).
    pub async fn start_inbox() -> Self {
        let dir = std::env::temp_dir().join(crate::unique_name("inbox_sqlite"));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("inbox.db").display());
        let pool = outbox_sqlite::connect_pool(&url).await.unwrap();
        assert_eq!(outbox_inbox::migrate_sqlite(&pool).await.unwrap(), vec![1]);
        assert!(
            outbox_inbox::migrate_sqlite(&pool)
                .await
                .unwrap()
                .is_empty(),
            "a second migration finds nothing to do"
        );
        outbox_sqlite::migrate(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effects (
                 n          INTEGER PRIMARY KEY AUTOINCREMENT,
                 message_id TEXT    NOT NULL,
                 key        TEXT    NOT NULL,
                 value      INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, dir, url }
    }
}

sqlx_backend!(SqliteInbox, Sqlite, {
    const NAME: &'static str = "SQLite";
    const CONCURRENT_REQUEST: Concurrent = Concurrent::WaitsThenReplays;

    fn inbox(&self) -> Inbox {
        Inbox::default()
    }

    /// `IMMEDIATE`: the transaction writes, so it takes the file's write lock at once (a
    /// second writer waits for it) rather than failing half-way.
    async fn begin(&self) -> Self::Tx {
        outbox_sqlite::begin_immediate(&self.pool).await.unwrap()
    }

    fn sql(&self, sql: &str) -> String {
        sql.replace("{queue}", outbox_inbox::sqlite::QUEUE_PREFIX)
            .replace("{schema}.", "")
    }

    fn database(&self) -> outbox_inbox::InboxDatabase {
        outbox_inbox::InboxDatabase::from_pool(self.pool.clone(), InboxSchema::default()).unwrap()
    }

    fn processor(&self, handlers: Handlers<Sqlite>, config: ProcessorConfig) -> InboxProcessor {
        InboxProcessor::sqlite(self.pool.clone(), handlers, config).unwrap()
    }

    fn daemon_args(&self) -> Vec<String> {
        vec!["--database-url".into(), self.url.clone()]
    }

    async fn teardown(self) {
        self.pool.close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
});
