SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1
