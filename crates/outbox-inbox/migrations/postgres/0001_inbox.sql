-- inbox tables, version 1 (see docs/consumers.md and docs/inbox-sql.md).
--
-- `{schema}` holds what applications touch in their own transactions; `{queue}` is the
-- processing queue, an outbox table set made by the outbox migration just before this one: the
-- insert-only engine, drained by the inbox processor with the relay engine.

-- What arrived, once per message id. The ingest daemon (or `ingest` in an application's
-- transaction) inserts with ON CONFLICT (id) DO NOTHING, and only a row it inserted is queued
-- for processing: a redelivery is absorbed here. Rows are never updated; processing state is
-- in `processed_messages` and the queue (see the view below).
CREATE TABLE IF NOT EXISTS {schema}.inbox_messages (
    id              uuid        PRIMARY KEY,
    source          text        NOT NULL,
    type            text        NOT NULL,
    key             text        NOT NULL,
    payload         jsonb       NOT NULL,
    -- how `payload` holds the body: json (the body), text (a JSON string of the body's text),
    -- base64 (a JSON string of the body's bytes)
    payload_format  text        NOT NULL DEFAULT 'json',
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- Ingest order. One ingest daemon per source writes at a time, so for its rows this is
    -- also commit order (see docs/inbox-sql.md before reading by it).
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    -- Where the broker had it (NATS stream sequence, Redis entry id), for operators.
    source_position text,
    CONSTRAINT inbox_messages_payload_format_check CHECK (payload_format IN ('json', 'text', 'base64'))
);
CREATE INDEX IF NOT EXISTS inbox_messages_seq_idx ON {schema}.inbox_messages (seq);
CREATE INDEX IF NOT EXISTS inbox_messages_received_idx ON {schema}.inbox_messages (received_at);

-- Layer 1, the dedupe claim: a consumer inserts (consumer, message_id) in the transaction that
-- applies the message's effect. The primary key rejects a second claim, so an effect commits at
-- most once per consumer and message, whoever races and however often the broker redelivers.
-- Kept for the retention (`outbox inbox --retention`), which must exceed the source's longest
-- redelivery window.
CREATE TABLE IF NOT EXISTS {schema}.processed_messages (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT processed_messages_pkey PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS processed_messages_message_idx ON {schema}.processed_messages (message_id);
CREATE INDEX IF NOT EXISTS processed_messages_at_idx ON {schema}.processed_messages (processed_at);

-- Request idempotency keys: the first request's result and the ids of the events it enqueued,
-- written in that request's own transaction. A request in progress holds a transaction-level
-- advisory lock on its key instead of a row, so a crashed request leaves nothing to expire.
CREATE TABLE IF NOT EXISTS {schema}.idempotency_keys (
    key         text        PRIMARY KEY,
    fingerprint text        NOT NULL,
    result      jsonb       NOT NULL,
    events      uuid[]      NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_idx ON {schema}.idempotency_keys (created_at);

-- The queue's parked messages by id, for the view below (the parked table is small; this keeps
-- a lookup of one message's state an index probe).
CREATE INDEX IF NOT EXISTS outbox_parked_id_idx ON {queue}.outbox_parked (id);

-- Each inbox message with its processing state, for SQL readers and operators:
-- `processed` (the processor's claim committed with the handler's effect), `failed` (given up,
-- with `last_error`; `outbox redrive --inbox` retries it), `retrying` (a failed attempt, waiting
-- for the next), `waiting` (behind a retrying or failed message of its key), or `pending`.
CREATE OR REPLACE VIEW {schema}.inbox_message_states AS
SELECT m.id, m.source, m.type, m.key, m.seq, m.received_at,
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
LEFT JOIN {queue}.outbox_parked AS k ON k.id = m.id;
