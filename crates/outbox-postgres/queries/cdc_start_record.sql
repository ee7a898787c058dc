-- Where the group's new slot starts (the snapshot just after it), replacing a lost slot's.
INSERT INTO {schema}.outbox_settings (name, value)
VALUES ($1, pg_current_snapshot()::text)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
