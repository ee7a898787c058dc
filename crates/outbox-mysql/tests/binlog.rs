//! The binlog reader against a real MariaDB with the row binlog on (scripts/services.sh starts
//! one on 127.0.0.1:3307; `OUTBOX_TEST_MYSQL_BINLOG_URL` names another), each test in a
//! database of its own, and against this machine's server without a binlog.

#![allow(clippy::unwrap_used)] // tests

use std::time::Duration;

use outbox_mysql::binlog::{
    server, BinlogPosition, BinlogReader, Committed, Item, ReadError, ReadOptions,
};
use outbox_mysql::Schema;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::MySqlPool;

mod common;

fn binlog_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into())
}

/// A migrated outbox in a database of its own on the binlog server, and where the binlog
/// ended once it was made.
struct Db {
    pool: MySqlPool,
    schema: Schema,
    start: BinlogPosition,
}

impl Db {
    async fn start() -> Self {
        let (pool, schema) = common::migrated_outbox(&binlog_url(), 8).await;
        sqlx::raw_sql(&schema.render(
            "CREATE TABLE {schema}.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
        ))
        .execute(&pool)
        .await
        .unwrap();
        let start = server::end_position(&pool).await.unwrap();
        Self {
            pool,
            schema,
            start,
        }
    }

    fn sql(&self, sql: &str) -> String {
        self.schema.render(sql)
    }

    /// The plain four-column insert of `key`, with `n` in its payload, on `conn`.
    async fn insert(&self, conn: &mut sqlx::MySqlConnection, key: &str, n: u64) {
        sqlx::query(&self.sql(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', ?, 'placed', JSON_OBJECT('n', ?))",
        ))
        .bind(key)
        .bind(n)
        .execute(conn)
        .await
        .unwrap();
    }

    async fn reader(&self, from: &BinlogPosition) -> BinlogReader {
        BinlogReader::open(&binlog_url(), &self.schema, from, &ReadOptions::default())
            .await
            .unwrap()
    }

    async fn drop(self) {
        sqlx::raw_sql(&self.sql("DROP DATABASE {schema}"))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

/// The next committed transaction, skipping idle reports; fails after 10 s.
async fn committed(reader: &mut BinlogReader) -> Committed {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match reader.next().await.unwrap() {
                Item::Committed(c) => return c,
                Item::Idle(_) => continue,
            }
        }
    })
    .await
    .expect("a committed transaction within 10 s")
}

impl Db {
    /// The `n` of each row, read from the table by its `seq` (the reader decodes only `seq`
    /// and the key).
    async fn numbers(&self, c: &Committed) -> Vec<u64> {
        let mut out = Vec::new();
        for r in &c.rows {
            let n: i64 = sqlx::query_scalar(&self.sql(
                "SELECT CAST(JSON_VALUE(payload, '$.n') AS SIGNED) FROM {schema}.outbox WHERE seq = ?",
            ))
            .bind(r.seq)
            .fetch_one(&self.pool)
            .await
            .unwrap();
            out.push(n as u64);
        }
        out
    }
}

#[tokio::test]
async fn transactions_come_in_commit_order_not_seq_order() {
    let db = Db::start().await;
    let mut a = db.pool.acquire().await.unwrap();
    let mut b = db.pool.acquire().await.unwrap();
    // Two keys of different partitions: the trigger's counter would make the second writer
    // of one partition wait for the first one's commit.
    let mut other_key = String::new();
    for i in 2.. {
        other_key = format!("order-{i}");
        let same: i64 = sqlx::query_scalar("SELECT CAST(CRC32(?) % 64 = CRC32(?) % 64 AS SIGNED)")
            .bind("order-1")
            .bind(&other_key)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if same == 0 {
            break;
        }
    }
    sqlx::raw_sql("BEGIN").execute(&mut *a).await.unwrap();
    db.insert(&mut a, "order-1", 1).await;
    sqlx::raw_sql("BEGIN").execute(&mut *b).await.unwrap();
    db.insert(&mut b, &other_key, 2).await;
    sqlx::raw_sql("COMMIT").execute(&mut *b).await.unwrap();
    sqlx::raw_sql("COMMIT").execute(&mut *a).await.unwrap();

    let mut reader = db.reader(&db.start).await;
    let first = committed(&mut reader).await;
    let second = committed(&mut reader).await;
    assert_eq!(
        (db.numbers(&first).await, db.numbers(&second).await),
        (vec![2], vec![1])
    );
    // seq was drawn at insert: the first to commit holds the higher one.
    assert!(first.rows[0].seq > second.rows[0].seq);
    assert!(db.start < first.end && first.end < second.end);
    let files = server::files(&db.pool).await.unwrap();
    assert!(
        files.contains(&first.end.file),
        "{} not in {files:?}",
        first.end
    );
    assert_eq!(reader.position(), &second.end);

    // What the sequencer needs, as written: the row's seq and its key.
    let row = &first.rows[0];
    assert_eq!(row.aggregate_id, other_key);
    let key: String = sqlx::query_scalar(
        &db.sql("SELECT CAST(aggregate_id AS CHAR) FROM {schema}.outbox WHERE seq = ?"),
    )
    .bind(row.seq)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(key, other_key);
    db.drop().await;
}

