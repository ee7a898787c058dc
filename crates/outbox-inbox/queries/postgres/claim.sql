INSERT INTO {schema}.processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
