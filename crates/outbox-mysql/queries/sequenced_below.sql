SELECT sequenced_below FROM {schema}.outbox_sequencer WHERE id = 1
