-- PostgreSQL 17 and later: a failover slot (the last argument), which a standby with
-- sync_replication_slots = on keeps in step, so it survives a promotion.
SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)
