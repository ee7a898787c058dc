SELECT CAST(binlog_file AS CHAR), binlog_offset FROM {schema}.outbox_sequencer
  WHERE id = 1
