-- The tables of scratch schema $1, plain and partitioned (relkind r, p), as quoted
-- `schema.table` names, ready to be joined into one `ANALYZE` statement (identifiers quoted by
-- `format('%I')`, so no name from the catalog is ever spliced in raw).
SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
