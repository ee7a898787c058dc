//! [`Store::gauges`](outbox_core::Store::gauges) and [`Store::ping`](outbox_core::Store::ping)
//! for PostgreSQL: the figures of a metrics scrape in one statement (`queries/gauges.sql`, whose
//! comments say why its cost does not grow with the backlog), and the readiness round trip.

use outbox_core::{Gauges, PinAge, Result};
use sqlx::{PgPool, Row};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// Pending rows a scrape counts per partition at most (64 × this in all): past it the gauge
/// says "at least" (`pending_capped`), and the oldest pending age stays exact.
pub const GAUGES_PENDING_CAP: i64 = 1000;

/// Reads the scrape's figures for the outbox in `schema`; `parked_cap` is the store's
/// per-partition parking cap.
pub(crate) async fn read(pool: &PgPool, schema: &Schema, parked_cap: i64) -> Result<Gauges> {
    let err = |e| map_sqlx_error("reading the outbox gauges", e);
    let sql = schema.render(&crate::store::with_pending_rows(
        include_str!("../queries/gauges.sql"),
        "",
    ));
    let r = crate::store::read_backlog_row(
        pool,
        sqlx::query(&sql).bind(GAUGES_PENDING_CAP).bind(parked_cap),
    )
    .await
    .map_err(err)?;
    let age = |name: &str| -> Result<f64> { r.try_get::<f64, _>(name).map_err(err) };
    Ok(Gauges {
        pending: r.try_get("pending").map_err(err)?,
        pending_capped: r.try_get("pending_capped").map_err(err)?,
        oldest_pending_age_seconds: r
            .try_get::<Option<f64>, _>("oldest_pending_age_seconds")
            .map_err(err)?
            .map(|s| s.max(0.0)),
        retrying: r.try_get("retrying").map_err(err)?,
        published: Some(r.try_get("published").map_err(err)?),
        parked: r.try_get("parked").map_err(err)?,
        failed: r.try_get("failed").map_err(err)?,
        partitions_at_parking_cap: r.try_get("partitions_at_parking_cap").map_err(err)?,
        segments: Some(r.try_get("segments").map_err(err)?),
        retention_pins: vec![
            PinAge {
                pin: "position",
                age_seconds: age("pin_position")?.max(0.0),
            },
            PinAge {
                pin: "transaction",
                age_seconds: age("pin_transaction")?.max(0.0),
            },
            PinAge {
                pin: "prepared",
                age_seconds: age("pin_prepared")?.max(0.0),
            },
        ],
        cdc_slot: None,
        binlog_sequencer: None,
    })
}

/// `SELECT 1` through the pool.
pub(crate) async fn ping(pool: &PgPool) -> Result<()> {
    sqlx::query(include_str!("../queries/ping.sql"))
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| map_sqlx_error("asking the database whether it answers", e))
}
