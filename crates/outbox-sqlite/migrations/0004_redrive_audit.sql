-- outbox schema, version 4: the audit trail of redrives. `outbox redrive` (Store::redrive) gives
-- failed messages a fresh budget; each one it releases is recorded here with the attempts and
-- last error it had, and the operator's reason, so a redrive never erases what happened.
CREATE TABLE IF NOT EXISTS outbox_redrives (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    redriven_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    message_id   TEXT    NOT NULL,
    aggregate_id TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    reason       TEXT    NOT NULL
);
