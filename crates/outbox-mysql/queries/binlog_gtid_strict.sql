SET @slave_gtid_strict_mode = 1, @slave_gtid_ignore_duplicates = 0
