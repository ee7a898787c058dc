-- The logical messages and transaction records between two positions of the WAL, read back by
-- pg_walinspect (in schema {walinspect}, a validated identifier) after a slot was lost.
SELECT start_lsn::text, xid::text::bigint, record_type, description
FROM {walinspect}.pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
WHERE resource_manager IN ('LogicalMessage', 'Transaction')
