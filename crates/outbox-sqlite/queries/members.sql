-- Live members and how many partitions each holds under an unexpired lease. ?1 now (unix ms)
SELECT m.member, m.heartbeat_at, m.circuit, m.sink_error, count(p.partition) AS partitions
FROM outbox_members AS m
LEFT JOIN outbox_partitions AS p ON p.owner = m.member AND p.lease_until > ?1
GROUP BY m.member, m.heartbeat_at, m.circuit, m.sink_error
ORDER BY m.member
