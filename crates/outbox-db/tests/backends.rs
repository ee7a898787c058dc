//! The same business-transaction script on both backends, against the real PostgreSQL of this
//! machine (a schema of its own) and a SQLite file of its own.

#![allow(clippy::unwrap_used)] // tests

use outbox_core::NewMessage;
use outbox_db::{Backend, Database, Param};
use uuid::Uuid;

fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
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
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ($1, $2, $3, $4) RETURNING CAST(id AS TEXT)",
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
        .fetch_all("SELECT CAST(id AS TEXT), n FROM {schema}.ledger", &[])
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
async fn the_public_schema_is_never_destroyed() {
    let db = outbox_db::open(&database_url(), "public", 1).await.unwrap();
    let e = db.destroy().await.unwrap_err();
    assert_eq!(e.kind(), outbox_core::ErrorKind::Config);
}
