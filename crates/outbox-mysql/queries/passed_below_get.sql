SELECT value FROM {schema}.outbox_settings WHERE name = 'passed_below'
