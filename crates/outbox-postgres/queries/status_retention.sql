-- What keeps storage, for `outbox status`. Segments are dropped whole once their txid range
-- lies below the horizon (the lowest xmin of the partitions' `done` snapshots, see
-- droppable.sql) and retention has run out since they closed. This reads:
--   - the segments: how many, their size, the oldest one;
--   - the horizon and the partition that sets it (the lowest xmin, then the oldest position);
--   - the oldest transaction still running in the cluster (the xmin of a snapshot taken now,
--     when anything runs): every position taken while it runs stops at its id. It is matched
--     to its session in pg_stat_activity, or to pg_prepared_xacts, by its 32-bit id.
-- The caller decides which of the two pins the horizon. Reads catalogs and small tables only.
WITH lp AS (
    SELECT lp.partition, lp.done_at, pg_snapshot_xmin(lp.done)::text::int8 AS xmin
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.done, x.done_at FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), pin AS (
    SELECT lp.partition, lp.done_at, lp.xmin,
           (SELECT p.owner FROM {schema}.outbox_partitions AS p
            WHERE p.partition = lp.partition AND p.lease_until > now()) AS owner
    FROM lp
    ORDER BY lp.xmin, lp.done_at, lp.partition
    LIMIT 1
), snap AS (
    SELECT pg_snapshot_xmin(s)::text::int8 AS xmin, pg_snapshot_xmax(s)::text::int8 AS xmax
    FROM pg_current_snapshot() AS s
), running AS (
    SELECT CASE WHEN snap.xmin < snap.xmax THEN snap.xmin END AS xid FROM snap
), seg AS (
    SELECT s.name, s.lo::text::int8 AS lo, s.hi::text::int8 AS hi, s.closed_at,
           pg_total_relation_size(to_regclass(format('%I.%I', '{schema}', s.name))) AS bytes
    FROM {schema}.outbox_segments AS s
)
SELECT
  (SELECT count(*) FROM seg) AS segments,
  (SELECT coalesce(sum(bytes), 0)::int8 FROM seg) AS bytes,
  (SELECT xmax FROM snap) AS next_xid,
  o.name AS oldest_name, o.lo AS oldest_lo, o.hi AS oldest_hi, o.closed_at AS oldest_closed_at,
  o.bytes AS oldest_bytes,
  pin.xmin AS horizon, pin.partition::int4 AS pin_partition, pin.owner AS pin_owner,
  pin.done_at AS pin_done_at,
  extract(epoch FROM now() - pin.done_at)::float8 AS pin_behind_seconds,
  running.xid AS running_xid,
  a.pid AS running_pid,
  extract(epoch FROM now() - coalesce(a.xact_start, px.prepared))::float8
    AS running_age_seconds,
  a.state AS running_state, a.application_name AS running_application,
  coalesce(a.datname, px.database)::text AS running_database,
  coalesce(a.usename, px.owner)::text AS running_user,
  px.gid AS running_prepared
FROM running
LEFT JOIN LATERAL (SELECT * FROM seg ORDER BY seg.lo LIMIT 1) AS o ON true
LEFT JOIN pin ON true
LEFT JOIN LATERAL (
    SELECT s.pid, s.xact_start, s.state, s.application_name, s.datname, s.usename
    FROM pg_stat_activity AS s
    WHERE s.backend_xid::text::int8 = running.xid % 4294967296
    LIMIT 1
) AS a ON true
LEFT JOIN LATERAL (
    SELECT t.gid, t.prepared, t.database, t.owner
    FROM pg_prepared_xacts AS t
    WHERE t.transaction::text::int8 = running.xid % 4294967296
    LIMIT 1
) AS px ON true
