-- Whether the inbox tables are there (a missing table is a Schema error naming the fix).
-- COUNT(*) is a 64-bit integer on every backend.
SELECT COUNT(*) FROM (SELECT 1 FROM {schema}.inbox_messages LIMIT 1) AS t
