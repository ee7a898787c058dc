-- CDC mode: parked messages that failed again after a redrive, by ($1 partition, $2 seq), with
-- $3 their errors and $4 the attempts made since the redrive; parked_at becomes the time it
-- failed again (the journey's last step).
UPDATE {schema}.outbox_parked p
SET state = 'failed', last_error = u.err, attempts = u.a, next_attempt_at = NULL, parked_at = now()
FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::int[]) AS u(pt, s, err, a)
WHERE p.partition = u.pt AND p.seq = u.s
