-- Dead tuples of table $2 in schema $1 with its partitions at any depth (the engine's message
-- table is partitioned, and a partition may itself be), and of every table of the schema.
-- `pg_stat_user_tables` is fed by the statistics system about a second after the transactions,
-- so callers wait before reading it.
WITH RECURSIVE tree AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = $2
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)
SELECT (SELECT coalesce(sum(s.n_dead_tup), 0)::int8
        FROM tree JOIN pg_stat_user_tables s ON s.relid = tree.oid),
       (SELECT coalesce(sum(n_dead_tup), 0)::int8
        FROM pg_stat_user_tables WHERE schemaname = $1)
