-- Where the group's slot starts (the snapshot just after it): kept when already recorded.
INSERT INTO {schema}.outbox_settings (name, value)
VALUES ($1, pg_current_snapshot()::text) ON CONFLICT (name) DO NOTHING
