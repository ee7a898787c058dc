-- inbox tables, version 1, for MySQL 8.0.29+ and MariaDB 10.6+ (tested on MariaDB 10.11 only).
-- The same tables as on PostgreSQL (see docs/consumers.md and docs/inbox-sql.md). `{schema}`
-- is the database of the inbox tables, `{queue}` the database of the processing queue (an
-- outbox table set, made by the outbox migrations just before this one). DDL commits as it
-- goes on MySQL, so every statement here can be run again whole.
--
-- `key` is a reserved word in MySQL: SQL readers write it `key` in backquotes. Ids are
-- lower-case hyphenated UUID text; times are UTC DATETIMEs. Text is utf8mb4 with a binary
-- collation, as in the outbox: keys compare byte for byte, except that this collation ignores
-- trailing spaces (so the Rust API refuses consumer names and idempotency keys that end in
-- one). Source, type and key are at most 255 characters, as the queue's columns they are
-- copied into.

-- What arrived, once per message id (the unique id). Ingest inserts only the ids not yet here
-- and queues exactly those; rows are never updated.
CREATE TABLE IF NOT EXISTS {schema}.inbox_messages (
    -- Ingest order (AUTO_INCREMENT is drawn at insert: not commit order across writers).
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    id              CHAR(36)     NOT NULL,
    source          VARCHAR(255) NOT NULL,
    type            VARCHAR(255) NOT NULL,
    `key`           VARCHAR(255) NOT NULL,
    payload         JSON         NOT NULL,
    -- how `payload` holds the body: json (the body), text (a JSON string of the body's text),
    -- base64 (a JSON string of the body's bytes)
    payload_format  VARCHAR(8)   NOT NULL DEFAULT 'json',
    headers         JSON         NOT NULL DEFAULT ('{}'),
    received_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- Where the broker had it (NATS stream sequence, Redis entry id), for operators.
    source_position VARCHAR(255) NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY inbox_messages_id (id),
    KEY inbox_messages_received (received_at),
    CONSTRAINT inbox_messages_payload_format_check CHECK (payload_format IN ('json', 'text', 'base64'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Layer 1, the dedupe claim: (consumer, message_id), inserted in the transaction that applies
-- the message's effect; the primary key rejects a second claim.
CREATE TABLE IF NOT EXISTS {schema}.processed_messages (
    consumer     VARCHAR(255) NOT NULL,
    message_id   CHAR(36)     NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, message_id),
    KEY processed_messages_message (message_id),
    KEY processed_messages_at (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Request idempotency keys: the first request's result and the ids of the events it enqueued
-- (a JSON array), written in that request's own transaction.
CREATE TABLE IF NOT EXISTS {schema}.idempotency_keys (
    `key`       VARCHAR(255) NOT NULL PRIMARY KEY,
    fingerprint TEXT         NOT NULL,
    result      JSON         NOT NULL,
    events      JSON         NOT NULL DEFAULT ('[]'),
    created_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY idempotency_keys_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A request in progress holds its key's row here, locked until its transaction ends (MySQL's
-- GET_LOCK belongs to the session, not the transaction, so PostgreSQL's transaction-level
-- advisory lock does not carry over). It takes the row with one exclusive statement
-- (`INSERT … ON DUPLICATE KEY UPDATE`), so requests under one key queue and none upgrades a
-- shared lock. A second request waits for the first and then replays its result. `stored`
-- says the key's result is in `idempotency_keys`, so a request reads that table only where the
-- row exists: a locking read of a missing row would lock a gap under REPEATABLE READ. A
-- crashed request's row goes with its transaction.
CREATE TABLE IF NOT EXISTS {schema}.idempotency_key_locks (
    `key`      VARCHAR(255) NOT NULL PRIMARY KEY,
    stored     BOOLEAN      NOT NULL DEFAULT FALSE,
    created_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY idempotency_key_locks_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Each inbox message with its processing state (see the PostgreSQL view of the same name).
-- The queue's parked table is keyed by the queue row's `seq`, found by the message id: the
-- latest queue row of that id (a message redelivered after the inbox's retention deleted its
-- row is queued again, and the older copy's range may not be dropped yet).
CREATE OR REPLACE VIEW {schema}.inbox_message_states AS
SELECT m.id, m.source, m.type, m.`key`, m.seq, m.received_at,
       CASE WHEN p.message_id IS NOT NULL THEN 'processed'
            WHEN k.state = 'failed' THEN 'failed'
            WHEN k.state = 'retrying' AND k.attempts > 0 THEN 'retrying'
            WHEN k.state IS NOT NULL AND k.state <> 'retrying' THEN 'waiting'
            ELSE 'pending' END AS state,
       COALESCE(k.attempts, 0) AS attempts,
       k.last_error,
       k.next_attempt_at,
       p.processed_at
FROM {schema}.inbox_messages AS m
LEFT JOIN {schema}.processed_messages AS p
       ON p.consumer = 'inbox' AND p.message_id = m.id
LEFT JOIN {queue}.outbox_parked AS k
       ON k.seq = (SELECT MAX(q.seq) FROM {queue}.outbox AS q WHERE q.id = m.id);