#[tokio::test]
async fn a_rolled_back_transaction_never_appears_and_a_transaction_comes_whole() {
    let db = Db::start().await;
    let other = Db::start().await;
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    db.insert(&mut conn, "order-1", 1).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
    // One transaction: a business row, three outbox rows of two keys, and a row of another
    // database's outbox, which this reader must leave out.
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    sqlx::raw_sql(&db.sql("INSERT INTO {schema}.accounts VALUES (1, 100)"))
        .execute(&mut *conn)
        .await
        .unwrap();
    db.insert(&mut conn, "order-2", 2).await;
    other.insert(&mut conn, "order-9", 9).await;
    db.insert(&mut conn, "order-3", 3).await;
    db.insert(&mut conn, "order-2", 4).await;
    sqlx::raw_sql("COMMIT").execute(&mut *conn).await.unwrap();
    drop(conn);

    let mut reader = db.reader(&db.start).await;
    let c = committed(&mut reader).await;
    assert_eq!(db.numbers(&c).await, vec![2, 3, 4]);
    // Nothing else: the rolled-back row never reached the binlog.
    let next = tokio::time::timeout(Duration::from_secs(3), reader.next()).await;
    assert!(
        matches!(next, Err(_) | Ok(Ok(Item::Idle(_)))),
        "only idle reports after the one transaction, got {next:?}"
    );
    other.drop().await;
    db.drop().await;
}

#[tokio::test]
async fn reading_again_from_a_transaction_end_starts_at_the_next_transaction() {
    let db = Db::start().await;
    let mut conn = db.pool.acquire().await.unwrap();
    for n in 1..=3 {
        db.insert(&mut conn, "order-1", n).await;
    }
    let mut reader = db.reader(&db.start).await;
    let first = committed(&mut reader).await;
    assert_eq!(db.numbers(&first).await, vec![1]);
    drop(reader);

    let mut again = db.reader(&first.end).await;
    let second = committed(&mut again).await;
    assert_eq!(db.numbers(&second).await, vec![2]);
    let third = committed(&mut again).await;
    assert_eq!(db.numbers(&third).await, vec![3]);
    db.drop().await;
}

#[tokio::test]
async fn an_idle_server_is_reported_idle_at_the_end_of_what_was_read() {
    let db = Db::start().await;
    let mut conn = db.pool.acquire().await.unwrap();
    db.insert(&mut conn, "order-1", 1).await;
    let mut reader = db.reader(&db.start).await;
    let c = committed(&mut reader).await;
    // Other databases' writers may be busy on this shared server; whatever it reports, an
    // idle position never goes back before what was handed out.
    let item = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("a heartbeat or idle report within 10 s")
        .unwrap();
    match item {
        Item::Idle(at) => assert!(at >= c.end, "{at} before {}", c.end),
        Item::Committed(other) => panic!("nothing else was written here: {other:?}"),
    }
    db.drop().await;
}

#[tokio::test]
async fn large_payloads_and_odd_columns_do_not_stop_the_reader() {
    let db = Db::start().await;
    let big = "x".repeat(2 * 1024 * 1024);
    sqlx::query(&db.sql(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic) \
         VALUES ('order', 'clé-ü', 'placed', JSON_OBJECT('big', ?), JSON_OBJECT('trace', 't-1'), 'orders.eu')",
    ))
    .bind(&big)
    .execute(&db.pool)
    .await
    .unwrap();
    // Rows written before the checks of migration 4 (or with them switched off): a zero date
    // and an id that is not a UUID. The reader reads only `seq` and the key, so neither stops
    // it (the relay fails them alone from the table).
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("SET SESSION check_constraint_checks = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(&db.sql(
        "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         VALUES ('01HZX3K9QW7N2M5R8T1V4Y6B0C', 'order', 'odd', 'placed', '{}', '0000-00-00 00:00:00')",
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    drop(conn);
    let mut reader = db.reader(&db.start).await;
    let c = committed(&mut reader).await;
    assert_eq!(c.rows[0].aggregate_id, "clé-ü");
    let odd = committed(&mut reader).await;
    assert_eq!(odd.rows[0].aggregate_id, "odd");
    assert!(odd.rows[0].seq > c.rows[0].seq);
    db.drop().await;
}

