-- CDC mode: parked messages the broker acknowledged, by ($1 partition, $2 seq).
DELETE FROM {schema}.outbox_parked p
USING unnest($1::smallint[], $2::bigint[]) AS u(pt, s)
WHERE p.partition = u.pt AND p.seq = u.s
