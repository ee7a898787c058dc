//! What idle-tx mode reads on MySQL/MariaDB around each run: the snapshot's holder (a session
//! that started `REPEATABLE READ` and took its consistent snapshot, `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT` and one read) and InnoDB's history list length
//! (`trx_rseg_history_len`, server-wide) at the start and the end: such a snapshot stops purge,
//! so the undo history grows.

use anyhow::Context as _;
use serde::Serialize;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};

use crate::load::Paced;
use crate::mysql::{MyCtx, Scratch, HISTORY_LENGTH};

/// What MySQL/MariaDB showed of one run.
#[derive(Debug, Serialize)]
pub(super) struct Seen {
    history_length_start: Option<i64>,
    history_length_end: Option<i64>,
}

impl Seen {
    /// The tail of the run's printed line.
    pub(super) fn line(&self) -> String {
        let history = |v: Option<i64>| v.map_or("-".into(), |v| v.to_string());
        format!(
            "history list length {} → {}",
            history(self.history_length_start),
            history(self.history_length_end)
        )
    }
}

/// Prints the mode's header.
pub(super) fn header(spec: &Paced) {
    println!(
        "outbox bench on MySQL/MariaDB: idle-tx, {} events/s for {:?} per run over {} \
         connections, relay polling; run 1 without, run 2 with a REPEATABLE READ snapshot held open",
        spec.rate, spec.duration, spec.producers
    );
}

/// MySQL's watch over one run.
pub(super) struct Watch {
    pool: MySqlPool,
    holder: Option<Holder>,
    history_length_start: Option<i64>,
}

impl Watch {
    /// Opens the holder when the run holds one, then reads the history list length.
    pub(super) async fn begin(ctx: &MyCtx, scratch: &Scratch, hold: bool) -> anyhow::Result<Self> {
        let holder = match hold {
            true => Some(Holder::open(ctx, scratch).await?),
            false => None,
        };
        Ok(Self {
            pool: scratch.pool.clone(),
            holder,
            history_length_start: history_length(&scratch.pool).await,
        })
    }

    /// After the drain: the history list length.
    pub(super) async fn drained(&mut self) -> Seen {
        Seen {
            history_length_start: self.history_length_start,
            history_length_end: history_length(&self.pool).await,
        }
    }

    /// Ends the held transaction (after the relay stopped).
    pub(super) async fn close(self) {
        if let Some(h) = self.holder {
            h.close().await;
        }
    }
}

/// InnoDB's history list length, or `None` where the server does not expose the metric.
async fn history_length(pool: &MySqlPool) -> Option<i64> {
    match sqlx::query_scalar::<_, i64>(HISTORY_LENGTH)
        .fetch_optional(pool)
        .await
    {
        Ok(v) => v,
        Err(error) => {
            tracing::debug!(%error, "no history list length");
            None
        }
    }
}

/// A session holding a REPEATABLE READ transaction whose consistent snapshot is taken.
struct Holder {
    conn: MySqlConnection,
}

impl Holder {
    async fn open(ctx: &MyCtx, scratch: &Scratch) -> anyhow::Result<Self> {
        let mut conn = MySqlConnection::connect_with(&outbox_db::tools::mysql::connect_options(
            &ctx.options.database_url,
        )?)
        .await
        .context("opening the session that holds the snapshot")?;
        sqlx::raw_sql(
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
             START TRANSACTION WITH CONSISTENT SNAPSHOT",
        )
        .execute(&mut conn)
        .await?;
        // A read of the outbox, as a report would make; the snapshot was taken at the start.
        sqlx::raw_sql(
            &scratch
                .schema
                .render("SELECT COUNT(*) FROM {schema}.outbox"),
        )
        .execute(&mut conn)
        .await?;
        Ok(Self { conn })
    }

    async fn close(mut self) {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}
