INSERT INTO {schema}.outbox_redrives (message_id, seq, attempts, last_error, reason)
  SELECT o.id, p.seq, p.attempts, p.last_error, {reason}
  FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq
  WHERE p.state = 'failed'
