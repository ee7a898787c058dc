//! The workload of `outbox verify`: producers that commit a ledger row and its event in one
//! transaction, on keys several producers share, and the ledger they leave behind (what
//! committed, and in which order within each key).
//!
//! Two kinds of producer write the outbox:
//! - *locked* producers enqueue through the writer API, which takes a per-key transaction lock
//!   before drawing `seq`; all of them write all the locked keys (a few hot ones most), so
//!   writers of one key meet all the time. Per-key order is a guarantee for these keys.
//! - *raw* producers write the SQL contract's plain `INSERT` without that lock, as an app in
//!   another language that skipped section 2 of `docs/sql-contract.md` would, on keys of their
//!   own; half of those keys have two raw writers. Their order is measured and reported.
//!
//! On MySQL/MariaDB two more write beside them, as the applications there do
//! ([`crate::mysql_producers`]):
//! - *XA* producers write the plain `INSERT` inside `XA START … XA END; XA PREPARE … XA
//!   COMMIT` (a JTA transaction manager's two phases; some commit in one phase, some end in
//!   `XA ROLLBACK` after the prepare), on keys of their own (`xa-…`), shared as the raw ones.
//! - an *odd-row* producer writes rows the SQL contract forbids (an `id` that is not a UUID, a
//!   zero `created_at`), with the server's checks off for the statement as a writer from before
//!   migration 4 would, each on a key of its own: each must end `failed` with its column named.
//!
//! Commit order, per key, is witnessed by a counter row: after its outbox insert, each
//! transaction runs `UPDATE verify_counters SET n = n + 1 WHERE key = … RETURNING n` and
//! records `n` in the ledger. The row lock lasts until commit, so the transaction that got the
//! larger `n` committed later. The witness comes *after* the outbox insert on purpose: before
//! it, its row lock alone would serialise the writers of a key, and the check would no longer
//! test the writer's own lock (nor show what raw writers get). For the same reason `n` is in
//! the ledger, not in the payload, which is written before `n` is known.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use outbox_core::NewMessage;
use outbox_db::{Backend, Database, Param};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::checker::{Committed, WriterKind};

/// Locked keys that take half of every locked producer's writes, so writers of one key meet.
const HOT_KEYS: usize = 4;

/// Share of transactions rolled back on purpose (one in this many).
const ROLLBACK_ONE_IN: u8 = 10;

/// Pause between two transactions of one producer.
const THINK_TIME: Duration = Duration::from_millis(5);

/// Longest pause between a transaction's outbox insert and its commit-order witness (on
/// PostgreSQL), so that two writers of a key overtake each other now and then: without the
/// writer's lock, that is when `seq` order and commit order part.
const MAX_WORK_IN_TRANSACTION: Duration = Duration::from_millis(3);

