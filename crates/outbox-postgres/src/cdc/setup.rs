//! What CDC mode needs in the database, and `outbox migrate --cdc`: a publication of the message
//! table (inserts only, named by the root table, so segments come and go unseen) and one logical
//! replication slot per relay group.
//!
//! Names are database objects that live outside the schema (publications are per database,
//! slots per cluster), so they carry the schema: `outbox_<schema>` and
//! `outbox_<schema>_<group>`.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::PgPool;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// The relay group a slot belongs to when none is given.
pub const DEFAULT_GROUP: &str = "relay";

/// The prefix of the logical messages [`crate::emit`] writes for the `public` schema; other
/// schemas use `outbox:<schema>`, so a relay publishes only its own schema's messages.
pub const MESSAGE_PREFIX: &str = "outbox";

/// The publication, slot and message prefix of one schema's CDC relay group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcNames {
    /// The schema of the message table.
    pub schema: Schema,
    /// `outbox_<schema>`.
    pub publication: String,
    /// `outbox_<schema>_<group>`.
    pub slot: String,
    /// `outbox` for `public`, `outbox:<schema>` otherwise.
    pub prefix: String,
}

impl CdcNames {
    /// `sql` with `{schema}`, `{channel}`, `{publication}` and `{slot}` filled in (each a
    /// validated identifier).
    pub fn render(&self, sql: &str) -> String {
        self.schema
            .render(sql)
            .replace("{publication}", &self.publication)
            .replace("{slot}", &self.slot)
    }

    /// The names for `schema` and relay group `group` (a plain identifier). Both names must fit
    /// PostgreSQL's 63 bytes.
    pub fn new(schema: &Schema, group: &str) -> Result<Self> {
        if !outbox_core::identifier::is_plain(group, 63) {
            return Err(Error::config(format!(
                "CDC group `{group}` is not a plain identifier: use lower-case letters, digits \
                 and `_`, starting with a letter or `_`"
            )));
        }
        let publication = format!("outbox_{}", schema.as_str());
        let slot = format!("outbox_{}_{group}", schema.as_str());
        if slot.len() > 63 {
            return Err(Error::config(format!(
                "the replication slot name `{slot}` is longer than PostgreSQL's 63 bytes; use a \
                 shorter schema or --cdc-group"
            )));
        }
        Ok(Self {
            schema: schema.clone(),
            publication,
            slot,
            prefix: message_prefix(schema),
        })
    }
}

impl CdcNames {
    /// The prefix of the group's heartbeats (`outbox-heartbeat:<slot>`), non-transactional
    /// logical messages the relay writes when asked to (`--cdc-heartbeat`).
    pub fn heartbeat_prefix(&self) -> String {
        format!("outbox-heartbeat:{}", self.slot)
    }

    /// The `outbox_settings` row holding the snapshot taken just after the slot was created.
    pub fn start_setting(&self) -> String {
        format!("cdc_start:{}", self.slot)
    }

    /// The `outbox_settings` row holding where the slot stood at the last maintenance round
    /// (restart and confirmed positions), read when the slot is lost.
    pub fn read_setting(&self) -> String {
        format!("cdc_read:{}", self.slot)
    }
}

/// The logical message prefix of `schema`'s outbox (see [`MESSAGE_PREFIX`]).
pub fn message_prefix(schema: &Schema) -> String {
    if schema.as_str() == crate::schema::DEFAULT_SCHEMA {
        MESSAGE_PREFIX.to_string()
    } else {
        format!("{MESSAGE_PREFIX}:{}", schema.as_str())
    }
}

/// What `outbox migrate --cdc` did and found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcSetup {
    /// Whether the publication was created now (false: it was there).
    pub publication_created: bool,
    /// Whether the slot was created now (false: it was there).
    pub slot_created: bool,
    /// The server's `max_slot_wal_keep_size` in MB; `None` when unlimited (-1).
    pub max_slot_wal_keep_mb: Option<i64>,
    /// Whether the slot follows a failover (PostgreSQL 17 and later: a failover slot, kept on
    /// standbys with `sync_replication_slots`).
    pub failover_slot: bool,
    /// Whether the relay can read WAL the slot no longer holds (`pg_walinspect`), to publish
    /// the `emit` messages of a lost slot (see [`crate::cdc::salvage`]).
    pub salvage: bool,
    /// What the operator should know (each a sentence with what to do).
    pub notes: Vec<String>,
}

