-- A one-row table for idle-tx mode's held transaction to read: a snapshot is taken by the
-- transaction's first query, and this one costs nothing and touches no outbox table.
CREATE TABLE {schema}.report (id integer);
INSERT INTO {schema}.report VALUES (1);
