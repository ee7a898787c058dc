//! Decoding the replication stream: `pgoutput` events turned into [`Item`]s, rows of the message
//! table and logical messages with the schema's prefix into outbox messages (a message that
//! cannot be read as one is malformed, never skipped), and the server's times.

use std::collections::HashMap;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use outbox_core::{Error, ErrorKind, Message};
use pgwire_replication::ReplicationEvent;
use uuid::Uuid;

use crate::cdc::pgoutput::{self, Change, Relation};
use crate::cdc::setup::CdcNames;
use crate::cdc::stream::Item;

/// Turns replication events into items: knows the message table's columns and the current
/// transaction's commit time.
pub(crate) struct Decoder {
    pub(crate) names: CdcNames,
    relations: HashMap<u32, Relation>,
    commit_time: DateTime<Utc>,
    /// See [`origin`](crate::cdc::stream::origin): part of every derived message id.
    origin: u64,
}

impl Decoder {
    pub(crate) fn new(names: CdcNames) -> Self {
        Self {
            names,
            relations: HashMap::new(),
            commit_time: Utc::now(),
            origin: 0,
        }
    }

    /// The same, deriving message ids from `origin` (see [`origin`](crate::cdc::stream::origin)).
    pub(crate) fn with_origin(mut self, origin: u64) -> Self {
        self.origin = origin;
        self
    }

    pub(crate) fn event(&mut self, ev: ReplicationEvent) -> Vec<Item> {
        match ev {
            ReplicationEvent::Begin {
                commit_time_micros,
                final_lsn,
                ..
            } => {
                self.commit_time = pg_time(commit_time_micros);
                vec![Item::Begin {
                    commit_time: self.commit_time,
                    final_lsn: final_lsn.as_u64(),
                }]
            }
            ReplicationEvent::Commit { end_lsn, .. } => vec![Item::Commit {
                end_lsn: end_lsn.as_u64(),
            }],
            ReplicationEvent::KeepAlive { wal_end, .. } => vec![Item::Idle {
                wal_end: wal_end.as_u64(),
            }],
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                // This group's heartbeat: a position in the WAL, like an idle one.
                if !transactional && prefix == self.names.heartbeat_prefix() {
                    return vec![Item::Idle {
                        wal_end: lsn.as_u64(),
                    }];
                }
                // A non-transactional message could be published before a rollback of its
                // transaction; only transactional ones are outbox messages.
                if !transactional || prefix != self.names.prefix {
                    return Vec::new();
                }
                vec![message_from_content(
                    lsn.as_u64(),
                    &content,
                    self.commit_time,
                    self.origin,
                )]
            }
            ReplicationEvent::XLogData { data, .. } => match pgoutput::decode(&data) {
                Ok(Change::Relation(r)) => {
                    self.relations.insert(r.oid, r);
                    Vec::new()
                }
                Ok(Change::Insert { relation, values }) => match self.relations.get(&relation) {
                    Some(r) if r.name == "outbox" && r.namespace == self.names.schema.as_str() => {
                        vec![row_message(r, values)]
                    }
                    Some(_) => Vec::new(),
                    None => vec![Item::Ended(Error::new(
                        ErrorKind::Other,
                        format!("pgoutput: an insert into relation {relation} before its description; will reconnect"),
                    ))],
                },
                Ok(Change::Other(_)) => Vec::new(),
                Err(e) => vec![Item::Ended(Error::new(
                    ErrorKind::Other,
                    format!("{e}; will reconnect"),
                ))],
            },
            ReplicationEvent::StoppedAt { .. } => Vec::new(),
        }
    }
}

