SELECT id, source, type, key, payload, payload_format, headers, source_position, received_at FROM inbox_messages WHERE id IN (SELECT value FROM json_each(?1))
