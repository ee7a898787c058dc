-- The payments service's business table, beside its outbox. Portable types, so one script
-- serves SQLite and PostgreSQL: the payment id (a UUID) is stored as text on either backend.
CREATE TABLE {schema}.payments (id text PRIMARY KEY, amount_cents bigint NOT NULL)
