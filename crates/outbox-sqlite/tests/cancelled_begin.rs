//! A `BEGIN IMMEDIATE` whose caller gives up (a deadline, a shutdown) must not leave its
//! connection inside a transaction: that connection would go back to the pool holding the
//! file's write lock, and every writer after it would fail with "database is locked".

use std::time::Duration;

use outbox_sqlite::{begin_immediate, connect_pool_sized};

/// Thousands of callers give up on `begin_immediate` at every moment around their BEGIN (queued
/// behind a writer, just as it runs, just after): afterwards each of the pool's connections
/// begins, writes and commits. With sqlx's own `pool.begin_with("BEGIN IMMEDIATE")` in its
/// place this fails within two rounds on this machine: "database is locked", for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_on_a_begin_leave_no_connection_inside_a_transaction() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("sqlite_begin"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("begin.db").display());
    let pool = connect_pool_sized(&url, 6).await.unwrap();
    sqlx::raw_sql("CREATE TABLE t (n INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    for round in 0..40 {
        // Half the rounds queue behind a writer that lets go 5 ms in; the others find the lock
        // free. Either way each caller gives up somewhere between before its BEGIN ran and just
        // after: a few hundred microseconds, on a machine this busy, spans them all.
        let holder = if round % 2 == 0 {
            Some(begin_immediate(&pool).await.unwrap())
        } else {
            None
        };
        let quitters: Vec<_> = (0..50)
            .map(|_| {
                let pool = pool.clone();
                let patience = Duration::from_micros(fastrand::u64(..400));
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(patience, begin_immediate(&pool)).await;
                })
            })
            .collect();
        if let Some(holder) = holder {
            tokio::time::sleep(Duration::from_millis(5)).await;
            holder.commit().await.unwrap();
        }
        for q in quitters {
            q.await.unwrap();
        }
        // Every connection of the pool, taken at once, is outside any transaction: each one
        // begins (sqlx refuses a `BEGIN …` on a connection still inside one) and commits a write.
        let mut conns = Vec::new();
        for _ in 0..6 {
            conns.push(pool.acquire().await.unwrap());
        }
        for conn in &mut conns {
            let mut tx = tokio::time::timeout(
                Duration::from_secs(10),
                sqlx::Connection::begin_with(&mut **conn, "BEGIN IMMEDIATE"),
            )
            .await
            .unwrap_or_else(|_| panic!("round {round}: the write lock was never released"))
            .unwrap_or_else(|e| {
                panic!("round {round}: a connection was left in a transaction: {e}")
            });
            sqlx::query("INSERT INTO t (n) VALUES (?)")
                .bind(round)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
