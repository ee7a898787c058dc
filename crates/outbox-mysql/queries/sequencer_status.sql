SELECT CAST(owner AS CHAR), epoch, lease_until, updated_at, CAST(binlog_file AS CHAR),
  binlog_offset, sequenced_below, from_table, UTC_TIMESTAMP(6), advanced_at
  FROM {schema}.outbox_sequencer WHERE id = 1
