//! Opening a transaction that a dropped caller cannot leave open.
//!
//! sqlx (0.8.6; sqlx issue #4393) sends `BEGIN` and counts the transaction only once the server
//! answered, and its rollback-on-drop guard does nothing before the count. A call dropped in
//! between (the relay drops a claim that outlives its budget, a metrics scrape one that outlives
//! its timeout) returns the connection to the pool inside a transaction nobody ends: the next
//! borrower's statements run in it, uncommitted, and its snapshot holds back vacuum and the
//! engine's retention. Here the `BEGIN` runs on a task of its own, so it completes; a
//! transaction nobody waits for any more is then dropped, and rolled back, like any other.

use std::time::{Duration, Instant};

use sqlx::{PgPool, Postgres, Transaction};

/// A transaction begun with `statement` on a connection of `pool`, and how long the connection
/// took to acquire.
pub(crate) async fn begin_with(
    pool: &PgPool,
    statement: &'static str,
) -> Result<(Transaction<'static, Postgres>, Duration), sqlx::Error> {
    let pool = pool.clone();
    let began = tokio::spawn(async move {
        let started = Instant::now();
        let conn = pool.acquire().await?;
        let acquired = started.elapsed();
        let tx = Transaction::begin(conn, Some(statement.into())).await?;
        Ok((tx, acquired))
    });
    match began.await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(sqlx::Error::Io(std::io::Error::other(format!(
            "beginning a transaction: {e}"
        )))),
    }
}
