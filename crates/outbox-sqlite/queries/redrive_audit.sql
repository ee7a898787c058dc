-- Records the failed messages a redrive is about to release, with the attempts and error they
-- had. Runs in the redrive's transaction, before redrive.sql.
-- ?1 every failed message (1/0), ?2 or these ids (JSON array of text), ?3 the operator's reason
INSERT INTO outbox_redrives (message_id, aggregate_id, attempts, last_error, reason)
SELECT id, aggregate_id, attempts, last_error, ?3
FROM outbox
WHERE state = 'failed' AND (?1 OR id IN (SELECT value FROM json_each(?2)))
ORDER BY seq
