UPDATE {schema}.outbox_settings SET value = GREATEST(value, ?)
  WHERE name = 'passed_below'
