-- Counts for `outbox status`, from the positions and the parked table; nothing here reads the
-- message table's history. Pending is the claim's own predicate (visible now, not yet passed by
-- the partition's position; pending_rows.sql), counted per partition up to $1 rows, plus the
-- parked messages that are not failed; partitions holding $2 parked messages have stopped
-- advancing. The oldest pending age is the oldest of the rows counted and of the parked
-- messages still to deliver.
WITH pos AS MATERIALIZED (
    SELECT lp.*, pg_current_snapshot() AS now_snap
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.done, x.done_bound, x.done_floor, x.cur, x.cursor, x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), pend AS (
    SELECT pos.partition, w.seq, w.created_at
    FROM pos
    CROSS JOIN LATERAL (
{pending_rows}
    ) AS w
)
SELECT
  (SELECT count(*) FROM pend)
    + (SELECT count(*) FROM {schema}.outbox_parked WHERE state <> 'failed') AS pending,
  (SELECT extract(epoch FROM now() - least(
      (SELECT min(created_at) FROM pend),
      (SELECT min(created_at) FROM {schema}.outbox_parked WHERE state <> 'failed')))::float8)
    AS oldest_pending_age_seconds,
  (SELECT count(*) FROM {schema}.outbox_parked WHERE state = 'failed') AS failed,
  (SELECT coalesce(sum(published), 0)::int8 FROM pos) AS published,
  (SELECT count(*) FROM {schema}.outbox_parked WHERE state = 'retrying') AS retrying,
  (SELECT count(*) FROM {schema}.outbox_parked) AS parked,
  (SELECT count(*) FROM (SELECT partition FROM {schema}.outbox_parked GROUP BY partition
                         HAVING count(*) >= $2) AS f) AS partitions_at_parking_cap,
  (SELECT count(*) FROM (SELECT DISTINCT partition, aggregate_id
                         FROM {schema}.outbox_parked) AS k) AS blocked_keys,
  -- Held back: the parked messages still to deliver (retrying heads and those queued behind
  -- a retrying or failed head), and how long the oldest of them has waited.
  (SELECT count(*) FROM {schema}.outbox_parked WHERE state <> 'failed') AS waiting,
  (SELECT extract(epoch FROM now() - min(created_at))::float8
   FROM {schema}.outbox_parked WHERE state <> 'failed') AS oldest_waiting_age_seconds
