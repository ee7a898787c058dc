-- Whether the file holds the outbox's ledger of applied migrations (1) or not (0).
SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox_migrations')
