-- The ledger of applied migrations ({ledger}: a fixed table name per crate).
CREATE TABLE IF NOT EXISTS {ledger} (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))
