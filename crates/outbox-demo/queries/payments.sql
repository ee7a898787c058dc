-- The payments service's business table, beside its outbox. Portable types, so one script
-- serves SQLite, PostgreSQL and MySQL/MariaDB: the payment id (a UUID) is stored as text on
-- each (MySQL indexes text only with a length, hence varchar).
CREATE TABLE {schema}.payments (id varchar(36) PRIMARY KEY, amount_cents bigint NOT NULL)
