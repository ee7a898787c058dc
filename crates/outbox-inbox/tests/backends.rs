//! The inbox backend suite (`outbox_testkit::inbox_suite`) on the three databases the inbox runs
//! on: PostgreSQL (a schema of its own per case, on the machine's server), MariaDB (databases of
//! its own per case) and SQLite (a file of its own per case). Every case runs on both: the dedupe claim (three deliveries, two racing
//! consumers, a crash between the commit and the broker's acknowledgement with a real
//! JetStream redelivery), ingest and the processor (once each in key order whatever the
//! grouping, transient and permanent handler failures, redrive, a handler that already
//! committed, a type without a handler), the three idempotent effect shapes, and request
//! idempotency keys.

use outbox_testkit::inbox_backend_suite;
use outbox_testkit::inbox_backends::{MysqlInbox, PgInbox, SqliteInbox};

inbox_backend_suite!(postgres, PgInbox);
inbox_backend_suite!(mysql, MysqlInbox);
inbox_backend_suite!(sqlite, SqliteInbox);