/// A logical message with the schema's prefix: its JSON content as an outbox message, committed
/// at `commit_time`. Without an `id` in it, the id is derived from the message's place: `origin`
/// (the cluster and database, see [`origin`](crate::cdc::stream::origin)) and its WAL position `lsn`, the same on every
/// redelivery and unique across clusters.
pub(crate) fn message_from_content(
    lsn: u64,
    content: &Bytes,
    commit_time: DateTime<Utc>,
    origin: u64,
) -> Item {
    let mut place = [0u8; 16];
    place[..8].copy_from_slice(&origin.to_be_bytes());
    place[8..].copy_from_slice(&lsn.to_be_bytes());
    let derived = uuid::Builder::from_custom_bytes(place).into_uuid();
    let mut m = Message {
        seq: 0,
        id: derived,
        aggregate_type: String::new(),
        aggregate_id: String::new(),
        event_type: String::new(),
        payload: Bytes::from_static(b"null"),
        headers: "{}".into(),
        topic: None,
        created_at: commit_time,
        attempts: 0,
    };
    let v: serde_json::Value = match serde_json::from_slice(content) {
        Ok(v) => v,
        Err(e) => {
            m.payload = content.clone();
            return Item::Malformed(
                Box::new(m),
                format!(
                    "the logical message is not JSON ({e}); write an object of the outbox columns"
                ),
            );
        }
    };
    let text = |name: &str| v.get(name).and_then(|x| x.as_str()).map(str::to_string);
    if let Some(id) = v.get("id") {
        match id.as_str().and_then(|s| Uuid::parse_str(s).ok()) {
            Some(id) => m.id = id,
            None => {
                return Item::Malformed(
                    Box::new(m),
                    "the logical message's `id` is not a UUID".into(),
                )
            }
        }
    }
    m.headers = v
        .get("headers")
        .map_or_else(|| "{}".to_string(), |h| h.to_string());
    m.topic = text("topic");
    m.payload = v.get("payload").map_or_else(
        || Bytes::from_static(b"null"),
        |p| Bytes::from(p.to_string()),
    );
    let mut missing = Vec::new();
    for (field, slot) in [
        ("aggregate_type", &mut m.aggregate_type),
        ("aggregate_id", &mut m.aggregate_id),
        ("event_type", &mut m.event_type),
    ] {
        match text(field) {
            Some(s) => *slot = s,
            None => missing.push(field),
        }
    }
    if v.get("payload").is_none() {
        missing.push("payload");
    }
    if !missing.is_empty() {
        return Item::Malformed(
            Box::new(m),
            format!(
                "the logical message lacks {} (strings; `payload` any JSON)",
                missing.join(", ")
            ),
        );
    }
    Item::Message(Box::new(m))
}

