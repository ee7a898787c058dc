SELECT {columns}, x.attempts
FROM (SELECT seq, part, aggregate_id, part_seq, attempts,
             ROW_NUMBER() OVER (PARTITION BY part, aggregate_id ORDER BY part_seq) AS rn
      FROM {schema}.outbox_parked WHERE ({keys}) {skip}) AS x
JOIN {messages} AS o ON o.seq = x.seq
WHERE x.rn <= ?
ORDER BY x.part, x.aggregate_id, x.part_seq
