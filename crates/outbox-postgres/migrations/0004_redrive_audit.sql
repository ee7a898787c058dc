-- outbox schema, version 4: the audit trail of redrives. `outbox redrive` (Store::redrive) gives
-- failed messages a fresh budget; each one it releases is recorded here with the attempts and
-- last error it had, and the operator's reason, so a redrive never erases what happened.
CREATE TABLE IF NOT EXISTS {schema}.outbox_redrives (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    redriven_at  timestamptz NOT NULL DEFAULT now(),
    message_id   uuid        NOT NULL,
    aggregate_id text        NOT NULL,
    attempts     integer     NOT NULL,
    last_error   text,
    reason       text        NOT NULL
);