/// Refuses, with the fix, a server whose `wal_level` is not `logical`.
pub async fn check_wal_level(pool: &PgPool) -> Result<()> {
    let level: String = sqlx::query_scalar(include_str!("../../queries/wal_level.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading wal_level", e))?;
    if level == "logical" {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        format!(
            "CDC mode reads the WAL by logical decoding, but this server runs \
             wal_level={level}; run `ALTER SYSTEM SET wal_level = logical` and restart \
             PostgreSQL, or use the polling relay (no --mode cdc)"
        ),
    ))
}

/// `max_slot_wal_keep_size` in MB, `None` when unlimited.
pub async fn max_slot_wal_keep_mb(pool: &PgPool) -> Result<Option<i64>> {
    let mb: i64 = sqlx::query_scalar(include_str!("../../queries/max_slot_wal_keep_size.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading max_slot_wal_keep_size", e))?;
    Ok((mb >= 0).then_some(mb))
}

/// Refuses a second CDC group on one schema: the groups would share `outbox_parked` (one would
/// publish and delete the other's redriven messages) and the polling positions (one's
/// checkpoints would move them past what the other has not published). The groups of a schema
/// are the slots its `outbox_settings` records (`cdc_start:<slot>`, written by
/// [`migrate_cdc`]).
pub async fn check_one_group(pool: &PgPool, names: &CdcNames) -> Result<()> {
    let others: Vec<String> = sqlx::query_scalar(
        &names
            .schema
            .render(include_str!("../../queries/cdc_other_groups.sql")),
    )
    .bind(names.start_setting())
    .fetch_all(pool)
    .await
    .map_err(|e| map_sqlx_error("looking for other CDC groups", e))?;
    match others.first() {
        None => Ok(()),
        Some(other) => Err(Error::config(format!(
            "schema `{}` already has the CDC slot `{other}`: one CDC group per schema (the \
             groups would share parked messages and the polling positions); use that group, \
             or drop it first",
            names.schema.as_str()
        ))),
    }
}

/// Refuses a slot name another database of the cluster already uses: slot names are
/// cluster-wide, and the two outboxes would read one stream.
async fn check_slot_name_free(pool: &PgPool, names: &CdcNames) -> Result<()> {
    let other: Option<String> =
        sqlx::query_scalar(include_str!("../../queries/cdc_slot_database.sql"))
            .bind(&names.slot)
            .fetch_optional(pool)
            .await
            .map_err(|e| map_sqlx_error("looking for the CDC slot's name in the cluster", e))?;
    match other {
        None => Ok(()),
        Some(db) => Err(Error::config(format!(
            "the replication slot name `{}` is taken by database `{db}` of this cluster (slot \
             names are cluster-wide): give this outbox another relay group (--cdc-group)",
            names.slot
        ))),
    }
}

/// Creates the publication, the slot and `outbox_emit` when missing, and checks the server's
/// settings. Idempotent. The slot starts at the moment it is created: messages written before
/// are not in its stream (the CDC relay's catch-up delivers those no polling relay has passed;
/// see docs/cdc.md, "Switching a running outbox"), and from then on it holds WAL until a relay
/// reads it: start the CDC relay soon after.
pub async fn migrate_cdc(pool: &PgPool, names: &CdcNames) -> Result<CdcSetup> {
    check_wal_level(pool).await?;
    check_one_group(pool, names).await?;
    check_slot_name_free(pool, names).await?;
    let mut notes = Vec::new();
    let publication_exists: bool =
        sqlx::query_scalar(include_str!("../../queries/cdc_publication_exists.sql"))
            .bind(&names.publication)
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error("looking for the CDC publication", e))?;
    if !publication_exists {
        // Names were validated as plain identifiers: nothing else is spliced in.
        let sql = names.render(include_str!("../../queries/cdc_publication_create.sql"));
        match sqlx::query(&sql).execute(pool).await {
            Ok(_) => {}
            // Another migrate created it meanwhile.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => {}
            Err(e) => return Err(map_sqlx_error("creating the CDC publication", e)),
        }
    }
    crate::cdc::checks::check_publication(pool, names).await?;
    crate::cdc::checks::check_synchronous_standbys(pool, names).await?;
    let made = make_slot(pool, names).await?;
    sqlx::raw_sql(&emit_function_sql(names, made.server_version))
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("creating outbox_emit", e))?;
    let salvage = crate::cdc::salvage::install(pool).await?;
    if !salvage {
        notes.push(
            "pg_walinspect is not installed and this login may not install it: a relay whose \
             slot is lost cannot publish the emit messages the slot had not delivered; run \
             CREATE EXTENSION pg_walinspect as a superuser (docs/cdc.md, \"When the slot is \
             lost\")"
                .to_string(),
        );
    }
    // The writer's EXECUTE on outbox_emit, the relay's REPLICATION: every recorded grant again.
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| map_sqlx_error("granting the CDC objects", e))?;
    notes.extend(crate::grants::apply_recorded(&mut conn, &names.schema).await?);
    if made.slot_created {
        notes.push(
            "the slot holds the WAL written from now on until a CDC relay reads it: start \
             `outbox relay --mode cdc` soon"
                .to_string(),
        );
    }
    if emit_open_to_public(pool).await? {
        notes.push(
            "any role that can connect may call pg_logical_emit_message and so publish through \
             the relay: REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), \
             pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC (as a superuser), and \
             give writers outbox_emit (outbox migrate --grant writer=…)"
                .to_string(),
        );
    }
    Ok(CdcSetup {
        publication_created: !publication_exists,
        slot_created: made.slot_created,
        max_slot_wal_keep_mb: max_slot_wal_keep_mb(pool).await?,
        failover_slot: made.failover,
        salvage,
        notes,
    })
}

