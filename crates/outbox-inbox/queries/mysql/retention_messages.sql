DELETE FROM {schema}.inbox_messages
    WHERE received_at < $1
      AND EXISTS (SELECT 1 FROM {schema}.processed_messages AS p
                  WHERE p.message_id = {schema}.inbox_messages.id)
    LIMIT $2
