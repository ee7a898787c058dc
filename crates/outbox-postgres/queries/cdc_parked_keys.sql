-- The keys with parked rows (all of them, or only those not failed when $1 is false), and how
-- many parked rows there are in all; one row with a NULL key when none is parked.
SELECT k.aggregate_id, (SELECT count(*) FROM {schema}.outbox_parked)
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT DISTINCT aggregate_id FROM {schema}.outbox_parked
                   WHERE $1 OR state <> 'failed') AS k ON true