const EMIT_FUNCTION_SQL: &str = include_str!("../../queries/cdc_emit_function.sql");

/// `outbox_emit` for the group's slot on a server of `version` (`server_version_num`): the slot's
/// name (a validated identifier) and the columns that say it is valid are fixed here, once,
/// rather than looked up in every emit.
fn emit_function_sql(names: &CdcNames, version: i32) -> String {
    let mut valid = String::from("s.wal_status IS DISTINCT FROM 'lost'");
    if version >= 160_000 {
        valid.push_str(" AND NOT coalesce(s.conflicting, false)");
    }
    if version >= 170_000 {
        valid.push_str(" AND s.invalidation_reason IS NULL");
    }
    names.render(&EMIT_FUNCTION_SQL.replace("{slot_valid}", &valid))
}

/// Whether PUBLIC may still call `pg_logical_emit_message` (its default).
async fn emit_open_to_public(pool: &PgPool) -> Result<bool> {
    sqlx::query_scalar(include_str!("../../queries/cdc_emit_open_to_public.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading who may emit logical messages", e))
}

/// What [`make_slot`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadeSlot {
    /// Whether it created the slot (false: it was there and valid).
    pub slot_created: bool,
    /// Whether the slot is a failover slot (PostgreSQL 17 and later).
    pub failover: bool,
    /// The slot's start (consistent point) when created now: every transaction that commits
    /// after it is in its stream, none before.
    pub start_lsn: Option<u64>,
    /// The server's `server_version_num`.
    pub server_version: i32,
}

/// Creates the group's slot when missing (a failover slot on PostgreSQL 17 and later), and
/// records the snapshot just after its start: checkpoints (cdc_checkpoint.sql) move the polling
/// positions of a partition only once every row visible in it is behind them, and the catch-up
/// delivers the rows before it. A lost (invalidated) slot is dropped and made again.
pub async fn make_slot(pool: &PgPool, names: &CdcNames) -> Result<MadeSlot> {
    let version: i32 = sqlx::query_scalar(include_str!("../../queries/server_version.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the server version", e))?;
    let failover = version >= 170_000;
    if slot_lost_now(pool, &names.slot).await? == Some(true) {
        let _ = sqlx::query(include_str!("../../queries/cdc_drop_slot.sql"))
            .bind(&names.slot)
            .execute(pool)
            .await;
    }
    let exists = slot_exists(pool, &names.slot).await?;
    let mut start_lsn = None;
    if !exists {
        let create = if failover {
            include_str!("../../queries/cdc_create_failover_slot.sql")
        } else {
            include_str!("../../queries/cdc_create_slot.sql")
        };
        match sqlx::query_scalar::<_, String>(create)
            .bind(&names.slot)
            .fetch_one(pool)
            .await
        {
            Ok(lsn) => start_lsn = crate::cdc::store::parse_lsn(&lsn),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => {}
            Err(e) => return Err(map_sqlx_error("creating the CDC replication slot", e)),
        }
    }
    let record = if exists {
        include_str!("../../queries/cdc_start_keep.sql")
    } else {
        include_str!("../../queries/cdc_start_record.sql")
    };
    sqlx::query(&names.schema.render(record))
        .bind(names.start_setting())
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("recording where the CDC slot starts", e))?;
    Ok(MadeSlot {
        slot_created: !exists,
        failover,
        start_lsn,
        server_version: version,
    })
}

