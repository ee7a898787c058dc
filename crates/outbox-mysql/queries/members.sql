SELECT CAST(m.member AS CHAR) AS member, m.heartbeat_at,
CAST(m.circuit AS CHAR) AS circuit, CAST(m.sink_error AS CHAR) AS sink_error,
COUNT(w.part) AS partitions
FROM {schema}.outbox_members AS m
LEFT JOIN {schema}.outbox_positions AS w
  ON w.owner = m.member AND w.lease_until > UTC_TIMESTAMP(6)
GROUP BY m.member, m.heartbeat_at, m.circuit, m.sink_error
ORDER BY m.member
