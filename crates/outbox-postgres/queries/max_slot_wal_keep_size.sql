SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'
