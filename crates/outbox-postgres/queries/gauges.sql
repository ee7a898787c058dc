-- The figures of a metrics scrape (`Store::gauges`), in one statement whose cost does not grow
-- with the backlog: a scrape every few seconds must cost the database next to nothing, with a
-- million rows pending as with none. Read-only; nothing here writes or takes a lock beyond
-- ACCESS SHARE.
--
-- Per partition, from its latest position (the `outbox_positions_latest_idx` probe, 64 of
-- them, as stats.sql):
--   * pending: the claim's own predicate (visible now, not passed by the position), counted up
--     to $1 rows per partition (pending_rows.sql): index entries of (partition, txid, seq) only,
--     no payload and no other column, each range starting past what the position has passed,
--     so a scrape reads at most about 64 × $1 entries however deep the backlog and however far
--     a long window has drained; a partition that reaches $1 sets `pending_capped`.
--   * the oldest pending age: for partitions with anything pending, the time since `done_at`,
--     when the partition's reader last caught up (every row it has not passed committed after
--     that snapshot was taken, so none has waited longer: an upper bound that needs no row
--     read, where `min(created_at)` would read every pending row's heap tuple). With the
--     parked messages still to deliver, by their `created_at` (the parked table is small:
--     capped per partition).
-- Then the parked table's counts ($2 is the per-partition parking cap), the segments, and what
-- holds retention: the least advanced position (a stuck partition or relay), the oldest
-- running transaction that holds a transaction id (transaction ids are cluster-wide, so every
-- database's count: no position passes it while it runs; `xact_start` of another role's
-- session is visible only with `pg_read_all_stats`), and the oldest prepared transaction.
WITH pos AS MATERIALIZED (
    SELECT lp.*, pg_current_snapshot() AS now_snap
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.done, x.done_bound, x.done_floor, x.done_at, x.cur, x.cursor,
               x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), pend AS MATERIALIZED (
    SELECT pos.partition, pos.done_at, w.n
    FROM pos
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
{pending_rows}
        ) AS capped
    ) AS w
), parked AS MATERIALIZED (
    SELECT count(*) FILTER (WHERE state <> 'failed') AS due,
           count(*) FILTER (WHERE state = 'retrying') AS retrying,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) AS parked,
           min(created_at) FILTER (WHERE state <> 'failed') AS oldest_due
    FROM {schema}.outbox_parked
)
SELECT
  (SELECT coalesce(sum(n), 0)::int8 FROM pend) + parked.due AS pending,
  coalesce((SELECT bool_or(n >= $1) FROM pend), false) AS pending_capped,
  extract(epoch FROM now() - least(
      (SELECT min(done_at) FROM pend WHERE n > 0), parked.oldest_due))::float8
    AS oldest_pending_age_seconds,
  parked.retrying,
  (SELECT coalesce(sum(published), 0)::int8 FROM pos) AS published,
  parked.parked,
  parked.failed,
  (SELECT count(*) FROM (SELECT partition FROM {schema}.outbox_parked GROUP BY partition
                         HAVING count(*) >= $2) AS f) AS partitions_at_parking_cap,
  (SELECT count(*) FROM {schema}.outbox_segments) AS segments,
  coalesce(extract(epoch FROM now() - (SELECT min(done_at) FROM pos))::float8, 0)
    AS pin_position,
  coalesce((SELECT extract(epoch FROM now() - min(a.xact_start))::float8
            FROM pg_stat_activity AS a WHERE a.backend_xid IS NOT NULL), 0) AS pin_transaction,
  coalesce((SELECT extract(epoch FROM now() - min(p.prepared))::float8
            FROM pg_prepared_xacts AS p), 0) AS pin_prepared
FROM parked
