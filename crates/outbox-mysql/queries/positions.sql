SELECT w.part, w.passed, w.parked, w.epoch, w.recorded, {n} AS n,
s.value AS passed_below
FROM {schema}.outbox_positions AS w
JOIN {schema}.outbox_part_seq AS p ON p.part = w.part
JOIN {schema}.outbox_settings AS s ON s.name = 'passed_below'
WHERE w.owner = ? AND w.lease_until > UTC_TIMESTAMP(6)