/// The ledger and the per-key counters; portable types, so one text serves PostgreSQL and SQLite.
const TABLES: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.verify_ledger (
        id       text   PRIMARY KEY,
        key      text   NOT NULL,
        n        bigint NOT NULL,
        writer   text   NOT NULL,
        producer bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS {schema}.verify_counters (
        key text   PRIMARY KEY,
        n   bigint NOT NULL)";

/// The SQL contract's minimal insert (section 1 of `docs/sql-contract.md`), with no per-key
/// lock; `RETURNING` reads back the id the database made, for the ledger.
const RAW_INSERT: &str = "
    INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
    VALUES ($1, $2, $3, $4)
    RETURNING CAST(id AS TEXT)";

/// Debezium's documented outbox table, in the verify schema (Debezium's table name is the
/// application's choice); `prepare` adopts it.
const DEBEZIUM_TABLE: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.debezium_outbox (
        id uuid NOT NULL PRIMARY KEY,
        aggregatetype varchar(255) NOT NULL,
        aggregateid varchar(255) NOT NULL,
        type varchar(255) NOT NULL,
        payload jsonb)";

/// The INSERT Debezium documents, the id made by the application (here by the database, read
/// back for the ledger): the row reaches the outbox through the adoption's copy trigger.
const DEBEZIUM_INSERT: &str = "
    INSERT INTO {schema}.debezium_outbox (id, aggregatetype, aggregateid, type, payload)
    VALUES (gen_random_uuid(), $1, $2, $3, $4)
    RETURNING CAST(id AS TEXT)";

/// Debezium's outbox table as an application on MySQL/MariaDB has it
/// (`examples/debezium/schema-mysql.sql`): the id a UUID as text, the payload JSON.
const DEBEZIUM_TABLE_MYSQL: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.debezium_outbox (
        id            VARCHAR(36)  NOT NULL PRIMARY KEY,
        aggregatetype VARCHAR(255) NOT NULL,
        aggregateid   VARCHAR(255) NOT NULL,
        type          VARCHAR(255) NOT NULL,
        payload       JSON) ENGINE = InnoDB";

/// Debezium's INSERT on MySQL/MariaDB, the id made by the producer as the application makes it
/// (no `RETURNING` on MySQL 8; the writer login may not read the table back).
const DEBEZIUM_INSERT_MYSQL: &str = "
    INSERT INTO {schema}.debezium_outbox (id, aggregatetype, aggregateid, type, payload)
    VALUES ($1, $2, $3, $4, $5)";

/// The commit-order witness (see the module comment).
const BUMP_COUNTER: &str =
    "UPDATE {schema}.verify_counters SET n = n + 1 WHERE key = $1 RETURNING n";

const RECORD: &str = "INSERT INTO {schema}.verify_ledger (id, key, n, writer, producer)
                      VALUES ($1, $2, $3, $4, $5)";

/// The same tables on MySQL/MariaDB: `key` is a reserved word there and a text key needs a
/// length, so the columns are `k` and `VARCHAR`; `CAST(… AS CHAR)` reads them back as text.
const TABLES_MYSQL: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.verify_ledger (
        id       VARCHAR(36)  NOT NULL PRIMARY KEY,
        k        VARCHAR(255) NOT NULL,
        n        BIGINT       NOT NULL,
        writer   VARCHAR(16)  NOT NULL,
        producer BIGINT       NOT NULL) ENGINE = InnoDB;
    CREATE TABLE IF NOT EXISTS {schema}.verify_counters (
        k VARCHAR(255) NOT NULL PRIMARY KEY,
        n BIGINT       NOT NULL) ENGINE = InnoDB;
    CREATE TABLE IF NOT EXISTS {schema}.verify_odd (
        seq BIGINT       NOT NULL PRIMARY KEY,
        id  VARCHAR(64)  NOT NULL,
        k   VARCHAR(255) NOT NULL,
        col VARCHAR(16)  NOT NULL) ENGINE = InnoDB";

/// The workload's statements in one database's dialect.
struct Dialect {
    tables: &'static str,
    add_counter: &'static str,
    /// The plain four-column insert, reading back the id the database made (`RETURNING`).
    raw_insert: &'static str,
    /// Where there is no `RETURNING`: the plain insert with the id made by the producer, as an
    /// application does (the writer login may only insert: it cannot read the row back).
    raw_insert_with_id: Option<&'static str>,
    /// Debezium's outbox table ([`Shape::debezium`]).
    debezium_table: &'static str,
    /// Debezium's INSERT, in the form `raw_insert` or `raw_insert_with_id` has here (the id
    /// read back, or made by the producer).
    debezium_insert: &'static str,
    /// The commit-order witness; `read_counter` then reads the value it set.
    bump_counter: &'static str,
    read_counter: Option<&'static str>,
    record: &'static str,
    ledger: &'static str,
}

impl Dialect {
    fn of(backend: Backend) -> &'static Dialect {
        match backend {
            Backend::Mysql => &MYSQL,
            _ => &PORTABLE,
        }
    }
}

/// PostgreSQL and SQLite.
static PORTABLE: Dialect = Dialect {
    tables: TABLES,
    add_counter: "INSERT INTO {schema}.verify_counters (key, n) VALUES ($1, 0)
                  ON CONFLICT (key) DO NOTHING",
    raw_insert: RAW_INSERT,
    raw_insert_with_id: None,
    debezium_table: DEBEZIUM_TABLE,
    debezium_insert: DEBEZIUM_INSERT,
    bump_counter: BUMP_COUNTER,
    read_counter: None,
    record: RECORD,
    ledger: "SELECT id, key, n, writer, producer FROM {schema}.verify_ledger",
};

