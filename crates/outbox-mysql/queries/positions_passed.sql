SELECT part, passed FROM {schema}.outbox_positions
