-- The database of a slot of this name in another database (none: the name is free here).
SELECT database::text FROM pg_replication_slots
WHERE slot_name = $1 AND database IS DISTINCT FROM current_database()