/// MySQL 8 has no `RETURNING`: the producer makes the id, and the counter hands its new value
/// back through `LAST_INSERT_ID(expr)`.
static MYSQL: Dialect = Dialect {
    tables: TABLES_MYSQL,
    add_counter: "INSERT IGNORE INTO {schema}.verify_counters (k, n) VALUES ($1, 0)",
    raw_insert: "",
    raw_insert_with_id: Some(
        "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload)
         VALUES ($1, $2, $3, $4, $5)",
    ),
    debezium_table: DEBEZIUM_TABLE_MYSQL,
    debezium_insert: DEBEZIUM_INSERT_MYSQL,
    bump_counter: "UPDATE {schema}.verify_counters SET n = LAST_INSERT_ID(n + 1) WHERE k = $1",
    read_counter: Some("SELECT CAST(LAST_INSERT_ID() AS SIGNED)"),
    record: "INSERT INTO {schema}.verify_ledger (id, k, n, writer, producer)
             VALUES ($1, $2, $3, $4, $5)",
    ledger: "SELECT CAST(id AS CHAR), CAST(k AS CHAR), n, CAST(writer AS CHAR), producer
             FROM {schema}.verify_ledger",
};

/// How many producers of each kind write how many keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Producers using the writer API.
    pub producers: usize,
    /// Keys they share.
    pub keys: usize,
    /// Producers using the plain `INSERT` without the lock (0: none).
    pub raw_producers: usize,
    /// Keys of the raw producers (none of them is a locked key).
    pub raw_keys: usize,
    /// CDC mode: producers writing with `emit` (a logical message, no row), on `raw_keys`
    /// keys of their own (`emit-…`), shared as the raw producers share theirs.
    pub emit_producers: usize,
    /// The raw producers write Debezium's outbox table (`{schema}.debezium_outbox`, adopted
    /// by `outbox migrate --adopt-debezium`) with Debezium's documented INSERT instead of the
    /// SQL contract's (PostgreSQL and MySQL/MariaDB).
    pub debezium: bool,
    /// MySQL/MariaDB: producers writing the plain insert in XA transactions, on `raw_keys`
    /// keys of their own (`xa-…`), shared as the raw producers share theirs.
    pub xa_producers: usize,
    /// MySQL/MariaDB: rows written against the SQL contract (checks off for the statement),
    /// each on a key of its own (`odd-…`); 0: none.
    pub odd_rows: usize,
}

impl Shape {
    /// The locked keys; every locked producer writes all of them.
    pub fn locked_keys(&self) -> Vec<String> {
        (0..self.keys).map(|k| format!("key-{k}")).collect()
    }

    /// The keys raw producer `j` writes: raw key `k` belongs to producer `k mod R`, and an
    /// even `k` also to producer `(k + 1) mod R`. With two or more raw producers, half the raw
    /// keys have two writers and half have one.
    pub fn raw_keys_of(&self, j: usize) -> Vec<String> {
        let r = self.raw_producers.max(1);
        (0..self.raw_keys)
            .filter(|k| k % r == j || (k % 2 == 0 && (k + 1) % r == j))
            .map(|k| format!("raw-{k}"))
            .collect()
    }

    /// The keys emit producer `j` writes, shared as [`Shape::raw_keys_of`] shares them.
    pub fn emit_keys_of(&self, j: usize) -> Vec<String> {
        let r = self.emit_producers.max(1);
        (0..self.raw_keys)
            .filter(|k| k % r == j || (k % 2 == 0 && (k + 1) % r == j))
            .map(|k| format!("emit-{k}"))
            .collect()
    }

    /// The keys XA producer `j` writes, shared as [`Shape::raw_keys_of`] shares them.
    pub fn xa_keys_of(&self, j: usize) -> Vec<String> {
        let r = self.xa_producers.max(1);
        (0..self.raw_keys)
            .filter(|k| k % r == j || (k % 2 == 0 && (k + 1) % r == j))
            .map(|k| format!("xa-{k}"))
            .collect()
    }

