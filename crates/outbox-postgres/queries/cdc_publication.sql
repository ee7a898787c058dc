-- CDC mode: the publication $1 as the server has it, for the check that it carries every row of
-- `$2.outbox` (cdc/checks.rs): inserts published, rows named by the root table, the table in it
-- (listed, or through FOR ALL TABLES / TABLES IN SCHEMA: the view resolves both), and neither a
-- row filter nor a column list on it. `to_jsonb(r)` reads `prqual` and `prattrs` on PostgreSQL
-- 15 and later and gives NULL on 14, which has neither.
SELECT p.pubinsert, p.pubviaroot,
       EXISTS (SELECT 1 FROM pg_publication_tables AS t
               WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = 'outbox')
           AS publishes_table,
       (SELECT to_jsonb(r) ->> 'prqual' FROM pg_publication_rel AS r
        WHERE r.prpubid = p.oid AND r.prrelid = to_regclass(format('%I.outbox', $2::text)))
           AS row_filter,
       (SELECT to_jsonb(r) ->> 'prattrs' FROM pg_publication_rel AS r
        WHERE r.prpubid = p.oid AND r.prrelid = to_regclass(format('%I.outbox', $2::text)))
           AS column_list
FROM pg_publication AS p
WHERE p.pubname = $1
