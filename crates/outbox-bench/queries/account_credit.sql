-- The business transaction's own write in writers mode: pgbench's UPDATE of one account.
UPDATE {schema}.accounts SET balance = balance + 1 WHERE id = $1
