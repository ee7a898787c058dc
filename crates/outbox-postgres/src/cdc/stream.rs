//! The replication stream of one slot, read by a task of its own and turned into [`Item`]s:
//! transaction boundaries, the outbox messages inside them (rows of the message table and
//! logical messages with the schema's prefix), and the server's idle positions. The task also
//! carries the relay's confirmed position back to the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use outbox_core::{Error, ErrorKind, Message, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::cdc::pgoutput::{self, Change, Relation};
use crate::cdc::setup::CdcNames;

/// How often the confirmed position is sent to the server when it moved (the issue's 100–250
/// ms): WAL behind it can be recycled that much sooner.
pub const FEEDBACK_INTERVAL: Duration = Duration::from_millis(200);

/// Session settings that make `timestamptz` text what [`parse_timestamptz`] reads.
const DATE_SETTINGS: &str = "-c datestyle=ISO,YMD -c timezone=UTC";

/// Items the stream task has decoded and the relay has not taken yet. Bounded: a relay that
/// publishes slower than the server sends stops reading, and the server waits.
const ITEMS_BUFFERED: usize = 16_384;

/// Payload bytes those items may hold, whatever their number: a backlog of 1 MB messages fills
/// this long before the count (16,384 of them were 16 GB). A single larger message still
/// passes, alone.
pub(crate) const BYTES_BUFFERED: usize = 32 << 20;

/// Replication events the client reads ahead of the stream task: each may be a whole row
/// (a payload of megabytes), so few. 64 held up to 64 MB of 1 MB rows beside the stream's own
/// 32 MiB, and a backlog of them peaked at 140 MiB of RSS (scripts/cdc-bounds.sh backlog); the
/// stream task decodes each event as it comes, so a short queue costs no throughput.
const EVENTS_BUFFERED: usize = 8;

/// How long connecting, identifying and starting the stream may take: a server that does not
/// answer (black-holed, frozen) is tried again rather than waited on.
const START_WITHIN: Duration = Duration::from_secs(10);

/// After this long without a word from the server the relay asks for one (a heartbeat written
/// through its pool, which the stream carries back); after as long again with none, the
/// connection is given up for dead and made again. An idle server says nothing on its own.
pub(crate) const SILENCE: Duration = Duration::from_secs(20);

/// What the stream says, in WAL order.
#[derive(Debug)]
pub(crate) enum Item {
    /// A committed transaction starts; its messages follow.
    Begin {
        /// When it committed.
        commit_time: DateTime<Utc>,
        /// Where its commit record starts: a synchronous standby has the commit once it has
        /// flushed the WAL past this (see [`crate::cdc::sync`]).
        final_lsn: u64,
    },
    /// An outbox message of the current transaction.
    Message(Box<Message>),
    /// A message of the current transaction that cannot be published as written: it must end
    /// failed (visible, redrivable), never be skipped. Carries what could be read of it.
    Malformed(Box<Message>, String),
    /// The current transaction ends; every message of it was sent. `end_lsn` is the position to
    /// confirm once all of them are handled.
    Commit { end_lsn: u64 },
    /// The server is idle at `wal_end`: with nothing in flight, that position may be confirmed
    /// (no transaction committed before it is still to come).
    Idle { wal_end: u64 },
    /// The stream ended; the relay must connect again (from the slot's confirmed position).
    Ended(Error),
}

