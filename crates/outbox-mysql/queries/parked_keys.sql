SELECT g.part, CAST(g.aggregate_id AS CHAR) AS aggregate_id, g.n,
CAST(g.failed AS SIGNED) AS failed,
CAST(h.next_attempt_at IS NULL OR h.next_attempt_at <= UTC_TIMESTAMP(6) AS SIGNED) AS due,
h.next_attempt_at
FROM (SELECT part, aggregate_id, COUNT(*) AS n, MIN(part_seq) AS head,
             SUM(state = 'failed') AS failed
      FROM {schema}.outbox_parked WHERE FIND_IN_SET(part, ?) {skip}
      GROUP BY part, aggregate_id) AS g
JOIN {schema}.outbox_parked AS h
  ON h.part = g.part AND h.aggregate_id = g.aggregate_id AND h.part_seq = g.head
