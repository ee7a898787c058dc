SELECT id FROM {schema}.outbox_sequencer WHERE id = 1
