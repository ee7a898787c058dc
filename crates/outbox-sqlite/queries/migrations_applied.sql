SELECT version FROM {ledger}
