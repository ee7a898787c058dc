//! Salvage: the `emit` messages a lost slot had not delivered, read back from the WAL.
//!
//! A table row survives the loss of a slot (the polling engine delivers it from the table), a
//! logical message does not: it exists only in the WAL, and only a slot decodes it. When the
//! relay's slot is lost (dropped over `--cdc-max-retained-wal`, invalidated, or missing on a
//! newly promoted standby), the relay reads the WAL between where the slot stood and where its
//! new slot starts with `pg_walinspect` (a contrib extension of PostgreSQL 15 and later), keeps
//! the messages of this schema's prefix whose transaction committed there and was not yet
//! confirmed, and parks them in commit order: the parked path publishes them, each key in
//! order, before anything the new slot streams of the key. The description of a logical message
//! record carries its payload in hex, and a commit record names the subtransactions it commits,
//! which is all this needs.
//!
//! What it cannot do: read WAL the server already removed (a slot PostgreSQL invalidated at
//! `max_slot_wal_keep_size` lost exactly that WAL). The relay then names the range it could not
//! read, in an error and in `outbox_cdc_wal_unread_bytes`.

use std::collections::HashMap;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::{Error, Result};
use sqlx::PgPool;

use crate::cdc::decode::{message_from_content, parse_timestamptz};
use crate::cdc::setup::CdcNames;
use crate::cdc::stream::{origin, Item};
use crate::error::map_sqlx_error;

/// WAL read per statement: the descriptions of the logical messages in it come back whole.
const CHUNK: u64 = 64 << 20;

/// Makes `pg_walinspect` available when this login may (a superuser); returns whether it is.
pub async fn install(pool: &PgPool) -> Result<bool> {
    let (installed, available, superuser): (bool, bool, bool) =
        sqlx::query_as(include_str!("../../queries/cdc_walinspect_available.sql"))
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error("looking for pg_walinspect", e))?;
    if installed {
        return Ok(true);
    }
    if !(available && superuser) {
        return Ok(false);
    }
    sqlx::query(include_str!("../../queries/cdc_walinspect_create.sql"))
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("installing pg_walinspect", e))?;
    Ok(true)
}

/// The schema `pg_walinspect`'s functions live in, when installed.
async fn walinspect_schema(pool: &PgPool) -> Result<Option<String>> {
    sqlx::query_scalar(include_str!("../../queries/cdc_walinspect_schema.sql"))
        .fetch_optional(pool)
        .await
        .map_err(|e| map_sqlx_error("looking for pg_walinspect", e))
}

/// What a salvage found.
#[derive(Debug, Default)]
pub(crate) struct Salvaged {
    /// The messages to publish (well-formed) or park as failed (malformed, with the reason), in
    /// commit order.
    pub items: Vec<Item>,
    /// A WAL range that could not be read, with why: any `emit` message committed there is
    /// lost.
    pub unread: Option<(u64, u64, String)>,
}

/// Reads `[from, until)` of the WAL (chunk by chunk) and returns this schema's transactional
/// logical messages whose transaction committed at or after `confirmed` and before `until`, in
/// commit order.
pub(crate) async fn salvage(
    pool: &PgPool,
    names: &CdcNames,
    from: u64,
    confirmed: u64,
    until: u64,
) -> Result<Salvaged> {
    let mut out = Salvaged::default();
    if from >= until {
        return Ok(out);
    }
    let Some(ns) = walinspect_schema(pool).await? else {
        out.unread = Some((
            from,
            until,
            "pg_walinspect is not installed (CREATE EXTENSION pg_walinspect, as a superuser)"
                .into(),
        ));
        return Ok(out);
    };
    if !outbox_core::identifier::is_plain(&ns, 63) {
        return Err(Error::config(format!(
            "pg_walinspect lives in schema `{ns}`, which is not a plain identifier; install it \
             in public"
        )));
    }
    let sql = include_str!("../../queries/cdc_wal_records.sql").replace("{walinspect}", &ns);
    // Ids derived as the stream derives them (the same message, the same id).
    let (system, database): (String, String) =
        sqlx::query_as(include_str!("../../queries/cdc_server_identity.sql"))
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error("reading the cluster's identity", e))?;
    let mut reader = Reader::new(names, origin(&system, &database));
    let mut at = from;
    while at < until {
        let to = (at + CHUNK).min(until);
        let rows: std::result::Result<Vec<(String, i64, String, String)>, sqlx::Error> =
            sqlx::query_as(&sql)
                .bind(lsn_text(at))
                .bind(lsn_text(to))
                .fetch_all(pool)
                .await;
        match rows {
            Ok(rows) => {
                for (lsn, xid, kind, description) in rows {
                    let lsn = crate::cdc::store::parse_lsn(&lsn).unwrap_or(0);
                    reader.record(lsn, xid, &kind, &description, confirmed);
                }
            }
            Err(e) => {
                out.unread = Some((at, until, map_sqlx_error("reading the WAL", e).to_string()));
                break;
            }
        }
        at = to;
    }
    out.items = reader.committed;
    Ok(out)
}

/// `16/B374D848` from a number.
pub fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// Walks records in WAL order: logical messages wait by transaction id until a commit record
/// names their transaction (or one of its subtransactions).
struct Reader<'a> {
    names: &'a CdcNames,
    origin: u64,
    pending: HashMap<i64, Vec<(u64, Bytes)>>,
    committed: Vec<Item>,
}