/// An item and its share of [`BYTES_BUFFERED`], given back when the relay takes the item.
pub(crate) struct Budgeted {
    pub(crate) item: Item,
    _bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A running stream: its items, and the position to confirm.
pub(crate) struct Stream {
    pub(crate) items: mpsc::Receiver<Budgeted>,
    pub(crate) confirm: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// Whether the stream task has ended (the server closed the stream, or it was given up):
    /// its items may still wait to be taken.
    pub(crate) fn ended(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The replication connection's settings from the relay's database URL: host, port, user,
/// password, database and TLS as the URL gives them.
///
/// A URL naming several servers gives the first one; `at` (the server the store's pool uses now,
/// which follows the primary) takes its place.
pub(crate) fn replication_config(
    url: &str,
    names: &CdcNames,
    at: Option<(&str, u16)>,
) -> Result<ReplicationConfig> {
    let redacted = outbox_core::redact::url(url);
    let servers = crate::servers::Servers::parse(url)?;
    let url = servers.first();
    let options: PgConnectOptions = url
        .parse()
        .map_err(|e| Error::config(format!("parsing database URL {redacted}: {e}")))?;
    let options = match at {
        Some((host, port)) => options.host(host).port(port),
        None => options,
    };
    let password = url_password(url)?.unwrap_or_default();
    let tls = replication_tls(url, options.get_ssl_mode())?;
    let database = options.get_database().unwrap_or(options.get_username());
    let config = ReplicationConfig::new(
        options.get_host(),
        options.get_username(),
        password,
        database,
        names.slot.clone(),
        names.publication.clone(),
    )
    .with_port(options.get_port())
    .with_tls(tls)
    // The URL's own `options` (session settings for the walsender, such as
    // logical_decoding_work_mem), then dates as `created_at` is parsed below, whatever the
    // server's defaults.
    .with_options(match options.get_options() {
        Some(own) => format!("{own} {DATE_SETTINGS}"),
        None => DATE_SETTINGS.to_string(),
    })
    .with_status_interval(FEEDBACK_INTERVAL)
    .with_wakeup_interval(Duration::from_secs(10))
    .with_buffer_size(EVENTS_BUFFERED)
    .with_application_name(crate::cdc::checks::application_name(names));
    Ok(config)
}

/// The replication connection's TLS, as the pool's: the URL's `sslmode` (PostgreSQL's default
/// `prefer` when absent) and its `sslrootcert`, `sslcert` and `sslkey` (or libpq's
/// `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, as sqlx reads them).
///
/// `prefer` (and `allow`) ask for TLS and fall back to plaintext only when the server has none:
/// the pool does the same, so the WAL never travels in clear text beside a pool that encrypts.
/// `verify-ca` and `verify-full` check the server's certificate against `sslrootcert` (the
/// system's roots when absent); `verify-full` its name too.
fn replication_tls(url: &str, mode: PgSslMode) -> Result<TlsConfig> {
    let param = |name: &str, env: &str| -> Option<std::path::PathBuf> {
        url::Url::parse(url)
            .ok()
            .and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            })
            .or_else(|| std::env::var(env).ok())
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    let root = param("sslrootcert", "PGSSLROOTCERT");
    let mut tls = match mode {
        PgSslMode::Disable => return Ok(TlsConfig::disabled()),
        PgSslMode::Allow | PgSslMode::Prefer => TlsConfig {
            mode: pgwire_replication::SslMode::Prefer,
            ..TlsConfig::default()
        },
        PgSslMode::Require => TlsConfig::require(),
        PgSslMode::VerifyCa => TlsConfig::verify_ca(root),
        PgSslMode::VerifyFull => TlsConfig::verify_full(root),
    };
    match (param("sslcert", "PGSSLCERT"), param("sslkey", "PGSSLKEY")) {
        (Some(cert), Some(key)) => tls = tls.with_client_cert(cert, key),
        (None, None) => {}
        _ => {
            return Err(Error::config(format!(
                "database URL {}: sslcert and sslkey go together (a client certificate needs \
                 its key); give both or neither",
                outbox_core::redact::url(url)
            )))
        }
    }
    Ok(tls)
}

/// The password a database URL holds, percent-decoded (`None` when it has none): what a
/// replication connection or a libpq tool started with `PGPASSWORD` needs.
pub fn url_password(url: &str) -> Result<Option<String>> {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_string))
        .map(|p| {
            percent_decode(&p).ok_or_else(|| {
                Error::config(format!(
                    "the password in {} is not valid percent-encoded UTF-8",
                    outbox_core::redact::url(url)
                ))
            })
        })
        .transpose()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(s).collect();
    String::from_utf8(bytes).ok()
}

/// Connects to the slot and starts reading. Returns once the server accepted
/// `START_REPLICATION`: from then on this session holds the slot, and no other relay of the
/// group can read it (the slot is the group's lease).
///
/// `confirmed` is the position the relay confirmed so far: sent again at once, so what it
/// confirmed while it had no stream is not sent again by the server. `probe` is rung when the
/// server has been silent for [`SILENCE`] (the store then writes a heartbeat).
pub(crate) async fn start(
    config: ReplicationConfig,
    names: CdcNames,
    doorbell: Arc<watch::Sender<u64>>,
    confirmed: u64,
    probe: Arc<watch::Sender<u64>>,
    silence: Duration,
) -> Result<Stream> {
    let slot = names.slot.clone();
    let started = tokio::time::timeout(START_WITHIN, async {
        let mut client = ReplicationClient::connect_gated(config).await?;
        let system = client.identify_system().await?;
        client.start().await?;
        client.wait_started().await?;
        Ok::<_, pgwire_replication::PgWireError>((client, system))
    })
    .await;
    let (client, system) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(e)) => return Err(replication_error(&slot, e)),
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "CDC replication on slot `{slot}`: the server did not start the stream \
                     within {START_WITHIN:?}; will retry"
                ),
            ))
        }
    };
    if confirmed > 0 {
        client.update_applied_lsn(Lsn::from_u64(confirmed));
    }
    let origin = origin(
        &system.system_id,
        system.dbname.as_deref().unwrap_or_default(),
    );
    let (tx, items) = mpsc::channel(ITEMS_BUFFERED);
    let (confirm, confirm_rx) = watch::channel(confirmed);
    let bytes = Arc::new(tokio::sync::Semaphore::new(BYTES_BUFFERED));
    let decoder = Decoder::new(names).with_origin(origin);
    let task = tokio::spawn(read(
        client, decoder, tx, bytes, confirm_rx, doorbell, probe, silence,
    ));
    Ok(Stream {
        items,
        confirm,
        task,
    })
}

