//! [`BinlogReader`]: one replication session that follows the binlog from a position and hands
//! back each committed transaction's outbox rows, whole and in commit order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, OptsBuilder};
use outbox_core::{Error, ErrorKind};
use tracing::{error, warn};

use super::decode::Layout;
use super::tls::{SslMode, Target};
use super::xa;
use super::BinlogPosition;
use crate::Schema;

/// What the sequencer needs of an outbox row the binlog carried (the relay reads the rest from
/// the table): only these two columns are decoded, so no other column can stop the route.
#[derive(Debug, Clone, PartialEq)]
pub struct BinlogRow {
    /// Drawn at insert (`AUTO_INCREMENT`): not commit order.
    pub seq: i64,
    /// The key: one key's messages keep their commit order.
    pub aggregate_id: String,
}

/// A committed transaction's outbox rows, in the order its statements wrote them.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// Where the binlog goes on after this transaction: reading again from here starts at
    /// the next one.
    pub end: BinlogPosition,
    /// When the server wrote the commit (to the second, as the binlog keeps it).
    pub committed_at: DateTime<Utc>,
    /// Its outbox rows; never empty.
    pub rows: Vec<BinlogRow>,
}

/// What [`BinlogReader::next`] hands back.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A transaction that wrote outbox rows committed.
    Committed(Committed),
    /// No outbox row committed before this position that was not handed back already: the
    /// server is idle (a heartbeat), or only other tables were written for a while.
    Idle(BinlogPosition),
}

/// Why reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The server no longer holds the binlog at `position` (it was purged, by age or by
    /// hand): what was committed there can only be found in the table now.
    #[error("the binlog at {position} is no longer on the server (purged, by `binlog_expire_logs_seconds` / `expire_logs_days` or by hand): {message}")]
    Purged {
        /// The position asked for.
        position: BinlogPosition,
        /// What the server said.
        message: String,
    },
    /// Anything else: a lost connection (retry), a refused login, a row that cannot be
    /// decoded.
    #[error(transparent)]
    Other(#[from] Error),
}

/// How a [`BinlogReader`] presents itself to the server.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// The replica id this session registers with. It must differ from every other replica
    /// of the server and from the server's own `server_id`; a second session with the same
    /// id makes the server end the first.
    pub server_id: u32,
    /// How often an idle server sends a heartbeat (so a dead connection is noticed, and the
    /// reader reports [`Item::Idle`]).
    pub heartbeat: Duration,
    /// How long the reader waits for the server's next event (a heartbeat counts) before it
    /// takes the connection as dead and fails with a connection error (the sequencer then
    /// reconnects): a connection cut without a RST (a network drop, a failover) never ends
    /// by itself. Several heartbeats long, so a busy server is not mistaken for a dead one.
    pub silence: Duration,
    /// TCP keepalive on the replication connection: the kernel probes an idle connection and
    /// closes one the peer no longer answers.
    pub keepalive: Duration,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            server_id: 0x4f42_0000 | fastrand::u32(..0xffff),
            heartbeat: Duration::from_secs(1),
            silence: Duration::from_secs(10),
            keepalive: Duration::from_secs(10),
        }
    }
}

/// How long a run of other tables' transactions goes before [`Item::Idle`] reports the
/// position past them.
const IDLE_REPORT: Duration = Duration::from_secs(1);

