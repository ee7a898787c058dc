SELECT id, source, type, key, payload::text AS payload, payload_format, headers::text AS headers, source_position, received_at FROM {schema}.inbox_messages WHERE id = ANY($1)
