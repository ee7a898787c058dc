-- The naive relay's claim, as the seed articles write it: the 100 oldest pending rows, locked
-- for the claiming transaction, skipping rows another relay holds. Through the
-- (status, created_at) index, it also steps over the entries that rows already marked SENT
-- leave in the PENDING range until vacuum removes them: the cost the baseline shows.
SELECT id, event_type, payload::text AS payload FROM {schema}.naive_outbox
WHERE status = 'PENDING' ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED
