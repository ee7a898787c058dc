-- CDC mode: how many partitions still hold a message written before the slot was created (so
-- not in its stream) that the polling positions have not passed: a row visible in $1, the
-- snapshot taken just after the slot was created, and not in the partition's latest `done`.
-- While any does, the CDC relay delivers by polling (its catch-up); at 0 it starts the stream.
-- One probe per partition on (partition, txid); an open window counts by its `done`, so a
-- partition whose window still holds such a row counts until the window is passed.
-- $1 the slot's start snapshot (text)
WITH latest AS MATERIALIZED (
    SELECT DISTINCT ON (x.partition) x.partition, x.done
    FROM {schema}.outbox_positions AS x
    ORDER BY x.partition, x.id DESC
)
SELECT count(*)
FROM latest AS l
WHERE EXISTS (
    SELECT 1 FROM {schema}.outbox AS o
    WHERE o.partition = l.partition
      AND o.txid >= pg_snapshot_xmin(l.done)
      AND o.txid < pg_snapshot_xmax($1::pg_snapshot)
      AND pg_visible_in_snapshot(o.txid, $1::pg_snapshot)
      AND NOT pg_visible_in_snapshot(o.txid, l.done))
