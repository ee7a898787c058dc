SELECT CAST(binlog_file AS CHAR) AS file, binlog_offset, sequenced_below,
  trigger_rows_taken, CAST(server_identity AS CHAR) AS server_identity,
  reread_below, CAST(binlog_gtid AS CHAR) AS binlog_gtid
  FROM {schema}.outbox_sequencer WHERE id = 1