    /// Every key the counters table needs a row for.
    fn all_keys(&self) -> Vec<String> {
        let mut keys = self.locked_keys();
        if self.raw_producers > 0 {
            keys.extend((0..self.raw_keys).map(|k| format!("raw-{k}")));
        }
        if self.emit_producers > 0 {
            keys.extend((0..self.raw_keys).map(|k| format!("emit-{k}")));
        }
        if self.xa_producers > 0 {
            keys.extend((0..self.raw_keys).map(|k| format!("xa-{k}")));
        }
        keys
    }
}

/// What the producers did, beside what the ledger holds.
#[derive(Debug, Default)]
pub struct Tally {
    /// Transactions rolled back on purpose.
    pub rolled_back: AtomicUsize,
    /// Transactions that failed (a fault); the ledger says whether any of them committed.
    pub errors: AtomicUsize,
    /// XA transactions that ended in `XA ROLLBACK` after their `XA PREPARE`, on purpose (also
    /// counted in `rolled_back`).
    pub xa_rolled_back: AtomicUsize,
    /// XA transactions committed in one phase (`XA COMMIT … ONE PHASE`).
    pub xa_one_phase: AtomicUsize,
    /// Prepared XA transactions a fault cut off from their producer, resolved afterwards from
    /// another connection (as a transaction manager's recovery does).
    pub xa_recovered: AtomicUsize,
}

