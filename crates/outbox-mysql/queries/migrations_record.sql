INSERT INTO {schema}.{ledger} (version, name) VALUES (?, ?)
