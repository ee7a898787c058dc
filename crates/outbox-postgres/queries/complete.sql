-- Records one batch of publish outcomes in one statement. Fenced: rows of partitions the member
-- no longer owns are left alone (their new owner delivers them again, with the same id).
-- $1 member, $2 seqs, $3 states, $4 errors, $5 retry delays in seconds
UPDATE {schema}.outbox AS o
SET state           = r.state,
    attempts        = o.attempts + 1,
    next_attempt_at = CASE WHEN r.state = 'pending' THEN now() + make_interval(secs => r.delay) END,
    last_error      = COALESCE(r.error, o.last_error),
    published_at    = CASE WHEN r.state = 'published' THEN now() END
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::float8[]) AS r(seq, state, error, delay)
WHERE o.seq = r.seq
  AND o.state = 'pending'
  AND o.partition = ANY (ARRAY(
        SELECT p.partition FROM {schema}.outbox_partitions AS p WHERE p.owner = $1))