/// Follows one server's binlog for one outbox table. Each call to [`next`](Self::next) waits
/// for the next committed transaction that wrote outbox rows (or an idle report).
///
/// Guarantees: transactions come in the order the server committed them; a transaction's rows
/// come together, in the order its statements wrote them; a rolled-back transaction never
/// comes (the server writes a transaction to the binlog only at its commit). Rows of other
/// tables and other databases are skipped, and so are updates and deletes of outbox rows
/// (nothing of ours makes them).
pub struct BinlogReader {
    stream: BinlogStream,
    schema: String,
    layout: Layout,
    /// The file being read and the end of the last event read in it.
    at: BinlogPosition,
    /// The end of the last transaction read whole.
    committed_through: BinlogPosition,
    /// The outbox rows of the transaction being read.
    rows: Vec<BinlogRow>,
    /// Prepared XA transactions with outbox rows, oldest first: each one's xid, its rows, and
    /// where reading again would read its group again (the end of the transaction before it).
    /// Their rows come out at their `XA COMMIT`, go at their `XA ROLLBACK`, and no position
    /// handed back passes the oldest one's group until then.
    /// With each, the GTID state at that place (see `gtids`).
    prepared: Vec<(String, Vec<BinlogRow>, BinlogPosition, Gtids)>,
    last_report: Instant,
    /// The server puts a checksum at the end of every event (`binlog_checksum`).
    checksums: bool,
    /// A format description event was read (the stream's events are understood from then).
    seen_format: bool,
    /// MariaDB's GTID state as of `committed_through`: the last transaction's GTID per
    /// replication domain (domain → (server_id, seq_no)), from the GTID event each transaction
    /// begins with. Only the domains this reader was given or has read are known.
    gtids: Gtids,
    /// The GTID of the transaction being read (domain, server_id, seq_no).
    current_gtid: Option<(u32, u32, u64)>,
    /// Opened by GTID ([`BinlogReader::open_after_gtid`]): where in the file the stream starts
    /// is known only at its first transaction's GTID event; no position is handed back before.
    start_pending: bool,
    /// See [`ReadOptions::silence`].
    silence: Duration,
    /// Since when the reader has waited for the server's next event; `None` while the caller
    /// handles what it was given (a slow save is not the server's silence).
    waiting_since: Option<Instant>,
}

impl BinlogReader {
    /// Opens a replication session to `url` and starts reading at `from` (a position a
    /// previous [`Committed::end`] or [`Item::Idle`] gave, or the server's end). Gives up with
    /// a connection error when the server does not answer within [`ReadOptions::silence`].
    pub async fn open(
        url: &str,
        schema: &Schema,
        from: &BinlogPosition,
        options: &ReadOptions,
    ) -> Result<Self, ReadError> {
        Self::open_with(url, schema, Start::At(from, None), options).await
    }

    /// [`open`](Self::open), knowing MariaDB's GTID state at `from` (`gtids`, as
    /// [`gtid_state`](Self::gtid_state) gave it with that position): the reader then keeps it
    /// up to date as it reads.
    pub async fn open_at(
        url: &str,
        schema: &Schema,
        from: &BinlogPosition,
        gtids: Option<&str>,
        options: &ReadOptions,
    ) -> Result<Self, ReadError> {
        Self::open_with(url, schema, Start::At(from, gtids), options).await
    }

    /// MariaDB: opens a replication session that starts after the transactions of GTID state
    /// `gtids` (`domain-server-seq`, comma-separated, as [`gtid_state`](Self::gtid_state) gave
    /// it), wherever they are in this server's binlog: on a promoted replica
    /// (`log_slave_updates`) the primary's transactions are there under the same GTIDs, in the
    /// same order. The server refuses (an error that is not a connection error) when its binlog
    /// lacks one of them (`gtid_strict_mode`) or was purged past it.
    pub async fn open_after_gtid(
        url: &str,
        schema: &Schema,
        gtids: &str,
        options: &ReadOptions,
    ) -> Result<Self, ReadError> {
        Self::open_with(url, schema, Start::AfterGtid(gtids), options).await
    }

