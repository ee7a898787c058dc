SELECT i.inhdetachpending
  FROM pg_inherits AS i
  JOIN pg_class AS c ON c.oid = i.inhrelid
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
  WHERE n.nspname = $1
  AND c.relname = $2