#[tokio::test]
async fn a_position_the_server_no_longer_holds_is_reported_as_purged() {
    let db = Db::start().await;
    // A file numbered before the oldest one the server holds: what a purge leaves a relay
    // that was stopped for longer than the binlog is kept. (Purging for real would take files
    // from under the other tests reading this server.)
    let oldest = server::files(&db.pool).await.unwrap().remove(0);
    let oldest = BinlogPosition::new(oldest, 4);
    let (base, _) = oldest.file.rsplit_once('.').unwrap();
    let gone = BinlogPosition::new(
        format!("{base}.{:06}", oldest.file_number().unwrap() - 1),
        4,
    );
    let result = async {
        let mut reader =
            BinlogReader::open(&binlog_url(), &db.schema, &gone, &ReadOptions::default()).await?;
        reader.next().await
    }
    .await;
    match result {
        Err(ReadError::Purged { position, message }) => {
            assert_eq!(position, gone);
            assert!(!message.is_empty());
        }
        other => panic!("expected a purged position, got {other:?}"),
    }
    let shown = ReadError::Purged {
        position: gone.clone(),
        message: "m".into(),
    }
    .to_string();
    assert!(
        shown.contains(&gone.to_string()) && shown.contains("purged"),
        "{shown}"
    );
    db.drop().await;
}

#[tokio::test]
async fn the_settings_say_which_server_can_be_read() {
    let with = MySqlPoolOptions::new()
        .connect(&binlog_url())
        .await
        .unwrap();
    let settings = server::settings(&with).await.unwrap();
    assert_eq!(settings.check(), Ok(()), "{settings:?}");
    // This machine's own server runs without a binlog, as MariaDB ships.
    let without = MySqlPoolOptions::new()
        .connect(&common::server_url())
        .await
        .unwrap();
    let settings = server::settings(&without).await.unwrap();
    if !settings.log_bin {
        let why = settings.check().unwrap_err();
        assert!(why.contains("log_bin is OFF"), "{why}");
        assert!(server::end_position(&without).await.is_err());
    }
}

/// `binlog_url()` through `proxy`: the same server, user and database, another port.
fn through(proxy: &outbox_testkit::proxy::TcpProxy) -> String {
    let url = binlog_url();
    let (head, rest) = url.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    format!("{head}@127.0.0.1:{}/{path}", proxy.port())
}

/// The port of `binlog_url()`.
fn binlog_port() -> u16 {
    let url = binlog_url();
    let host = url.split_once('@').unwrap().1.split('/').next().unwrap();
    host.rsplit_once(':')
        .map_or(3306, |(_, p)| p.parse().unwrap())
}

#[tokio::test]
async fn a_server_gone_silent_is_taken_as_a_dead_connection_within_the_bound() {
    let db = Db::start().await;
    let proxy = outbox_testkit::proxy::TcpProxy::start(binlog_port());
    let url = through(&proxy);
    let options = ReadOptions {
        silence: Duration::from_secs(3),
        ..ReadOptions::default()
    };
    let mut reader = BinlogReader::open(&url, &db.schema, &db.start, &options)
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("an idle report through the proxy");
    assert!(matches!(first, Ok(Item::Idle(_))), "{first:?}");
    // A black-holed network: the connection stays open, nothing flows, no RST ever comes.
    proxy.go_silent();
    // What was on its way before is still read; then nothing more comes.
    let err = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Err(e) = reader.next().await {
                return e;
            }
        }
    })
    .await
    .expect("the reader noticed the silence within 30 s (it waited for ever before)");
    assert!(err.to_string().contains("sent nothing"), "{err}");
    // Reconnecting while the network is still gone fails within the bound too.
    let again = tokio::time::timeout(
        Duration::from_secs(30),
        BinlogReader::open(&url, &db.schema, &db.start, &options),
    )
    .await
    .expect("opening gave up within 30 s");
    assert!(again.is_err());
    // Once the network is back, a new session reads on.
    proxy.open();
    let mut conn = db.pool.acquire().await.unwrap();
    db.insert(&mut conn, "after", 7).await;
    let mut reader = BinlogReader::open(&url, &db.schema, &db.start, &options)
        .await
        .unwrap();
    let c = committed(&mut reader).await;
    assert_eq!(db.numbers(&c).await, vec![7]);
    drop(reader);
    drop(proxy);
    db.drop().await;
}

