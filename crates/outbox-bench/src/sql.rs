//! Every SQL statement the bench runs, by name. The longer ones live in `queries/*.sql` with
//! their reasons; `{schema}` is the run's scratch schema, filled in by
//! [`outbox_db::Schema::render`] (a validated identifier, never user text).
//!
//! None of them reads the engine's own tables or columns (the one exception, the raw insert,
//! is the outbox's documented SQL contract): the modes keep working when the engine changes
//! underneath.

// Scratch schemas (see `scratch.rs`).

/// A run's scratch schema.
pub const CREATE_SCHEMA: &str = "CREATE SCHEMA {schema}";
/// Drops a run's scratch schema and everything in it.
pub const DROP_SCHEMA: &str = "DROP SCHEMA {schema} CASCADE";
/// Drops a schema the run may or may not have made (the inbox's processing queue).
pub const DROP_SCHEMA_IF_EXISTS: &str = "DROP SCHEMA IF EXISTS {schema} CASCADE";
/// The scratch schema's tables, quoted, for [`ANALYZE`].
pub const SCRATCH_TABLES: &str = include_str!("../queries/scratch_tables.sql");
/// Statistics for the listed tables (`{tables}`, from [`SCRATCH_TABLES`]), so the planner sees
/// a freshly filled backlog as it would a production table.
pub const ANALYZE: &str = "ANALYZE {tables}";
/// Dead tuples of one table (partitions included) and of the whole scratch schema.
pub const DEAD_TUPLES: &str = include_str!("../queries/dead_tuples.sql");

// The naive relay and its table (see `naive.rs`).

/// The seed articles' outbox table and its index.
pub const NAIVE_OUTBOX: &str = include_str!("../queries/naive_outbox.sql");
/// One row into the naive table, as the seed articles' application writes it.
pub const NAIVE_INSERT: &str = include_str!("../queries/naive_insert.sql");
/// A thousand rows into the naive table at once, returning their ids.
pub const NAIVE_FILL: &str = include_str!("../queries/naive_fill.sql");
/// The naive relay's claim: 100 rows `FOR UPDATE SKIP LOCKED`.
pub const NAIVE_CLAIM: &str = include_str!("../queries/naive_claim.sql");
/// The naive relay's mark, one UPDATE per published row.
pub const NAIVE_MARK_SENT: &str = include_str!("../queries/naive_mark_sent.sql");

// Writers mode (see `writers.rs`).

/// The pgbench-like accounts table.
pub const ACCOUNTS: &str = include_str!("../queries/accounts.sql");
/// Fills accounts 1..$1.
pub const ACCOUNTS_FILL: &str = include_str!("../queries/accounts_fill.sql");
/// Leaves the accounts table vacuumed and analysed, as `pgbench -i` does.
pub const ACCOUNTS_VACUUM: &str = "VACUUM ANALYZE {schema}.accounts";
/// The business transaction's UPDATE.
pub const ACCOUNT_CREDIT: &str = include_str!("../queries/account_credit.sql");
/// The outbox's raw SQL insert (the SQL contract), variant (b).
pub const OUTBOX_RAW_INSERT: &str = include_str!("../queries/outbox_raw_insert.sql");
/// Flushes dirty pages before each variant, so none inherits the previous one's debt. Needs
/// superuser or `pg_checkpoint`; refused, the variants run without it.
pub const CHECKPOINT: &str = "CHECKPOINT";

// Idle mode (see `idle.rs`).

/// The relay's own backends, by `application_name`.
pub const RELAY_BACKENDS: &str = include_str!("../queries/relay_backends.sql");

// Idle-tx mode (see `idle_tx.rs`).

/// Whether autovacuum runs: without it only page pruning reclaims dead tuples, which the
/// report says, since it changes both runs' figures.
pub const SHOW_AUTOVACUUM: &str = "SHOW autovacuum";
/// Other sessions holding an old snapshot.
pub const OTHER_SNAPSHOTS: &str = include_str!("../queries/other_snapshots.sql");
/// The one-row table the held transaction reads.
pub const HELD_REPORT: &str = include_str!("../queries/held_report.sql");
/// The held connection's backend pid, to find its snapshot in `pg_stat_activity`.
pub const BACKEND_PID: &str = "SELECT pg_backend_pid()";
/// Opens the held transaction. REPEATABLE READ keeps the snapshot of its first query to the
/// end (READ COMMITTED would take a new one per statement and hold nothing).
pub const BEGIN_REPEATABLE_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ";
/// The held transaction's first query, which takes the snapshot.
pub const HELD_READ: &str = include_str!("../queries/held_read.sql");
/// Age of a backend's snapshot, in transaction ids.
pub const XMIN_AGE: &str = include_str!("../queries/xmin_age.sql");
/// Ends the held transaction.
pub const ROLLBACK: &str = "ROLLBACK";

// Inbox mode (see `inbox.rs`).

/// The effects table and the naive consumer's inbox.
pub const INBOX_TABLES: &str = include_str!("../queries/inbox_tables.sql");
/// The naive ingest's insert.
pub const NAIVE_INBOX_INSERT: &str = include_str!("../queries/naive_inbox_insert.sql");
/// A handler's effect.
pub const EFFECT_INSERT: &str = include_str!("../queries/effect_insert.sql");
/// Effects written.
pub const EFFECTS_COUNT: &str = include_str!("../queries/effects_count.sql");
/// The naive handler's dedupe claim.
pub const NAIVE_HANDLER_CLAIM: &str = include_str!("../queries/naive_handler_claim.sql");
