-- inbox tables, version 1, for SQLite (see docs/consumers.md and docs/inbox-sql.md). The same
-- tables as on PostgreSQL; the processing queue is the outbox table set `inbox_queue` in the
-- same file (made just before this by the outbox migrations under that prefix).
-- Ids are lower-case hyphenated UUID text; times are RFC 3339 text in UTC with milliseconds.

CREATE TABLE IF NOT EXISTS inbox_messages (
    -- Ingest order; SQLite runs one writer at a time, so also commit order.
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL UNIQUE,
    source          TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    payload_format  TEXT    NOT NULL DEFAULT 'json'
                    CHECK (payload_format IN ('json', 'text', 'base64')),
    headers         TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    received_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    source_position TEXT
);
CREATE INDEX IF NOT EXISTS inbox_messages_received_idx ON inbox_messages (received_at);

CREATE TABLE IF NOT EXISTS processed_messages (
    consumer     TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS processed_messages_message_idx ON processed_messages (message_id);
CREATE INDEX IF NOT EXISTS processed_messages_at_idx ON processed_messages (processed_at);

CREATE TABLE IF NOT EXISTS idempotency_keys (
    key         TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    result      TEXT NOT NULL CHECK (json_valid(result)),
    -- JSON array of the ids of the events the first request enqueued
    events      TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(events)),
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_idx ON idempotency_keys (created_at);

-- Each inbox message with its processing state (see the PostgreSQL view of the same name).
CREATE VIEW IF NOT EXISTS inbox_message_states AS
SELECT m.id, m.source, m.type, m.key, m.seq, m.received_at,
       CASE WHEN p.message_id IS NOT NULL THEN 'processed'
            WHEN q.state = 'failed' THEN 'failed'
            WHEN q.state = 'pending' AND q.attempts > 0 THEN 'retrying'
            ELSE 'pending' END AS state,
       coalesce(q.attempts, 0) AS attempts,
       q.last_error,
       q.next_attempt_at,
       p.processed_at
FROM inbox_messages AS m
LEFT JOIN processed_messages AS p ON p.consumer = 'inbox' AND p.message_id = m.id
LEFT JOIN inbox_queue AS q ON q.id = m.id;
