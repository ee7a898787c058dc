UPDATE {schema}.outbox_positions SET recorded = recorded + 1, passed = CASE part
