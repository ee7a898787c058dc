-- CDC mode's scrape figures in one statement: the parked table's counts, and the slot $1 as the
-- server sees it (no row for a dropped slot: it counts as lost).
SELECT (SELECT count(*) FROM {schema}.outbox_parked) AS parked,
       (SELECT count(*) FROM {schema}.outbox_parked WHERE state = 'failed') AS failed,
       s.lag_bytes, s.retained_bytes, COALESCE(s.lost, true) AS lost
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag_bytes,
           pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes,
           wal_status = 'lost' AS lost
    FROM pg_replication_slots
    WHERE slot_name = $1
) AS s ON true
