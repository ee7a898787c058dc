-- The held transaction's first query: it takes the REPEATABLE READ snapshot, which the
-- transaction keeps until it ends.
SELECT 1 FROM {schema}.report LIMIT 1