    async fn open_with(
        url: &str,
        schema: &Schema,
        start: Start<'_>,
        options: &ReadOptions,
    ) -> Result<Self, ReadError> {
        let from = match start {
            Start::At(p, _) => p.clone(),
            Start::AfterGtid(g) => BinlogPosition::new(format!("(after GTID {g})"), 4),
        };
        let from = &from;
        let limit = options.silence.max(options.heartbeat * 2);
        match tokio::time::timeout(limit, Self::open_now(url, schema, start, options)).await {
            Ok(opened) => opened,
            Err(_) => Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "opening the binlog stream at {from} on {}: no answer within {limit:?}; \
                     will retry",
                    outbox_core::redact::url(url)
                ),
            )
            .into()),
        }
    }

    async fn open_now(
        url: &str,
        schema: &Schema,
        start: Start<'_>,
        options: &ReadOptions,
    ) -> Result<Self, ReadError> {
        let (from, known) = match start {
            Start::At(p, g) => (p.clone(), g),
            Start::AfterGtid(g) => (BinlogPosition::new("", 4), Some(g)),
        };
        let from = &from;
        let gtids = match known {
            Some(g) => parse_gtids(g).ok_or_else(|| {
                Error::config(format!(
                    "`{g}` is not a MariaDB GTID state (domain-server-seq,…)"
                ))
            })?,
            None => BTreeMap::new(),
        };
        let shown = outbox_core::redact::url(url);
        let target = Target::parse(url, &shown)?;
        let opts = Opts::from_url(&target.url)
            .map_err(|e| Error::config(format!("database URL `{shown}`: {e}")))?;
        let keepalive = options.keepalive.max(Duration::from_secs(1));
        let mut opts = OptsBuilder::from_opts(opts).tcp_keepalive(Some(keepalive));
        // mysql_async moves a connection to 127.0.0.1 onto the server's Unix socket unless told
        // not to: the connection the URL names (a proxy's, say) is the one to read through (and
        // the one TLS protects: mysql_async never encrypts a socket).
        if !target.url.contains("prefer_socket=") {
            opts = opts.prefer_socket(false);
        }
        let mut conn = connect(&target, opts, &shown).await?;
        let columns: Vec<(String, u64)> = conn
            .exec(
                include_str!("../../queries/binlog_outbox_columns.sql"),
                (schema.as_str(),),
            )
            .await
            .map_err(|e| error("reading the outbox table's columns", e))?;
        let layout = Layout::from_columns(&columns)?;
        let checksum: Option<String> = conn
            .query_first(include_str!("../../queries/binlog_checksum.sql"))
            .await
            .map_err(|e| error("reading the binlog's checksum setting", e))?;
        let checksums = checksum.is_some_and(|c| !c.eq_ignore_ascii_case("NONE"));
        // In nanoseconds; the server sends a heartbeat after this long with nothing to send.
        let heartbeat = options
            .heartbeat
            .as_nanos()
            .clamp(1_000_000, 4_294_967_000_000);
        conn.query_drop(
            include_str!("../../queries/binlog_heartbeat.sql")
                .replace("{nanos}", &heartbeat.to_string()),
        )
        .await
        .map_err(|e| error("setting the binlog heartbeat", e))?;
        // MariaDB: a replica that announces no capability is sent old-style events only, and an
        // XA transaction's GTID event has none: the server ends the stream there ("Failed to
        // replace GTID event with backwards-compatible event"), so one XA transaction anywhere
        // on the server would stop the route for good. Announcing GTID support (4, MariaDB
        // 10.0's) gets the events as they are; the ones this reader does not know (GTID,
        // annotations, checkpoints) are skipped. A user variable: MySQL ignores it.
        conn.query_drop(include_str!("../../queries/binlog_capability.sql"))
            .await
            .map_err(|e| error("announcing the replica's capabilities", e))?;
        let by_gtid = matches!(start, Start::AfterGtid(_));
        if by_gtid {
            // MariaDB's GTID replica protocol: the dump starts after these transactions, found
            // by GTID in this server's binlog, with the strict checks a replica gets.
            conn.exec_drop(
                include_str!("../../queries/binlog_connect_state.sql"),
                (format_gtids(&gtids),),
            )
            .await
            .map_err(|e| error("giving the GTID state to start from", e))?;
            conn.query_drop(include_str!("../../queries/binlog_gtid_strict.sql"))
                .await
                .map_err(|e| error("asking for strict GTID checks", e))?;
        }
        let request = BinlogStreamRequest::new(options.server_id)
            .with_filename(from.file.as_bytes())
            .with_pos(from.offset);
        let stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(|e| read_error(from, "asking for the binlog", e))?;
        Ok(Self {
            stream,
            schema: schema.as_str().to_string(),
            layout,
            at: from.clone(),
            committed_through: from.clone(),
            rows: Vec::new(),
            prepared: Vec::new(),
            last_report: Instant::now(),
            checksums,
            seen_format: false,
            gtids,
            current_gtid: None,
            start_pending: by_gtid,
            silence: options.silence.max(options.heartbeat * 2),
            waiting_since: None,
        })
    }

    /// Where reading again misses nothing: the end of the last transaction read whole, or,
    /// while an XA transaction with outbox rows is prepared and not yet resolved, the start of
    /// the oldest such one's group (reading again from there repeats the transactions committed
    /// since, whose rows the sequencer finds positioned already).
    pub fn position(&self) -> &BinlogPosition {
        self.prepared
            .first()
            .map_or(&self.committed_through, |(_, _, from, _)| from)
    }

    /// MariaDB's GTID state at [`position`](Self::position) (`domain-server-seq`,
    /// comma-separated): saved with the position, a replica promoted after a failover can be
    /// read from the same place ([`open_after_gtid`](Self::open_after_gtid)); while an XA
    /// transaction is held, the state before its group, as the position is. `None` while it is
    /// not known: no transaction read yet and none given, or a MySQL server (its GTIDs are not
    /// read).
    pub fn gtid_state(&self) -> Option<String> {
        let gtids = self
            .prepared
            .first()
            .map_or(&self.gtids, |(_, _, _, gtids)| gtids);
        if gtids.is_empty() || self.start_pending {
            return None;
        }
        Some(format_gtids(gtids))
    }

    /// Whether an XA transaction with outbox rows is prepared and not yet resolved: the
    /// [`position`](Self::position) handed back stays before its group meanwhile.
    pub fn holding(&self) -> bool {
        !self.prepared.is_empty()
    }

    /// Waits for the next committed transaction with outbox rows, or an idle report. Fails
    /// with a connection error when the server sends nothing, not even a heartbeat, for
    /// [`ReadOptions::silence`]. Cancel-safe: a call dropped while it waits loses nothing, and
    /// the silence is counted across such calls.
    pub async fn next(&mut self) -> Result<Item, ReadError> {
        let item = self.read().await;
        // Whatever came, the caller handles it before it asks again: not the server's time.
        self.waiting_since = None;
        item
    }

    async fn read(&mut self) -> Result<Item, ReadError> {
        // Long because: one loop over the stream's events, beside the transaction's state.
        loop {
            let since = *self.waiting_since.get_or_insert_with(Instant::now);
            let next = tokio::time::timeout_at((since + self.silence).into(), self.stream.next());
            let Ok(next) = next.await else {
                return Err(Error::new(
                    ErrorKind::Connection,
                    format!(
                        "the server sent nothing on the binlog connection (not even a heartbeat) \
                         for {:?} at {}: the connection is taken as dead (a network drop or a \
                         failover without a reset); will reconnect",
                        self.silence, self.at
                    ),
                )
                .into());
            };
            // An event: the server is alive; the next wait starts now.
            self.waiting_since = Some(Instant::now());
            let event = match next {
                Some(Ok(event)) => event,
                Some(Err(e)) => return Err(read_error(&self.at, "reading the binlog", e)),
                None => {
                    return Err(Error::new(
                        ErrorKind::Connection,
                        format!(
                            "the server ended the binlog stream at {}; will retry",
                            self.at
                        ),
                    )
                    .into())
                }
            };
            let header = event.header();
            // A fake rotate (timestamp 0) or a heartbeat carries no place in the file.
            let log_pos = u64::from(header.log_pos());
            let data = event
                .read_data()
                .map_err(|e| decode_error(&self.at, &format!("an event: {e}")))?;
            match data {
                Some(EventData::RotateEvent(rotate)) => {
                    let mut name = rotate.name_raw();
                    // The rotate that opens the stream comes before the format description
                    // that says events carry a checksum, so its name still ends in one.
                    if !self.seen_format && self.checksums && name.len() > 4 {
                        name = &name[..name.len() - 4];
                    }
                    let name = String::from_utf8_lossy(name).into_owned();
                    self.at = BinlogPosition::new(name, rotate.position());
                    if self.rows.is_empty() {
                        self.committed_through = self.at.clone();
                    }
                    continue;
                }
                Some(EventData::FormatDescriptionEvent(_)) => {
                    self.seen_format = true;
                    // A group never spans files, and a server that restarted begins a new
                    // file: rows left buffered belong to a group its crash left unfinished,
                    // which never committed.
                    if !self.rows.is_empty() {
                        warn!(at = %self.at, rows = self.rows.len(), "the binlog holds an unfinished transaction (a server crash): its outbox rows never committed and are dropped");
                        self.rows.clear();
                    }
                    self.current_gtid = None;
                    continue;
                }
                Some(EventData::HeartbeatEvent) => {
                    if self.rows.is_empty() && !self.start_pending {
                        self.last_report = Instant::now();
                        return Ok(Item::Idle(self.position().clone()));
                    }
                    continue;
                }
                _ => {}
            }
            if header.event_type_raw() == MARIADB_GTID_EVENT {
                // seq_no (8 bytes), domain_id (4), flags: a transaction begins.
                let body = event.data();
                if body.len() >= 12 {
                    let seq_no = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
                    let domain = u32::from_le_bytes(body[8..12].try_into().unwrap_or_default());
                    self.current_gtid = Some((domain, header.server_id(), seq_no));
                }
                if self.start_pending && log_pos > 0 {
                    // Opened by GTID: the stream starts at this event.
                    let start = log_pos.saturating_sub(u64::from(header.event_size()));
                    self.at.offset = start;
                    self.committed_through = self.at.clone();
                    self.start_pending = false;
                }
            }
            if log_pos > 0 {
                self.at.offset = log_pos;
            }
            let commit = match data {
                Some(EventData::RowsEvent(rows)) => {
                    self.take_rows(&rows)?;
                    false
                }
                Some(EventData::XidEvent(_)) => true,
                Some(EventData::XaPrepareLogEvent(body)) => match xa::prepared(&body) {
                    Some(p) if p.one_phase => true,
                    Some(p) => {
                        // The group ends here, uncommitted: its rows wait for its outcome.
                        if !self.rows.is_empty() {
                            let rows = std::mem::take(&mut self.rows);
                            self.prepared.push((
                                p.xid,
                                rows,
                                self.committed_through.clone(),
                                self.gtids.clone(),
                            ));
                        }
                        if let Some((domain, server, seq_no)) = self.current_gtid.take() {
                            self.gtids.insert(domain, (server, seq_no));
                        }
                        self.committed_through = self.at.clone();
                        continue;
                    }
                    None => {
                        return Err(decode_error(
                            &self.at,
                            "an XA prepare event shorter than it says",
                        ))
                    }
                },
                Some(EventData::QueryEvent(query)) => match xa::outcome(query.query_raw()) {
                    // Its own group: a prepared transaction's rows come out now, or go.
                    Some((commit, xid)) => {
                        if let Some(i) = self.prepared.iter().position(|(x, _, _, _)| *x == xid) {
                            let (_, rows, _, _) = self.prepared.remove(i);
                            if commit {
                                self.rows.extend(rows);
                            }
                        }
                        true
                    }
                    // A transaction of a non-transactional engine ends with a COMMIT statement.
                    None => query.query_raw().eq_ignore_ascii_case(b"COMMIT"),
                },
                _ => false,
            };
            if !commit {
                continue;
            }
            if let Some((domain, server, seq_no)) = self.current_gtid.take() {
                self.gtids.insert(domain, (server, seq_no));
            }
            self.committed_through = self.at.clone();
            if !self.rows.is_empty() {
                self.last_report = Instant::now();
                return Ok(Item::Committed(Committed {
                    end: self.position().clone(),
                    committed_at: DateTime::from_timestamp(header.timestamp().into(), 0)
                        .unwrap_or_else(Utc::now),
                    rows: std::mem::take(&mut self.rows),
                }));
            }
            if self.last_report.elapsed() >= IDLE_REPORT {
                self.last_report = Instant::now();
                return Ok(Item::Idle(self.position().clone()));
            }
        }
    }

    /// Keeps the inserted rows of a rows event, if it is the outbox table's.
    fn take_rows(&mut self, event: &RowsEventData<'_>) -> Result<(), ReadError> {
        let (RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_)) = event else {
            return Ok(());
        };
        let Some(table) = self.stream.get_tme(event.table_id()) else {
            return Err(decode_error(
                &self.at,
                "a rows event with no table map before it",
            ));
        };
        if table.table_name() != "outbox" || table.database_name() != self.schema.as_str() {
            return Ok(());
        }
        for row in event.rows(table) {
            let (_, after) = row.map_err(|e| decode_error(&self.at, &format!("a row: {e}")))?;
            if let Some(after) = after {
                match self.layout.row(after) {
                    Ok(row) => self.rows.push(row),
                    // Left to the seal's net, which takes every row below its bound that has
                    // no position from the table (late, in seq order, but not lost); the route
                    // goes on.
                    Err(e) => {
                        error!(at = %self.at, error = %e, "an outbox row in the binlog cannot be read; it is left for the sequencer's seal to take from the table")
                    }
                }
            }
        }
        Ok(())
    }
}