/// Runs `sql` (several statements) on `conn`.
async fn run(conn: &mut sqlx::MySqlConnection, sql: &str) {
    sqlx::raw_sql(sql).execute(&mut *conn).await.unwrap();
}

#[tokio::test]
async fn xa_rows_come_at_their_commit_go_at_their_rollback_and_hold_the_position_meanwhile() {
    // A prepared XA transaction outlives its session and holds every binlog seal on the
    // server: whatever happens in the body, none is left behind.
    let outcome =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(xa_rows_body())).await;
    rollback_prepared(&binlog_url(), &["x1", "x2", "x3"]).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

/// Rolls back the XA transactions `xids` if they are still prepared on `url`'s server.
async fn rollback_prepared(url: &str, xids: &[&str]) {
    let pool = MySqlPoolOptions::new().connect(url).await.unwrap();
    for xid in xids {
        // An xid committed or rolled back already is an error here, and that is fine.
        let _ = sqlx::raw_sql(&format!("XA ROLLBACK '{xid}'"))
            .execute(&pool)
            .await;
    }
}

async fn xa_rows_body() {
    let db = Db::start().await;
    let mut xa = db.pool.acquire().await.unwrap();
    let mut plain = db.pool.acquire().await.unwrap();
    let mut reader = db.reader(&db.start).await;
    // Prepared, then an ordinary transaction commits, then the prepared one.
    run(&mut xa, "XA START 'x1'").await;
    db.insert(&mut xa, "a", 1).await;
    run(&mut xa, "XA END 'x1'; XA PREPARE 'x1'").await;
    db.insert(&mut plain, "b", 2).await;
    let first = committed(&mut reader).await;
    assert_eq!(db.numbers(&first).await, vec![2]);
    // Reading again from the position handed back must read the prepared group again.
    assert!(first.end < reader_position_after(&db).await, "{first:?}");
    run(&mut xa, "XA COMMIT 'x1'").await;
    let second = committed(&mut reader).await;
    assert_eq!(db.numbers(&second).await, vec![1]);
    assert!(second.end > first.end);
    // Prepared and rolled back: its rows never come; the next transaction's do.
    run(&mut xa, "XA START 'x2'").await;
    db.insert(&mut xa, "a", 3).await;
    run(&mut xa, "XA END 'x2'; XA PREPARE 'x2'; XA ROLLBACK 'x2'").await;
    db.insert(&mut plain, "a", 4).await;
    let third = committed(&mut reader).await;
    assert_eq!(db.numbers(&third).await, vec![4]);
    // One phase: committed at once.
    run(&mut xa, "XA START 'x3'").await;
    db.insert(&mut xa, "a", 5).await;
    run(&mut xa, "XA END 'x3'; XA COMMIT 'x3' ONE PHASE").await;
    let fourth = committed(&mut reader).await;
    assert_eq!(db.numbers(&fourth).await, vec![5]);
    drop(reader);
    // Read again from the position handed back while x1 was prepared: x1's rows come (at
    // its commit) and the transaction committed in between comes again (the sequencer skips
    // rows it positioned already).
    let mut again = db.reader(&first.end).await;
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let c = committed(&mut again).await;
        seen.extend(db.numbers(&c).await);
    }
    assert_eq!(seen, vec![2, 1, 4]);
    db.drop().await;
}

/// Where the binlog ends now.
async fn reader_position_after(db: &Db) -> BinlogPosition {
    server::end_position(&db.pool).await.unwrap()
}

#[tokio::test]
async fn a_position_past_the_end_of_its_file_is_reported_as_purged() {
    let db = Db::start().await;
    // A binlog tail lost in an OS crash with `sync_binlog = 0`: the saved position lies past
    // what the file now holds. Only the table can tell what was committed there.
    let files = server::file_sizes(&db.pool).await.unwrap();
    let (file, size) = files.last().unwrap().clone();
    let past = BinlogPosition::new(file, size + 1_000_000);
    let result = async {
        let mut reader =
            BinlogReader::open(&binlog_url(), &db.schema, &past, &ReadOptions::default()).await?;
        loop {
            if let Item::Committed(_) = reader.next().await? {
                continue;
            }
        }
    };
    let result: Result<(), ReadError> = tokio::time::timeout(Duration::from_secs(10), result)
        .await
        .expect("the server refused the position within 10 s");
    match result {
        Err(ReadError::Purged { position, .. }) => assert_eq!(position, past),
        other => panic!("expected the position reported as purged, got {other:?}"),
    }
    db.drop().await;
}
