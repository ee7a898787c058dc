//! Adopting a Debezium outbox table on MariaDB: the application's INSERTs into Debezium's
//! documented layout, unchanged, reach the outbox in their own transaction (a rolled-back one
//! does not), with the trace context and additional columns as headers, in insert order per
//! key; released, they no longer do.

#![allow(clippy::unwrap_used)]

mod common;

use common::{migrated_outbox, server_url};
use outbox_mysql::debezium::{adopt, release};
use outbox_mysql::grants::{create_account, drop_account, login_url, server};

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test]
async fn debeziums_inserts_reach_the_outbox_in_their_transaction() {
    let (pool, schema) = migrated_outbox(&server_url(), 4).await;
    let db = schema.as_str();
    sqlx::raw_sql(&format!(
        "CREATE TABLE `{db}`.debezium_outbox (
            id VARCHAR(36) NOT NULL PRIMARY KEY,
            aggregatetype VARCHAR(255) NOT NULL,
            aggregateid VARCHAR(255) NOT NULL,
            type VARCHAR(255) NOT NULL,
            payload JSON,
            tracingspancontext VARCHAR(256),
            tenant VARCHAR(64)
        ) ENGINE = InnoDB"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let table = format!("{db}.debezium_outbox");
    let a = adopt(&pool, &schema, &table).await.unwrap();
    assert!(a.tracing);
    assert_eq!(a.additional, vec!["tenant".to_string()]);
    adopt(&pool, &schema, &table).await.unwrap();
    let insert = format!(
        "INSERT INTO `{db}`.debezium_outbox (id, aggregatetype, aggregateid, type, payload, \
         tracingspancontext, tenant) VALUES (?, 'order', ?, 'OrderCreated', ?, ?, ?)"
    );
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = uuid::Uuid::now_v7().to_string();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&insert)
            .bind(&id)
            .bind("o-1")
            .bind(serde_json::json!({"n": n}).to_string())
            .bind(format!("#Sat\ntraceparent={TRACEPARENT}\ntracestate=v=1\n"))
            .bind(if n == 1 { None } else { Some("t9") })
            .execute(&mut *tx)
            .await
            .unwrap();
        // Debezium's advice: delete the row right after inserting it. The copy stays.
        sqlx::query(&format!("DELETE FROM `{db}`.debezium_outbox WHERE id = ?"))
            .bind(&id)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        ids.push(id);
    }
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&insert)
        .bind(uuid::Uuid::now_v7().to_string())
        .bind("o-1")
        .bind("{}")
        .bind(None::<String>)
        .bind(None::<String>)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let rows: Vec<(String, String, String, String, String, String)> = sqlx::query_as(&format!(
        "SELECT CAST(id AS CHAR), CAST(aggregate_type AS CHAR), CAST(aggregate_id AS CHAR), \
         CAST(event_type AS CHAR), CAST(payload AS CHAR), CAST(headers AS CHAR) \
         FROM `{db}`.outbox ORDER BY part_seq"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3, "the rolled-back INSERT is not copied");
    for (n, (id, at, key, ty, payload, headers)) in rows.iter().enumerate() {
        assert_eq!(id, &ids[n], "insert order");
        assert_eq!(
            (at.as_str(), key.as_str(), ty.as_str()),
            ("order", "o-1", "OrderCreated")
        );
        let payload: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(payload, serde_json::json!({"n": n}));
        let headers: serde_json::Value = serde_json::from_str(headers).unwrap();
        assert_eq!(headers["traceparent"], TRACEPARENT);
        assert_eq!(headers["tracestate"], "v=1");
        if n == 1 {
            assert!(
                headers.get("tenant").is_none(),
                "a NULL column is no header"
            );
        } else {
            assert_eq!(headers["tenant"], "t9");
        }
    }

    release(&pool, &schema, &table).await.unwrap();
    sqlx::query(&insert)
        .bind(uuid::Uuid::now_v7().to_string())
        .bind("o-2")
        .bind("{}")
        .bind(None::<String>)
        .bind(None::<String>)
        .execute(&pool)
        .await
        .unwrap();
    let (count,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM `{db}`.outbox"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3, "released: no longer copied");
    let own = format!("{db}.outbox");
    let err = adopt(&pool, &schema, &own).await.unwrap_err().to_string();
    assert!(err.contains("relay's own outbox table"), "{err}");
    let _ = sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await;
}

/// docs/engine-mysql.md, "Least privileges": an application account holding only `INSERT,
/// DELETE, SELECT (id)` on its Debezium table (the `DELETE … WHERE id = ?` Debezium advises
/// reads `id`: without `SELECT` on it the server refuses it, error 1143) reaches the outbox,
/// since the copy trigger writes it with its definer's rights (here the administrator that
/// adopted the table), and is refused on the outbox itself. `outbox verify --debezium` gives
/// its writer login the same grant.
#[tokio::test]
async fn an_account_holding_only_insert_on_debeziums_table_reaches_the_outbox() {
    let url = server_url();
    let (pool, schema) = migrated_outbox(&url, 2).await;
    let db = schema.as_str();
    sqlx::raw_sql(&format!(
        "CREATE TABLE `{db}`.debezium_outbox (
            id VARCHAR(36) NOT NULL PRIMARY KEY,
            aggregatetype VARCHAR(255) NOT NULL,
            aggregateid VARCHAR(255) NOT NULL,
            type VARCHAR(255) NOT NULL,
            payload JSON
        ) ENGINE = InnoDB"
    ))
    .execute(&pool)
    .await
    .unwrap();
    adopt(&pool, &schema, &format!("{db}.debezium_outbox"))
        .await
        .unwrap();
    let random = uuid::Uuid::now_v7().simple().to_string();
    // The v7 id's last characters are random; its first are the time.
    let name = format!("dbz_app_{}", &random[24..]);
    let password = uuid::Uuid::now_v7().simple().to_string();
    let (mariadb, _) = server(&pool).await.unwrap();
    create_account(
        &pool,
        &name,
        &password,
        db,
        &["GRANT INSERT, DELETE, SELECT (id) ON {db}.debezium_outbox TO {user}"],
        mariadb,
    )
    .await
    .unwrap();
    let app = sqlx::MySqlPool::connect(&login_url(&url, &name, &password, db).unwrap())
        .await
        .unwrap();
    let id = uuid::Uuid::now_v7().to_string();
    let mut tx = app.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO debezium_outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES (?, 'order', 'o-1', 'OrderCreated', ?)",
    )
    .bind(&id)
    .bind(r#"{"total": 12}"#)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("DELETE FROM debezium_outbox WHERE id = ?")
        .bind(&id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let refused = sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (?, 'order', 'o-1', 'OrderCreated', '{}')",
    )
    .bind(uuid::Uuid::now_v7().to_string())
    .execute(&app)
    .await;
    app.close().await;
    let copied: Vec<(String,)> =
        sqlx::query_as(&format!("SELECT CAST(id AS CHAR) FROM `{db}`.outbox"))
            .fetch_all(&pool)
            .await
            .unwrap();
    drop_account(&pool, &name).await.unwrap();
    let _ = sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await;
    assert!(refused.is_err(), "the account holds nothing on the outbox");
    assert_eq!(copied, vec![(id,)], "the copy trigger wrote the outbox");
}