/// A row of the message table as an outbox message. The columns are found by name, so the
/// table may gain columns.
fn row_message(r: &Relation, values: Vec<Option<Bytes>>) -> Item {
    let mut m = Message {
        seq: 0,
        id: Uuid::nil(),
        aggregate_type: String::new(),
        aggregate_id: String::new(),
        event_type: String::new(),
        payload: Bytes::from_static(b"null"),
        headers: "{}".into(),
        topic: None,
        created_at: Utc::now(),
        attempts: 0,
    };
    let mut problems = Vec::new();
    for (name, value) in r.columns.iter().zip(values) {
        let text = || {
            value
                .as_ref()
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        match name.as_str() {
            "id" => match text().and_then(|s| Uuid::parse_str(&s).ok()) {
                Some(id) => m.id = id,
                None => problems.push("id"),
            },
            "aggregate_type" => m.aggregate_type = text().unwrap_or_default(),
            "aggregate_id" => m.aggregate_id = text().unwrap_or_default(),
            "event_type" => m.event_type = text().unwrap_or_default(),
            "payload" => m.payload = value.unwrap_or_else(|| Bytes::from_static(b"null")),
            "headers" => m.headers = text().unwrap_or_else(|| "{}".into()),
            "topic" => m.topic = text(),
            "seq" => match text().and_then(|s| s.parse().ok()) {
                Some(seq) => m.seq = seq,
                None => problems.push("seq"),
            },
            "created_at" => match text().and_then(|s| parse_timestamptz(&s)) {
                Some(t) => m.created_at = t,
                None => problems.push("created_at"),
            },
            _ => {}
        }
    }
    if problems.is_empty() {
        Item::Message(Box::new(m))
    } else {
        let why = format!(
            "the decoded row's {} could not be read",
            problems.join(", ")
        );
        Item::Malformed(Box::new(m), why)
    }
}

/// PostgreSQL's ISO text of a `timestamptz` in UTC (`2026-12-05 02:50:01.123456+00`). Read as
/// RFC 3339 once the separator and a short offset are mended: chrono's RFC 3339 reader is a
/// fixed one, where a format string is interpreted afresh on every call (this runs per row).
pub(crate) fn parse_timestamptz(s: &str) -> Option<DateTime<Utc>> {
    let (date, rest) = s.split_once(' ')?;
    let sign = rest.rfind(['+', '-'])?;
    let short_offset = rest.len() - sign == 3;
    let text = format!("{date}T{rest}{}", if short_offset { ":00" } else { "" });
    DateTime::parse_from_rfc3339(&text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Microseconds since 2000-01-01 UTC (PostgreSQL's epoch) as a time.
fn pg_time(micros: i64) -> DateTime<Utc> {
    const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;
    Utc.timestamp_opt(PG_EPOCH_UNIX_SECS, 0)
        .single()
        .and_then(|e| e.checked_add_signed(chrono::Duration::microseconds(micros)))
        .unwrap_or_else(Utc::now)
}

#[cfg(test)]
mod tests {
    use pgwire_replication::Lsn;

    use super::*;
    use crate::cdc::pgoutput::tests::{insert, relation};
    use crate::schema::Schema;

    #[test]
    fn timestamps_read_as_postgres_writes_them() {
        let t = |s: &str| parse_timestamptz(s).map(|t| t.to_rfc3339());
        assert_eq!(
            t("2026-12-05 02:50:01.123456+00").as_deref(),
            Some("2026-12-05T02:50:01.123456+00:00")
        );
        assert_eq!(
            t("2026-12-05 02:50:01+00").as_deref(),
            Some("2026-12-05T02:50:01+00:00")
        );
        assert_eq!(
            t("2026-12-05 08:20:01.5+05:30").as_deref(),
            Some("2026-12-05T02:50:01.500+00:00")
        );
        assert_eq!(t("yesterday"), None);
        assert_eq!(t("2026-12-05 25:00:00+00"), None);
    }

    fn decoder() -> Decoder {
        let s = Schema::new("shop").unwrap();
        Decoder::new(CdcNames::new(&s, "relay").unwrap())
    }

    fn xlog(data: Bytes) -> ReplicationEvent {
        ReplicationEvent::XLogData {
            wal_start: Lsn(1),
            wal_end: Lsn(2),
            server_time_micros: 0,
            data,
        }
    }

    const COLUMNS: &[&str] = &[
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "topic",
        "created_at",
        "txid",
        "seq",
        "partition",
    ];

    #[test]
    fn a_row_of_the_message_table_becomes_a_message() {
        let mut d = decoder();
        assert!(d
            .event(xlog(relation(9, "shop", "outbox", COLUMNS)))
            .is_empty());
        let id = Uuid::now_v7().to_string();
        let row = insert(
            9,
            &[
                Some(&id),
                Some("order"),
                Some("o-1"),
                Some("order.placed"),
                Some("{\"total\": 10}"),
                Some("{}"),
                None,
                Some("2026-12-05 02:50:01.123456+00"),
                Some("800"),
                Some("42"),
                Some("3"),
            ],
        );
        let items = d.event(xlog(row));
        let [Item::Message(m)] = items.as_slice() else {
            panic!("{items:?}")
        };
        assert_eq!(m.id.to_string(), id);
        assert_eq!(m.aggregate_id, "o-1");
        assert_eq!(m.seq, 42);
        assert_eq!(&m.payload[..], b"{\"total\": 10}");
        assert_eq!(m.topic, None);
        assert_eq!(m.created_at.timestamp_subsec_micros(), 123_456);
    }

    #[test]
    fn rows_of_other_schemas_are_not_this_relays() {
        let mut d = decoder();
        d.event(xlog(relation(9, "other", "outbox", COLUMNS)));
        assert!(d.event(xlog(insert(9, &[None; 11]))).is_empty());
    }

    fn logical(prefix: &str, content: &str, transactional: bool) -> ReplicationEvent {
        ReplicationEvent::Message {
            transactional,
            lsn: Lsn(0x16_0000_0028),
            prefix: prefix.into(),
            content: Bytes::from(content.to_string()),
        }
    }

    #[test]
    fn a_logical_message_becomes_a_message_with_a_stable_id() {
        let mut d = decoder();
        let c = r#"{"aggregate_type":"order","aggregate_id":"o-1","event_type":"placed","payload":{"a":1}}"#;
        let a = d.event(logical("outbox:shop", c, true));
        let b = d.event(logical("outbox:shop", c, true));
        let ([Item::Message(a)], [Item::Message(b)]) = (a.as_slice(), b.as_slice()) else {
            panic!()
        };
        assert_eq!(a.id, b.id, "the same WAL position gives the same id");
        assert_eq!(&a.payload[..], br#"{"a":1}"#);
        assert!(
            d.event(logical("outbox", c, true)).is_empty(),
            "another schema's"
        );
        assert!(
            d.event(logical("outbox:shop", c, false)).is_empty(),
            "not transactional"
        );
    }

    #[test]
    fn the_groups_heartbeat_is_a_position_and_others_are_ignored() {
        let mut d = decoder();
        let own = d.names.heartbeat_prefix();
        let items = d.event(logical(&own, "", false));
        let [Item::Idle { wal_end }] = items.as_slice() else {
            panic!("{items:?}")
        };
        assert_eq!(*wal_end, 0x16_0000_0028);
        assert!(d
            .event(logical("outbox-heartbeat:another_slot", "", false))
            .is_empty());
    }

    #[test]
    fn a_bad_logical_message_is_malformed_not_skipped() {
        let mut d = decoder();
        for (content, why) in [
            ("not json", "not JSON"),
            (
                r#"{"aggregate_type":"o","event_type":"e","payload":1}"#,
                "aggregate_id",
            ),
            (
                r#"{"id":"x","aggregate_type":"o","aggregate_id":"k","event_type":"e","payload":1}"#,
                "UUID",
            ),
        ] {
            let items = d.event(logical("outbox:shop", content, true));
            let [Item::Malformed(_, e)] = items.as_slice() else {
                panic!("{content}: {items:?}")
            };
            assert!(e.contains(why), "{e}");
        }
    }
}
