-- outbox tables, version 4: the formats the relay reads are checked at insert. See
-- docs/engine-mysql.md ("Rows the relay cannot read") and docs/sql-contract.md.
--
-- `id` is the message id the relay publishes as a UUID: 8-4-4-4-12 hexadecimal text (a ULID or
-- any other id is refused). `created_at` must be a real time: MariaDB's default `sql_mode`
-- accepts zero and partly zero dates ('0000-00-00', '2026-00-10'), which no client can read.
--
-- Rows written before this migration are not checked (MariaDB: `check_constraint_checks = 0`
-- for this one statement), so a non-conforming old row cannot stop the migration; the relay
-- fails each such row alone, naming its column, and other keys flow. MySQL has no such switch
-- and checks the existing rows: there, mend or delete a non-conforming row before migrating
-- (the error names the constraint). `IF NOT EXISTS` (MariaDB) lets the statement run again.
/*M!100200 SET STATEMENT check_constraint_checks = 0 FOR */
ALTER TABLE {schema}.outbox
    ADD CONSTRAINT /*M!100200 IF NOT EXISTS */ outbox_id_uuid
        CHECK (id REGEXP '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'),
    ADD CONSTRAINT /*M!100200 IF NOT EXISTS */ outbox_created_at_real
        CHECK (created_at >= '1000-01-01' AND MONTH(created_at) > 0 AND DAYOFMONTH(created_at) > 0);
