-- The ids of a batch the inbox already has; the crate adds one bound `?` per id and the closing
-- parenthesis (and `existing_locking_tail.sql` for a locking read).
SELECT CAST(id AS CHAR) FROM {schema}.inbox_messages WHERE id IN (