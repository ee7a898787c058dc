-- CDC mode: moves the polling engine's positions to a mark the CDC relay has passed (see
-- cdc_mark.sql), so `outbox status` counts what is really pending, retention drops segments
-- behind it, and a polling relay that takes over (the slot lost) starts there: it publishes again
-- only what came after the mark, and loses nothing.
--
-- Appended, compare-and-append, for each partition whose latest position:
--   * is not owned under a live lease: a polling relay that owns it records its own positions;
--   * has no open window, or one whose snapshot `cur` S contains: the window's rows are then all
--     visible in S, so each was published by this relay or is one the check below refuses (a
--     polling relay that stopped in mid-window no longer pins the partition; one that was only
--     paused finds its record refused by compare-and-append and claims again from here);
--   * is older than the mark (its `done` is contained in S), so a position never moves back;
--   * has nothing the slot's stream lacks: every row written before the slot was created is
--     behind it already, i.e. no row of the partition is visible in $4 (the snapshot taken just
--     after the slot was created) and not in its `done`.
-- The new position is a closed window at S: done = S, done_floor = F, and done_bound the id the
-- mark assigned after F was read (so every id at or above it belongs to a transaction whose
-- rows lie above F). `published` is carried over (the CDC relay does not count per
-- partition); `parked` is recounted.
-- $1 S (text), $2 F, $3 the mark's time, $4 the slot's start snapshot (text), $5 the mark's
-- bound (text)
WITH latest AS MATERIALIZED (
    SELECT DISTINCT ON (x.partition) x.*
    FROM {schema}.outbox_positions AS x
    ORDER BY x.partition, x.id DESC
), eligible AS MATERIALIZED (
    SELECT l.partition, p.epoch, l.id, l.published
    FROM latest AS l
    JOIN {schema}.outbox_partitions AS p ON p.partition = l.partition
    WHERE (p.owner IS NULL OR p.lease_until < now())
      -- No open window, or S contains it.
      AND (l.cur IS NULL
           OR (pg_snapshot_xmax(l.cur) <= pg_snapshot_xmax($1::pg_snapshot)
               AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip($1::pg_snapshot) AS s(xid)
                               WHERE pg_visible_in_snapshot(s.xid, l.cur))))
      -- S contains `done`: every txid visible in `done` is visible in S.
      AND pg_snapshot_xmax(l.done) <= pg_snapshot_xmax($1::pg_snapshot)
      AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip($1::pg_snapshot) AS s(xid)
                      WHERE pg_visible_in_snapshot(s.xid, l.done))
      -- and is newer.
      AND l.done::text <> $1
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.outbox AS o
          WHERE o.partition = l.partition
            AND o.txid >= pg_snapshot_xmin(l.done)
            AND o.txid < pg_snapshot_xmax($4::pg_snapshot)
            AND pg_visible_in_snapshot(o.txid, $4::pg_snapshot)
            AND NOT pg_visible_in_snapshot(o.txid, l.done))
)
INSERT INTO {schema}.outbox_positions
    (partition, epoch, done, done_bound, done_floor, done_at, cursor, published, prev_id, parked)
SELECT e.partition, e.epoch, $1::pg_snapshot, $5::xid8, $2, $3, 0, e.published, e.id,
       (SELECT count(*) FROM {schema}.outbox_parked AS k WHERE k.partition = e.partition)
FROM eligible AS e
ON CONFLICT (partition, prev_id) DO NOTHING
RETURNING partition
