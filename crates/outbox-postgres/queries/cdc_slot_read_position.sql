SELECT restart_lsn::text, confirmed_flush_lsn::text
  FROM pg_replication_slots
  WHERE slot_name = $1
  AND database = current_database()
  AND restart_lsn IS NOT NULL
  AND confirmed_flush_lsn IS NOT NULL
