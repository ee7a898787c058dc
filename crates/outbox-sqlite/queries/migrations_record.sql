INSERT INTO {ledger} (version, name) VALUES (?1, ?2)
