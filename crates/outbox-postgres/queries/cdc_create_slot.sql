SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')
