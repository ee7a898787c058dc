SELECT current_setting('wal_level')
