SELECT count(pg_terminate_backend(active_pid))
FROM pg_replication_slots
WHERE slot_name = $1 AND active_pid IS NOT NULL
