SELECT part, epoch, recorded, CAST(owner AS CHAR) AS owner
  FROM {schema}.outbox_positions WHERE part IN (
