UPDATE {schema}.outbox_settings SET value = GREATEST(value, ?)
  WHERE name = 'sealed_below'
