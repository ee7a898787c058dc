//! The replication stream of one slot, read by a task of its own and turned into [`Item`]s
//! (decoded in `decode.rs`): transaction boundaries, the outbox messages inside them (rows of
//! the message table and logical messages with the schema's prefix), and the server's idle
//! positions. The task also carries the relay's confirmed position back to the server.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::{Error, ErrorKind, Message, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, TlsConfig};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use tokio::sync::{mpsc, watch};

use crate::cdc::decode::Decoder;
use crate::cdc::setup::CdcNames;

/// How often the confirmed position is sent to the server when it moved (the 100–250
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;

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
