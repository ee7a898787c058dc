-- Forgets positions that are neither a partition's latest nor recent. Claims read only the
-- latest through a backward index scan, so rows pruned here (dead until VACUUM can remove them)
-- are never on a claim's path.
DELETE FROM {schema}.outbox_positions AS p
USING (SELECT partition, max(id) AS keep FROM {schema}.outbox_positions GROUP BY partition) AS k
WHERE p.partition = k.partition AND p.id < k.keep AND p.recorded_at < now() - interval '1 minute'
