-- CDC mode: parked messages that failed again after a redrive, by ($1 partition, $2 seq), with
-- $3 their errors and $4 the attempts made since the redrive.
UPDATE {schema}.outbox_parked p
SET state = 'failed', last_error = u.err, attempts = u.a, next_attempt_at = NULL
FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::int[]) AS u(pt, s, err, a)
WHERE p.partition = u.pt AND p.seq = u.s
