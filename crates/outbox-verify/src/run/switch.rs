//! The switch of a `--mode switch` run, under load, and CDC mode's backlog figures (the WAL
//! the slot has not confirmed, the parked messages still to publish).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use outbox_db::{Backend, CdcNames, Database};

use super::prepare::Setup;
use super::{bounded, progress};
use crate::faults::FaultEvent;
use crate::logins::Logins;
use crate::relays::Relays;

/// The switch of a `--mode switch` run, under load: kills every relay (kill -9, whatever it is
/// in the middle of), lets the producers write for [`SWITCH_GAP`] with no relay running, makes
/// the slot (what `outbox migrate --cdc` does), then starts every relay again in CDC mode: it
/// must deliver what the polling relays left, before the slot and after, then read the stream.
/// Recorded among the faults, so the duplicates it causes are attributed.
pub(super) async fn switch_to_cdc(
    setup: &Setup,
    relays: &Mutex<Relays>,
    started: Instant,
) -> anyhow::Result<FaultEvent> {
    let (db, logins) = (&setup.db, setup.logins.as_ref());
    let at = started.elapsed().as_secs_f64();
    progress(
        started,
        "switching: every relay killed, the slot made under load, the relays started in CDC mode",
    );
    if db.backend() != Backend::Postgres {
        anyhow::bail!("verify --mode switch reads PostgreSQL's WAL; use a postgres:// URL");
    }
    let lock = || {
        relays
            .lock()
            .map_err(|_| anyhow::anyhow!("the relays' lock is poisoned"))
    };
    let kill_all = |r: &mut Relays| {
        for i in 0..r.children.len() {
            r.signal(i, "-CONT");
            let _ = r.children[i].kill();
            let _ = r.children[i].wait();
        }
    };
    kill_all(&mut *lock()?);
    tokio::time::sleep(SWITCH_GAP).await;
    // The database may be restarting (the `db` fault): tried again for up to a minute.
    let mut tries = 0;
    let names = loop {
        match bounded(migrate_cdc(db, logins, &setup.admin_db_url)).await {
            Ok(names) => break names,
            Err(e) => {
                tries += 1;
                if tries >= 60 {
                    return Err(e.context("creating the CDC publication and slot under load"));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    // The relay role reads the WAL now: its grants again give it the REPLICATION attribute.
    if let Some(l) = logins {
        l.grant(db).await?;
    }
    let mut r = lock()?;
    // A relay the fault schedule restarted meanwhile runs in polling mode: killed again.
    kill_all(&mut r);
    r.replace_arg("polling", "cdc");
    for i in 0..r.children.len() {
        let c = r.spawn_one(i)?;
        r.children[i] = c;
    }
    Ok(FaultEvent {
        problem: None,
        kind: "switch".into(),
        at_seconds: at,
        ended_seconds: started.elapsed().as_secs_f64(),
        detail: format!(
            "{} polling relays killed (kill -9); {SWITCH_GAP:?} later slot {} made under load; \
             the relays started in CDC mode",
            r.children.len(),
            names.slot,
        ),
    })
}

/// What `outbox migrate --cdc` makes (the publication, the slot, `outbox_emit`), made by the
/// owner login when the run has logins, as production makes it (docs/roles.md: the owner runs
/// `migrate`) and as a `--mode cdc` run's preparation does. Made by the administrator, the
/// writers' `outbox_emit` (`SECURITY DEFINER`) would run with a superuser's rights, and, owned
/// by another role inside the owner's schema, it kept `DROP OWNED BY` from dropping the owner
/// at the end: the run leaked its owner login.
async fn migrate_cdc(
    db: &Database,
    logins: Option<&Logins>,
    admin_url: &str,
) -> anyhow::Result<CdcNames> {
    let Some(l) = logins else {
        return Ok(db.migrate_cdc("relay").await?.0);
    };
    let owner = l.open_owner(admin_url, db.schema()).await?;
    let made = owner.migrate_cdc("relay").await;
    if let Some(pg) = owner.postgres() {
        pg.pool().close().await;
    }
    Ok(made?.0)
}

/// How long a switching run's producers write with no relay running, before the slot is made:
/// a backlog the CDC relays' catch-up must deliver.
const SWITCH_GAP: Duration = Duration::from_secs(2);

/// The server's WAL position now (CDC mode).
pub(super) async fn cdc_wal_now(db: &Database) -> outbox_core::Result<String> {
    let (lsn,): (String,) = db
        .fetch_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?;
    Ok(lsn)
}

/// CDC mode's pending figure: 1 while the slot has not confirmed `lsn` (a position after the
/// last commit of the load), plus the parked messages still to publish; 0 once everything is
/// handled.
pub(super) async fn cdc_pending(db: &Database, lsn: String) -> outbox_core::Result<i64> {
    let schema = db.schema().to_string();
    let sql = format!(
        "SELECT (SELECT count(*) FROM pg_replication_slots \
                 WHERE slot_name = 'outbox_' || $1 || '_relay' \
                   AND confirmed_flush_lsn < CAST($2 AS pg_lsn)) \
              + (SELECT count(*) FROM {schema}.outbox_parked WHERE state <> 'failed')"
    );
    let (n,): (i64,) = db.fetch_one(&sql, &[schema.into(), lsn.into()]).await?;
    Ok(n)
}
