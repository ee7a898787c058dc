-- The redrives of the messages $1 (Store::journey), oldest first: the audit trail keeps the
-- attempts and last error each message had when an operator gave it a fresh budget, and why.
SELECT message_id, redriven_at, attempts, last_error, reason
FROM {schema}.outbox_redrives
WHERE message_id = ANY ($1::uuid[])
ORDER BY id
