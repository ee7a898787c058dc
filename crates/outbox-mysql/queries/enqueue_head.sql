INSERT INTO {schema}.outbox
  (id, aggregate_type, aggregate_id, event_type, payload, headers, topic)
