SELECT EXISTS (SELECT 1 FROM pg_replication_slots
               WHERE slot_name = $1 AND database = current_database())
