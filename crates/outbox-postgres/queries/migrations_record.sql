INSERT INTO {schema}.{ledger} (version, name) VALUES ($1, $2)