impl<'a> Reader<'a> {
    fn new(names: &'a CdcNames, origin: u64) -> Self {
        Self {
            names,
            origin,
            pending: HashMap::new(),
            committed: Vec::new(),
        }
    }

    fn record(&mut self, lsn: u64, xid: i64, kind: &str, description: &str, confirmed: u64) {
        match kind {
            "MESSAGE" => {
                if let Some((prefix, content)) = logical_message(description) {
                    if prefix == self.names.prefix {
                        self.pending.entry(xid).or_default().push((lsn, content));
                    }
                }
            }
            "COMMIT" => {
                let mut xids = vec![xid];
                xids.extend(subxacts(description));
                let mut messages: Vec<(u64, Bytes)> = xids
                    .iter()
                    .filter_map(|x| self.pending.remove(x))
                    .flatten()
                    .collect();
                if lsn < confirmed || messages.is_empty() {
                    return; // delivered before the slot was lost, or nothing of ours
                }
                messages.sort_by_key(|(at, _)| *at);
                let at = commit_time(description).unwrap_or_else(Utc::now);
                for (lsn, content) in messages {
                    self.committed
                        .push(message_from_content(lsn, &content, at, self.origin));
                }
            }
            "ABORT" => {
                self.pending.remove(&xid);
                for x in subxacts(description) {
                    self.pending.remove(&x);
                }
            }
            _ => {}
        }
    }
}

/// The prefix and payload of a transactional logical message's description
/// (`transactional, prefix "outbox"; payload (11 bytes): 7B 22 …`); `None` for another kind.
fn logical_message(description: &str) -> Option<(String, Bytes)> {
    let rest = description.strip_prefix("transactional, prefix \"")?;
    let (prefix, rest) = rest.split_once("\"; payload (")?;
    let (_, hex) = rest.split_once("): ").unwrap_or((rest, ""));
    let bytes: Option<Vec<u8>> = hex
        .split_ascii_whitespace()
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    Some((prefix.to_string(), Bytes::from(bytes?)))
}

/// The subtransactions a commit or abort record's description names (`…; subxacts: 730 731`).
fn subxacts(description: &str) -> Vec<i64> {
    description
        .split(';')
        .filter_map(|part| part.trim().strip_prefix("subxacts:"))
        .flat_map(|list| list.split_ascii_whitespace().filter_map(|x| x.parse().ok()))
        .collect()
}

/// The commit time a commit record's description starts with.
fn commit_time(description: &str) -> Option<DateTime<Utc>> {
    parse_timestamptz(description.split(';').next()?.trim())
}

/// The message of a salvaged item.
#[cfg(test)]
fn message_of(item: &Item) -> Option<&outbox_core::Message> {
    match item {
        Item::Message(m) | Item::Malformed(m, _) => Some(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;

    #[test]
    fn descriptions_are_read_as_postgresql_15_writes_them() {
        let (p, c) = logical_message(
            "transactional, prefix \"outbox\"; payload (11 bytes): 7B 22 68 65 6C 6C 6F 22 3A 31 7D",
        )
        .unwrap();
        assert_eq!((p.as_str(), &c[..]), ("outbox", &b"{\"hello\":1}"[..]));
        assert!(
            logical_message("non-transactional, prefix \"outbox\"; payload (0 bytes): ").is_none()
        );
        assert_eq!(
            subxacts("2026-12-06 05:48:43.469073+00; subxacts: 730 731"),
            vec![730, 731]
        );
        assert_eq!(
            commit_time("2026-12-06 05:48:43.469073+00; subxacts: 730")
                .unwrap()
                .to_rfc3339(),
            "2026-12-06T05:48:43.469073+00:00"
        );
    }

    #[test]
    fn only_committed_messages_after_the_confirmed_position_come_out_in_commit_order() {
        let names = CdcNames::new(&Schema::default(), "relay").unwrap();
        let mut r = Reader::new(&names, 7);
        let msg = |k: &str| {
            let body = format!(
                r#"{{"aggregate_type":"a","aggregate_id":"{k}","event_type":"e","payload":1}}"#
            );
            let hex: Vec<String> = body.bytes().map(|b| format!("{b:02X}")).collect();
            format!(
                "transactional, prefix \"outbox\"; payload ({} bytes): {}",
                body.len(),
                hex.join(" ")
            )
        };
        r.record(10, 1, "MESSAGE", &msg("before"), 100);
        r.record(20, 1, "COMMIT", "2026-12-06 05:00:00+00", 100); // confirmed already
        r.record(110, 2, "MESSAGE", &msg("late"), 100);
        r.record(120, 3, "MESSAGE", &msg("sub"), 100); // a subtransaction of 4
        r.record(125, 5, "MESSAGE", &msg("rolled back"), 100);
        r.record(130, 4, "COMMIT", "2026-12-06 05:00:01+00; subxacts: 3", 100);
        r.record(135, 5, "ABORT", "2026-12-06 05:00:01+00", 100);
        r.record(140, 2, "COMMIT", "2026-12-06 05:00:02+00", 100);
        let keys: Vec<&str> = r
            .committed
            .iter()
            .filter_map(message_of)
            .map(|m| m.aggregate_id.as_str())
            .collect();
        assert_eq!(
            keys,
            ["sub", "late"],
            "commit order, nothing confirmed or rolled back"
        );
        assert!(r.pending.is_empty() || r.pending.values().all(Vec::is_empty));
    }
}
