-- Redrives failed messages: each goes back to `retrying`, due now, with zero attempts, so the
-- next claim of its partition hands it out first and its key's waiting messages follow it in seq
-- order. Every message released is written to the audit table with the attempts and error it
-- had. Failed messages are never handed out, so no relay holds one while this runs; the rows
-- are locked first so two redrives of one message record it once.
-- $1 every failed message, $2 or these ids, $3 the operator's reason.
WITH old AS (
    SELECT partition, seq, id, aggregate_id, attempts, last_error
    FROM {schema}.outbox_parked
    WHERE state = 'failed' AND ($1::boolean OR id = ANY ($2::uuid[]))
    FOR UPDATE
), released AS (
    UPDATE {schema}.outbox_parked AS p
    SET state = 'retrying', attempts = 0, next_attempt_at = now()
    FROM old
    WHERE p.partition = old.partition AND p.seq = old.seq AND p.state = 'failed'
    RETURNING p.partition, p.seq
)
INSERT INTO {schema}.outbox_redrives (message_id, aggregate_id, attempts, last_error, reason)
SELECT old.id, old.aggregate_id, old.attempts, old.last_error, $3
FROM old JOIN released USING (partition, seq)
RETURNING message_id
