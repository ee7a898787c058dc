DELETE FROM {schema}.processed_messages
    WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM {schema}.processed_messages
                                     WHERE processed_at < $1
                                     LIMIT $2)
