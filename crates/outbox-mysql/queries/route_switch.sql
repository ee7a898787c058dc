DROP TRIGGER IF EXISTS {schema}.outbox_position;
INSERT INTO {schema}.outbox_settings (name, value) VALUES ('binlog_route', 1)
  ON DUPLICATE KEY UPDATE value = 1;
