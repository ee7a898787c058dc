SELECT pg_logical_emit_message(false, $1, '')::text