/// Creates the outbox tables, the ledger and a counter row per key; in CDC mode also the
/// publication and the slot (before any message is written, so the slot's stream has them all),
/// and with `binlog` the MySQL binlog route.
pub async fn prepare(db: &Database, shape: &Shape, cdc: bool, binlog: bool) -> anyhow::Result<()> {
    let dialect = Dialect::of(db.backend());
    db.migrate().await.context("migrating the outbox")?;
    if binlog {
        db.enable_binlog_route()
            .await
            .context("turning the binlog route on")?;
    }
    if cdc {
        if db.backend() != Backend::Postgres {
            anyhow::bail!("verify --mode cdc reads PostgreSQL's WAL; use a postgres:// URL");
        }
        db.migrate_cdc("relay")
            .await
            .context("creating the CDC publication and slot")?;
    }
    db.execute_script(dialect.tables)
        .await
        .context("creating the ledger")?;
    if shape.debezium {
        if !matches!(db.backend(), Backend::Postgres | Backend::Mysql) {
            anyhow::bail!(
                "verify --debezium adopts a PostgreSQL or MySQL/MariaDB table; use a postgres:// \
                 or mysql:// URL"
            );
        }
        db.execute_script(dialect.debezium_table)
            .await
            .context("creating Debezium's outbox table")?;
        db.adopt_debezium(&format!("{}.debezium_outbox", db.schema()))
            .await
            .context("adopting Debezium's outbox table")?;
    }
    let mut tx = db.begin().await?;
    for key in shape.all_keys() {
        tx.execute(dialect.add_counter, &[key.into()]).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Lets the writer login `name` write the ledger and the counters, the business tables a
/// producer's transaction writes beside its message (the outbox's own grants are its part's),
/// and with `debezium` Debezium's adopted table, as the application's login holds it. On
/// MySQL/MariaDB that is `INSERT, DELETE, SELECT (id)` (the INSERT, and the `DELETE … WHERE id
/// = ?` Debezium advises right after it, which reads `id`) and nothing more: the copy trigger
/// writes the outbox with its definer's rights (docs/engine-mysql.md, "Least privileges").
pub async fn grant_ledger(db: &Database, name: &str, debezium: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        outbox_core::identifier::is_plain(name, 63),
        "verify: login `{name}` is not a plain identifier"
    );
    let sql = match db.backend() {
        Backend::Mysql => {
            let mut sql = format!(
                "GRANT SELECT, INSERT, UPDATE ON {{schema}}.verify_ledger TO '{name}'@'%';
                 GRANT SELECT, INSERT, UPDATE ON {{schema}}.verify_counters TO '{name}'@'%';
                 GRANT SELECT, INSERT, UPDATE ON {{schema}}.verify_odd TO '{name}'@'%'"
            );
            if debezium {
                sql.push_str(&format!(
                    ";\n GRANT INSERT, DELETE, SELECT (id) ON {{schema}}.debezium_outbox TO '{name}'@'%'"
                ));
            }
            sql
        }
        _ if debezium => format!(
            "GRANT SELECT, INSERT, UPDATE ON {{schema}}.verify_ledger, {{schema}}.verify_counters, \
             {{schema}}.debezium_outbox TO {name}"
        ),
        _ => format!(
            "GRANT SELECT, INSERT, UPDATE ON {{schema}}.verify_ledger, {{schema}}.verify_counters \
             TO {name}"
        ),
    };
    db.execute_script(&sql)
        .await
        .context("granting the ledger to the writer login")
}

/// Starts every producer; they run until `stop` is cancelled. Producer ids in the ledger:
/// `0..P` locked, `P..P+R` raw, `P+R..P+R+E` emit, then XA. `xa_tag` makes the run's XA
/// transaction ids its own (they are the server's, not the database's).
pub fn spawn(
    db: Arc<Database>,
    shape: Shape,
    seed: u64,
    xa_tag: &str,
    stop: CancellationToken,
) -> (Vec<JoinHandle<()>>, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    let locked_keys = shape.locked_keys();
    for p in 0..shape.producers {
        let producer = Producer {
            debezium: shape.debezium,
            db: db.clone(),
            writer: WriterKind::Locked,
            id: p,
            keys: locked_keys.clone(),
            hot: HOT_KEYS.min(shape.keys),
            tally: tally.clone(),
        };
        tasks.push(tokio::spawn(producer.run(seed, stop.clone())));
    }
    for j in 0..shape.raw_producers {
        let producer = Producer {
            debezium: shape.debezium,
            db: db.clone(),
            writer: WriterKind::Raw,
            id: shape.producers + j,
            keys: shape.raw_keys_of(j),
            hot: 0,
            tally: tally.clone(),
        };
        tasks.push(tokio::spawn(producer.run(seed, stop.clone())));
    }
    for j in 0..shape.emit_producers {
        let producer = Producer {
            debezium: shape.debezium,
            db: db.clone(),
            writer: WriterKind::Emit,
            id: shape.producers + shape.raw_producers + j,
            keys: shape.emit_keys_of(j),
            hot: 0,
            tally: tally.clone(),
        };
        tasks.push(tokio::spawn(producer.run(seed, stop.clone())));
    }
    let first_xa = shape.producers + shape.raw_producers + shape.emit_producers;
    for j in 0..shape.xa_producers {
        let producer = Producer {
            debezium: false,
            db: db.clone(),
            writer: WriterKind::Xa,
            id: first_xa + j,
            keys: shape.xa_keys_of(j),
            hot: 0,
            tally: tally.clone(),
        };
        tasks.push(tokio::spawn(producer.run_xa(
            seed,
            xa_tag.to_string(),
            stop.clone(),
        )));
    }
    if shape.odd_rows > 0 {
        tasks.push(tokio::spawn(crate::mysql_producers::write_odd_rows(
            db.clone(),
            shape.odd_rows,
            stop.clone(),
        )));
    }
    (tasks, tally)
}

/// Reads the ledger: every committed message, its key and commit rank.
pub async fn ledger(db: &Database) -> anyhow::Result<HashMap<Uuid, Committed>> {
    let rows: Vec<(String, String, i64, String, i64)> = db
        .fetch_all(Dialect::of(db.backend()).ledger, &[])
        .await
        .context("reading the ledger")?;
    let mut out = HashMap::with_capacity(rows.len());
    for (id, key, n, writer, producer) in rows {
        let writer = WriterKind::parse(&writer)
            .with_context(|| format!("ledger row {id}: unknown writer `{writer}`"))?;
        let id = id
            .parse()
            .with_context(|| format!("ledger row `{id}`: not a UUID"))?;
        out.insert(
            id,
            Committed {
                key,
                n,
                writer,
                producer,
            },
        );
    }
    Ok(out)
}

/// One producer task.
struct Producer {
    /// Raw writes go to Debezium's adopted table ([`Shape::debezium`]).
    debezium: bool,
    db: Arc<Database>,
    writer: WriterKind,
    id: usize,
    keys: Vec<String>,
    /// The first `hot` keys take half the writes.
    hot: usize,
    tally: Arc<Tally>,
}

impl Producer {
    async fn run(self, seed: u64, stop: CancellationToken) {
        let mut rng = fastrand::Rng::with_seed(seed ^ (self.id as u64 + 1));
        // SQLite runs one writer at a time: a pause there would only hold the file's lock.
        let max_work = match self.db.backend() {
            Backend::Postgres | Backend::Mysql => MAX_WORK_IN_TRANSACTION,
            _ => Duration::ZERO,
        };
        while !stop.is_cancelled() && !self.keys.is_empty() {
            let key = if self.hot > 0 && rng.bool() {
                &self.keys[rng.usize(..self.hot)]
            } else {
                &self.keys[rng.usize(..self.keys.len())]
            };
            let rollback = rng.u8(..ROLLBACK_ONE_IN) == 0;
            let work = max_work.mul_f64(rng.f64());
            match self.write(key, work, rollback).await {
                Ok(()) if rollback => {
                    self.tally.rolled_back.fetch_add(1, Ordering::Relaxed);
                }
                Ok(()) => {}
                Err(_) => {
                    // A fault (database restart, busy file): the ledger is the truth about
                    // whether it committed; wait a little and go on.
                    self.tally.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            tokio::time::sleep(THINK_TIME).await;
        }
    }

    /// The XA producer's loop ([`crate::mysql_producers::xa_write`]): one XA transaction on a
    /// key of its own at a time, a tenth ended in `XA ROLLBACK` after the prepare, a quarter of
    /// the rest committed in one phase.
    async fn run_xa(self, seed: u64, tag: String, stop: CancellationToken) {
        let mut rng = fastrand::Rng::with_seed(seed ^ (self.id as u64 + 1));
        let Database::Mysql(store) = &*self.db else {
            return;
        };
        let mut count = 0u64;
        while !stop.is_cancelled() && !self.keys.is_empty() {
            let key = &self.keys[rng.usize(..self.keys.len())];
            let rollback = rng.u8(..ROLLBACK_ONE_IN) == 0;
            let one_phase = !rollback && rng.u8(..4) == 0;
            count += 1;
            let xa = crate::mysql_producers::XaTransaction {
                xid: format!("{tag}-{}-{count}", self.id),
                key,
                producer: self.id as i64,
                work: MAX_WORK_IN_TRANSACTION.mul_f64(rng.f64()),
                prepared_for: Duration::from_millis(rng.u64(..20)),
                rollback,
                one_phase,
            };
            match crate::mysql_producers::xa_write(store.pool(), store.schema().as_str(), &xa).await
            {
                Ok(recovered) => {
                    if rollback {
                        self.tally.rolled_back.fetch_add(1, Ordering::Relaxed);
                        self.tally.xa_rolled_back.fetch_add(1, Ordering::Relaxed);
                    } else if one_phase {
                        self.tally.xa_one_phase.fetch_add(1, Ordering::Relaxed);
                    }
                    if recovered {
                        self.tally.xa_recovered.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(_) => {
                    // A fault before the prepare: the server rolled it back; the ledger is
                    // the truth.
                    self.tally.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            tokio::time::sleep(THINK_TIME).await;
        }
    }

    /// One transaction: the outbox row (writer API or plain insert), a pause standing for the
    /// rest of the business work, the commit-order witness, the ledger row; then commit or
    /// roll back.
    async fn write(&self, key: &str, work: Duration, rollback: bool) -> anyhow::Result<()> {
        let payload = serde_json::json!({
            "key": key,
            "writer": self.writer.as_str(),
            "producer": self.id,
        });
        let dialect = Dialect::of(self.db.backend());
        let mut tx = self.db.begin().await?;
        let id: Uuid = match self.writer {
            WriterKind::Locked => {
                tx.enqueue(&NewMessage::new("verify", key, "event", payload))
                    .await?
            }
            WriterKind::Emit => {
                tx.emit(&NewMessage::new("verify", key, "event", payload))
                    .await?
            }
            WriterKind::Raw => {
                let params = [
                    "verify".into(),
                    key.into(),
                    "event".into(),
                    Param::Json(payload),
                ];
                if let Some(insert) = dialect.raw_insert_with_id {
                    let insert = if self.debezium {
                        dialect.debezium_insert
                    } else {
                        insert
                    };
                    let id = Uuid::now_v7();
                    let mut with_id = vec![id.to_string().into()];
                    with_id.extend(params);
                    tx.execute(insert, &with_id).await?;
                    id
                } else {
                    let insert = if self.debezium {
                        dialect.debezium_insert
                    } else {
                        dialect.raw_insert
                    };
                    let (id,): (String,) = tx.fetch_one(insert, &params).await?;
                    id.parse()
                        .context("the database made an id that is not a UUID")?
                }
            }
            WriterKind::Xa => anyhow::bail!("XA producers write through `run_xa`"),
        };
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        let (n,): (i64,) = match dialect.read_counter {
            None => tx.fetch_one(dialect.bump_counter, &[key.into()]).await?,
            Some(read) => {
                tx.execute(dialect.bump_counter, &[key.into()]).await?;
                tx.fetch_one(read, &[]).await?
            }
        };
        tx.execute(
            dialect.record,
            &[
                id.into(),
                key.into(),
                n.into(),
                self.writer.as_str().into(),
                (self.id as i64).into(),
            ],
        )
        .await?;
        if rollback {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn shape(raw_producers: usize, raw_keys: usize) -> Shape {
        Shape {
            producers: 4,
            keys: 64,
            raw_producers,
            raw_keys,
            emit_producers: 0,
            debezium: false,
            xa_producers: 2,
            odd_rows: 0,
        }
    }

    fn writers_per_raw_key(s: &Shape) -> HashMap<String, usize> {
        let mut count = HashMap::new();
        for j in 0..s.raw_producers {
            for k in s.raw_keys_of(j) {
                *count.entry(k).or_default() += 1;
            }
        }
        count
    }

    #[test]
    fn half_the_raw_keys_have_two_writers_and_every_raw_key_has_one_at_least() {
        for r in 2..6 {
            let s = shape(r, 16);
            let count = writers_per_raw_key(&s);
            assert_eq!(count.len(), 16, "every raw key is written ({r} producers)");
            let shared = count.values().filter(|&&c| c == 2).count();
            assert_eq!(shared, 8, "{r} producers: {count:?}");
            assert!(count.values().all(|&c| c == 1 || c == 2));
        }
    }

    #[test]
    fn one_raw_producer_writes_every_raw_key_once() {
        let count = writers_per_raw_key(&shape(1, 6));
        assert_eq!(count.len(), 6);
        assert!(count.values().all(|&c| c == 1), "{count:?}");
    }

    /// `write` binds the producer's id to Debezium's INSERT exactly where it binds one to the
    /// plain insert, and reads it back elsewhere: each dialect's two statements agree.
    #[test]
    fn debeziums_insert_takes_its_id_as_the_plain_insert_does_in_each_dialect() {
        for backend in [Backend::Postgres, Backend::Mysql] {
            let d = Dialect::of(backend);
            let returns = d.debezium_insert.contains("RETURNING");
            assert_eq!(returns, d.raw_insert_with_id.is_none(), "{backend:?}");
            assert_eq!(d.debezium_insert.contains("$5"), !returns, "{backend:?}");
            assert!(d.debezium_table.contains("debezium_outbox"));
            assert!(d.debezium_insert.contains("debezium_outbox"));
        }
    }

    #[test]
    fn raw_keys_never_meet_locked_keys() {
        let s = shape(2, 16);
        let locked = s.locked_keys();
        for j in 0..2 {
            assert!(s.raw_keys_of(j).iter().all(|k| !locked.contains(k)));
            assert!(s.xa_keys_of(j).iter().all(|k| !locked.contains(k)));
            assert!(s.xa_keys_of(j).iter().all(|k| k.starts_with("xa-")));
        }
        // Locked, raw and XA keys each have their counter row.
        assert_eq!(s.all_keys().len(), 64 + 16 + 16);
    }
}
