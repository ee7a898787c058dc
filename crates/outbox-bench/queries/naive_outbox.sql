-- The seed articles' outbox table, the benchmark's baseline: a random uuid key, a status column
-- the relay UPDATEs, an index on (status, created_at) for its claim, no trigger. Kept as the
-- articles write it, on purpose: the bench measures the engine against this design.
CREATE TABLE {schema}.naive_outbox (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    status         text        NOT NULL DEFAULT 'PENDING',
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX naive_outbox_status_created_idx ON {schema}.naive_outbox (status, created_at);
