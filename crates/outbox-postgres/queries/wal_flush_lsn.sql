SELECT pg_current_wal_flush_lsn()::text
