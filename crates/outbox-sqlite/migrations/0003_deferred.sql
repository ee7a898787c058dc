-- outbox schema, version 3: a pending row waits for a later attempt whenever it has a
-- `next_attempt_at`, whether a failed attempt set it (a retry) or the relay deferred it without
-- trying (its sink's circuit was open; no attempt spent). The index of waiting keys follows.
DROP INDEX IF EXISTS outbox_retrying_idx;
CREATE INDEX IF NOT EXISTS outbox_waiting_idx ON outbox (partition, aggregate_id)
    WHERE state = 'pending' AND next_attempt_at IS NOT NULL;
