-- Up to 20 keys whose head message waits for a retry or has failed, with that head's error.
-- Both predicates are served by their small partial indexes.
SELECT DISTINCT ON (aggregate_id)
       aggregate_id AS key,
       CASE WHEN state = 'failed' THEN 'failed' ELSE 'retrying' END AS state,
       attempts, last_error
FROM {schema}.outbox
WHERE (state = 'pending' AND attempts > 0) OR state = 'failed'
ORDER BY aggregate_id, seq
LIMIT 20
