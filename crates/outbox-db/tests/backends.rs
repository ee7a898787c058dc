//! The same business-transaction script on every backend, against the real PostgreSQL (a
//! schema of its own) and MariaDB (a database of its own) of this machine and a SQLite file of
//! its own.

#![allow(clippy::unwrap_used)] // tests

use outbox_core::NewMessage;
use outbox_db::{Backend, Database, Param};
use uuid::Uuid;

fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The type a value is cast to for reading it as text: MySQL has no `CAST(… AS TEXT)`.
fn text(db: &Database) -> &'static str {
    match db.backend() {
        Backend::Mysql => "CHAR",
        _ => "TEXT",
    }
}

/// Business table, writer enqueue, the SQL contract's raw insert, a rollback, reads: what demo
/// and verify do, with the same statements on either backend.
async fn business_script(db: &Database) {
    assert!(!db.exists().await.unwrap(), "a fresh place holds nothing");
    assert!(!db.migrate().await.unwrap().is_empty());
    assert!(
        db.migrate().await.unwrap().is_empty(),
        "migrate is idempotent"
    );
    assert!(db.exists().await.unwrap());
    let ddl = match db.backend() {
        Backend::Postgres => {
            "CREATE TABLE {schema}.ledger (id uuid PRIMARY KEY, n bigint NOT NULL)"
        }
        Backend::Mysql => {
            "CREATE TABLE {schema}.ledger (id CHAR(36) PRIMARY KEY, n BIGINT NOT NULL)"
        }
        _ => "CREATE TABLE {schema}.ledger (id TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    };
    db.execute_script(ddl).await.unwrap();

    // Committed: a business row and a message through the writer.
    let msg = NewMessage::new("t", "k", "e", serde_json::json!({ "n": 1 }));
    let mut tx = db.begin().await.unwrap();
    tx.execute(
        "INSERT INTO {schema}.ledger (id, n) VALUES ($1, $2)",
        &[msg.id.into(), 1i64.into()],
    )
    .await
    .unwrap();
    assert_eq!(tx.enqueue(&msg).await.unwrap(), msg.id);
    tx.commit().await.unwrap();

    // Committed: the SQL contract's minimal insert, the id made by the database.
    let mut tx = db.begin().await.unwrap();
    let (raw_id,): (String,) = tx
        .fetch_one(
            &format!(
                "INSERT INTO {{schema}}.outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ($1, $2, $3, $4) RETURNING CAST(id AS {})",
                text(db)
            ),
            &[
                "t".into(),
                "k".into(),
                "e".into(),
                Param::Json(serde_json::json!({ "n": 2 })),
            ],
        )
        .await
        .unwrap();
    let raw_id: Uuid = raw_id.parse().unwrap();
    tx.execute(
        "INSERT INTO {schema}.ledger (id, n) VALUES ($1, $2)",
        &[raw_id.into(), 2i64.into()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    // Rolled back: nothing of it remains.
    let gone = NewMessage::new("t", "k", "e", serde_json::json!({ "n": 3 }));
    let mut tx = db.begin().await.unwrap();
    tx.execute(
        "INSERT INTO {schema}.ledger (id, n) VALUES ($1, $2)",
        &[gone.id.into(), 3i64.into()],
    )
    .await
    .unwrap();
    tx.enqueue(&gone).await.unwrap();
    tx.rollback().await.unwrap();

    let mut rows: Vec<(String, i64)> = db
        .fetch_all(
            &format!("SELECT CAST(id AS {}), n FROM {{schema}}.ledger", text(db)),
            &[],
        )
        .await
        .unwrap();
    rows.sort_by_key(|r| r.1);
    assert_eq!(rows, vec![(msg.id.to_string(), 1), (raw_id.to_string(), 2)]);
    assert_eq!(db.store().stats().await.unwrap().pending, 2);
}

#[tokio::test]
async fn postgres_business_transactions_commit_and_roll_back_with_their_messages() {
    let schema = outbox_testkit::unique_name("db");
    // `postgresql://` names the same backend as `postgres://`.
    let url = database_url().replacen("postgres://", "postgresql://", 1);
    let db = outbox_db::open(&url, &schema, 4).await.unwrap();
    assert_eq!(db.backend(), Backend::Postgres);
    assert_eq!(db.schema(), schema);
    assert_eq!(db.place(), format!("schema `{schema}`"));
    business_script(&db).await;
    db.clone().destroy().await.unwrap();
    let check = outbox_db::open(&database_url(), &schema, 1).await.unwrap();
    assert!(!check.exists().await.unwrap(), "destroy drops the schema");
}

#[tokio::test]
async fn sqlite_business_transactions_commit_and_roll_back_with_their_messages() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("outbox-db"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.db");
    let db = outbox_db::open(&format!("sqlite://{}", file.display()), "public", 4)
        .await
        .unwrap();
    assert_eq!(db.backend(), Backend::Sqlite);
    assert_eq!(db.schema(), "main");
    business_script(&db).await;
    db.destroy().await.unwrap();
    assert!(!file.exists(), "destroy deletes the file");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn mysql_business_transactions_commit_and_roll_back_with_their_messages() {
    let name = outbox_testkit::unique_name("db");
    // `mariadb://` names the same backend as `mysql://`.
    let url = mysql_url().replacen("mysql://", "mariadb://", 1);
    let db = outbox_db::open(&url, &name, 4).await.unwrap();
    assert_eq!(db.backend(), Backend::Mysql);
    assert_eq!(db.schema(), name);
    assert_eq!(db.place(), format!("database `{name}`"));
    business_script(&db).await;
    // `outbox purge` on MySQL: the only range it may drop is the migration's empty one below
    // the first seq; the messages written above stay.
    let pending = db.store().stats().await.unwrap().pending;
    let purged = db.purge(std::time::Duration::ZERO).await.unwrap();
    assert_eq!(purged.segments_dropped, 1, "{purged:?}");
    assert_eq!(db.store().stats().await.unwrap().pending, pending);
    db.clone().destroy().await.unwrap();
    let check = outbox_db::open(&mysql_url(), &name, 1).await.unwrap();
    assert!(!check.exists().await.unwrap(), "destroy drops the database");
    // Without --schema, the outbox is in the database the URL names.
    let default = outbox_db::open(&mysql_url(), "public", 1).await.unwrap();
    assert_eq!(default.schema(), "test");
    let e = outbox_db::open("mysql://root:hunter2@127.0.0.1:1", "public", 1)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test]
async fn the_public_schema_is_never_destroyed() {
    let db = outbox_db::open(&database_url(), "public", 1).await.unwrap();
    let e = db.destroy().await.unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config);
}

/// What crates built on the outbox use, on either backend: a sibling table set that is an
/// outbox of its own, a crate's own migrations beside it, times bound as parameters, and a
/// session whose transactions run on its connection.
async fn building_blocks_script(db: &Database, sibling: &str) {
    db.migrate().await.unwrap();
    let queue = db.sibling(sibling).unwrap();
    assert_eq!(queue.backend(), db.backend());
    assert!(
        queue.check().await.is_err(),
        "the sibling is not migrated yet"
    );
    assert!(!queue.migrate().await.unwrap().is_empty());
    queue.check().await.unwrap();
    let mut tx = queue.begin().await.unwrap();
    tx.enqueue(&NewMessage::new("t", "k", "e", serde_json::json!({})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(queue.store().stats().await.unwrap().pending, 1);
    assert_eq!(
        db.store().stats().await.unwrap().pending,
        0,
        "table sets apart"
    );

    // A crate's own tables: applied once, then recorded; each backend gets its own SQL.
    let migrations = outbox_db::Migrations {
        ledger: "extra_migrations",
        lock: "outbox-db-test-extra",
        postgres: &[(
            1,
            "extra",
            "CREATE TABLE {schema}.extra (id bigint PRIMARY KEY, at timestamptz NOT NULL, tag text NOT NULL DEFAULT '{tag}')",
        )],
        sqlite: &[(
            1,
            "extra",
            "CREATE TABLE extra (id INTEGER PRIMARY KEY, at TEXT NOT NULL, tag TEXT NOT NULL DEFAULT '{tag}')",
        )],
        mysql: &[(
            1,
            "extra",
            "CREATE TABLE IF NOT EXISTS {schema}.extra (id BIGINT PRIMARY KEY, at DATETIME(6) NOT NULL, \
             tag VARCHAR(64) COLLATE utf8mb4_general_ci NOT NULL DEFAULT '{tag}')",
        )],
    };
    let render = |sql: &str| sql.replace("{tag}", "rendered");
    let (a, b) = tokio::join!(
        db.apply_migrations(&migrations, &render),
        db.apply_migrations(&migrations, &render)
    );
    let mut applied = [a.unwrap(), b.unwrap()];
    applied.sort();
    assert_eq!(
        applied,
        [vec![], vec![1]],
        "concurrent migrators apply it once"
    );

    // Times compare as times on both backends.
    let now = chrono::Utc::now();
    for (id, at) in [(1i64, now - chrono::Duration::hours(2)), (2, now)] {
        db.execute(
            "INSERT INTO {schema}.extra (id, at) VALUES ($1, $2)",
            &[id.into(), at.into()],
        )
        .await
        .unwrap();
    }
    let old: Vec<(i64, String)> = db
        .fetch_all(
            "SELECT id, tag FROM {schema}.extra WHERE at < $1",
            &[(now - chrono::Duration::hours(1)).into()],
        )
        .await
        .unwrap();
    assert_eq!(old, vec![(1, "rendered".to_string())]);

    // A session's transaction commits like any other.
    let mut session = db.lock_session("outbox-db-test").await.unwrap().unwrap();
    assert!(session.alive().await);
    let mut tx = session.begin().await.unwrap();
    tx.execute(
        "INSERT INTO {schema}.extra (id, at) VALUES ($1, $2)",
        &[3i64.into(), now.into()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (n,): (i64,) = db
        .fetch_one("SELECT count(*) FROM {schema}.extra", &[])
        .await
        .unwrap();
    assert_eq!(n, 3);
}

#[tokio::test]
async fn postgres_siblings_migrations_times_and_sessions() {
    let schema = outbox_testkit::unique_name("db");
    let db = outbox_db::open(&database_url(), &schema, 4).await.unwrap();
    let sibling = format!("{schema}_q");
    building_blocks_script(&db, &sibling).await;
    db.sibling(&sibling)
        .unwrap()
        .execute_script("DROP SCHEMA {schema} CASCADE")
        .await
        .unwrap();
    db.destroy().await.unwrap();
}

#[tokio::test]
async fn sqlite_siblings_migrations_times_and_sessions() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("outbox-db"));
    std::fs::create_dir_all(&dir).unwrap();
    let db = outbox_db::open(
        &format!("sqlite://{}", dir.join("x.db").display()),
        "public",
        4,
    )
    .await
    .unwrap();
    building_blocks_script(&db, "queue").await;
    // SQLite has no session locks: a second session is granted as well.
    let _first = db.lock_session("held").await.unwrap().unwrap();
    assert!(db.lock_session("held").await.unwrap().is_some());
    db.destroy().await.unwrap();
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn mysql_siblings_migrations_times_and_sessions() {
    let name = outbox_testkit::unique_name("db");
    let db = outbox_db::open(&mysql_url(), &name, 4).await.unwrap();
    let sibling = format!("{name}_q");
    building_blocks_script(&db, &sibling).await;
    db.sibling(&sibling)
        .unwrap()
        .execute_script("DROP DATABASE {schema}")
        .await
        .unwrap();
    db.destroy().await.unwrap();
}

#[tokio::test]
async fn a_postgres_session_lock_is_held_until_its_session_ends() {
    session_lock_is_held_until_its_session_ends(&database_url()).await;
}

#[tokio::test]
async fn a_mysql_session_lock_is_held_until_its_session_ends() {
    session_lock_is_held_until_its_session_ends(&mysql_url()).await;
}

async fn session_lock_is_held_until_its_session_ends(url: &str) {
    let db = outbox_db::open(url, "public", 2).await.unwrap();
    let name = outbox_testkit::unique_name("lock");
    let mut first = db.lock_session(&name).await.unwrap().expect("free");
    assert!(
        db.lock_session(&name).await.unwrap().is_none(),
        "held by the first"
    );
    assert!(first.alive().await);
    drop(first);
    // The server lets the lock go when it sees the connection close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if db.lock_session(&name).await.unwrap().is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lock outlived its session"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A MySQL/MariaDB throw-away account (what verify's and bench's least-privilege parts log in
/// as) holds the documented grants it was given, takes the writer's once the tables exist, and
/// is gone after `drop_account`; other backends refuse accounts, and only PostgreSQL emits.
#[tokio::test]
async fn mysql_throw_away_accounts_hold_their_grants_and_go() {
    let name = outbox_testkit::unique_name("acct");
    let db = outbox_db::open(&mysql_url(), &name, 2).await.unwrap();
    db.migrate().await.unwrap();
    let (mariadb, _) = db.mysql_server().await.unwrap();
    let account = format!("{name}_w");
    db.create_account(&account, "s3cret0", outbox_db::MYSQL_GRANTS.relay, mariadb)
        .await
        .unwrap();
    db.grant_account(&account, outbox_db::MYSQL_GRANTS.writer, mariadb)
        .await
        .unwrap();
    let grants: Vec<(String,)> = db
        .fetch_all(&format!("SHOW GRANTS FOR '{account}'@'%'"), &[])
        .await
        .unwrap();
    let grants: Vec<String> = grants.into_iter().map(|(g,)| g).collect();
    assert!(
        grants
            .iter()
            .any(|g| g.contains("INSERT") && g.contains("outbox")),
        "{grants:?}"
    );
    db.drop_account(&account).await.unwrap();
    let (left,): (i64,) = db
        .fetch_one(
            "SELECT COUNT(*) FROM mysql.user WHERE user = $1",
            &[account.as_str().into()],
        )
        .await
        .unwrap();
    assert_eq!(left, 0, "the account is dropped");
    db.drop_account(&account).await.unwrap();
    let mut tx = db.begin().await.unwrap();
    let m = NewMessage::new("t", "k", "e", serde_json::json!({}));
    let e = tx.emit(&m).await.unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{e}");
    tx.rollback().await.unwrap();
    db.destroy().await.unwrap();

    let pg = outbox_db::open(&database_url(), &outbox_testkit::unique_name("acct"), 1)
        .await
        .unwrap();
    let e = pg.mysql_server().await.unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{e}");
    let e = pg.drop_account("nobody").await.unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{e}");
}
