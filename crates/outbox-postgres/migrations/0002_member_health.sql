-- outbox schema, version 2: each relay member reports its sink's circuit breaker, so
-- `outbox status` shows a broker outage as the relays see it.
ALTER TABLE {schema}.outbox_members
    ADD COLUMN IF NOT EXISTS circuit    text NOT NULL DEFAULT 'closed',
    ADD COLUMN IF NOT EXISTS sink_error text;
