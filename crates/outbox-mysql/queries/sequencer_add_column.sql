ALTER TABLE {schema}.outbox_sequencer ADD COLUMN {column} {definition}
