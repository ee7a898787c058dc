DELETE FROM {schema}.inbox_messages
    WHERE id IN (SELECT m.id FROM {schema}.inbox_messages AS m
                 WHERE m.received_at < $1
                   AND EXISTS (SELECT 1 FROM {schema}.processed_messages AS p
                               WHERE p.message_id = m.id)
                 LIMIT $2)
