-- Redrives failed messages: each goes back to `pending`, due now, with zero attempts; it has the
-- lowest seq of its key's pending rows, so the next claim hands it out first and the rest of its
-- key follows in order. Failed rows are never handed out, so no relay holds one while this runs.
-- ?1 every failed message (1/0), ?2 or these ids (JSON array of text)
UPDATE outbox
SET state = 'pending', attempts = 0, next_attempt_at = NULL
WHERE state = 'failed' AND (?1 OR id IN (SELECT value FROM json_each(?2)))
