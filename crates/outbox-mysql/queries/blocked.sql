SELECT CAST(aggregate_id AS CHAR) AS aggregate_id,
CAST(state AS CHAR) AS state, attempts, CAST(last_error AS CHAR) AS last_error
FROM {schema}.outbox_parked WHERE state IN ('retrying', 'failed') ORDER BY seq LIMIT 20