/// Whether `slot` is lost (`Some(true)`: WAL it needed is gone, or PostgreSQL invalidated it
/// for another reason), valid (`Some(false)`), or missing (`None`).
pub async fn slot_lost_now(pool: &PgPool, slot: &str) -> Result<Option<bool>> {
    sqlx::query_scalar(include_str!("../../queries/cdc_slot_lost.sql"))
        .bind(slot)
        .fetch_optional(pool)
        .await
        .map_err(|e| map_sqlx_error("looking at the CDC slot", e))
}

/// Whether the logical slot `slot` exists in this database.
pub async fn slot_exists(pool: &PgPool, slot: &str) -> Result<bool> {
    sqlx::query_scalar(include_str!("../../queries/cdc_slot_exists.sql"))
        .bind(slot)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("looking for the CDC replication slot", e))
}

/// Ends the session reading `slot`, if one does (`pg_terminate_backend`, which needs the
/// administrator's rights); returns how many it ended. For the owner of a scratch slot that must
/// go (`outbox verify`'s clean-up), never for a relay's slot in use: the relay would take it back.
pub async fn end_slot_reader(pool: &PgPool, slot: &str) -> Result<i64> {
    sqlx::query_scalar(include_str!("../../queries/cdc_slot_terminate.sql"))
        .bind(slot)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("ending the CDC slot's reader", e))
}

/// A row of `pg_replication_slots` as [`slots`] reads it: name, reader pid, `wal_status`, lag,
/// retained and safe bytes.
type SlotRow = (
    String,
    Option<i32>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// The CDC slots of `schema`'s outbox (`outbox_<schema>_<group>`), for `outbox status`.
pub async fn slots(pool: &PgPool, schema: &Schema) -> Result<Vec<outbox_core::status::SlotStatus>> {
    let prefix = format!("outbox_{}_", schema.as_str());
    let rows: Vec<SlotRow> = sqlx::query_as(include_str!("../../queries/cdc_slots.sql"))
        .bind(&prefix)
        .fetch_all(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the CDC slots", e))?;
    Ok(rows
        .into_iter()
        .map(|(slot, active_pid, wal_status, lag, retained, safe)| {
            outbox_core::status::SlotStatus {
                slot,
                active_pid,
                wal_status,
                lag_bytes: lag,
                retained_bytes: retained,
                safe_wal_bytes: safe,
            }
        })
        .collect())
}

/// Drops the slot and the publication (for tests and `outbox migrate --cdc --drop`): the WAL the
/// slot held is released. Waits for nothing: a slot in use by a relay cannot be dropped.
pub async fn drop_cdc(pool: &PgPool, names: &CdcNames) -> Result<()> {
    if slot_exists(pool, &names.slot).await? {
        sqlx::query(include_str!("../../queries/cdc_drop_slot.sql"))
            .bind(&names.slot)
            .execute(pool)
            .await
            .map_err(|e| map_sqlx_error("dropping the CDC replication slot", e))?;
    }
    let _ = sqlx::query(
        &names
            .schema
            .render(include_str!("../../queries/setting_delete.sql")),
    )
    .bind(names.start_setting())
    .execute(pool)
    .await;
    sqlx::query(&names.render(include_str!("../../queries/cdc_publication_drop.sql")))
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("dropping the CDC publication", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_schema_and_the_group() {
        let n = CdcNames::new(&Schema::default(), DEFAULT_GROUP).unwrap();
        assert_eq!(n.publication, "outbox_public");
        assert_eq!(n.slot, "outbox_public_relay");
        assert_eq!(n.prefix, "outbox");
        let s = Schema::new("shop").unwrap();
        let n = CdcNames::new(&s, "eu").unwrap();
        assert_eq!(n.slot, "outbox_shop_eu");
        assert_eq!(n.prefix, "outbox:shop");
    }

    #[test]
    fn bad_groups_and_long_names_are_refused() {
        let s = Schema::default();
        for g in ["", "A", "a-b", "a;b"] {
            assert_eq!(CdcNames::new(&s, g).unwrap_err().kind(), ErrorKind::Config);
        }
        let long = Schema::new(&"s".repeat(60)).unwrap();
        assert_eq!(
            CdcNames::new(&long, "relay").unwrap_err().kind(),
            ErrorKind::Config
        );
    }
}
