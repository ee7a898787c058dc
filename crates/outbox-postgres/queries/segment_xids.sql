SELECT value::bigint FROM {schema}.outbox_settings WHERE name = 'segment_xids'
