-- The naive relay marks each row once the broker acknowledged it: one UPDATE per row, inside
-- the claiming transaction (a new row version and an index entry per message).
UPDATE {schema}.naive_outbox SET status = 'SENT' WHERE id = $1
