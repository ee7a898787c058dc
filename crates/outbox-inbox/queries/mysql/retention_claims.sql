DELETE FROM {schema}.processed_messages WHERE processed_at < $1 LIMIT $2
