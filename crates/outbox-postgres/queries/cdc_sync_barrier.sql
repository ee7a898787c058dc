SELECT pg_logical_emit_message(true, $1, '')::text
