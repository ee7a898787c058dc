-- Up to 20 keys whose head message waits for a retry or has failed, with that head's error.
SELECT o.aggregate_id AS key,
       CASE WHEN o.state = 'failed' THEN 'failed' ELSE 'retrying' END AS state,
       o.attempts, o.last_error
FROM outbox AS o
WHERE ((o.state = 'pending' AND o.next_attempt_at IS NOT NULL) OR o.state = 'failed')
  AND o.seq = (SELECT min(x.seq) FROM outbox AS x
               WHERE x.aggregate_id = o.aggregate_id
                 AND ((x.state = 'pending' AND x.next_attempt_at IS NOT NULL) OR x.state = 'failed'))
ORDER BY o.aggregate_id
LIMIT 20