/// The server's error numbers for a binlog position it cannot serve from its files:
/// ER_MASTER_FATAL_ERROR_READING_BINLOG ("Could not find first log file name in binary log
/// index file", "impossible position", "log event entry exceeded max_allowed_packet", ...).
/// The first two kinds are taken as a purge; the message tells them apart.
const ER_MASTER_FATAL_ERROR_READING_BINLOG: u16 = 1236;

fn read_error(position: &BinlogPosition, doing: &str, err: mysql_async::Error) -> ReadError {
    if let mysql_async::Error::Server(server) = &err {
        // A position past the end of its file ("impossible position", MySQL's "position >
        // file size") is a binlog tail the server no longer has: lost in an OS crash with
        // `sync_binlog = 0`, or another server's file of the same name. Like a purge, only the
        // table can tell what was committed there; retrying would fail for ever.
        let purged = server.code == ER_MASTER_FATAL_ERROR_READING_BINLOG
            && (server.message.contains("first log file name")
                || server.message.contains("binary log index file")
                || server.message.contains("purged")
                || server.message.contains("impossible position")
                || server.message.contains("position > file size")
                // Opened by GTID (MariaDB): the server's binlog lacks a transaction of the
                // state (a diverged history) or was purged past it.
                || server.message.contains("requested to start from GTID")
                || server.message.contains("GTID state requested"));
        if purged {
            return ReadError::Purged {
                position: position.clone(),
                message: server.message.clone(),
            };
        }
    }
    ReadError::Other(error(doing, err))
}

