-- outbox schema, version 2: each relay member reports its sink's circuit breaker, so
-- `outbox status` shows a broker outage as the relays see it.
ALTER TABLE outbox_members ADD COLUMN circuit TEXT NOT NULL DEFAULT 'closed';
ALTER TABLE outbox_members ADD COLUMN sink_error TEXT;
