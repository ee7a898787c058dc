UPDATE {schema}.outbox_sequencer SET binlog_file = ?, binlog_offset = ?
  WHERE id = 1 AND binlog_file IS NULL
