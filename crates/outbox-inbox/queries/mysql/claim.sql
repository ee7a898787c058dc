INSERT IGNORE INTO {schema}.processed_messages (consumer, message_id) VALUES (?, ?)
