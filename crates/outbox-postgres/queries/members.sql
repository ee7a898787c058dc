-- Live members and how many partitions each holds under an unexpired lease.
SELECT m.member, m.heartbeat_at, m.circuit, m.sink_error, count(p.partition) AS partitions
FROM {schema}.outbox_members AS m
LEFT JOIN {schema}.outbox_partitions AS p ON p.owner = m.member AND p.lease_until > now()
GROUP BY m.member, m.heartbeat_at, m.circuit, m.sink_error
ORDER BY m.member