fn decode_error(position: &BinlogPosition, what: &str) -> ReadError {
    ReadError::Other(Error::new(
        ErrorKind::Malformed,
        format!("decoding the binlog at {position}: {what}"),
    ))
}

/// Connects as `target` asks: over TLS unless `DISABLED`; `PREFERRED` falls back to plaintext
/// only when the server offers no TLS (as the pool does), never after a failed handshake.
async fn connect(target: &Target, opts: OptsBuilder, shown: &str) -> Result<Conn, Error> {
    // The process's one provider (ring): with aws-lc-rs in the build too (the AWS SDK's),
    // rustls will not choose one by itself. An error only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let doing = format!("connecting to MySQL at {shown} to read the binlog");
    // With TLS turned off, a refused login may be the server's require_secure_transport
    // (MariaDB answers a plaintext login to it as a denied access): say so beside the
    // privilege the login needs. (`PREFERRED` falls back only where the server offers no TLS,
    // so it cannot require it.)
    let plain = |e: mysql_async::Error| {
        let refused = matches!(&e, mysql_async::Error::Server(s) if s.code == 1045);
        let e = error(&doing, e);
        if refused && target.mode == SslMode::Disabled {
            Error::new(
                e.kind(),
                format!(
                    "{e}; or the login went in plaintext (ssl-mode=DISABLED) to a server with \
                     require_secure_transport, which refuses it so: set ssl-mode=VERIFY_IDENTITY \
                     and ssl-ca"
                ),
            )
        } else {
            e
        }
    };
    let Some(ssl) = target.ssl_opts(shown)? else {
        return Conn::new(opts).await.map_err(plain);
    };
    match Conn::new(opts.clone().ssl_opts(ssl)).await {
        Ok(conn) => Ok(conn),
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer))
            if target.mode == SslMode::Preferred =>
        {
            Conn::new(opts).await.map_err(plain)
        }
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)) => {
            Err(Error::config(format!(
                "{doing}: the server offers no TLS, and ssl-mode={} asks for it: turn TLS on at \
                 the server (ssl_cert, ssl_key) or connect with ssl-mode=PREFERRED",
                target.mode.name()
            )))
        }
        Err(e) => match tls_failure(&e) {
            Some(cause) => Err(Error::config(format!(
                "{doing}: the TLS handshake failed ({cause}): check that ssl-ca is the CA that \
                 signed the server's certificate, that the URL's host is a name in that \
                 certificate (VERIFY_IDENTITY), and that ssl-cert/ssl-key are the client \
                 certificate the user requires; will retry"
            ))),
            None => Err(error(&doing, e)),
        },
    }
}

