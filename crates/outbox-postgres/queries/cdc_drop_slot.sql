SELECT pg_drop_replication_slot($1)
