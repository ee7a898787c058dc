SELECT has_function_privilege('public', 'pg_logical_emit_message(boolean, text, text)', 'EXECUTE')
