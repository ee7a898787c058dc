SET SESSION information_schema_stats_expiry = 0
