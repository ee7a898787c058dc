-- Up to 20 keys held back by a parked head (waiting for a retry, or failed), with that head's
-- error. Reads only the small parked table.
SELECT DISTINCT ON (partition, aggregate_id)
       aggregate_id AS key,
       CASE WHEN state = 'failed' THEN 'failed' ELSE 'retrying' END AS state,
       attempts, last_error
FROM {schema}.outbox_parked
ORDER BY partition, aggregate_id, seq
LIMIT 20
