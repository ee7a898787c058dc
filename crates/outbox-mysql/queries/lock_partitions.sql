SELECT part, CAST(owner AS CHAR) AS owner,
CAST(lease_until > UTC_TIMESTAMP(6) AS SIGNED) AS live
FROM {schema}.outbox_positions ORDER BY part FOR UPDATE