/// What failed in a TLS handshake, if `e` is one: rustls's verdict (tokio-rustls hands it up
/// inside an I/O error) or mysql_async's own TLS error (a CA or key it could not load).
fn tls_failure(e: &mysql_async::Error) -> Option<String> {
    match e {
        mysql_async::Error::Io(mysql_async::IoError::Tls(e)) => Some(e.to_string()),
        mysql_async::Error::Io(mysql_async::IoError::Io(io)) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(ToString::to_string),
        _ => None,
    }
}

/// A `mysql_async` error as an outbox error whose kind tells retry from fix.
fn error(doing: &str, err: mysql_async::Error) -> Error {
    let (kind, hint) = match &err {
        mysql_async::Error::Io(_) => (ErrorKind::Connection, "; will retry"),
        mysql_async::Error::Url(_) => (ErrorKind::Config, ""),
        mysql_async::Error::Server(server) => match server.code {
            // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR
            1045 | 1044 | 1227 => (
                ErrorKind::Config,
                "; reading the binlog needs the REPLICATION SLAVE privilege",
            ),
            // ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_CONNECTION_KILLED
            1040 | 1053 | 1927 => (ErrorKind::Connection, "; will retry"),
            _ => (ErrorKind::Database, ""),
        },
        _ => (ErrorKind::Other, ""),
    };
    Error::new(kind, format!("{doing}: {err}{hint}"))
}

