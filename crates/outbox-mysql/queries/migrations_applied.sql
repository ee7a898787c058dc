SELECT version FROM {schema}.{ledger}
