-- The business table every example writes: one ledger per account, its entries numbered
-- 1, 2, 3... in commit order. The entry number is read and written under the per-key lock of
-- docs/sql-contract.md (section 2 b), so it is also the position of the entry's event in its
-- key's stream. Run it in the schema the outbox was migrated into, e.g.
--   PGOPTIONS='-c search_path=myschema' psql "$DATABASE_URL" -f examples/schema.sql
CREATE TABLE IF NOT EXISTS ledger (
    account_id   text        NOT NULL,
    entry_no     bigint      NOT NULL,
    amount_cents bigint      NOT NULL,
    producer     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, entry_no)
);
