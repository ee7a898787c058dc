SELECT COUNT(*) FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox_migrations'
