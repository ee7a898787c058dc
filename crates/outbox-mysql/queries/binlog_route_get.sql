SELECT value FROM {schema}.outbox_settings WHERE name = 'binlog_route'
