UPDATE {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq
  SET p.state = 'retrying', p.attempts = 0, p.next_attempt_at = UTC_TIMESTAMP(6)
  WHERE p.state = 'failed'
