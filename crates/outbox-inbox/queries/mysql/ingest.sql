INSERT INTO {schema}.inbox_messages (id, source, type, `key`, payload, payload_format, headers, source_position)