/// MariaDB's GTID event (`GTID_EVENT`, 0xA2): the first event of every transaction group.
const MARIADB_GTID_EVENT: u8 = 0xA2;

/// A GTID state: domain → (server_id, seq_no) of its last transaction.
type Gtids = BTreeMap<u32, (u32, u64)>;

/// Where a [`BinlogReader`] starts.
#[derive(Clone, Copy)]
enum Start<'a> {
    /// At a position, with the GTID state there when known.
    At(&'a BinlogPosition, Option<&'a str>),
    /// After the transactions of a GTID state (MariaDB).
    AfterGtid(&'a str),
}

/// `domain-server-seq,…` as a map domain → (server, seq); `None` when it is not one.
fn parse_gtids(text: &str) -> Option<BTreeMap<u32, (u32, u64)>> {
    let mut map = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let mut it = part.split('-');
        let (d, s, n) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        map.insert(d.parse().ok()?, (s.parse().ok()?, n.parse().ok()?));
    }
    Some(map)
}

/// The map of [`parse_gtids`] as MariaDB writes a GTID state.
fn format_gtids(map: &BTreeMap<u32, (u32, u64)>) -> String {
    map.iter()
        .map(|(d, (s, n))| format!("{d}-{s}-{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod gtid_tests {
    use super::*;

    #[test]
    fn a_gtid_state_reads_and_writes_as_mariadb_writes_it() {
        let m = parse_gtids("0-11-1234,1-12-7").unwrap();
        assert_eq!(m.get(&0), Some(&(11, 1234)));
        assert_eq!(format_gtids(&m), "0-11-1234,1-12-7");
        assert!(parse_gtids("0-11").is_none());
        assert!(parse_gtids("0-11-x").is_none());
        assert!(parse_gtids("").unwrap().is_empty());
    }
}
