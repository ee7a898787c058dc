//! Layer 2, idempotent effects, on real PostgreSQL and SQLite: the three shapes of
//! `docs/consumers.md`, each applied three times (a message delivered three times to a consumer
//! without layer 1), changing the state once. And the shape that is not idempotent, for
//! contrast.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Lite, Pg};
use outbox_inbox::effects::is_duplicate;
use uuid::Uuid;

#[tokio::test]
async fn an_upsert_by_business_key_sets_the_same_state_however_often_it_is_applied() {
    let pg = Pg::new().await;
    let s = &pg.name;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {s}.accounts (account_id text PRIMARY KEY, balance bigint NOT NULL, \
         as_of timestamptz NOT NULL)"
    ))
    .execute(&pg.pool)
    .await
    .unwrap();
    // The event carries the new state (`account.balance_changed`, balance 250 as of t).
    let upsert = format!(
        "INSERT INTO {s}.accounts (account_id, balance, as_of) VALUES ($1, $2, $3)
         ON CONFLICT (account_id) DO UPDATE SET balance = EXCLUDED.balance, as_of = EXCLUDED.as_of
         WHERE {s}.accounts.as_of <= EXCLUDED.as_of"
    );
    let at = chrono::Utc::now();
    for _ in 0..3 {
        sqlx::query(&upsert)
            .bind("acc-1")
            .bind(250i64)
            .bind(at)
            .execute(&pg.pool)
            .await
            .unwrap();
    }
    // An older event delivered late does not roll the state back.
    sqlx::query(&upsert)
        .bind("acc-1")
        .bind(100i64)
        .bind(at - chrono::Duration::seconds(60))
        .execute(&pg.pool)
        .await
        .unwrap();
    let (n, balance): (i64, i64) =
        sqlx::query_as(&format!("SELECT count(*), max(balance) FROM {s}.accounts"))
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!((n, balance), (1, 250));
    pg.drop_all().await;
}

#[tokio::test]
async fn a_conditional_transition_moves_only_from_the_expected_state() {
    let pg = Pg::new().await;
    let s = &pg.name;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {s}.orders (id text PRIMARY KEY, status text NOT NULL, paid_count int NOT NULL DEFAULT 0);
         INSERT INTO {s}.orders (id, status) VALUES ('o-1', 'PENDING')"
    ))
    .execute(&pg.pool)
    .await
    .unwrap();
    let pay = format!(
        "UPDATE {s}.orders SET status = 'PAID', paid_count = paid_count + 1
         WHERE id = $1 AND status = 'PENDING'"
    );
    let mut moved = Vec::new();
    for _ in 0..3 {
        moved.push(
            sqlx::query(&pay)
                .bind("o-1")
                .execute(&pg.pool)
                .await
                .unwrap()
                .rows_affected(),
        );
    }
    assert_eq!(
        moved,
        vec![1, 0, 0],
        "a repeat matches no row: nothing to do"
    );
    let (status, count): (String, i32) =
        sqlx::query_as(&format!("SELECT status, paid_count FROM {s}.orders"))
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), count), ("PAID", 1));
    pg.drop_all().await;
}

#[tokio::test]
async fn a_ledger_entry_keyed_by_the_message_id_is_rejected_as_a_duplicate_on_postgres() {
    let pg = Pg::new().await;
    let s = &pg.name;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {s}.ledger (message_id uuid PRIMARY KEY, account text NOT NULL, cents bigint NOT NULL)"
    ))
    .execute(&pg.pool)
    .await
    .unwrap();
    let id = Uuid::now_v7();
    let insert =
        format!("INSERT INTO {s}.ledger (message_id, account, cents) VALUES ($1, 'acc-1', 500)");
    let mut applied = Vec::new();
    for _ in 0..3 {
        let mut tx = pg.pool.begin().await.unwrap();
        // A savepoint keeps the business transaction usable after the constraint says no.
        let mut sp = sqlx::Acquire::begin(&mut tx).await.unwrap();
        match sqlx::query(&insert).bind(id).execute(&mut *sp).await {
            Ok(_) => {
                sp.commit().await.unwrap();
                applied.push(true);
            }
            Err(e) if is_duplicate(&e) => {
                sp.rollback().await.unwrap();
                applied.push(false);
            }
            Err(e) => panic!("{e}"),
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(applied, vec![true, false, false]);
    let total: i64 = pg
        .scalar("SELECT sum(cents)::int8 FROM {schema}.ledger")
        .await;
    assert_eq!(total, 500);
    // For contrast: an increment is not idempotent; three deliveries add three times.
    sqlx::raw_sql(&format!(
        "CREATE TABLE {s}.balances (account text PRIMARY KEY, cents bigint NOT NULL);
         INSERT INTO {s}.balances VALUES ('acc-1', 0)"
    ))
    .execute(&pg.pool)
    .await
    .unwrap();
    for _ in 0..3 {
        sqlx::query(&format!(
            "UPDATE {s}.balances SET cents = cents + 500 WHERE account = 'acc-1'"
        ))
        .execute(&pg.pool)
        .await
        .unwrap();
    }
    assert_eq!(
        pg.scalar("SELECT cents FROM {schema}.balances").await,
        1500,
        "needs layer 1"
    );
    pg.drop_all().await;
}

#[tokio::test]
async fn a_ledger_entry_keyed_by_the_message_id_is_rejected_as_a_duplicate_on_sqlite() {
    let lite = Lite::new().await;
    sqlx::raw_sql("CREATE TABLE ledger (message_id TEXT PRIMARY KEY, account TEXT NOT NULL, cents INTEGER NOT NULL)")
        .execute(&lite.pool)
        .await
        .unwrap();
    let id = Uuid::now_v7().to_string();
    let mut applied = Vec::new();
    for _ in 0..3 {
        let r = sqlx::query(
            "INSERT INTO ledger (message_id, account, cents) VALUES (?1, 'acc-1', 500)",
        )
        .bind(&id)
        .execute(&lite.pool)
        .await;
        applied.push(match r {
            Ok(_) => true,
            Err(e) if is_duplicate(&e) => false,
            Err(e) => panic!("{e}"),
        });
    }
    assert_eq!(applied, vec![true, false, false]);
    assert_eq!(lite.scalar("SELECT sum(cents) FROM ledger").await, 500);
    lite.drop_all().await;
}
