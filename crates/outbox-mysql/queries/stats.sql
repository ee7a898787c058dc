SELECT
(SELECT CAST(COALESCE(SUM(c.n - w.passed), 0) AS SIGNED)
   FROM {schema}.outbox_positions AS w
   JOIN {counters} AS c ON c.part = w.part) AS unpassed,
(SELECT CAST(COALESCE(SUM(passed), 0) AS SIGNED) FROM {schema}.outbox_positions) AS passed,
(SELECT COUNT(*) FROM {schema}.outbox_parked) AS parked,
(SELECT COUNT(*) FROM {schema}.outbox_parked WHERE state = 'failed') AS failed,
(SELECT COUNT(*) FROM {schema}.outbox_parked WHERE state = 'retrying') AS retrying,
(SELECT COUNT(*) FROM (SELECT DISTINCT part, aggregate_id FROM {schema}.outbox_parked
   WHERE state IN ('retrying', 'failed')) AS k) AS blocked_keys,
(SELECT COUNT(*) FROM {schema}.outbox_positions WHERE parked >= ?) AS at_cap,
(SELECT TIMESTAMPDIFF(MICROSECOND, MIN(t), UTC_TIMESTAMP(6)) FROM (
   SELECT o.created_at AS t FROM {schema}.outbox_positions AS w
     JOIN {messages} AS o ON o.part = w.part AND o.part_seq = w.passed + 1
   UNION ALL
   SELECT o.created_at FROM {schema}.outbox_parked AS p
     JOIN {schema}.outbox AS o ON o.seq = p.seq WHERE p.state <> 'failed') AS a) AS oldest_us,
(SELECT TIMESTAMPDIFF(MICROSECOND, MIN(o.created_at), UTC_TIMESTAMP(6))
   FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq
   WHERE p.state <> 'failed') AS oldest_waiting_us