/// What makes a derived message id unique across clusters and databases: a hash of the
/// cluster's system identifier (shared by its physical standbys, so an id survives a failover)
/// and the database's name.
pub(crate) fn origin(system_id: &str, database: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in system_id.bytes().chain([b'/']).chain(database.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A replication error as the relay reports it: the cause, and what to do for the common ones.
fn replication_error(slot: &str, e: pgwire_replication::PgWireError) -> Error {
    let text = e.to_string();
    let hint = if text.contains("is active for PID") {
        "; another relay of this group reads the slot (one reader at a time); this one waits \
         and takes over when it stops"
    } else if text.contains("publication") && text.contains("does not exist") {
        "; run `outbox migrate --cdc` to create the publication"
    } else if text.contains("does not exist") {
        "; the relay makes the slot again (docs/cdc.md, \"When the slot is lost\")"
    } else if text.contains("can no longer get changes") || text.contains("invalidated") {
        "; the slot lost WAL it needed (max_slot_wal_keep_size): the relay makes it again and \
         delivers the table's messages by polling meanwhile (docs/cdc.md, \"When the slot is \
         lost\")"
    } else {
        "; will retry"
    };
    let kind = if hint == "; will retry"
        || hint.contains("takes over")
        || hint.contains("makes the slot again")
        || hint.contains("makes it again")
    {
        ErrorKind::Connection
    } else {
        ErrorKind::Config
    };
    Error::new(
        kind,
        format!("CDC replication on slot `{slot}`: {text}{hint}"),
    )
}

/// The stream task: events in, items out (each holding its payload's share of `bytes` until
/// the relay takes it), confirmed positions back to the server. A server silent for `silence`
/// ([`SILENCE`]) is asked for a word (`probe`); silent for as long again, its connection is
/// given up and the relay connects anew.
#[allow(clippy::too_many_arguments)] // one task's whole state, each piece passed once
async fn read(
    mut client: ReplicationClient,
    mut decoder: Decoder,
    tx: mpsc::Sender<Budgeted>,
    bytes: Arc<tokio::sync::Semaphore>,
    mut confirm: watch::Receiver<u64>,
    doorbell: Arc<watch::Sender<u64>>,
    probe: Arc<watch::Sender<u64>>,
    silence: Duration,
) {
    use futures::FutureExt as _;
    let mut asked = false;
    loop {
        let event = tokio::select! {
            ev = tokio::time::timeout(silence, client.recv()) => match ev {
                Ok(ev) => {
                    asked = false;
                    ev
                }
                Err(_) if !asked => {
                    asked = true;
                    probe.send_modify(|n| *n = n.wrapping_add(1));
                    continue;
                }
                Err(_) => {
                    let why = Error::new(
                        ErrorKind::Connection,
                        format!(
                            "CDC replication on slot `{}`: no word from the server for {:?}, \
                             a heartbeat asked for included; the connection is given up for dead \
                             and made again",
                            decoder.names.slot,
                            silence * 2
                        ),
                    );
                    let _ = tx.send(Budgeted { item: Item::Ended(why), _bytes: None }).await;
                    client.abort();
                    doorbell.send_modify(|n| *n = n.wrapping_add(1));
                    return;
                }
            },
            changed = confirm.changed() => {
                if changed.is_err() {
                    // The relay dropped the stream.
                    client.stop();
                    return;
                }
                let lsn = *confirm.borrow_and_update();
                client.update_applied_lsn(Lsn::from_u64(lsn));
                continue;
            }
        };
        // This event and every one already waiting, then one ring of the doorbell: a
        // transaction is three events (Begin, the row, Commit), and each ring wakes the relay.
        let mut next = Some(event);
        while let Some(event) = next.take() {
            let items = match event {
                Ok(Some(ev)) => decoder.event(ev),
                Ok(None) => vec![Item::Ended(Error::new(
                    ErrorKind::Connection,
                    "CDC replication stream closed by the server; will reconnect",
                ))],
                Err(e) => vec![Item::Ended(replication_error(&decoder.names.slot, e))],
            };
            for item in items {
                let end = matches!(item, Item::Ended(_));
                let sent = deliver(&tx, &bytes, item, &mut confirm, &client).await;
                if !sent || end {
                    client.stop();
                    doorbell.send_modify(|n| *n = n.wrapping_add(1));
                    return;
                }
            }
            // A long catch-up stays in this loop: pass on what the relay confirmed meanwhile,
            // so the slot moves (and its WAL is freed) while the backlog drains.
            if confirm.has_changed().unwrap_or(false) {
                let lsn = *confirm.borrow_and_update();
                client.update_applied_lsn(Lsn::from_u64(lsn));
            }
            next = client.recv().now_or_never();
        }
        doorbell.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Hands `item` to the relay once the channel has room and its payload fits in the byte
/// budget; meanwhile passes on what the relay confirms, so the slot moves while the relay works
/// through what it holds. `false` when the relay dropped the stream.
async fn deliver(
    tx: &mpsc::Sender<Budgeted>,
    bytes: &Arc<tokio::sync::Semaphore>,
    item: Item,
    confirm: &mut watch::Receiver<u64>,
    client: &ReplicationClient,
) -> bool {
    let size = match &item {
        Item::Message(m) | Item::Malformed(m, _) => m.payload.len(),
        _ => 0,
    };
    let send = async {
        let permit = if size == 0 {
            None
        } else {
            let want = u32::try_from(size.min(BYTES_BUFFERED)).unwrap_or(u32::MAX);
            bytes.clone().acquire_many_owned(want).await.ok()
        };
        tx.send(Budgeted {
            item,
            _bytes: permit,
        })
        .await
        .is_ok()
    };
    tokio::pin!(send);
    loop {
        tokio::select! {
            sent = &mut send => return sent,
            changed = confirm.changed() => {
                if changed.is_err() {
                    return false;
                }
                let lsn = *confirm.borrow_and_update();
                client.update_applied_lsn(Lsn::from_u64(lsn));
            }
        }
    }
}

/// Turns replication events into items: knows the message table's columns and the current
/// transaction's commit time.
pub(crate) struct Decoder {
    names: CdcNames,
    relations: HashMap<u32, Relation>,
    commit_time: DateTime<Utc>,
    /// See [`origin`]: part of every derived message id.
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

    /// The same, deriving message ids from `origin` (see [`origin`]).
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
/// (the cluster and database, see [`origin`]) and its WAL position `lsn`, the same on every
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

    #[test]
    fn urls_give_the_replication_settings() {
        let n = CdcNames::new(&Schema::default(), "relay").unwrap();
        let c = replication_config(
            "postgres://u:p%40ss@db.example:6543/app?sslmode=require",
            &n,
            None,
        )
        .unwrap();
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.user.as_str(),
                c.password.as_str(),
                c.database.as_str()
            ),
            ("db.example", 6543, "u", "p@ss", "app")
        );
        assert_eq!(c.slot, "outbox_public_relay");
        assert_eq!(c.tls.mode, pgwire_replication::SslMode::Require);
    }

    /// The stream follows the URL's TLS settings as the pool does: before, `prefer` (the default)
    /// streamed in plaintext beside an encrypted pool, and `sslrootcert`, `sslcert` and `sslkey`
    /// were ignored.
    #[test]
    fn the_stream_takes_the_urls_tls_settings() {
        use pgwire_replication::SslMode;
        let n = CdcNames::new(&Schema::default(), "relay").unwrap();
        let tls = |url: &str| replication_config(url, &n, None).unwrap().tls;
        assert_eq!(tls("postgres://u@h/db").mode, SslMode::Prefer);
        assert_eq!(
            tls("postgres://u@h/db?sslmode=prefer").mode,
            SslMode::Prefer
        );
        assert_eq!(
            tls("postgres://u@h/db?sslmode=disable").mode,
            SslMode::Disable
        );
        let full = tls(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/c.key",
        );
        assert_eq!(full.mode, SslMode::VerifyFull);
        assert_eq!(
            full.ca_pem_path.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        assert_eq!(
            full.client_cert_pem_path.as_deref(),
            Some(std::path::Path::new("/c.pem"))
        );
        assert_eq!(
            full.client_key_pem_path.as_deref(),
            Some(std::path::Path::new("/c.key"))
        );
        let e = replication_config("postgres://u@h/db?sslmode=require&sslcert=/c.pem", &n, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslcert and sslkey go together"), "{e}");
    }
}
