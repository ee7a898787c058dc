SELECT slot_name::text, active_pid, wal_status,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, safe_wal_size
FROM pg_replication_slots
WHERE database = current_database() AND plugin = 'pgoutput'
  AND left(slot_name::text, length($1)) = $1
ORDER BY slot_name
